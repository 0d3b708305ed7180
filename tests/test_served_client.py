"""The served client's HTTP behaviour (issue 41) against small scripted servers on 127.0.0.1:
SSE decoding (UTF-8 whatever the charset, no Content-Type, U+2028 / U+0085 raw inside JSON),
one deadline per request across its retries (a trickled body or stream cannot extend it),
Retry-After, 4xx never retried, the failure cause and attempt count on ServerError, one Timing
across retries, no environment proxy for loopback, abort() from another thread, and URLs with
credentials or a query refused without repeating them. `Fake` is also used by
test_served_client_adapter.py."""
from __future__ import annotations

import json
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any, Callable

import pytest

from evalkit.model_adapters.served.client import Client, ServerError, clean_url

LIMIT_S = 20  # no test here may take longer, whatever the client does


class LocalServer(ThreadingHTTPServer):
    """An HTTP server on 127.0.0.1 at a free port, served by a thread for the length of a
    `with` block; `stopped` wakes handlers that wait (slow or stalled answers)."""
    daemon_threads = True

    def __init__(self, handler: type[BaseHTTPRequestHandler], port: int = 0) -> None:
        super().__init__(("127.0.0.1", port), handler)  # a port: a server restarted on it
        self.lock, self.stopped = threading.Lock(), threading.Event()
        self.thread = threading.Thread(target=self.serve_forever, args=(0.05,), daemon=True)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.server_address[1]}/v1"

    def __enter__(self):
        self.thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self.stop()

    def stop(self) -> None:  # also from a handler (a server that dies mid-request)
        self.stopped.set()
        if self.thread.is_alive():
            self.shutdown()
            self.thread.join(timeout=5)
        self.server_close()


class Fake(LocalServer):
    """A scripted OpenAI-compatible server: `reply(handler, body)` answers each POST (the
    attempt number is handler.server.hits); GET /v1/models lists `models`, /version answers
    `version` (404 when None). Every POST body and header set is kept."""

    def __init__(self, reply: Callable[["Handler", dict], None], *,
                 models: list[dict] | None = None, version: str | None = None,
                 port: int = 0) -> None:
        super().__init__(Handler, port)
        self.reply, self.version = reply, version
        self.models = models if models is not None else [{"id": "fake", "max_model_len": 4096}]
        self.bodies: list[dict] = []
        self.headers_seen: list[dict] = []
        self.times: list[float] = []  # time.monotonic() of each POST's arrival

    @property
    def hits(self) -> int:
        return len(self.bodies)


class Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    server: Fake

    def log_message(self, *args) -> None:
        pass

    def do_GET(self) -> None:
        if self.path.endswith("/v1/models"):
            self.json(200, {"object": "list", "data": self.server.models})
        elif self.path.endswith("/version") and self.server.version is not None:
            self.json(200, {"version": self.server.version})
        else:
            self.json(404, {"error": "not found"})

    def do_POST(self) -> None:
        n = int(self.headers.get("Content-Length") or 0)
        body = json.loads(self.rfile.read(n) or b"{}")
        with self.server.lock:
            self.server.bodies.append(body)
            self.server.headers_seen.append(dict(self.headers))
            self.server.times.append(time.monotonic())
        self.server.reply(self, body)

    # -- what a reply can send -----------------------------------------------------------
    def raw(self, status: int, data: bytes, headers: dict[str, str] | None = None) -> None:
        self.send_response(status)
        for k, v in (headers or {}).items():
            self.send_header(k, v)
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.write(data)

    def json(self, status: int, obj: Any, headers: dict[str, str] | None = None) -> None:
        self.raw(status, json.dumps(obj).encode(),
                 {"Content-Type": "application/json", **(headers or {})})

    def start_chunked(self, content_type: str | None = "text/event-stream") -> None:
        self.send_response(200)
        if content_type is not None:
            self.send_header("Content-Type", content_type)
        self.send_header("Transfer-Encoding", "chunked")
        self.end_headers()

    def chunk(self, data: bytes) -> bool:
        return self.write(b"%x\r\n%s\r\n" % (len(data), data))

    def end_chunks(self) -> None:
        self.write(b"0\r\n\r\n")

    def write(self, data: bytes) -> bool:
        try:
            self.wfile.write(data)
            self.wfile.flush()
            return True
        except OSError:  # the client gave up
            return False

    def sse(self, texts: list[str], *, content_type: str | None = "text/event-stream") -> None:
        """A whole completion stream: one chunk per text (JSON with raw non-ASCII), [DONE]."""
        self.start_chunked(content_type)
        for t in texts:
            event = {"choices": [{"index": 0, "text": t, "finish_reason": None}]}
            self.chunk(b"data: " + json.dumps(event, ensure_ascii=False).encode() + b"\n\n")
        self.chunk(b"data: [DONE]\n\n")
        self.end_chunks()


