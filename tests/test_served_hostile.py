"""Issue 59's hostile review of the served path, each finding as the review reproduced it: a
fake OpenAI-compatible server of the test's own on 127.0.0.1 (test_served_client.py's `Fake`),
the real client, adapter and runner.

    11-13  the API key: tests/test_served_key.py
    16  a 429 is retried after its Retry-After, within the request's deadline
    17  a trace offset "1_0" (float() reads 10) is refused
     5  a refused connection is one request's failure: a restarted server answers the next
     6  queue_s is the whole wait from the due time at the cap on open requests
     8  the served model's identity holds its card as the server reports it (/v1/models):
        a redeployed model is another cache key, and --resume refuses it
"""
from __future__ import annotations

import json
import re
import socket
import threading
import time

import pytest

from evalkit.model_adapters.served.client import ServerError
from helpers import TINY_TOKENIZER
from test_served_client import BODY, Fake, bounded, client
from test_served_runner import OneSlot, run, suite_file

KEY = "sk-hostile-review-0123456789abcdef"
KEY_ENV = "EVALKIT_TEST_HOSTILE_KEY"


def _ok(h, body) -> None:  # no keep-alive: a stopped server takes its connections with it
    h.json(200, {"choices": [{"index": 0, "text": "x"}]}, headers={"Connection": "close"})


def _proxy_env(monkeypatch, proxy: Fake) -> None:
    for var in ("HTTP_PROXY", "http_proxy", "HTTPS_PROXY", "https_proxy", "ALL_PROXY",
                "all_proxy"):
        monkeypatch.setenv(var, proxy.url.rsplit("/v1", 1)[0])
    for var in ("NO_PROXY", "no_proxy"):
        monkeypatch.delenv(var, raising=False)
    monkeypatch.setenv(KEY_ENV, KEY)


# -- 16: 429 with Retry-After ---------------------------------------------------------------
def test_a_429_is_retried_after_its_retry_after():
    def reply(h, body):
        if h.server.hits == 1:
            h.json(429, {"error": "slow down"}, headers={"Retry-After": "1"})
        else:
            _ok(h, body)

    with Fake(reply) as srv:
        out, _ = bounded(lambda: client(srv.url).post_json("/completions", BODY))
    assert not isinstance(out, BaseException), out
    assert srv.hits == 2 and srv.times[1] - srv.times[0] >= 0.95


def test_a_429_without_retry_after_is_retried_with_backoff():
    def reply(h, body):
        if h.server.hits <= 2:
            h.json(429, {"error": "slow down"})
        else:
            _ok(h, body)

    with Fake(reply) as srv:
        out, _ = bounded(lambda: client(srv.url).post_json("/completions", BODY))
    assert not isinstance(out, BaseException), out
    assert srv.hits == 3


def test_a_429_asking_past_the_deadline_fails_at_once():
    with Fake(lambda h, b: h.json(429, {"error": "slow down"},
                                  headers={"Retry-After": "3600"})) as srv:
        err, wall = bounded(lambda: client(srv.url, timeout_s=10.0).stream_completion(BODY))
    assert isinstance(err, ServerError) and err.status == 429 and err.cause == "http_4xx", err
    # at once: well inside the 10 s deadline a wait would have run into (1.8 s was seen for
    # one request on a loaded 2-core machine, so the bound is not tighter)
    assert err.attempts == srv.hits == 1 and wall < 5.0


# -- 17: trace offsets as written ---------------------------------------------------------------
@pytest.mark.parametrize("bad", ["1_0", "１０", "0x10", "1__0", "1\x0b2", "1\u20282"])
def test_a_trace_offset_float_reads_loosely_is_refused(tmp_path, bad):
    """float() reads "1_0" as 10 and "１０" as 10; splitlines() would read "1\v2" as two
    offsets an editor shows on one line."""
    from evalkit.runner.arrivals import parse

    trace = tmp_path / "t.txt"
    trace.write_text(f"0\n{bad}\n20\n", encoding="utf-8")
    with pytest.raises(ValueError, match=rf"t.txt:2: {re.escape(repr(bad))} is not an offset"):
        parse(f"trace:{trace}")
    with pytest.raises(ValueError, match="RATE should be requests per second"):
        parse(f"poisson:{bad}")


