"""The leaderboard (issue 6): a small real run -> `evalkit publish` -> tables, plots, merging.

One real run (the runner, the oracle and forgetful reference adapters, the shared tiny
tokenizer, the real needle generator on two small grids: depth x length, and a load sweep) is
made once per module. Table values are recomputed here by hand from its samples.jsonl with
plain Python (json, statistics), not with the leaderboard's pandas code.
"""
from __future__ import annotations

import json
import math
import shutil
import statistics
from collections import defaultdict
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from evalkit.leaderboard import publish
from evalkit.leaderboard import derived

from helpers import restamp

# forgetful keeps this many n-gram entries: enough for 128-token prompts, not for 256+, so
# facts at depth 0 are lost at the longer lengths (a real recall gap against the oracle).
CAPACITY = 1200
NEEDLE_YAML = """task: lb_needle
version: "1"
generator: evalkit.tasks.needle:generate
description: depth x length grid (leaderboard tests)
params: {haystack: prose, digits: 4}
defaults: {lengths: [128, 256, 512], depths: [0.0, 1.0], loads: [1], samples: 2}
"""
LOAD_YAML = """task: lb_load
version: "1"
generator: evalkit.tasks.needle:generate
description: load sweep (leaderboard tests)
params: {haystack: prose, digits: 4}
defaults: {lengths: [256], depths: [0.5], loads: [1, 2, 4, 8], samples: 2}
"""
PRIMARY = "string_match_all"


@pytest.fixture(scope="module")
def real_run(tmp_path_factory) -> Path:
    from evalkit.runner import resolve, run_suite
    from evalkit.runner.suite import validate

    root = tmp_path_factory.mktemp("lbrun")
    (root / "tasks").mkdir()
    (root / "tasks" / "lb_needle.yaml").write_text(NEEDLE_YAML)
    (root / "tasks" / "lb_load.yaml").write_text(LOAD_YAML)
    suite = {"name": "lbtest", "include": [str(root / "tasks")],
             "models": ["oracle", {"name": "forgetful", "options": {"capacity": CAPACITY}}],
             "tasks": ["lb_needle", "lb_load"]}
    out = run_suite(resolve(validate(suite, "test"), "test"), output=root / "run",
                    progress=False)
    assert (out.run_dir / "DONE").exists() and out.failed == 0
    return out.run_dir


@pytest.fixture(scope="module")
def board(real_run, tmp_path_factory) -> Path:
    dst = tmp_path_factory.mktemp("lbout") / "leaderboard"
    publish([real_run], dst)
    return dst


def samples_of(run: Path) -> list[dict]:
    return [json.loads(line) for line in (run / "samples.jsonl").read_text().splitlines()]


def scored(s: dict) -> bool:
    return s["error"] is None and s["flag"] is None


def mean_se(vals: list[float]) -> tuple[float, float]:
    m = statistics.fmean(vals)
    return m, (statistics.stdev(vals) / math.sqrt(len(vals)) if len(vals) > 1 else 0.0)


def readme_table(readme: str, heading: str, nth: int = 0) -> list[list[str]]:
    """The nth Markdown table after `heading`, as rows of cells (header first)."""
    text = readme.split(heading + "\n", 1)[1]
    tables, cur = [], []
    for line in text.splitlines():
        if line.startswith("|"):
            if not line.startswith("| ---") and not line.startswith("|---"):
                cur.append([c.strip() for c in line.strip("|").split(" | ")])
        elif cur:
            tables.append(cur)
            cur = []
        if line.startswith("## ") and tables:
            break
    if cur:
        tables.append(cur)
    return tables[nth]


def snapshot(folder: Path) -> dict[str, bytes]:
    return {p.relative_to(folder).as_posix(): p.read_bytes()
            for p in sorted(folder.rglob("*")) if p.is_file()}


def copy_run(src: Path, dst: Path, *, run_id: str | None = None, created: str | None = None,
             edit_sample=None, edit_results=None) -> Path:
    """A copy of a real run with its identity or samples changed, as a rerun would have."""
    shutil.copytree(src, dst, ignore=shutil.ignore_patterns("cache"))
    res = json.loads((dst / "results.json").read_text())
    res["run_id"] = run_id or dst.name
    if created:
        res["created"] = created
    if edit_results:
        edit_results(res)
    (dst / "results.json").write_text(json.dumps(res))
    if edit_sample:
        rows = [edit_sample(s) for s in samples_of(dst)]
        (dst / "samples.jsonl").write_text(
            "".join(json.dumps(s) + "\n" for s in rows if s is not None))
    return restamp(dst)


# -- tables vs. hand computation ------------------------------------------------------------

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
        for metric in ("string_match_all", "exact_match", "forced_choice", "partial_credit"):
            m, se = mean_se([s["scores"][metric] for s in ok])
            assert row[metric] == pytest.approx(m) and row[f"{metric}_stderr"] == pytest.approx(se)
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


def by_length_by_hand(samples: list[dict]) -> dict[tuple, tuple[float, float, int]]:
    pooled = defaultdict(list)
    for s in samples:
        if scored(s):
            pooled[(s["model"], s["task"], s["target_length"])].append(s["scores"][PRIMARY])
    return {k: (*mean_se(v), len(v)) for k, v in pooled.items()}


def test_readme_tables_by_hand(real_run, board):
    samples = samples_of(real_run)
    readme = (board / "README.md").read_text()
    pooled = by_length_by_hand(samples)

    # Recall by length: model x length pivot of "mean ± se (n=N)".
    table = readme_table(readme, "### lb_needle")
    assert table[0] == ["model", "state", "128 tok", "256 tok", "512 tok"]
    for row in table[1:]:
        model = row[0]
        for L, cell in zip((128, 256, 512), row[2:]):
            m, se, n = pooled[(model, "lb_needle", L)]
            assert cell == f"{m:.2f} ± {se:.2f} (n={n})"

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
        assert shown[(key[0], str(key[1]))][-1] == \
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
        assert (r.lo, r.hi) == pytest.approx(wilson(r.recall, r.n))
    assert P.recall_vs_distance(b.samples, b.identities, "lb_needle", tmp_path / "a.png") is None
    ids = {**b.identities, "forgetful": {**b.identities["forgetful"], "window": 64}}
    path = P.recall_vs_distance(b.samples, ids, "lb_needle", tmp_path / "b.png")
    img = mpimg.imread(path)
    assert img.ndim == 3 and img[..., :3].std() > 0.01


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
