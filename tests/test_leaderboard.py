"""The leaderboard (issue 6): a small real run -> `evalkit publish` -> tables and plots.

The run (tests/leaderboard_run.py) is made once per module; table values are recomputed here
by hand from its samples.jsonl. Atomic publishing and merging: test_leaderboard_merge.py.
"""
from __future__ import annotations

import json
import math
import statistics
from collections import defaultdict
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from evalkit.leaderboard import publish
from evalkit.leaderboard import derived

from leaderboard_run import PRIMARY, make_real_run, mean_wilson, readme_table, samples_of, scored


@pytest.fixture(scope="module")
def real_run(tmp_path_factory) -> Path:
    return make_real_run(tmp_path_factory)


@pytest.fixture(scope="module")
def board(real_run, tmp_path_factory) -> Path:
    dst = tmp_path_factory.mktemp("lbout") / "leaderboard"
    publish([real_run], dst)
    return dst


def test_rows_match_samples_by_hand(real_run, board):
    samples = samples_of(real_run)
    res = json.loads((real_run / "results.json").read_text())
    cells = defaultdict(list)
    for s in samples:
        cells[(s["model"], s["task"], s["target_length"], s["depth"], s["load"])].append(s)
    csv = pd.read_csv(board / "results.csv")
    doc = json.loads((board / "results.json").read_text())
    assert len(csv) == len(cells) == len(doc["rows"])
    for row in doc["rows"]:
        cell = cells[(row["model"], row["task"], row["target_length"], row["depth"], row["load"])]
        ok = [s for s in cell if scored(s)]
        assert row["n"] == len(ok) and row["n_failed"] == 0 and row["n_flagged"] == 0
        assert row["run_id"] == res["run_id"] == real_run.name
        assert row["model_hash"] == cell[0]["model_hash"] == res["models"][row["model"]]["hash"]
        assert row["task_version"] == "1"
        assert row["task_config_hash"] == res["tasks"][row["task"]]["config_hash"]
        for metric in ("word_match", "string_match_all", "exact_match", "forced_choice",
                       "partial_credit"):
            m, lo, hi = mean_wilson([s["scores"][metric] for s in ok])
            assert row[metric] == pytest.approx(m)
            assert (row[f"{metric}_lo"], row[f"{metric}_hi"]) == pytest.approx((lo, hi), abs=1e-12)
            assert f"{metric}_stderr" not in row
        assert row["recall"] == pytest.approx(row[PRIMARY]) and row["primary_metric"] == PRIMARY
        assert row["prompt_tokens"] == pytest.approx(statistics.fmean(s["prompt_tokens"] for s in cell))
        assert row["prompt_chars"] == pytest.approx(statistics.fmean(s["prompt_chars"] for s in cell))
        assert row["state_bytes"] == pytest.approx(statistics.fmean(s["state_bytes"] for s in ok))
        assert row["state_kind"] == "memory"
    # The CSV holds the same rows as the JSON.
    key = ["model", "task", "target_length", "depth", "load"]
    merged = csv.merge(pd.DataFrame(doc["rows"]), on=key, suffixes=("", "_j"))
    assert len(merged) == len(csv)
    assert np.allclose(merged[PRIMARY], merged[f"{PRIMARY}_j"])
    # And agree with the runner's own aggregates.
    for r in res["rows"]:
        mine = csv[(csv.model == r["model"]) & (csv.task == r["task"])
                   & (csv.target_length == r["target_length"]) & (csv.depth == r["depth"])
                   & (csv.load == r["load"])]
        assert len(mine) == 1 and mine["n"].iat[0] == r["n"]
        assert mine[PRIMARY].iat[0] == pytest.approx(r["metrics"][PRIMARY]["mean"])


def by_length_by_hand(samples: list[dict]) -> dict[tuple, tuple[float, float, float, int]]:
    pooled = defaultdict(list)
    for s in samples:
        if scored(s):
            pooled[(s["model"], s["task"], s["target_length"])].append(s["scores"][PRIMARY])
    return {k: (*mean_wilson(v), len(v)) for k, v in pooled.items()}


