"""The whole task -> runner -> scoring path on the deterministic reference adapters.

The oracle (an ideal copier) must score 100 % on every single-value built-in task; the
forgetful adapter's fixed memory must lose recall as the load grows.
"""
import json

import pytest

from evalkit.cli import main


def run(tmp_path, name, *args):
    out = tmp_path / name
    rc = main(["run", "--output", str(out), "--no-progress", "--seed", "11", *args])
    assert rc == 0
    assert (out / "DONE").is_file()
    return json.loads((out / "results.json").read_text())


def test_oracle_scores_100_percent_on_every_family(tmp_path):
    res = run(tmp_path, "oracle", "--models", "oracle", "--tasks",
              "needle,needle_uuid,needle_multi,multikey,multikey_mqar,multikey_multiquery,"
              "multikey_multivalue,conversation,conversation_checkpoints",
              "--lengths", "1024", "--depths", "0,0.5,1", "--loads", "4", "--samples", "1")
    tasks = {r["task"] for r in res["rows"]}
    assert len(tasks) == 9 and res["summary"]["failed"] == 0
    for row in res["rows"]:
        for metric in ("exact_match", "string_match_all", "forced_choice"):
            assert row["metrics"][metric]["mean"] == 1.0, (row["task"], metric, row["metrics"])


def test_forgetful_falls_as_load_grows(tmp_path):
    res = run(tmp_path, "forgetful", "--models", "forgetful", "--model-args", "capacity=1500",
              "--tasks", "multikey_mqar", "--lengths", "4096", "--depths", "0,0.25,0.5,0.75,1",
              "--loads", "4,16,64", "--samples", "2")
    recall = {}
    for row in res["rows"]:
        recall.setdefault(row["load"], []).append(row["metrics"]["exact_match"]["mean"])
    mean = {k: sum(v) / len(v) for k, v in recall.items()}
    assert mean[4] == 1.0  # a few facts fit in memory wherever they sit
    assert mean[4] > mean[16] > mean[64], mean
    assert mean[64] <= 0.5, mean
