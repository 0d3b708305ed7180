"""One client for every OpenAI-compatible completions server (vLLM, SGLang, llama.cpp).

Every request is bounded: `timeout_s` for the answer to start and for a stream to end, then
`retries` retries with capped exponential backoff for what a retry can fix (a refused or reset
connection, a timeout, a 5xx, a cut-off or malformed JSON body); a 4xx is the caller's mistake
and is raised at once. The final error names the cause. A server that still refuses connections
after a request's retries is down: later requests to it fail at once instead of each waiting out
its own retries, so a dead server ends a run in about one retry cycle, not one per sample
(`evalkit run --resume` retries those samples). Several base URLs spread requests round-robin
over the servers that are up. The API key is read from an environment variable and sent only
as a header: it never enters an error message, an identity or a file.
"""
from __future__ import annotations

import json
import os
import re
import threading
import time
from dataclasses import dataclass
from typing import Any, Iterator, Sequence
from urllib.parse import urlsplit

import requests
from urllib3.exceptions import ConnectTimeoutError

MAX_RETRIES = 20
MAX_TIMEOUT_S = 3600.0
MAX_BACKOFF_S = 30.0  # one wait between attempts at most: 20 retries stay within minutes


class ServerError(ConnectionError):
    """A request that failed after its retries, or a refusal no retry can fix (4xx). A
    ConnectionError, so the command line reports it as a failed environment: one line, exit 1.
    `status` is the HTTP status where there was one; `retryable` whether a retry may help."""

    def __init__(self, message: str, *, status: int | None = None,
                 retryable: bool = False) -> None:
        super().__init__(message)
        self.status, self.retryable = status, retryable


def clean_url(url: str) -> str:
    """`url` without credentials, query or trailing slash; checked to be http(s)://host[:port]/..."""
    parts = urlsplit(str(url).strip())
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise ValueError(f"base_url {url!r}: expected http://HOST:PORT/v1 (an OpenAI-compatible "
                         f"server's API root)")
    if parts.username or parts.password:
        raise ValueError("base_url: put no credentials in the URL; pass the key through "
                         "api_key_env=NAME (the environment variable holding it)")
    port = f":{parts.port}" if parts.port else ""
    return f"{parts.scheme}://{parts.hostname}{port}{parts.path.rstrip('/')}"


@dataclass
class Timing:
    """One streamed request: seconds to the first token and to the last byte."""
    ttft_s: float | None
    latency_s: float