def test_readme_tables_by_hand(real_run, board):
    samples = samples_of(real_run)
    readme = (board / "README.md").read_text()
    pooled = by_length_by_hand(samples)

    # Recall by length: model x length pivot of "mean [lo, hi] (n=N)", the Wilson interval.
    table = readme_table(readme, "### lb_needle")
    assert table[0] == ["model", "state", "128 tok", "256 tok", "512 tok"]
    for row in table[1:]:
        model = row[0]
        for L, cell in zip((128, 256, 512), row[2:]):
            m, lo, hi, n = pooled[(model, "lb_needle", L)]
            assert cell == f"{m:.2f} [{lo:.2f}, {hi:.2f}] (n={n})"

    # Effective length: longest length with recall >= 0.85 there and at every shorter one.
    eff = {}
    for model in ("oracle", "forgetful"):
        best, lengths = None, (128, 256, 512)
        for L in lengths:
            if pooled[(model, "lb_needle", L)][0] < derived.DEFAULT_THRESHOLD:
                break
            best = L
        eff[model] = ("≥ " if best == lengths[-1] else "") + str(best) if best else "< 128"
    assert eff["oracle"] == "≥ 512" and eff["forgetful"] != "≥ 512"  # the run shows forgetting
    rows = {(r[0], r[1]): r[2] for r in readme_table(readme, "## Effective length (threshold 0.85)")[1:]}
    assert rows[("oracle", "lb_needle")] == eff["oracle"]
    assert rows[("forgetful", "lb_needle")] == eff["forgetful"]

    # State bytes at each length: mean over scored samples of every task at that length.
    sb = defaultdict(list)
    for s in samples:
        if scored(s):
            sb[(s["model"], s["target_length"])].append(s["state_bytes"])
    from evalkit.formatting import fmt_bytes
    for row in readme_table(readme, "## State bytes vs. KV cache by length")[1:]:
        for L, cell in zip((128, 256, 512), row[2:]):
            assert cell == fmt_bytes(statistics.fmean(sb[(row[0], L)]))

    # Recall per byte (per MB) at 512 tokens.
    rpb = {r[0]: r[3] for r in readme_table(readme, "**lb_needle**")[1:]}
    for model in ("oracle", "forgetful"):
        assert rpb[model] == f"{pooled[(model, 'lb_needle', 512)][0] / statistics.fmean(sb[(model, 512)]) * 1e6:.3g}"

    # Recall gap oracle - forgetful, paired on (task, length, depth, load, seed, question).
    rec = {}
    for s in samples:
        if scored(s):
            rec[(s["model"], s["task"], s["target_length"], s["depth"], s["load"], s["seed"],
                 s["question"])] = s["scores"][PRIMARY]
    diffs = defaultdict(list)
    for (model, *key), v in rec.items():
        if model == "oracle" and ("forgetful", *key) in rec:
            diffs[(key[0], key[1])].append(v - rec[("forgetful", *key)])
    doc = json.loads((board / "results.json").read_text())
    gaps = {(g["task_label"], g["target_length"]): g for g in doc["gaps"]["by_length"]}
    assert set(gaps) == set(diffs)
    table = readme_table(readme, "## Recall gap (baseline minus model)")
    shown = {(r[2], r[3]): r for r in table[1:]}
    for key, d in diffs.items():
        g = gaps[key]
        assert (g["baseline"], g["model"]) == ("oracle", "forgetful")
        assert g["n_pairs"] == len(d) and g["gap"] == pytest.approx(statistics.fmean(d))
        assert min(d) - 1e-12 <= g["ci_low"] <= g["gap"] <= g["ci_high"] <= max(d) + 1e-12
        excludes_zero = g["ci_low"] > 0 or g["ci_high"] < 0
        gen = table[0].index("by generation")
        assert shown[(key[0], str(key[1]))][gen] == \
            f"`{PRIMARY}` {g['baseline_recall']:.2f} -> {g['model_recall']:.2f}: " \
            f"{g['gap']:+.2f} [{g['ci_low']:+.2f}, {g['ci_high']:+.2f}]" + \
            (" *" if excludes_zero else "")
    assert any(statistics.fmean(d) > 0 for d in diffs.values())  # the oracle recalls more
    # Every (length, depth, load) cell has its own gap with an interval.
    cells = pd.read_csv(board / "gaps.csv")
    both = {tuple(key[:4]) for (model, *key) in rec
            if model == "oracle" and ("forgetful", *key) in rec}
    assert len(cells) == len(both)
    assert cells[["ci_low", "ci_high"]].notna().all().all()

    # Load sweep: forgetful and oracle keep every fact up to 8 -> censored knee "> 8".
    knee = {(r[0], r[1]): r[3] for r in readme_table(readme, "## Capacity knee")[1:]}
    by_load = defaultdict(list)
    for s in samples:
        if s["task"] == "lb_load" and scored(s):
            by_load[(s["model"], s["load"])].append(s["scores"][PRIMARY])
    for model in ("oracle", "forgetful"):
        ys = [statistics.fmean(by_load[(model, n)]) for n in (1, 2, 4, 8)]
        expect = "> 8" if min(ys) >= 0.5 else ("< 1" if max(ys) < 0.5 else None)
        if expect:
            assert knee[(model, "lb_load")] == expect

    # Provenance names the run, the model hashes and the task config hashes.
    res = json.loads((real_run / "results.json").read_text())
    assert res["run_id"] in readme and res["models"]["oracle"]["hash"][:16] in readme
    assert res["tasks"]["lb_needle"]["config_hash"][:16] in readme
    assert "## How to read" in readme and "Effective length" in readme