def bounded(fn: Callable[[], Any], limit_s: float = LIMIT_S) -> tuple[Any, float]:
    """(fn()'s value or the exception it raised, seconds); fails the test on a hang."""
    out: dict = {}

    def run() -> None:
        try:
            out["value"] = fn()
        except BaseException as e:  # handed back to the test
            out["value"] = e

    t = threading.Thread(target=run, daemon=True)
    t0 = time.monotonic()
    t.start()
    t.join(limit_s)
    assert not t.is_alive(), f"still running after {limit_s} s: a hang"
    return out["value"], time.monotonic() - t0


BODY = {"model": "fake", "prompt": [1, 2, 3], "max_tokens": 4}


def client(url: str, **kw) -> Client:
    return Client([url], **{"timeout_s": 5.0, "retries": 2, "backoff_s": 0.01, **kw})


# -- SSE decoding -----------------------------------------------------------------------------
@pytest.mark.parametrize("case", ["no charset", "no content type", "line separators"])
def test_sse_stream_decoding(case):
    """SSE is UTF-8 by definition, a missing Content-Type is no reason to fail, and only
    CR / LF end a line: U+2028 and U+0085 arrive raw inside vLLM's JSON."""
    texts = {"no charset": [" café", " naïve"], "no content type": [" plain", " café"],
             "line separators": [" a\u2028b", " c\u0085d", " e\u2029f"]}[case]
    ctype = None if case == "no content type" else "text/event-stream"
    with Fake(lambda h, body: h.sse(texts, content_type=ctype)) as srv:
        out, _ = bounded(lambda: client(srv.url).stream_completion(BODY))
    assert not isinstance(out, BaseException), out
    assert out[0] == "".join(texts) and srv.hits == 1


# -- one deadline per request -----------------------------------------------------------------
def _trickle_json(h, body) -> None:  # a Content-Length body sent a byte at a time, forever
    h.send_response(200)
    h.send_header("Content-Type", "application/json")
    h.send_header("Content-Length", "100000")
    h.end_headers()
    while h.write(b" ") and not h.server.stopped.wait(0.05):
        pass


def _trickle_stream(h, body) -> None:  # a token every 50 ms, never [DONE]
    h.start_chunked()
    while h.chunk(b'data: {"choices": [{"text": "a"}]}\n\n') and not h.server.stopped.wait(0.05):
        pass


def _stall(h, body) -> None:  # headers, then nothing
    h.start_chunked()
    h.server.stopped.wait(LIMIT_S)


@pytest.mark.parametrize("reply,call", [(_trickle_json, "post_json"),
                                        (_trickle_stream, "stream_completion"),
                                        (_stall, "stream_completion")])