def test_a_poisson_label_is_the_exact_rate():
    from evalkit.runner.arrivals import parse

    assert parse("poisson:12.34567").label != parse("poisson:12.34571").label
    assert [parse(f"poisson:{r}").label for r in ("2", "0.5", "2.0")] == [
        "poisson:2/s", "poisson:0.5/s", "poisson:2/s"]


# -- 5: a refused connection is not a run-wide verdict -----------------------------------------
def test_a_restarted_server_answers_the_requests_after_it(tmp_path):
    """One request meets a refused connection on each of its attempts while the server is
    down; the server comes back on its port; the next request is sent and answered (the
    review saw every later request fail at once, as `connect` with attempts 0)."""
    with Fake(_ok) as first:
        port = first.server_address[1]
        c = client(first.url, retries=1, backoff_s=0.05)
        assert c.post_json("/completions", BODY)["choices"]
    err, _ = bounded(lambda: c.post_json("/completions", BODY))  # down
    assert isinstance(err, ServerError) and err.cause == "connect" and err.attempts == 2, err
    with Fake(_ok, port=port) as again:
        out, _ = bounded(lambda: c.post_json("/completions", BODY))
        assert not isinstance(out, BaseException), out
        assert again.hits == 1


class Dying(OneSlot):
    """OneSlot whose connections die with it: once stopped, a request on a kept-alive
    connection is dropped (a process that exits takes its sockets along)."""

    def _reply(self, h, body) -> None:
        if self.stopped.is_set():
            h.close_connection = True
            h.connection.shutdown(socket.SHUT_RDWR)
            return
        super()._reply(h, body)


def _on_port(port: int) -> type[OneSlot]:
    """OneSlot bound to `port`: the same server started again after a restart."""
    class OnPort(OneSlot):
        def server_bind(self) -> None:
            self.server_address = ("127.0.0.1", port)
            super().server_bind()
    return OnPort


def test_a_run_across_a_server_restart_answers_what_is_sent_after_it(tmp_path):
    """evalkit run, 16 requests due 0.3 s apart; the server goes down at its 3rd request and
    is back on its port 1.5 s later. The requests due meanwhile fail after their own attempts;
    every one due after it is answered (the review saw all the later ones fail at once as
    `connect`, attempts 0, with their ~0.05 s in the response times)."""
    trace = tmp_path / "trace.txt"
    trace.write_text("".join(f"{0.3 * i:.1f}\n" for i in range(16)))
    first = Dying(0.02)
    port = first.server_address[1]
    back: dict = {}

    def restart() -> None:  # down at the 3rd greedy request, up again 1.5 s later
        while len(first.greedy) < 3 and not first.stopped.is_set():
            time.sleep(0.005)
        first.stop()
        back["down"] = time.monotonic()
        time.sleep(1.5)
        back["server"] = _on_port(port)(0.02).__enter__()
        back["up"] = time.monotonic()

    with first:
        suite = suite_file(tmp_path, first.url, samples=4, concurrency=1, retries=1,
                           backoff_s=0.05, timeout_s=5)
        threading.Thread(target=restart, daemon=True).start()
        try:
            rc, rows = run(suite, tmp_path / "run", "--arrivals", f"trace:{trace}")
        finally:
            if "server" in back:
                back["server"].__exit__(None, None, None)
    assert "up" in back and len(rows) == 16, rows
    answered = {r["gold"][0]: r for r in rows if r["error"] is None}
    start = min(first.served[g][0] - r["due_s"] for g, r in answered.items()
                if g in first.served)
    after = [r for r in rows if r["due_s"] > back["up"] - start + 0.1]
    failed = [r for r in rows if r["error"]]
    print(f"{len(failed)} failed while down, {len(after)} due after the restart")
    assert len(after) >= 8 and all(r["error"] is None for r in after), [
        (r["due_s"], r["error"]) for r in after if r["error"]]
    assert failed and all(r["attempts"] >= 1 and "not sent" not in r["error"] for r in failed)
    assert rc == 1


