"""One client for every OpenAI-compatible completions server (vLLM, SGLang, llama.cpp).

httpx speaks HTTP, httpx-sse reads the streams and tenacity schedules the retries; they run on
one asyncio loop in a background thread, which the callers (the runner's threads) hand their
requests to. Asyncio because it can end a request at any await: that is what lets one deadline
bound everything and `abort()` end every request at once, which a blocking socket read cannot.

- One deadline per request: `timeout_s` from the first send bounds every attempt, every
  backoff and every byte of the answer; a server that trickles bytes cannot extend it.
- Retries (`retries` of them) only for what a retry can fix: a refused or reset connection, a
  5xx, a 429 (too many requests), a cut-off or malformed answer; backoff is exponential,
  jittered, capped, and waits at least what a Retry-After header asks (capped too). A wait that
  would pass the deadline is not begun. Any other 4xx is the caller's mistake and is raised at
  once.
- A failure is a ServerError with `cause` (timeout, connect, http_5xx, http_4xx, bad_response,
  cancelled) and `attempts`, so the runner can count failures by cause.
- A refused connection is one request's failure, retried within that request's deadline; it
  is never a verdict on the server for the rest of the run (a server restarting for a few
  seconds refuses the requests sent meanwhile, and answers the ones sent after). Several base
  URLs spread the attempts round-robin, so a retry goes to the next server.
- No secret anywhere: a URL with credentials, a query, a fragment or path parameters is refused
  without being repeated; the API key is read from an environment variable and sent only as a
  header, and every text a server sends back (error bodies, answers, model lists) has the key
  replaced by REDACTED before anything stores or prints it. An environment proxy (HTTP_PROXY,
  ALL_PROXY, ...) is never used for a server on this machine (decided by resolving its host:
  127.1, 0.0.0.0, [::ffff:127.0.0.1] and the host name are this machine too), nor for a plain
  http:// server when a key is set (the proxy would read it); for https the key is inside TLS.
"""
from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import email.utils
import json
import os
import re
import threading
import time
import weakref
from contextlib import asynccontextmanager
from dataclasses import dataclass
from typing import Any, AsyncIterator, Awaitable, Callable, Sequence

import httpx
from httpx_sse import EventSource, SSEError
from tenacity import (AsyncRetrying, retry_if_exception, stop_after_attempt, stop_before_delay,
                      wait_exponential_jitter)

from evalkit.model_adapters.served.api_key import ApiKey
from evalkit.model_adapters.served.urls import clean_url, on_this_machine

MAX_RETRIES = 20
MAX_TIMEOUT_S = 3600.0
MAX_BACKOFF_S = 30.0      # one wait between attempts at most: 20 retries stay within minutes
MAX_RETRY_AFTER_S = 60.0  # a server's Retry-After is honoured up to this
LOOP_PARSE_BYTES = 1 << 16  # larger JSON answers are parsed in a worker thread
GRACE_S = 5.0             # the caller's own bound beyond the deadline (the loop's cancel path)
CAUSES = ("timeout", "connect", "http_5xx", "http_4xx", "bad_response", "cancelled")


class ServerError(ConnectionError):
    """A request that failed after its retries, or a refusal no retry can fix (4xx). A
    ConnectionError, so the command line reports it as a failed environment: one line, exit 1.
    `cause` is one of CAUSES; `attempts` the attempts made; `status` the HTTP status where
    there was one; `retryable` whether a retry may help."""

    def __init__(self, message: str, *, status: int | None = None, retryable: bool = False,
                 cause: str = "bad_response", attempts: int = 1,
                 retry_after: float | None = None, nothing_sent: bool = False) -> None:
        super().__init__(message)
        if cause not in CAUSES:
            raise ValueError(f"ServerError cause={cause!r}: expected one of {', '.join(CAUSES)}")
        self.status, self.retryable, self.cause, self.attempts = status, retryable, cause, attempts
        self.retry_after, self.nothing_sent = retry_after, nothing_sent


@dataclass
class Timing:
    """One request, across all its attempts. `sent_at` (the first attempt's send) and `done_at`
    (its last token: the stream's end) are time.monotonic() values; `service_s` runs between
    them, backoffs and retries included; `ttft_s` from the first send to the first text of the
    answer returned (text from an attempt that failed does not count)."""
    ttft_s: float | None
    service_s: float
    attempts: int
    sent_at: float
    done_at: float

    @property
    def latency_s(self) -> float:
        """The service time for now; the runner measures latency from the request's due time."""
        return self.service_s