# -- plots ----------------------------------------------------------------------------------

def test_every_plot_rendered(board):
    import matplotlib.image as mpimg

    expected = {"state-bytes-lb_needle.png", "state-bytes-lb_load.png", "length-lb_needle.png",
                "heatmap-lb_needle.png", "load-lb_load.png", "gap-lb_needle.png",
                "gap-lb_load.png", "capacity-lb_load.png", "capacity-bytes-lb_load.png"}
    assert {p.name for p in (board / "plots").iterdir()} == expected
    readme = (board / "README.md").read_text()
    for name in expected:
        p = board / "plots" / name
        assert p.stat().st_size > 1024, name
        img = mpimg.imread(p)
        assert img.ndim == 3 and img.shape[0] > 200 and img.shape[1] > 200
        assert img[..., :3].std() > 0.01, f"{name} is blank"
        assert f"(plots/{name})" in readme
    # The absent figures are named with their reason, never drawn empty.
    assert "lb_load: recall vs. context length: fewer than two lengths scored" in readme
    assert "lb_needle: recall vs. load: no load sweep (one load)" in readme
    assert "lb_needle: recall vs. number of facts by state size: no load sweep" in readme
    assert ("lb_needle: recall vs. distance, windows marked: no model with a window" in readme)


def test_recall_by_distance_and_window_marks(real_run, tmp_path):
    """Octave bins of the distance recomputed by hand from samples.jsonl; the figure is drawn
    only once some model of the task has an exact window (a twin's identity `window`)."""
    import matplotlib.image as mpimg

    from evalkit.cell_stats import wilson
    from evalkit.leaderboard import plots as P
    from evalkit.leaderboard.board import build
    from evalkit.leaderboard.load import load_run

    b = build([load_run(real_run)])
    per = P.recall_by_distance(b.samples, "lb_needle")
    groups = defaultdict(list)
    for s in samples_of(real_run):
        if s["task"] == "lb_needle" and scored(s):
            edge = 2 ** int(math.floor(math.log2(max(s["distance"], 1))))
            groups[(s["model"], edge)].append(s["scores"][PRIMARY])
    assert len(per) == len(groups) and per["bin"].nunique() >= 3
    for r in per.itertuples():
        vals = groups[(r.model_label, r.bin)]
        assert r.n == len(vals) and r.recall == pytest.approx(statistics.fmean(vals))
        assert (r.recall_lo, r.recall_hi) == pytest.approx(wilson(r.recall, r.n))
    assert P.recall_vs_distance(b.samples, b.identities, "lb_needle", tmp_path / "a.png") is None
    ids = {**b.identities, "forgetful": {**b.identities["forgetful"], "window": 64}}
    path = P.recall_vs_distance(b.samples, ids, "lb_needle", tmp_path / "b.png")
    img = mpimg.imread(path)
    assert img.ndim == 3 and img[..., :3].std() > 0.01
