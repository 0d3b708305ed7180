"""The leaderboard (issue 6): publishing is atomic, and runs merge cell by cell (the newest
run wins a cell, task versions stay apart), on the shared real run (tests/leaderboard_run.py).
"""
from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from evalkit.leaderboard import publish

from leaderboard_run import PRIMARY, copy_run, make_real_run, readme_table, snapshot


@pytest.fixture(scope="module")
def real_run(tmp_path_factory) -> Path:
    return make_real_run(tmp_path_factory)


# -- atomic publishing ----------------------------------------------------------------------

def test_failed_publish_leaves_previous_leaderboard_untouched(real_run, tmp_path, monkeypatch):
    dst = tmp_path / "leaderboard"
    publish([real_run], dst)
    before = snapshot(dst)
    assert "README.md" in before and "results.json" in before

    def assert_untouched():
        assert snapshot(dst) == before
        assert sorted(p.name for p in tmp_path.iterdir() if p.name.startswith(".")) == []

    # 1. A corrupt run (a samples.jsonl line cut short after the run finished).
    bad = copy_run(real_run, tmp_path / "corrupt")
    text = (bad / "samples.jsonl").read_text()
    (bad / "samples.jsonl").write_text(text[: len(text) - 40])
    with pytest.raises(ValueError, match=r"corrupt/samples\.jsonl: not the file the run wrote"):
        publish([real_run, bad], dst)
    assert_untouched()

    # 2. An unfinished run (no DONE): refused by name.
    partial = copy_run(real_run, tmp_path / "partial")
    (partial / "DONE").unlink()
    with pytest.raises(ValueError, match=r"partial: incomplete run \(no DONE marker\)"):
        publish([partial], dst)
    assert_untouched()

    # 3. A failure late in the build, after tables and most plots were written (a plotting
    #    bug): the half-built folder is thrown away.
    from evalkit.leaderboard import plots

    def broken(cell_gaps, task, path):
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(b"\x89PNG half")
        raise RuntimeError("plotting failed")

    monkeypatch.setattr(plots, "gap_heatmaps", broken)
    with pytest.raises(RuntimeError, match="plotting failed"):
        publish([real_run], dst)
    assert_untouched()
    monkeypatch.undo()

    # 4. Never replaces a folder that is not a leaderboard.
    other = tmp_path / "notes"
    other.mkdir()
    (other / "keep.txt").write_text("mine")
    with pytest.raises(ValueError, match="not an evalkit leaderboard"):
        publish([real_run], other)
    assert (other / "keep.txt").read_text() == "mine"

    # A good publish over the old one replaces it whole, deterministically.
    publish([real_run], dst)
    assert snapshot(dst) == before


# -- merging --------------------------------------------------------------------------------

def test_newer_run_replaces_older_rows(real_run, tmp_path):
    res = json.loads((real_run / "results.json").read_text())

    def rerun_forgetful_needle(s):
        # The rerun covers forgetful on lb_needle only, and (say) recalls everything now.
        if s["model"] != "forgetful" or s["task"] != "lb_needle":
            return None
        s["scores"] = {**s["scores"], PRIMARY: 1.0}
        return s

    newer = copy_run(real_run, tmp_path / "newer", created="2099-01-01T00:00:00Z",
                     edit_sample=rerun_forgetful_needle)
    older = copy_run(real_run, tmp_path / "older", created="2000-01-01T00:00:00Z")
    dst = tmp_path / "lb"
    # Given newest first: the date decides, not the order.
    out = publish([newer, older], dst)
    rows = pd.read_csv(dst / "results.csv")
    from_new = rows[rows.run_id == "newer"]
    assert set(zip(from_new.model, from_new.task)) == {("forgetful", "lb_needle")}
    assert len(from_new) == 6 and (from_new[PRIMARY] == 1.0).all()
    assert (from_new["n"] == 2).all()  # replaced, not pooled with the older samples
    assert len(rows) == len(res["rows"]) and set(rows.run_id) == {"newer", "older"}
    assert out.board.merged.superseded == {"older": 6}
    readme = (dst / "README.md").read_text()
    prov = {r[0]: r for r in readme_table(readme, "## Provenance")[1:]}
    assert prov["older"][5] == "6" and prov["newer"][4] == "6"

    # Same date: the run given later wins.
    a = copy_run(real_run, tmp_path / "a", created=res["created"])
    b = copy_run(real_run, tmp_path / "b", created=res["created"])
    publish([a, b], dst)
    assert set(pd.read_csv(dst / "results.csv").run_id) == {"b"}


