"""Faults a served model's server can have, injected on /v1/completions by a small stdlib HTTP
server on 127.0.0.1 (no vLLM; tests/test_served_vllm_faults.py kills a real one): a 5xx, an
answer slower than timeout_s, a stream that never ends, a malformed body, a cut-off response,
a 401, a refused connection and a server gone mid-run. Each is retried with backoff (the fault
server counts the attempts) within the request's one deadline (timeout_s: a timed-out attempt
leaves no time for another), then fails its sample with an error naming the cause, in bounded
time. It is a fault injector, not a fake model: /v1/models and the adapter's load-time scoring
check get just enough of an answer to reach the fault."""
from __future__ import annotations

import json
import socket
import threading
import time
from http.server import BaseHTTPRequestHandler
from pathlib import Path

import pytest
import yaml

from evalkit.cli import main as evalkit_main
from evalkit.model_adapters.served.client import Client, ServerError
from helpers import TINY_TOKENIZER
from test_served_client import LocalServer

TIMEOUT_S, RETRIES, BACKOFF_S = 0.3, 2, 0.02
LIMIT_S = 60  # no test here may take longer, whatever the client does


class FaultServer(LocalServer):
    def __init__(self, fault: str, *, pass_canary: bool) -> None:
        super().__init__(_Handler)
        self.fault, self.pass_canary = fault, pass_canary
        self.hits = 0  # /v1/completions requests that met the fault


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"  # chunked streams, as vLLM's server sends them
    server: FaultServer

    def log_message(self, *args) -> None:
        pass

    def do_GET(self) -> None:
        if self.path == "/v1/models":
            self._send(200, json.dumps({"data": [{"id": "fault", "max_model_len": 4096}]}))
        else:
            self._send(404, '{"error": "not found"}')

    def do_POST(self) -> None:
        body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        srv = self.server
        with srv.lock:
            canary, srv.pass_canary = srv.pass_canary, False
            srv.hits += not canary
        if canary:  # the adapter's load-time check that prompt_logprobs exist: just enough
            self._send(200, json.dumps({"choices": [{"index": 0, "text": "",
                                                     "prompt_logprobs": [None]}]}))
            return
        getattr(self, f"fault_{srv.fault}")(bool(body.get("stream")))

    # -- the faults -------------------------------------------------------------------------
    def fault_5xx(self, stream: bool) -> None:
        self._send(503, '{"error": "overloaded"}')

    def fault_401(self, stream: bool) -> None:
        self._send(401, '{"error": "Unauthorized"}')

    def fault_slow(self, stream: bool) -> None:  # answers long after the client's timeout
        self.server.stopped.wait(TIMEOUT_S * 6)
        self._send(200, '{"choices": []}')

    def fault_trickle(self, stream: bool) -> None:  # a chunk every timeout/5, never the end
        self._start_chunked()
        for _ in range(int(LIMIT_S / TIMEOUT_S)):
            piece = 'data: {"choices": [{"text": "a"}]}\n\n' if stream else " "
            if not self._chunk(piece) or self.server.stopped.wait(TIMEOUT_S / 5):
                return

    def fault_malformed(self, stream: bool) -> None:
        self._send(200, 'data: {"choices": [{"te\n\n' if stream else '{"choices": [{"te')

    def fault_cut(self, stream: bool) -> None:  # the connection drops mid-answer
        self._start_chunked()
        self._chunk('data: {"choices": [{"text": "a"}]}\n\n' if stream else '{"choices": [')
        self._drop()

    def fault_gone(self, stream: bool) -> None:  # the server dies: nothing listens any more
        threading.Thread(target=self.server.stop, daemon=True).start()
        deadline = time.monotonic() + 10
        while self.server.socket.fileno() != -1 and time.monotonic() < deadline:
            time.sleep(0.01)
        self._drop()

    # -- HTTP -------------------------------------------------------------------------------
    def _send(self, status: int, text: str) -> None:
        data = text.encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        try:
            self.wfile.write(data)
        except OSError:  # the client gave up
            pass

    def _start_chunked(self) -> None:
        self.send_response(200)
        self.send_header("Content-Type", "text/event-stream")
        self.send_header("Transfer-Encoding", "chunked")
        self.end_headers()

    def _chunk(self, text: str) -> bool:
        data = text.encode()
        try:
            self.wfile.write(b"%x\r\n%s\r\n" % (len(data), data))
            self.wfile.flush()
            return True
        except OSError:  # the client gave up
            return False

    def _drop(self) -> None:
        self.close_connection = True
        self.connection.shutdown(socket.SHUT_RDWR)


# What each fault's error must say, how many attempts the server sees per request, and the
# error's cause (what the runner counts failures by).
FAULTS = {"5xx": ("HTTP 503", RETRIES + 1, "http_5xx"), "slow": ("timed out", 1, "timeout"),
          "trickle": ("timed out", 1, "timeout"),
          "malformed": ("malformed", RETRIES + 1, "bad_response"),
          "cut": ("cut off", RETRIES + 1, "bad_response"),
          "401": ("HTTP 401 Unauthorized", 1, "http_4xx")}


