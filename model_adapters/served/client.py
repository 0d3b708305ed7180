"""One client for every OpenAI-compatible completions server (vLLM, SGLang, llama.cpp).

Every request is bounded: a connect/read timeout, then `retries` retries with exponential
backoff for what a retry can fix (a refused connection, a timeout, a 5xx, a cut-off or malformed
JSON body); a 4xx is the caller's mistake and is raised at once. Several base URLs spread
requests round-robin. The API key is read from an environment variable and sent only as a
header: it never enters an error message, an identity or a file.
"""
from __future__ import annotations

import itertools
import json
import os
import threading
import time
from dataclasses import dataclass
from typing import Any, Iterator, Sequence
from urllib.parse import urlsplit

import requests

MAX_RETRIES = 20
MAX_TIMEOUT_S = 3600.0


class ServerError(ConnectionError):
    """A request that failed after its retries, or a refusal no retry can fix (4xx). A
    ConnectionError, so the command line reports it as a failed environment: one line, exit 1."""


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
        self.timeout_s, self.retries, self.backoff_s = float(timeout_s), int(retries), backoff_s
        self._headers = {"Content-Type": "application/json"}
        if api_key_env:
            key = os.environ.get(api_key_env)
            if not key:
                raise ValueError(f"served: api_key_env={api_key_env}: that environment variable "
                                 f"is not set (it should hold the server's API key)")
            self._headers["Authorization"] = f"Bearer {key}"
        self._next = itertools.cycle(range(len(self.base_urls)))
        self._lock = threading.Lock()
        self._local = threading.local()  # one requests.Session per thread (not thread-safe)

    def _session(self) -> requests.Session:
        s = getattr(self._local, "session", None)
        if s is None:
            s = self._local.session = requests.Session()
        return s

    def _url(self, path: str, index: int | None) -> str:
        if index is None:
            with self._lock:
                index = next(self._next)
        return self.base_urls[index] + path

    def _request(self, method: str, path: str, body: dict | None, *, stream: bool,
                 index: int | None = None):
        """The response (status 200) after bounded retries; the body is parsed by the caller,
        whose parse errors are retried through `call`."""
        url = self._url(path, index)
        r = self._session().request(method, url, json=body, headers=self._headers, stream=stream,
                                    timeout=(min(10.0, self.timeout_s), self.timeout_s))
        if r.status_code != 200:
            text = r.text[:300].replace("\n", " ")
            err = ServerError(f"{url}: HTTP {r.status_code}: {text}")
            err.retryable = r.status_code >= 500 or r.status_code == 429
            if r.status_code == 401:
                err.args = (f"{url}: HTTP 401 Unauthorized: the server wants an API key; pass "
                            f"api_key_env=NAME with the key in that environment variable",)
            raise err
        return r

    def call(self, what: str, fn) -> Any:
        """`fn()` with bounded retries and exponential backoff for what a retry can fix."""
        last: BaseException | None = None
        for attempt in range(self.retries + 1):
            try:
                return fn()
            except ServerError as e:
                if not getattr(e, "retryable", False):
                    raise
                last = e
            except (requests.ConnectionError, requests.Timeout,
                    requests.exceptions.ChunkedEncodingError, ValueError, KeyError,
                    IndexError, TypeError) as e:
                # refused / reset / timed out / a cut-off or malformed body
                last = e
            if attempt < self.retries:
                time.sleep(self.backoff_s * 2 ** attempt)
        raise ServerError(f"{what}: failed after {self.retries + 1} attempt(s): "
                          f"{type(last).__name__}: {_short(last)}") from None

    # -- endpoints ------------------------------------------------------------------------
    def get_json(self, path: str, index: int = 0) -> Any:
        return self.call(f"GET {self.base_urls[index]}{path}",
                         lambda: self._request("GET", path, None, stream=False, index=index).json())

    def post_json(self, path: str, body: dict) -> dict:
        def once():
            out = self._request("POST", path, body, stream=False).json()
            if not isinstance(out, dict) or not isinstance(out.get("choices"), list):
                raise ValueError(f"malformed response (no 'choices'): {str(out)[:200]}")
            return out
        return self.call(f"POST {path}", once)

    def stream_completion(self, body: dict) -> tuple[str, dict, Timing]:
        """A streamed completion: (text, last chunk, timing). TTFT is the first chunk that
        carries text."""
        def once():
            t0 = time.perf_counter()
            r = self._request("POST", "/completions", {**body, "stream": True}, stream=True)
            text, ttft, last, done = [], None, {}, False
            for line in _sse_lines(r):
                if line == "[DONE]":
                    done = True
                    break
                chunk = json.loads(line)
                if "error" in chunk:
                    raise ServerError(f"server error mid-stream: {str(chunk['error'])[:200]}")
                last = chunk
                for ch in chunk.get("choices", []):
                    piece = ch.get("text") or ""
                    if piece and ttft is None:
                        ttft = time.perf_counter() - t0
                    text.append(piece)
            if not done:
                raise ValueError("the stream ended before [DONE] (cut off)")
            return "".join(text), last, Timing(ttft, time.perf_counter() - t0)
        return self.call("POST /completions (stream)", once)


def _sse_lines(r: requests.Response) -> Iterator[str]:
    for raw in r.iter_lines(decode_unicode=True):
        if raw and raw.startswith("data:"):
            yield raw[5:].strip()


def _short(e: BaseException | None) -> str:
    return str(e).splitlines()[0][:300] if e is not None and str(e) else ""
