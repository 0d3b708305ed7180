"""The served adapter over scripted servers (issue 41): neutral sampling parameters in every
request, benchmarks/vllm_server.py on vLLM's own generation defaults, the echo scoring
path sliced as lm-eval does and checked against the ids sent, every URL of a list probed and a
mismatch refused by field, abort(), generate_timed's Timing, and no URL or secret in a name,
an identity or an error. The real-vLLM side (parity on a folder with skewed generation
defaults) is tests/test_served_vllm.py."""
from __future__ import annotations

import json
import sys
import threading
from pathlib import Path

import pytest

from evalkit.model_adapters.served.client import ServerError
from evalkit.model_adapters.models import load_model
from helpers import TINY_TOKENIZER, benchmark
from test_served_client import Fake, _slow_stream, bounded

# What a greedy request must pin itself, whatever the server's or the folder's defaults.
NEUTRAL = {"temperature": 0, "top_p": 1, "top_k": -1, "min_p": 0, "repetition_penalty": 1,
           "frequency_penalty": 0, "presence_penalty": 0}


def _prompts(body: dict) -> list[list[int]]:
    p = body["prompt"]
    return p if isinstance(p[0], list) else [p]


def vllm_like(h, body) -> None:
    """prompt_logprobs (-1.0 a token) for scoring, a short stream for generation."""
    if body.get("stream"):
        h.sse([" answer"])
        return
    h.json(200, {"choices": [{"index": i, "text": "", "prompt_logprobs": [None] + [
        {str(t): {"logprob": -1.0, "rank": 1}} for t in p[1:]]}
        for i, p in enumerate(_prompts(body))]})


def echo_like(extra: int | None = None, wrong: bool = False, as_ids: bool = False):
    """A server without prompt_logprobs: echo + logprobs, -1.0 a prompt token and -50.0 a
    generated one. It appends `extra` generated tokens (None: max_tokens of them, as asked);
    `wrong` echoes another id than the one sent."""
    from evalkit.tokenization import load_tokenizer

    tok = load_tokenizer(TINY_TOKENIZER)

    def reply(h, body) -> None:
        if "prompt_logprobs" in body:
            h.json(400, {"error": "unknown field: prompt_logprobs"})
            return
        gen = body.get("max_tokens", 16) if extra is None else extra
        choices = []
        for i, p in enumerate(_prompts(body)):
            ids = list(p) + [5] * gen
            if wrong:
                ids[1] = ids[1] + 1
            tokens = [f"token_id:{t}" if as_ids else tok.decode([t]) for t in ids]
            lps = [None] + [-1.0] * (len(p) - 1) + [-50.0] * gen
            choices.append({"index": i, "text": "", "logprobs": {
                "tokens": tokens, "token_logprobs": lps, "top_logprobs": None}})
        h.json(200, {"choices": choices})
    return reply


def served(*urls: str, **kw):
    return load_model("served:" + "|".join(urls), tokenizer=str(TINY_TOKENIZER),
                      **{"timeout_s": 5.0, "retries": 1, "backoff_s": 0.01, **kw})


def test_every_request_pins_neutral_sampling():
    with Fake(vllm_like) as srv:
        m = served(srv.url)
        s = m.prefill([3, 4, 5])
        assert m.generate(s, 4) == " answer"
        m.score(s, [[6], [7, 8]])
    assert srv.hits == 3  # the load-time scoring check, one generation, one scoring request
    for body in srv.bodies:
        assert {k: body.get(k) for k in NEUTRAL} == NEUTRAL, body
        assert isinstance(body.get("seed"), int), body


def test_vllm_server_uses_vllms_own_generation_defaults(tmp_path):
    """Not the folder's generation_config.json: its penalties would reach every request that
    does not set them."""
    server = benchmark("vllm_server").VllmServer(tmp_path, tmp_path, python=sys.executable,
                                                  port=8999)
    cmd = server.cmd
    i = cmd.index("--generation-config")
    assert cmd[i + 1] == "vllm"


@pytest.mark.parametrize("reply", ["appends one", "as asked", "token ids"])
def test_echo_scoring_takes_the_continuation_after_the_context(reply):
    """lm-eval's slice: the log-probs after the context, whatever the server generated after
    the prompt (a server that appends a generated token's -50 must not be summed)."""
    make = {"appends one": lambda: echo_like(extra=1), "as asked": lambda: echo_like(),
            "token ids": lambda: echo_like(extra=1, as_ids=True)}[reply]
    with Fake(make()) as srv:
        m = served(srv.url)
        assert m.score_method == "echo"
        got = m.score(m.prefill([3, 4, 5, 6]), [[7], [8, 9, 10]])
        asked = srv.bodies[-1]
    assert got == [-1.0, -3.0]
    assert asked["echo"] is True and asked["max_tokens"] == 1 and asked["logprobs"] == 0


