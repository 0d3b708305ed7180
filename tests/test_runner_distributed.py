"""Data parallel: torchrun with 2 gloo processes on CPU gives exactly the single-process run."""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import yaml

from evalkit.runner.aggregate import strip_timestamps
from runner_support import build_tokenizer, read_samples, run, suite_dict, without_latency

REPO = Path(__file__).resolve().parent.parent


def test_two_gloo_ranks_equal_one_process(tmp_path):
    tok_dir = build_tokenizer(tmp_path / "tok")
    suite = suite_dict(tok_dir, models=("oracle", {"name": "forgetful", "options": {"capacity": 600}}),
                       tasks=("toy_recall", {"name": "toy_conv", "lengths": [256, 288]}),
                       lengths=[96, 128], depths=[0.5],
                       loads=[4], samples=2)
    single = tmp_path / "single" / "run"
    run(suite, single)

    cfg = tmp_path / "suite.yaml"
    cfg.write_text(yaml.safe_dump(suite))
    multi = tmp_path / "multi" / "run"
    env = {**os.environ, "PYTHONPATH": str(REPO / "tests")}
    proc = subprocess.run(
        [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2",
         "-m", "evalkit", "run", "--config", str(cfg), "--output", str(multi), "--no-progress"],
        cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stdout + proc.stderr

    a = json.loads((single / "results.json").read_text())
    b = json.loads((multi / "results.json").read_text())
    assert strip_timestamps(b) == strip_timestamps(a)
    assert without_latency(read_samples(multi)) == without_latency(read_samples(single))
    [inv] = json.loads((multi / "execution.json").read_text())["invocations"]
    assert inv["world_size"] == 2
    # Both ranks did real work: the shards split the units between them.
    assert [r["computed"] > 0 for r in inv["ranks"]] == [True, True]
    assert sum(r["computed"] for r in inv["ranks"]) == len(read_samples(single))
