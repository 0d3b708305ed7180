"""Recall under arrivals against a real vLLM server (marker vllm, `make test-vllm`): the same
probes in a closed loop and under Poisson arrivals below and above what the server sustains;
every sample records when it was due and its response time from then; the board shows recall
beside response-time percentiles; `evalkit compare` names the answers that changed under
load."""
from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
import yaml

from evalkit.cli import main as evalkit_main
from evalkit.runner.arrivals import parse
from vllm_support import vllm_python, vllm_server

pytestmark = pytest.mark.vllm

TASKS = [{"name": "needle", "lengths": [256], "depths": [0.2, 0.8]}]


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    from evalkit.model_adapters.embedded import convert_gguf_once

    vllm_python()  # skips without vLLM
    folder = convert_gguf_once()
    # no prefix cache: each run sends the previous run's prompts, which would come back warm
    with vllm_server(folder, tmp_path_factory.mktemp("vllm"),
                     extra=("--no-enable-prefix-caching",)) as url:
        yield url, folder


def _run(tmp: Path, name: str, url: str, tok: Path, *extra: str) -> Path:
    suite = {"name": "served-load", "tasks": TASKS, "samples": 4, "seed": 0,
             "models": [{"name": "smollm2-vllm", "spec": f"served:{url}",
                         "options": {"tokenizer": str(tok), "concurrency": 4,
                                     "timeout_s": 300}}]}
    cfg = tmp / "suite.yaml"
    cfg.write_text(yaml.safe_dump(suite))
    out = tmp / name
    assert evalkit_main(["run", "--config", str(cfg), "--output", str(out), "--no-progress",
                         *extra]) == 0
    return out


def _samples(run: Path) -> list[dict]:
    return [json.loads(line) for line in (run / "samples.jsonl").read_text().splitlines()]


def test_recall_and_latency_under_arrivals(server, tmp_path, capsys):
    url, tok = server
    quiet = _run(tmp_path, "unloaded", url, tok)
    rows = _samples(quiet)
    assert {r["arrivals"] for r in rows} == {"closed:4"}
    service = float(np.median([r["latency_s"] for r in rows]))
    low, high = 0.3 / service, 4.0 / service  # about a third of, and four times, its pace
    load = {"low": f"poisson:{low:.3g}", "high": f"poisson:{high:.3g}"}
    runs = {name: _run(tmp_path, name, url, tok, "--arrivals", a) for name, a in load.items()}
    lat = {"unloaded": [r["latency_s"] for r in rows]}
    for name, run in runs.items():
        got = _samples(run)
        assert len(got) == len(rows) and all(r["error"] is None for r in got)
        assert all(r["queue_s"] == 0.0 and r["due_s"] is not None for r in got)  # open loop
        assert all(r["latency_s"] >= r["service_s"] - 1e-6 for r in got)  # from the arrival
        assert {r["arrivals"] for r in got} == {parse(load[name]).label}
        lat[name] = [r["latency_s"] for r in got]
        same = sum(a["prediction"] == b["prediction"] for a, b in zip(
            sorted(rows, key=lambda r: (r["probe_hash"], r["question"])),
            sorted(got, key=lambda r: (r["probe_hash"], r["question"]))))
        print(f"{name}: greedy answers identical to unloaded {same}/{len(rows)}")
    for name, xs in lat.items():
        print(f"{name}: latency p50 {np.percentile(xs, 50):.2f} s, "
              f"p99 {np.percentile(xs, 99):.2f} s")
    # above the server's pace the requests queue at the server, and it shows in response time
    assert np.percentile(lat["high"], 50) > np.percentile(lat["low"], 50)

    board = tmp_path / "board"
    assert evalkit_main(["publish", str(quiet), *map(str, runs.values()), "--to", str(board)]) == 0
    csv = pd.read_csv(board / "results.csv", keep_default_na=False)
    assert sorted(set(csv["arrivals"])) == sorted({r["arrivals"] for run in [quiet, *runs.values()]
                                                   for r in _samples(run)})
    p50 = pd.to_numeric(csv["latency_p50_s"])
    assert (p50 > 0).all()
    # p99 only from 100 response times (evalkit.cell_stats.percentiles): empty below, never NaN
    p99 = pd.to_numeric(csv["latency_p99_s"].replace("", None))
    assert ((p99.isna() & (pd.to_numeric(csv["n"]) < 100)) | (p99 >= p50)).all()
    readme = (board / "README.md").read_text()
    assert "## Served models: recall and response time" in readme
    assert "smollm2-vllm @ poisson:" in readme and "smollm2-vllm @ closed loop, 4 in flight" in readme

    report = tmp_path / "drift"
    assert evalkit_main(["compare", str(quiet), str(runs["high"]), "--out", str(report)]) == 0
    drift = json.loads((report / "drift.json").read_text())["comparisons"][0]
    assert drift["settings"]["arrivals"][0] == "closed:4"
    print(f"compare unloaded vs high load: {len(drift['changes'])} answers changed")