@dataclass
class _Trace:
    """What one request's attempts have done so far (the final error and Timing read it)."""
    attempts: int = 0
    sent_at: float | None = None
    first_text_at: float | None = None


def _stop_loop(loop: asyncio.AbstractEventLoop) -> None:
    with contextlib.suppress(RuntimeError):  # already closed
        loop.call_soon_threadsafe(loop.stop)


def _serve(loop: asyncio.AbstractEventLoop, clients: list[httpx.AsyncClient]) -> None:
    """The loop thread: run until stopped, then close the connections and the loop."""
    asyncio.set_event_loop(loop)
    loop.run_forever()
    loop.run_until_complete(asyncio.gather(*(c.aclose() for c in clients),
                                           return_exceptions=True))
    loop.close()


class Client:
    def __init__(self, base_urls: Sequence[str], *, api_key_env: str | None = None,
                 timeout_s: float = 300.0, retries: int = 3, backoff_s: float = 0.5,
                 trust_env: bool | None = None) -> None:
        if not base_urls:
            raise ValueError("served: give at least one base_url")
        self.base_urls = [clean_url(u) for u in base_urls]  # a secret is refused before all else
        if not 0 < float(timeout_s) <= MAX_TIMEOUT_S:
            raise ValueError(f"served: timeout_s={timeout_s}: expected (0, {MAX_TIMEOUT_S:g}] "
                             f"seconds for a whole request, retries included")
        if not 0 <= int(retries) <= MAX_RETRIES:
            raise ValueError(f"served: retries={retries}: expected 0..{MAX_RETRIES}")
        if not 0 <= float(backoff_s) <= MAX_BACKOFF_S:
            raise ValueError(f"served: backoff_s={backoff_s}: expected 0..{MAX_BACKOFF_S:g} seconds")
        if trust_env not in (None, True, False):
            raise ValueError(f"served: trust_env={trust_env!r}: expected true (use HTTP_PROXY & "
                             f"co. for every server but this machine's), false (never) or unset "
                             f"(https, and http without a key, not this machine)")
        self.timeout_s, self.retries = float(timeout_s), int(retries)
        self.backoff_s = float(backoff_s)
        self._headers = {"Content-Type": "application/json"}
        self._secret = ApiKey.from_env(api_key_env, self.base_urls)
        self._key_env, self._key = self._secret.env, self._secret.key
        if self._key is not None:
            self._headers["Authorization"] = f"Bearer {self._key}"
        self._turn = 0
        self._lock = threading.Lock()
        self._aborted = threading.Event()
        self._tasks: set[asyncio.Task] = set()  # requests in flight (touched on the loop only)
        # the whole-request deadline is asyncio's; httpx's own per-read limits only back it up
        timeout = httpx.Timeout(self.timeout_s, connect=min(10.0, self.timeout_s))
        self._http = [httpx.AsyncClient(
            timeout=timeout, limits=httpx.Limits(max_connections=None),
            trust_env=self._proxied(u, trust_env)) for u in self.base_urls]
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=_serve, args=(self._loop, list(self._http)),
                                        name="evalkit-served-client", daemon=True)
        self._thread.start()
        self._finalize = weakref.finalize(self, _stop_loop, self._loop)

    def _proxied(self, url: str, trust_env: bool | None) -> bool:
        """Whether requests to `url` may go through an environment proxy: never to this
        machine (the proxy would reach its own loopback, with the key); never plain http with a
        key (the proxy reads the header); https, or http without a key, unless trust_env=False."""
        if trust_env is False or on_this_machine(url):
            return False
        if url.startswith("http://") and self._key is not None:
            if trust_env:
                raise ValueError(f"served: trust_env=true with api_key_env={self._key_env} and "
                                 f"{url}: a proxy would read the key in the clear (plain http); "
                                 f"use https, or leave trust_env unset (no proxy for it)")
            return False
        return True

    def redact(self, text: str) -> str:
        """`text` with the API key replaced by REDACTED (api_key.py): every text from a server
        passes here before it is stored or printed."""
        return self._secret.redact(text)

    def _redacted(self, e: ServerError) -> ServerError:
        text = self.redact(str(e))
        if text == str(e):
            return e
        return ServerError(text, status=e.status, retryable=e.retryable, cause=e.cause,
                           attempts=e.attempts, retry_after=e.retry_after,
                           nothing_sent=e.nothing_sent)

    @property
    def headers(self) -> dict:
        """The request headers (with the key, if any): never logged or stored."""
        return dict(self._headers)

    def close(self) -> None:
        """Stop the loop and close the connections (also done when the client is collected)."""
        self._finalize()

    # -- cancellation ---------------------------------------------------------------------------
    def abort(self) -> None:
        """From any thread: every request in flight, and every later one, raises
        ServerError(cause="cancelled") at once (within the loop's next turn)."""
        self._aborted.set()
        with contextlib.suppress(RuntimeError):  # a closed loop has nothing in flight
            self._loop.call_soon_threadsafe(self._cancel_all)

    def _cancel_all(self) -> None:
        for task in list(self._tasks):
            task.cancel()

    def _cancelled(self, what: str, attempts: int) -> ServerError:
        return ServerError(f"{what}: cancelled after {attempts} attempt(s) (the run is "
                           f"stopping)", cause="cancelled", attempts=attempts)

    # -- the request machinery --------------------------------------------------------------------
    def _sync(self, what: str, make: Callable[[], Awaitable[Any]]) -> Any:
        """Run the coroutine `make()` on the loop and wait for it (bounded: its own deadline
        ends it; GRACE_S more covers the cancel path)."""
        if self._aborted.is_set():
            raise self._cancelled(what, 0)
        fut = asyncio.run_coroutine_threadsafe(make(), self._loop)
        try:
            return fut.result(timeout=self.timeout_s + GRACE_S)
        except ServerError as e:  # its message may quote a server's text
            raise self._redacted(e) from None
        except concurrent.futures.TimeoutError:
            fut.cancel()
            raise ServerError(f"{what}: no answer within timeout_s={self.timeout_s:g} s",
                              cause="timeout", retryable=True) from None
        except concurrent.futures.CancelledError:
            raise self._cancelled(what, 0) from None

    async def _request(self, what: str, fn: Callable[[int, _Trace], Awaitable[Any]],
                       index: int | None = None, tries: int | None = None
                       ) -> tuple[Any, _Trace]:
        """`fn(server index, trace)` with bounded retries inside one deadline; (its result,
        the trace). Every failure is a ServerError naming its cause and attempts."""
        trace, task = _Trace(), asyncio.current_task()
        self._tasks.add(task)
        try:
            if self._aborted.is_set():
                raise asyncio.CancelledError
            try:
                return await asyncio.wait_for(self._attempts(what, fn, index, trace, tries),
                                              self.timeout_s), trace
            except asyncio.TimeoutError:
                raise ServerError(f"{what}: failed after {trace.attempts} attempt(s): timed out "
                                  f"(no complete answer within timeout_s={self.timeout_s:g} s)",
                                  cause="timeout", retryable=True,
                                  attempts=trace.attempts) from None
        except asyncio.CancelledError:
            if self._aborted.is_set():
                raise self._cancelled(what, trace.attempts) from None
            raise
        finally:
            self._tasks.discard(task)

    async def _attempts(self, what: str, fn, index: int | None, trace: _Trace,
                        tries: int | None) -> Any:
        retrying = AsyncRetrying(
            stop=stop_after_attempt(tries or self.retries + 1) | stop_before_delay(self.timeout_s),
            wait=self._wait, retry=retry_if_exception(lambda e: getattr(e, "retryable", False)),
            reraise=True)
        try:
            async for attempt in retrying:
                with attempt:
                    trace.attempts = attempt.retry_state.attempt_number
                    return await fn(self._pick(index), trace)
        except ServerError as e:
            raise ServerError(f"{what}: failed after {trace.attempts} attempt(s): {e}",
                              status=e.status, retryable=e.retryable, cause=e.cause,
                              attempts=trace.attempts) from None

    def _wait(self, state) -> float:
        """Exponential from backoff_s, jittered by up to backoff_s, capped at MAX_BACKOFF_S,
        and at least the Retry-After the server asked for (up to MAX_RETRY_AFTER_S)."""
        wait = wait_exponential_jitter(multiplier=self.backoff_s, max=MAX_BACKOFF_S,
                                       jitter=self.backoff_s)(state)
        asked = getattr(state.outcome.exception(), "retry_after", None)
        return max(wait, min(asked, MAX_RETRY_AFTER_S)) if asked else wait

    def _pick(self, index: int | None) -> int:
        """`index`, or the next server (round-robin, attempt by attempt: a retry goes to the
        next one). No server is ever written off: each attempt finds out for itself."""
        if index is not None:
            return index
        with self._lock:
            self._turn += 1
            return (self._turn - 1) % len(self.base_urls)

    @asynccontextmanager
    async def _open(self, i: int, method: str, path: str, body: dict | None, trace: _Trace,
                    base: str | None = None) -> AsyncIterator[httpx.Response]:
        """The response (status 200) with its body still to read; anything else is a
        ServerError naming the status, or the transport's reason. `path` is below the API
        root, or below `base`."""
        url = (base or self.base_urls[i]) + path
        http = self._http[i]
        request = http.build_request(method, url, json=body, headers=self._headers)
        if trace.sent_at is None:
            trace.sent_at = time.monotonic()
        try:
            r = await http.send(request, stream=True)
        except (httpx.ConnectError, httpx.ConnectTimeout) as e:  # refused, unreachable: unsent
            raise ServerError(f"connection failed: {_reason(e)}", cause="connect",
                              retryable=True, nothing_sent=True) from None
        except httpx.TimeoutException:
            raise ServerError("timed out", cause="timeout", retryable=True) from None
        except httpx.TransportError as e:  # closed or reset after the request went out
            raise ServerError(f"connection failed: {_reason(e)}", cause="connect",
                              retryable=True) from None
        try:
            if r.status_code != 200:
                await self._refuse(r, url)
            yield r
        except httpx.TimeoutException:
            raise ServerError("timed out", cause="timeout", retryable=True) from None
        except httpx.TransportError as e:
            raise ServerError(f"the response was cut off ({_reason(e)})",
                              retryable=True) from None
        except httpx.HTTPError as e:  # a body its Content-Encoding does not decode, ...
            raise _malformed(f"{type(e).__name__}: {_short(e)}") from None
        finally:
            await r.aclose()

    async def _refuse(self, r: httpx.Response, url: str) -> None:
        text, room = b"", 300 + 6 * len(self._key or "")  # a key that straddles 300 is whole
        async for part in r.aiter_bytes():  # the first 300 characters say enough
            text += part
            if len(text) >= room:
                break
        status = r.status_code
        said = self.redact(text[:room].decode("utf-8", "replace"))[:300]
        msg = f"{url}: HTTP {status}: {said}".replace("\n", " ")
        if status == 401:
            msg = (f"{url}: HTTP 401 Unauthorized: the server refused the API key in "
                   f"${self._key_env}" if self._key_env else
                   f"{url}: HTTP 401 Unauthorized: the server wants an API key; pass "
                   f"api_key_env=NAME with the key in that environment variable")
        cause = "http_5xx" if status >= 500 else "http_4xx" if status >= 400 else "bad_response"
        # 429 asks to come back later (after its Retry-After), as a 503 does
        raise ServerError(msg, status=status, retryable=status >= 500 or status == 429, cause=cause,
                          retry_after=_retry_after(r.headers.get("retry-after")))

    # -- endpoints ------------------------------------------------------------------------------
    def get_json(self, path: str, index: int = 0) -> Any:
        what = f"GET {self.base_urls[index]}{path}"
        return self._sync(what, lambda: self._request(
            what, lambda i, t: self._json("GET", path, None, i, t), index=index))[0]

    def get_optional(self, path: str, index: int = 0) -> Any:
        """GET `path` below the server's root (not the API root: vLLM's /version), one attempt:
        the JSON, or None where the server has no such route or answers anything else."""
        root = self.base_urls[index].rsplit("/v1", 1)[0]
        what = f"GET {root}{path}"
        # with the key: a server that guards every route (not vLLM's default) still answers
        fn = lambda i, t: self._json("GET", path, None, i, t, base=root)
        try:
            return self._sync(what, lambda: self._request(what, fn, index=index, tries=1))[0]
        except ServerError as e:
            if e.cause == "cancelled":
                raise
            return None

    def post_json(self, path: str, body: dict, index: int | None = None) -> dict:
        """POST to `index`'s server (default: the next one up)."""
        async def once(i: int, trace: _Trace) -> dict:
            out = await self._json("POST", path, body, i, trace)
            if not isinstance(out, dict) or not isinstance(out.get("choices"), list):
                raise _malformed(f"no 'choices' list in {str(out)[:200]}")
            return out
        what = f"POST {path}"
        return self._sync(what, lambda: self._request(what, once, index=index))[0]

    async def _json(self, method: str, path: str, body: dict | None, i: int, trace: _Trace,
                    base: str | None = None) -> Any:
        async with self._open(i, method, path, body, trace, base) as r:
            data = await r.aread()
        try:
            parse = lambda: self._secret.parsed(data)
            if len(data) < LOOP_PARSE_BYTES:
                return parse()
            # a large answer (prompt_logprobs of long prompts) is parsed off the loop, which
            # would otherwise hold every other stream's tokens (and their timing) meanwhile
            return await asyncio.to_thread(parse)
        except ValueError as e:  # UTF-8 JSON (RFC 8259) whatever the headers say
            raise _malformed(f"malformed JSON ({_short(e)})") from None

    def stream_completion(self, body: dict) -> tuple[str, dict, Timing]:
        """A streamed completion: (text, last chunk, Timing). TTFT is the first chunk that
        carries text; the Timing spans every attempt."""
        async def once(i: int, trace: _Trace) -> tuple[str, dict, float]:
            text, last = [], {}
            trace.first_text_at = None  # the answer's first text: a retry starts it again
            async with self._open(i, "POST", "/completions", {**body, "stream": True},
                                  trace) as r:
                r.encoding = "utf-8"  # SSE is UTF-8 by definition, charset or not
                try:
                    async for event in _Events(r).aiter_sse():
                        if event.data == "[DONE]":
                            return "".join(text), last, time.monotonic()
                        last = self._secret.scrub(_chunk(self.redact(event.data)))
                        for ch in last.get("choices") or []:
                            piece = (ch.get("text") if isinstance(ch, dict) else None) or ""
                            if piece and trace.first_text_at is None:
                                trace.first_text_at = time.monotonic()
                            text.append(piece)
                except SSEError as e:
                    raise _malformed(str(e)) from None
            raise _malformed("the stream ended before [DONE] (cut off)")

        what = "POST /completions (stream)"
        (text, last, done), trace = self._sync(what, lambda: self._request(what, once))
        ttft = None if trace.first_text_at is None else trace.first_text_at - trace.sent_at
        # the key may be split over two chunks: the whole answer is redacted again
        return self.redact(text), last, Timing(ttft, done - trace.sent_at, trace.attempts, trace.sent_at,
                                  done)