def test_timeout_bounds_the_whole_request(reply, call):
    """timeout_s=1 ends the request at about 1 s: bytes trickled within it do not extend it,
    and retries share the same deadline (a timed-out attempt leaves no time for another)."""
    with Fake(reply) as srv:
        c = client(srv.url, timeout_s=1.0, retries=3)
        err, wall = bounded(lambda: getattr(c, call)("/completions", BODY) if call == "post_json"
                            else c.stream_completion(BODY))
    assert isinstance(err, ServerError), err
    assert err.cause == "timeout" and "timed out" in str(err)
    assert err.attempts == srv.hits == 1
    assert wall < 1.8, wall


def test_timing_spans_every_retry():
    """Two 503s, then an answer: the Timing covers all three attempts from the first send."""
    def reply(h, body):
        if h.server.hits <= 2:
            h.json(503, {"error": "overloaded"})
        else:
            h.sse([" ok"])

    with Fake(reply) as srv:
        t_before = time.monotonic()
        out, _ = bounded(lambda: client(srv.url, backoff_s=0.2).stream_completion(BODY))
    assert not isinstance(out, BaseException), out
    text, _, timing = out
    assert text == " ok" and timing.attempts == 3 == srv.hits
    assert t_before <= timing.sent_at <= srv.times[0]
    assert timing.done_at >= srv.times[-1]
    assert timing.service_s == pytest.approx(timing.done_at - timing.sent_at)
    assert timing.service_s >= srv.times[-1] - srv.times[0] > 0.1  # the backoffs are inside
    assert timing.latency_s == timing.service_s
    assert timing.ttft_s is not None and srv.times[-1] - srv.times[0] < timing.ttft_s \
        <= timing.service_s


# -- retries ----------------------------------------------------------------------------------
def test_retry_after_is_honoured():
    def reply(h, body):
        if h.server.hits == 1:
            h.json(503, {"error": "busy"}, headers={"Retry-After": "1"})
        else:
            h.json(200, {"choices": [{"index": 0, "text": "x"}]})

    with Fake(reply) as srv:
        out, _ = bounded(lambda: client(srv.url, backoff_s=0.01).post_json("/completions", BODY))
    assert not isinstance(out, BaseException), out
    assert srv.hits == 2 and srv.times[1] - srv.times[0] >= 0.95


def test_retry_after_beyond_the_deadline_fails_at_once():
    with Fake(lambda h, body: h.json(503, {"error": "busy"},
                                     headers={"Retry-After": "3600"})) as srv:
        err, wall = bounded(lambda: client(srv.url, timeout_s=2.0).post_json("/completions",
                                                                              BODY))
    assert isinstance(err, ServerError), err
    assert err.cause == "http_5xx" and err.attempts == srv.hits == 1 and "HTTP 503" in str(err)
    assert wall < 1.0, wall


@pytest.mark.parametrize("status", [400, 404, 422])
def test_a_4xx_is_never_retried(status):
    with Fake(lambda h, body: h.json(status, {"error": "no"})) as srv:
        err, _ = bounded(lambda: client(srv.url).stream_completion(BODY))
    assert isinstance(err, ServerError), err
    assert err.cause == "http_4xx" and err.attempts == srv.hits == 1 and err.status == status


def _no_done(h, body) -> None:  # a stream that ends without [DONE]: cut off
    h.raw(200, b'data: {"choices": []}\n\n', {"Content-Type": "text/event-stream"})


def test_failure_causes_and_attempts():
    """Each failure names its category (what the runner counts) and its attempts."""
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        dead = f"http://127.0.0.1:{s.getsockname()[1]}/v1"
        err, _ = bounded(lambda: client(dead).stream_completion(BODY))
    assert isinstance(err, ServerError) and err.cause == "connect" and err.attempts == 3, err
    assert "Connection refused" in str(err)
    for reply, cause in [(lambda h, b: h.json(500, {"error": "boom"}), "http_5xx"),
                         (lambda h, b: h.raw(200, b'{"choices": [{"te'), "bad_response"),
                         (_no_done, "bad_response")]:
        with Fake(reply) as srv:
            err, _ = bounded(lambda: client(srv.url).stream_completion(BODY))
        assert isinstance(err, ServerError) and err.cause == cause, (cause, err)
        assert err.attempts == srv.hits == 3, err