def test_different_task_versions_stay_apart(real_run, tmp_path):
    def bump(s):
        if s["task"] == "lb_needle":
            s["task_version"] = "2"
        return s

    def bump_results(res):
        res["tasks"]["lb_needle"] = {**res["tasks"]["lb_needle"], "version": "2",
                                     "config_hash": "f" * 64}
        # Another tokenizer for forgetful: lengths are then compared in characters too.
        res["models"]["forgetful"]["tokenizer_hash"] = "0" * 64

    v2 = copy_run(real_run, tmp_path / "v2", created="2099-01-01T00:00:00Z",
                  edit_sample=bump, edit_results=bump_results)
    dst = tmp_path / "lb"
    out = publish([real_run, v2], dst)
    rows = pd.read_csv(dst / "results.csv", dtype={"task_version": str})
    needle = rows[rows.task == "lb_needle"]
    # Both versions are kept as separate cells with their own n, never averaged together.
    assert sorted(set(needle.task_version)) == ["1", "2"]
    assert len(needle) == 2 * 12 and (needle["n"] == 2).all()
    labels = set(needle.task_label)
    assert len(labels) == 2 and all(lab.startswith("lb_needle v") for lab in labels)
    # lb_load has one version in both runs: the newer run replaced the older.
    assert set(rows[rows.task == "lb_load"].run_id) == {"v2"}
    readme = (dst / "README.md").read_text()
    for lab in labels:
        assert f"### {lab}" in readme
    assert out.board.use_chars[next(lab for lab in labels if " v2@" in lab)]
    assert "Tokenizers differ here" in readme


# -- command line ---------------------------------------------------------------------------

def test_cli_publish(real_run, tmp_path, capsys):
    from evalkit.cli import main

    dst = tmp_path / "lb"
    assert main(["publish", str(real_run), "--to", str(dst), "--threshold", "0.99",
                 "--gap", "oracle:forgetful", "--bootstrap", "500"]) == 0
    assert "published 20 rows" in capsys.readouterr().out
    doc = json.loads((dst / "results.json").read_text())
    assert doc["options"]["threshold"] == 0.99 and doc["options"]["bootstrap_resamples"] == 500
    assert "## Effective length (threshold 0.99)" in (dst / "README.md").read_text()

    partial = copy_run(real_run, tmp_path / "unfinished")
    (partial / "DONE").unlink()
    assert main(["publish", str(partial), "--to", str(tmp_path / "lb2")]) == 2
    err = capsys.readouterr().err
    assert "unfinished: incomplete run (no DONE marker)" in err
    assert not (tmp_path / "lb2").exists()
    assert main(["publish", str(real_run), "--to", str(dst), "--gap", "oracle:nobody"]) == 2
    assert "no model 'nobody'" in capsys.readouterr().err


def test_bad_runs_are_named(real_run, tmp_path):
    from evalkit.leaderboard.load import load_run

    no_date = copy_run(real_run, tmp_path / "no_date", edit_results=lambda r: r.pop("created"))
    with pytest.raises(ValueError, match=r"no_date/results\.json: missing field 'created'"):
        load_run(no_date)

    def drop_hash(s):
        s.pop("model_hash")
        return s
    no_hash = copy_run(real_run, tmp_path / "no_hash", edit_sample=drop_hash)
    with pytest.raises(ValueError, match=r"no_hash/samples\.jsonl:1: missing field\(s\) \['model_hash'\]"):
        load_run(no_hash)

    unknown = copy_run(real_run, tmp_path / "unknown_task",
                       edit_results=lambda r: r["tasks"].pop("lb_load"))
    with pytest.raises(ValueError, match=r"task 'lb_load' is not listed in results\.json"):
        load_run(unknown)


def test_capacity_knee_on_a_run(real_run, tmp_path):
    from evalkit.leaderboard.board import build
    from evalkit.leaderboard.load import load_run

    def overloaded(s):
        # As if forgetful lost every fact from 4 needles on: recall 1, 1, 0, 0 by load.
        if s["model"] == "forgetful" and s["task"] == "lb_load" and s["load"] >= 4:
            s["scores"] = {**s["scores"], PRIMARY: 0.0}
        return s

    b = build([load_run(copy_run(real_run, tmp_path / "knee", edit_sample=overloaded))])
    k = b.capacity_knee.set_index("model_label")
    assert k.loc["forgetful", "censored"] == "" and 2 < k.loc["forgetful", "knee"] < 4
    assert k.loc["forgetful", "loads"] == [1, 2, 4, 8]
    assert k.loc["oracle", "censored"] == "above" and np.isnan(k.loc["oracle", "knee"])