@pytest.mark.parametrize("reply,words", [(lambda: echo_like(extra=2), "longer"),
                                         (lambda: echo_like(extra=1, wrong=True), "echoed")])
def test_echo_scoring_refuses_what_it_cannot_trust(reply, words):
    with Fake(reply()) as srv:
        with pytest.raises(ServerError, match=words) as e:
            m = served(srv.url)
            m.score(m.prefill([3, 4, 5, 6]), [[7], [8, 9, 10]])
    assert e.value.cause == "bad_response"


SAME = dict(version="0.32.0", models=[{"id": "fake", "max_model_len": 4096}])
OTHER = {"max_model_len": dict(SAME, models=[{"id": "fake", "max_model_len": 2048}]),
         "version": dict(SAME, version="0.31.0"),
         "score_method": SAME,  # but without prompt_logprobs (below)
         "model": dict(SAME, models=[{"id": "other", "max_model_len": 4096}])}


@pytest.mark.parametrize("field", list(OTHER))
def test_every_url_is_probed_and_a_mismatch_refused(field):
    """Not only the first server: one that disagrees is refused, naming the field and the
    server (host:port/path: a URL with a secret never gets this far)."""
    reply = echo_like(extra=1) if field == "score_method" else vllm_like
    with Fake(vllm_like, **SAME) as first, Fake(reply, **OTHER[field]) as second:
        with pytest.raises(ValueError) as e:
            served(first.url, second.url)
        with Fake(vllm_like, **SAME) as same:  # servers that agree are fine
            m = served(first.url, same.url)
    msg = str(e.value)
    assert (field if field != "model" else "is not served") in msg and second.url in msg, msg
    assert m.server == {"engine": "vllm", "version": "0.32.0"} and same.hits >= 1


def test_generate_timed_and_abort():
    with Fake(vllm_like) as srv:
        m = served(srv.url)
        text, timing = m.generate_timed(m.prefill([3, 4]), 4, stop=["\n"])
        assert text == " answer" and timing.attempts == 1
        assert timing.sent_at <= timing.done_at and timing.ttft_s <= timing.service_s
    with Fake(lambda h, b: vllm_like(h, b) if not b.get("stream") else _slow_stream(h, b)) as srv:
        m = served(srv.url, timeout_s=60.0)
        threading.Timer(0.5, m.abort).start()
        err, wall = bounded(lambda: m.generate_timed(m.prefill([3, 4]), 4))
        assert isinstance(err, ServerError) and err.cause == "cancelled" and wall < 2.0, err
        err, _ = bounded(lambda: m.score(m.prefill([3, 4]), [[5]]))
        assert isinstance(err, ServerError) and err.cause == "cancelled", err


def test_no_url_in_the_name_or_identity():
    with Fake(vllm_like) as srv:
        m = served(srv.url)
        host = srv.url.split("//")[1].split("/")[0]
        assert host not in m.name and host not in json.dumps(m.identity())
        assert m.name == "served:fake"


@pytest.mark.parametrize("url,secret", [("http://u:s3cr3t-pw@127.0.0.1:1/v1", "s3cr3t-pw"),
                                        ("http://127.0.0.1:1/v1?token=s3cr3t-tk", "s3cr3t-tk")])
def test_a_secret_in_the_url_is_refused_before_anything_is_sent(url, secret):
    with pytest.raises(ValueError) as e:
        served(url)
    assert secret not in str(e.value) and "base_url" in str(e.value)


def test_public_spec_keeps_no_secret():
    """What the runner may print or name a model by (it must not repeat the raw spec)."""
    from evalkit.model_adapters.served.adapter import public_spec

    spec = "served:http://u:s3cr3t-pw@127.0.0.1:8000/v1/?token=s3cr3t-tk#x|https://[::1]/v1"
    assert public_spec(spec) == "served:http://127.0.0.1:8000/v1|https://[::1]/v1"
    assert public_spec("served:http://h:bad-port/v1") == "served:<unreadable URL>"
    assert public_spec("hf:/some/path") == "hf:/some/path"