class _Events(EventSource):
    """httpx-sse's reader, also for a stream sent without a Content-Type (some servers send
    none); a stream with another type is still refused."""

    def _check_content_type(self) -> None:
        if self.response.headers.get("content-type"):
            super()._check_content_type()


def _chunk(data: str) -> dict:
    try:
        chunk = json.loads(data)
    except ValueError as e:
        raise _malformed(f"stream chunk {data[:200]!r}: {_short(e)}") from None
    if not isinstance(chunk, dict):
        raise _malformed(f"stream chunk {data[:200]} is not an object")
    if "error" in chunk:  # vLLM reports an engine failure inside the stream
        err = chunk["error"]
        code = err.get("code") if isinstance(err, dict) else None
        code = int(code) if isinstance(code, int) or str(code).isdigit() else 0
        cause = "http_5xx" if code >= 500 else "http_4xx" if code >= 400 else "bad_response"
        raise ServerError(f"server error mid-stream: {str(err)[:200]}", status=code or None,
                          retryable=cause != "http_4xx", cause=cause)
    return chunk


def _retry_after(value: str | None) -> float | None:
    """Retry-After in seconds (a number or an HTTP date); None when absent or unreadable."""
    if not value:
        return None
    if re.fullmatch(r"\s*\d+(\.\d+)?\s*", value, re.ASCII):  # seconds (float() also takes 1_0)
        return float(value)
    try:
        return max(0.0, email.utils.parsedate_to_datetime(value).timestamp() - time.time())
    except (TypeError, ValueError, OverflowError):
        return None


def _malformed(why: str) -> ServerError:
    return ServerError(f"malformed response: {why}", retryable=True)


def _reason(e: BaseException) -> str:
    """The transport's reason in words ("Connection refused"), not its wrapper's repr: the
    errno of the OSError underneath, else the first line of the message."""
    seen: BaseException | None = e
    for _ in range(8):  # the chain httpx -> httpcore -> anyio -> OSError is short
        if seen is None:
            break
        if isinstance(seen, OSError) and seen.errno:
            return os.strerror(seen.errno)
        seen = seen.__cause__ or seen.__context__
    m = re.search(r"\[Errno (\d+)\]", str(e))
    return os.strerror(int(m.group(1))) if m else _short(e) or type(e).__name__


def _short(e: BaseException | None) -> str:
    return str(e).splitlines()[0][:300] if e is not None and str(e) else ""