def _bounded(fn, limit_s: float = LIMIT_S):
    """fn() in a thread, failing the test (not hanging it) if it outlasts `limit_s`."""
    out: dict = {}
    t = threading.Thread(target=lambda: out.update(value=fn()), daemon=True)
    t0 = time.monotonic()
    t.start()
    t.join(limit_s)
    assert not t.is_alive(), f"still running after {limit_s} s: a hang"
    assert "value" in out, "raised (see the thread's traceback above)"
    return out["value"], time.monotonic() - t0


def _client(url: str) -> Client:
    return Client([url], timeout_s=TIMEOUT_S, retries=RETRIES, backoff_s=BACKOFF_S)


def _evalkit_run(tmp: Path, url: str, **opts) -> tuple[int, list[dict]]:
    model = {"name": "served", "spec": f"served:{url}",
             "options": {"tokenizer": str(TINY_TOKENIZER), "timeout_s": TIMEOUT_S,
                         "retries": RETRIES, "backoff_s": BACKOFF_S, "concurrency": 1, **opts}}
    suite = {"name": "faults", "models": [model], "seed": 0, "samples": 1, "depths": [0.5],
             "tasks": [{"name": "needle", "lengths": [64, 128]}]}
    (tmp / "suite.yaml").write_text(yaml.safe_dump(suite))
    rc = evalkit_main(["run", "--config", str(tmp / "suite.yaml"), "--output", str(tmp / "run"),
                       "--no-progress"])
    out = tmp / "run" / "samples.jsonl"
    return rc, [json.loads(l) for l in out.read_text().splitlines()] if out.is_file() else []


@pytest.mark.parametrize("fault", list(FAULTS))
def test_fault_fails_the_sample_after_retries(fault, tmp_path):
    words, attempts, _ = FAULTS[fault]
    with FaultServer(fault, pass_canary=True) as srv:
        (rc, rows), wall = _bounded(lambda: _evalkit_run(tmp_path, srv.url))
    print(f"{fault}: {srv.hits} attempts for {len(rows)} samples, {wall:.1f} s")
    assert rc == 1 and len(rows) == 2
    for r in rows:  # each sample failed at its first request, saying why
        assert r["prediction"] is None and r["scores"] in (None, {})
        assert f"failed after {attempts} attempt(s)" in r["error"] or attempts == 1, r["error"]
        assert words in r["error"], r["error"]
    assert srv.hits == attempts * len(rows)


@pytest.mark.parametrize("fault", list(FAULTS))
def test_fault_on_a_scoring_request(fault):
    """The scoring path (one JSON answer, not a stream) meets every fault the same way."""
    words, attempts, cause = FAULTS[fault]
    body = {"model": "fault", "prompt": [1, 2, 3], "max_tokens": 1, "prompt_logprobs": 0}

    def score() -> str:
        with pytest.raises(ServerError) as e:
            _client(srv.url).post_json("/completions", body)
        assert e.value.cause == cause and e.value.attempts == attempts, e.value
        return str(e.value)

    with FaultServer(fault, pass_canary=False) as srv:
        msg, wall = _bounded(score)
    print(f"{fault} (scoring): {srv.hits} attempts, {wall:.1f} s")
    assert words in msg and srv.hits == attempts
    # a timeout costs at most about timeout_s per attempt
    assert wall < attempts * (2 * TIMEOUT_S + BACKOFF_S * 4) + 1


def test_refused_connection(tmp_path, capsys):
    with socket.socket() as s:  # a port nobody listens on
        s.bind(("127.0.0.1", 0))
        dead = f"http://127.0.0.1:{s.getsockname()[1]}/v1"

        def refused() -> str:
            with pytest.raises(ServerError) as e:
                _client(dead).stream_completion({"model": "m", "prompt": [1], "max_tokens": 1})
            return str(e.value)

        msg, wall = _bounded(refused)
        assert f"failed after {RETRIES + 1} attempt(s): connection failed: Connection refused" \
            in msg, msg
        assert wall >= BACKOFF_S * (2 ** RETRIES - 1)  # it did back off between attempts
        # the command line: one line naming the cause, exit 1, no traceback, no samples
        capsys.readouterr()
        assert _bounded(lambda: _evalkit_run(tmp_path, dead))[0] == (1, [])
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "Connection refused" in err[0] and "Traceback" not in err[0], err


def test_server_gone_mid_run(tmp_path):
    """A server that dies after the model loaded: each request waits out its own retries (a
    refused connection is never a verdict on the later requests: a restarting server answers
    them, test_served_hostile.py), every sample fails naming the cause, exit 1, bounded time."""
    with FaultServer("gone", pass_canary=True) as srv:
        (rc, rows), wall = _bounded(lambda: _evalkit_run(tmp_path, srv.url))
    print(f"gone: {len(rows)} samples failed in {wall:.1f} s")
    assert rc == 1 and len(rows) == 2 and srv.hits == 1
    errors = [r["error"] for r in rows]
    assert all(f"failed after {RETRIES + 1} attempt(s): connection failed" in e for e in errors)
    assert all(r["attempts"] == RETRIES + 1 for r in rows), rows
    assert wall < 10