# -- proxies ----------------------------------------------------------------------------------
def test_loopback_is_never_sent_through_an_environment_proxy(monkeypatch):
    """HTTP(S)_PROXY / ALL_PROXY would carry the Bearer key to the proxy: never for a server on
    this machine, even with trust_env=True (a proxy would reach its own loopback, not ours).
    More spellings of this machine: test_served_key.py."""
    with Fake(lambda h, b: h.json(502, {"error": "proxy"})) as proxy, \
            Fake(lambda h, b: h.json(200, {"choices": [{"index": 0, "text": "x"}]})) as srv:
        for var in ("HTTP_PROXY", "http_proxy", "ALL_PROXY", "all_proxy"):
            monkeypatch.setenv(var, proxy.url.rsplit("/v1", 1)[0])
        for var in ("NO_PROXY", "no_proxy"):
            monkeypatch.delenv(var, raising=False)
        monkeypatch.setenv("EVALKIT_TEST_KEY", "sk-do-not-leak")
        c = client(srv.url, api_key_env="EVALKIT_TEST_KEY")
        out, _ = bounded(lambda: c.post_json("/completions", BODY))
        assert not isinstance(out, BaseException), out
        assert proxy.hits == 0 and srv.hits == 1
        c = client(srv.url, trust_env=True, retries=0)
        out, _ = bounded(lambda: c.post_json("/completions", BODY))
        assert not isinstance(out, BaseException), out
        assert proxy.hits == 0 and srv.hits == 2


# -- abort --------------------------------------------------------------------------------------
def _slow_stream(h, body) -> None:  # one token, then silence for the rest of the test
    h.start_chunked()
    h.chunk(b'data: {"choices": [{"text": "a"}]}\n\n')
    h.server.stopped.wait(LIMIT_S)


def _no_headers(h, body) -> None:
    h.server.stopped.wait(LIMIT_S)


def _busy(h, body) -> None:  # a 503 that asks for a long wait: the client sits in backoff
    h.json(503, {"error": "busy"}, headers={"Retry-After": "20"})


@pytest.mark.parametrize("reply", [_slow_stream, _no_headers, _busy])
def test_abort_ends_requests_in_flight_and_later_ones(reply):
    with Fake(reply) as srv:
        c = client(srv.url, timeout_s=60.0, retries=3)
        threading.Timer(0.5, c.abort).start()
        err, wall = bounded(lambda: c.stream_completion(BODY))
        assert isinstance(err, ServerError) and err.cause == "cancelled", err
        assert wall < 2.0, wall
        hits = srv.hits
        err, wall = bounded(lambda: c.post_json("/completions", BODY))
        assert isinstance(err, ServerError) and err.cause == "cancelled", err
        assert wall < 1.0 and srv.hits == hits  # nothing more was sent


# -- secrets --------------------------------------------------------------------------------------
@pytest.mark.parametrize("url,secret", [
    ("http://user:s3cr3t-pw@127.0.0.1:1/v1", "s3cr3t-pw"),
    ("http://127.0.0.1:1/v1?token=s3cr3t-tok", "s3cr3t-tok"),
    ("http://127.0.0.1:1/v1?api_key=s3cr3t-q#frag", "s3cr3t-q"),
    ("http://127.0.0.1:1/v1#s3cr3t-frag", "s3cr3t-frag"),
    ("ftp://user:s3cr3t-ftp@127.0.0.1/v1", "s3cr3t-ftp"),
    ("http://user:s3cr3t-port@127.0.0.1:99999/v1", "s3cr3t-port"),
])
def test_urls_with_secrets_are_refused_without_repeating_them(url, secret):
    with pytest.raises(ValueError) as e:
        clean_url(url)
    assert "base_url" in str(e.value) and secret not in str(e.value)
    with pytest.raises(ValueError) as e:
        Client([url])
    assert secret not in str(e.value)