# -- 6: queue_s at the cap --------------------------------------------------------------------
def test_queue_s_is_the_whole_wait_at_the_cap(tmp_path, monkeypatch):
    """Two open requests at most (the cap), eight due at once on a one-slot server of 0.5 s:
    each request's queue_s is from its due time to when it was sent (the server's clock), not
    only its own turn at the cap (the review saw the later ones undercounted by whole turns).
    The tolerance, 0.25 s, is under one turn and above the send-to-arrival delay seen on a
    loaded 2-core machine (0.17 s)."""
    from evalkit.runner import concurrent, run as runner

    monkeypatch.setattr(runner, "MAX_OPEN", 2)
    monkeypatch.setattr(concurrent, "MAX_OPEN", 2)
    with OneSlot(0.5) as srv:
        rc, rows = run(suite_file(tmp_path, srv.url, samples=2, concurrency=1),
                       tmp_path / "run", "--arrivals", "poisson:1000")
    assert rc == 0 and len(rows) == 8 and all(r["error"] is None for r in rows)
    # the run's start on the server's clock: arrival - due - queue for the first sent
    got = {r["gold"][0]: r for r in rows}
    start = min(srv.served[g][0] - r["due_s"] for g, r in got.items())
    for g, r in got.items():
        arrived = srv.served[g][0]
        waited = arrived - start - r["due_s"]
        assert r["queue_s"] == pytest.approx(waited, abs=0.25), (g, r["queue_s"], waited)
    assert max(r["queue_s"] for r in rows) > 2.5  # the last ones waited for six 0.5 s turns


# -- 8: the served model's identity as the server reports it -----------------------------------
def _identity(url: str) -> dict:
    from evalkit.model_adapters.models import load_model

    adapter = load_model(f"served:{url}", tokenizer=str(TINY_TOKENIZER), retries=0)
    try:
        return adapter.identity()
    finally:
        adapter.client.close()


def _scoring(h, body) -> None:
    h.json(200, {"choices": [{"index": 0, "text": "", "prompt_logprobs": [None] + [
        {str(t): {"logprob": -1.0}} for t in body["prompt"][1:]]}]})


def test_the_identity_holds_the_served_card_less_what_changes_by_the_call():
    """Same name, same engine version, other weights (root): another identity. vLLM fills
    `created` with the time of the listing and `permission` with a random id: those are left
    out, or no run would ever find its own cache again."""
    card = {"id": "m", "object": "model", "owned_by": "vllm", "root": "org/weights-a",
            "parent": None, "max_model_len": 4096}
    with Fake(_scoring, models=[{**card, "created": 1, "permission": [{"id": "a"}]}],
              version="0.0.0-fake") as srv:
        a = _identity(srv.url)
        srv.models = [{**card, "created": 2, "permission": [{"id": "b"}]}]
        assert _identity(srv.url) == a  # only the listing's clock and ids moved
        srv.models = [{**card, "root": "org/weights-b", "created": 3}]
        b = _identity(srv.url)
    assert a["served_card"] == card and a["name"] == b["name"] == "served:m"
    assert b["served_card"]["root"] == "org/weights-b" and b != a


def test_a_card_with_a_non_finite_number_is_refused():
    """json.loads reads NaN; the card goes into config.json and results.json, which hold none."""
    with Fake(_scoring, models=[{"id": "m", "max_model_len": 4096, "score": float("nan")}]) as srv:
        with pytest.raises(ServerError, match="non-finite number"):
            _identity(srv.url)