class Client:
    def __init__(self, base_urls: Sequence[str], *, api_key_env: str | None = None,
                 timeout_s: float = 300.0, retries: int = 3, backoff_s: float = 0.5) -> None:
        if not base_urls:
            raise ValueError("served: give at least one base_url")
        self.base_urls = [clean_url(u) for u in base_urls]
        if not 0 < float(timeout_s) <= MAX_TIMEOUT_S:
            raise ValueError(f"served: timeout_s={timeout_s}: expected (0, {MAX_TIMEOUT_S:g}] seconds")
        if not 0 <= int(retries) <= MAX_RETRIES:
            raise ValueError(f"served: retries={retries}: expected 0..{MAX_RETRIES}")
        if not 0 <= float(backoff_s) <= MAX_BACKOFF_S:
            raise ValueError(f"served: backoff_s={backoff_s}: expected 0..{MAX_BACKOFF_S:g} seconds")
        self.timeout_s, self.retries = float(timeout_s), int(retries)
        self.backoff_s = float(backoff_s)
        self._headers = {"Content-Type": "application/json"}
        self._key_env = api_key_env
        if api_key_env:
            key = os.environ.get(api_key_env)
            if not key:
                raise ValueError(f"served: api_key_env={api_key_env}: that environment variable "
                                 f"is not set (it should hold the server's API key)")
            self._headers["Authorization"] = f"Bearer {key}"
        self._turn = 0
        self._down: dict[int, str] = {}  # base_url index -> why it counts as down
        self._lock = threading.Lock()
        self._local = threading.local()  # one requests.Session per thread (not thread-safe)

    @property
    def headers(self) -> dict:
        """The request headers (with the key, if any): never logged or stored."""
        return dict(self._headers)

    def _session(self) -> requests.Session:
        s = getattr(self._local, "session", None)
        if s is None:
            s = self._local.session = requests.Session()
        return s

    def _pick(self, index: int | None, what: str) -> int:
        """`index`, or the next server that is up (round-robin); none up: fail at once."""
        with self._lock:
            up = [i for i in range(len(self.base_urls)) if i not in self._down]
            if index is None and up:
                index = up[self._turn % len(up)]
                self._turn += 1
            if index is None or index in self._down:
                why = "; ".join(f"{self.base_urls[i]} {r}" for i, r in sorted(self._down.items())
                                if index is None or i == index)
                raise ServerError(f"{what}: not sent, the server is down ({why}); `evalkit run "
                                  f"--resume` retries the failed samples once it is back")
            return index

    def _request(self, method: str, path: str, body: dict | None, *, stream: bool,
                 index: int):
        """The response (status 200); anything else is a ServerError naming the status."""
        url = self.base_urls[index] + path
        r = self._session().request(method, url, json=body, headers=self._headers, stream=stream,
                                    timeout=(min(10.0, self.timeout_s), self.timeout_s))
        if r.status_code == 200:
            return r
        with r:
            text = r.text[:300].replace("\n", " ")
        msg = f"{url}: HTTP {r.status_code}: {text}"
        if r.status_code == 401:
            msg = (f"{url}: HTTP 401 Unauthorized: the server refused the API key in "
                   f"${self._key_env}" if self._key_env else
                   f"{url}: HTTP 401 Unauthorized: the server wants an API key; pass "
                   f"api_key_env=NAME with the key in that environment variable")
        raise ServerError(msg, status=r.status_code,
                          retryable=r.status_code >= 500 or r.status_code in (408, 429))

    def call(self, what: str, fn, index: int | None = None) -> Any:
        """`fn(index)` with bounded retries and capped exponential backoff for what a retry can
        fix; the final error names the cause."""
        last: BaseException | None = None
        for attempt in range(self.retries + 1):
            i = self._pick(index, what)
            try:
                return fn(i)
            except ServerError as e:
                if not e.retryable:
                    raise
                last = e
            except (requests.RequestException, ValueError) as e:
                # refused / reset / timed out / a cut-off or malformed body (JSON errors are
                # ValueErrors)
                last = e
            if attempt < self.retries:
                time.sleep(min(self.backoff_s * 2 ** attempt, MAX_BACKOFF_S))
        cause = self._cause(last)
        if _refused(last):  # nobody listens there any more: later requests fail at once
            with self._lock:
                self._down.setdefault(i, f"refused connections on {self.retries + 1} attempt(s)"
                                         f" ({cause})")
        raise ServerError(f"{what}: failed after {self.retries + 1} attempt(s): "
                          f"{cause}") from None

    def _cause(self, e: BaseException | None) -> str:
        """What went wrong, in words: the transport's reason, not its wrapper's repr."""
        if isinstance(e, requests.Timeout) or "Read timed out" in str(e):  # also a stalled stream
            return f"timed out (no complete answer within timeout_s={self.timeout_s:g} s)"
        if isinstance(e, (requests.exceptions.ChunkedEncodingError,
                          requests.exceptions.ContentDecodingError)):
            return f"the response was cut off ({_short(e)})"
        if isinstance(e, requests.ConnectionError):
            m = re.search(r"\[Errno -?\d+\] ([^'\")]+)|(Remote end closed[^'\")]*)"
                          r"|(Connection (?:reset|aborted|refused)[^'\")]*)", str(e))
            return f"connection failed: {next(g for g in m.groups() if g) if m else _short(e)}"
        if isinstance(e, json.JSONDecodeError):
            return f"malformed JSON in the response ({_short(e)})"
        return f"{type(e).__name__}: {_short(e)}" if not isinstance(e, ServerError) else _short(e)

    # -- endpoints ------------------------------------------------------------------------
    def get_json(self, path: str, index: int = 0) -> Any:
        return self.call(f"GET {self.base_urls[index]}{path}",
                         lambda i: self._json("GET", path, None, i), index=index)

    def post_json(self, path: str, body: dict) -> dict:
        def once(i: int) -> dict:
            out = self._json("POST", path, body, i)
            if not isinstance(out, dict) or not isinstance(out.get("choices"), list):
                raise _malformed(f"no 'choices' list in {str(out)[:200]}")
            return out
        return self.call(f"POST {path}", once)

    def _json(self, method: str, path: str, body: dict | None, index: int) -> Any:
        """A JSON answer read chunk by chunk against timeout_s (see stream_completion)."""
        t0, data = time.perf_counter(), bytearray()
        with self._request(method, path, body, stream=True, index=index) as r:
            for part in r.iter_content(1 << 16):
                data += part
                if time.perf_counter() - t0 > self.timeout_s:
                    raise requests.Timeout("the answer outlasted timeout_s")
        return json.loads(data)

    def stream_completion(self, body: dict) -> tuple[str, dict, Timing]:
        """A streamed completion: (text, last chunk, timing). TTFT is the first chunk that
        carries text. requests' read timeout bounds only the wait for each chunk, so a stream
        that trickles forever would hang: it is given up at the first chunk past timeout_s."""
        def once(i: int):
            t0 = time.perf_counter()
            text, ttft, last = [], None, {}
            with self._request("POST", "/completions", {**body, "stream": True}, stream=True,
                               index=i) as r:
                for line in _sse_lines(r):
                    if time.perf_counter() - t0 > self.timeout_s:
                        raise requests.Timeout("the stream outlasted timeout_s")
                    if line == "[DONE]":
                        return "".join(text), last, Timing(ttft, time.perf_counter() - t0)
                    chunk = json.loads(line)
                    if not isinstance(chunk, dict):
                        raise _malformed(f"stream chunk {line[:200]} is not an object")
                    if "error" in chunk:  # vLLM reports an engine failure inside the stream
                        raise ServerError(f"server error mid-stream: "
                                          f"{str(chunk['error'])[:200]}", retryable=True)
                    last = chunk
                    for ch in chunk.get("choices") or []:
                        piece = (ch.get("text") if isinstance(ch, dict) else None) or ""
                        if piece and ttft is None:
                            ttft = time.perf_counter() - t0
                        text.append(piece)
            raise _malformed("the stream ended before [DONE] (cut off)")
        return self.call("POST /completions (stream)", once)


def _malformed(why: str) -> ServerError:
    return ServerError(f"malformed response: {why}", retryable=True)


def _refused(e: BaseException | None) -> bool:
    """No connection could be made (refused, or the connect timed out): nothing was sent."""
    if isinstance(e, requests.exceptions.ConnectTimeout):
        return True
    inner = e.args[0] if isinstance(e, requests.ConnectionError) and e.args else None
    return isinstance(getattr(inner, "reason", None), ConnectTimeoutError)


def _sse_lines(r: requests.Response) -> Iterator[str]:
    for raw in r.iter_lines(decode_unicode=True):
        if raw and raw.startswith("data:"):
            yield raw[5:].strip()


def _short(e: BaseException | None) -> str:
    return str(e).splitlines()[0][:300] if e is not None and str(e) else ""