def test_a_local_root_is_keyed_by_its_weights_not_its_path(tmp_path):
    """A server on this machine serving /some/clone/model: the card holds the folder's name and
    its weights' hash, so a clone elsewhere is the same model and weights overwritten in place
    are another."""
    import torch
    from safetensors.torch import save_file

    roots = [tmp_path / "clone1" / "model", tmp_path / "clone2" / "model"]
    for r in roots:
        r.mkdir(parents=True)
        save_file({"w": torch.zeros(4)}, str(r / "model.safetensors"))
    cards = []
    with Fake(_scoring, models=[{"id": "m", "root": str(roots[0])}]) as srv:
        cards.append(_identity(srv.url)["served_card"])
        srv.models = [{"id": "m", "root": str(roots[1])}]
        cards.append(_identity(srv.url)["served_card"])
        save_file({"w": torch.ones(4)}, str(roots[1] / "model.safetensors"))
        cards.append(_identity(srv.url)["served_card"])
    assert cards[0] == cards[1] and cards[0]["root"]["folder"] == "model"
    assert str(tmp_path) not in json.dumps(cards[0])
    assert cards[2] != cards[1]


def test_a_redeployed_model_is_not_resumed_nor_its_cache_reused(tmp_path, capsys):
    """The review: a model redeployed with other weights under the same name and version reused
    cached answers, and --resume accepted it."""
    with OneSlot(0.0) as srv:
        srv.models = [{"id": "fake", "root": "org/weights-a", "max_model_len": 4096}]
        suite = suite_file(tmp_path, srv.url, samples=1, lengths=(64,), depths=(0.5,))
        cache = str(tmp_path / "cache")
        rc, rows = run(suite, tmp_path / "a", "--cache-dir", cache)
        assert rc == 0 and len(rows) == 1
        srv.models = [{"id": "fake", "root": "org/weights-b", "max_model_len": 4096}]
        capsys.readouterr()
        rc, _ = run(suite, tmp_path / "a", "--resume")
        err = capsys.readouterr().err
        assert rc == 2 and "is not the model this run started with" in err, err
        assert "served_card" in err
        sent = len(srv.greedy)
        rc, rows = run(suite, tmp_path / "b", "--cache-dir", cache)
        assert rc == 0 and len(rows) == 1
        assert len(srv.greedy) == sent + 1  # asked again, not taken from the cache
    assert "(0 from cache, 1 evaluated)" in capsys.readouterr().out


# -- own pass: what a server sends is read strictly ---------------------------------------------
def _load(url: str):
    from evalkit.model_adapters.models import load_model

    return load_model(f"served:{url}", tokenizer=str(TINY_TOKENIZER), retries=0)


@pytest.mark.parametrize("value", ["-1_0", "-2", 3.5, True])
def test_a_log_probability_that_is_no_number_or_above_zero_is_refused(value):
    """float() read the string "-1_0" as -10 and a server's 3.5 summed as a probability > 1."""
    def reply(h, body):
        h.json(200, {"choices": [{"index": 0, "text": "", "prompt_logprobs": [None] + [
            {str(t): {"logprob": value}} for t in body["prompt"][1:]]}]})

    with Fake(reply) as srv:
        m = _load(srv.url)
        with pytest.raises(ServerError, match="expected a number <= 0"):
            m.score(m.prefill([3, 4]), [[5]])
        m.client.close()


@pytest.mark.parametrize("limit", ["4_096", 4096.5, -1, True])
def test_a_max_model_len_that_is_no_whole_number_is_refused(limit):
    with Fake(_scoring, models=[{"id": "m", "max_model_len": limit}]) as srv:
        with pytest.raises(ServerError, match="max_model_len .* expected a whole number"):
            _load(srv.url)


def test_a_body_its_content_encoding_does_not_decode_is_a_malformed_answer():
    """httpx's DecodingError escaped the client as no ServerError (no cause, no retry)."""
    with Fake(lambda h, b: h.raw(200, b"not gzip at all", {"Content-Encoding": "gzip",
                                                           "Content-Type": "application/json"})
              ) as srv:
        err, _ = bounded(lambda: client(srv.url).post_json("/completions", BODY))
    assert isinstance(err, ServerError) and err.cause == "bad_response", repr(err)
    assert err.attempts == srv.hits == 3 and "malformed" in str(err)


def test_a_model_listed_twice_is_refused():
    """Two cards under one id (two roots): which one the answers come from is a guess."""
    with Fake(_scoring, models=[{"id": "m", "root": "a"}, {"id": "m", "root": "b"}]) as srv:
        with pytest.raises(ServerError, match="lists m more than once"):
            _load(srv.url)
