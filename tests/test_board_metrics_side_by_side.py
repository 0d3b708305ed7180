"""Issue 58: the board shows the loss whichever metric shows it, and says when nothing was
answered. Two committed real runs (SmolLM2-135M and its GLA twin, leaderboard/runs/) are
published with one task's generated answers replaced by a non-answer in both runs, as a rerun
of models that do not follow that prompt would have written them (scores recomputed by
evalkit.scoring; forced choice, from the log-probabilities, unchanged). Numbers are checked
against plain Python over samples.jsonl."""
from __future__ import annotations

import doctest
import json
import re
import shutil
import statistics
from collections import defaultdict
from pathlib import Path

import pandas as pd
import pytest

from evalkit import scoring, unanswered
from evalkit.leaderboard import Options, publish
from helpers import REPO, restamp
from leaderboard_run import readme_table

BASE, MODEL = "smollm2-135m", "smollm2-135m-gla-w64-s4"
SILENT = "needle"  # the task nobody answers here


def _silence(run: Path) -> Path:
    rows = [json.loads(line) for line in (run / "samples.jsonl").read_text().splitlines()]
    for s in rows:
        if s["task"] == SILENT and s["error"] is None and s["flag"] is None:
            s["prediction"] = " I do not know."
            s["scores"] = scoring.score_sample(s["prediction"], s["gold"],
                                               s["candidate_logprobs"], s["kind"])
    (run / "samples.jsonl").write_text("".join(json.dumps(s) + "\n" for s in rows))
    return restamp(run)


@pytest.fixture(scope="module")
def board(tmp_path_factory) -> tuple[Path, dict[str, list[dict]]]:
    root = tmp_path_factory.mktemp("silent")
    runs, samples = [], {}
    for m in (BASE, MODEL):
        run = root / m
        shutil.copytree(REPO / "leaderboard" / "runs" / "standard-twins" / m, run)
        runs.append(_silence(run))
        samples[m] = [json.loads(line) for line in (run / "samples.jsonl").read_text().splitlines()]
    out = root / "board"
    publish(runs, out, Options(gap_pairs=(f"{BASE}:{MODEL}",), n_boot=200))
    return out, samples


def _paired(samples: dict[str, list[dict]], metric: str) -> dict[str, list[tuple[float, float]]]:
    """task -> [(baseline score, model score)] over the questions scored by both."""
    key = lambda s: (s["task"], s["target_length"], s["depth"], s["load"], s["seed"],  # noqa: E731
                     s["question"])
    ok = lambda s: s["error"] is None and s["flag"] is None  # noqa: E731
    a = {key(s): s for s in samples[BASE] if ok(s)}
    b = {key(s): s for s in samples[MODEL] if ok(s)}
    out = defaultdict(list)
    # the committed runs predate word_match: the board scores it from the stored answers
    score = lambda s: scoring.fill_missing(s["scores"], s["prediction"], s["gold"],  # noqa: E731
                                           s["kind"])
    for k in sorted(a.keys() & b.keys()):
        sa, sb = score(a[k]), score(b[k])
        if metric in sa and metric in sb:
            out[k[0]].append((sa[metric], sb[metric]))
    return out


def test_headline_shows_each_metric_side_by_side_and_names_the_larger_gap(board):
    out, samples = board
    readme = (out / "README.md").read_text()
    table = readme_table(readme, "## Headline")
    head = table[0]
    rows = {r[head.index("task")]: r for r in table[1:]}
    assert head == ["baseline", "model", "task", "pairs", "by generation", "by forced choice",
                    "larger gap"]
    gen, fc = _paired(samples, "word_match"), _paired(samples, "forced_choice")
    assert set(rows) == set(gen) and set(fc) < set(gen)  # conversation_recall: no candidates
    for task, r in rows.items():
        assert (r[0], r[1]) == (BASE, MODEL) and r[3] == str(len(gen[task]))
        if task not in fc:
            assert r[5] == "—" and r[6] == "`word_match`"
            continue
        gaps = {}
        for metric, pairs, cell in (("word_match", gen[task], r[4]),
                                    ("forced_choice", fc[task], r[5])):
            a = statistics.fmean(x for x, _ in pairs)
            b = statistics.fmean(y for _, y in pairs)
            gaps[metric] = statistics.fmean(x - y for x, y in pairs)
            assert cell.startswith(f"`{metric}` {a:.2f} -> {b:.2f}: {gaps[metric]:+.2f} [")
        larger = "forced_choice" if gaps["forced_choice"] > gaps["word_match"] else "word_match"
        assert r[6] == f"`{larger}`"
    # the silenced task: 0.00 -> 0.00 by generation, its loss (if any) only by forced choice
    assert rows[SILENT][4].startswith("`word_match` 0.00 -> 0.00: +0.00 [+0.00, +0.00]")


def test_gap_tables_and_gaps_csv_carry_forced_choice_beside_the_primary(board):
    out, samples = board
    cells = pd.read_csv(out / "gaps.csv")
    fc = _paired(samples, "forced_choice")
    assert set(cells["metric"]) == {"word_match"}
    has = cells["task_label"].isin(list(fc))
    assert (cells.loc[has, "other_metric"] == "forced_choice").all()
    assert cells.loc[~has, "other_metric"].isna().all() and (~has).any()
    assert cells.loc[~has, "other_gap"].isna().all()  # an empty CSV cell, never a number
    cells = cells[has]
    by_task = cells.groupby("task_label").apply(
        lambda g: (g["other_gap"] * g["other_n_pairs"]).sum() / g["other_n_pairs"].sum())
    for task, pairs in fc.items():
        assert by_task[task] == pytest.approx(statistics.fmean(x - y for x, y in pairs))
    assert (cells["other_ci_low"] <= cells["other_gap"] + 1e-12).all()
    assert (cells["other_gap"] <= cells["other_ci_high"] + 1e-12).all()
    table = readme_table((out / "README.md").read_text(), "## Recall gap (baseline minus model)")
    assert table[0][-3:] == ["by generation", "by forced choice", "larger gap"]
    assert all(r[-2].startswith("`forced_choice` ") == (r[2] in fc) for r in table[1:])
    assert all(r[-2] == "—" for r in table[1:] if r[2] not in fc)


def test_nothing_answered_is_said_once_on_top_and_in_the_task(board):
    out, _ = board
    readme = (out / "README.md").read_text()
    top = readme.split("## Recall by context length")[0]
    assert f"**Nothing answered by generation** on [{SILENT}](#{SILENT}):" in top
    assert top.count("[") and "needle_multi](" not in top.split("Nothing answered")[1]
    section = readme.split(f"### {SILENT}\n", 1)[1].split("\n### ", 1)[0]
    assert f"**No model answered {SILENT} by generation**" in section
    assert "`smollm2-135m`" in section and "forced choice" in section
    others = readme.split("**No model answered")
    assert len(others) == 2  # only the silenced task


def test_run_summary_names_unanswered_tasks():
    assert doctest.testmod(unanswered).failed == 0
    rows = [{"task": "t", "model": m, "n": 4, "metrics": {"word_match": {"mean": 0.0},
                                                          "string_match_all": {"mean": 0.5},
                                                          "forced_choice": {"mean": 0.75}}}
            for m in ("a", "b")]
    assert unanswered.unanswered_tasks(rows) == {"t": "word_match"}
    rows[1]["metrics"]["word_match"]["mean"] = 0.25  # one model answered something
    assert unanswered.unanswered_tasks(rows) == {}


def test_gap_heatmaps_draw_the_other_metric_beside_the_primary(board, tmp_path, monkeypatch):
    """Each pair's panel in the primary metric, and beside it one in forced choice where the
    task has it (read back from the published gaps.csv, whose empty cells are NaN)."""
    from evalkit.leaderboard import plots

    out, samples = board
    cells = pd.read_csv(out / "gaps.csv")
    fc = _paired(samples, "forced_choice")
    drawn = []
    monkeypatch.setattr(plots, "_save", lambda fig, path: drawn.append(
        [ax.get_title() for ax in fig.axes if ax.get_title()]) or path)
    pair = f"{BASE} minus {MODEL}"
    for task in sorted(set(cells["task_label"])):
        assert plots.gap_heatmaps(cells, task, tmp_path / f"{task}.png") is not None
        expected = [f"{pair} (word_match)"] + ([f"{pair} (forced_choice)"] if task in fc else [])
        assert drawn.pop() == expected, task
    assert (out / "plots").is_dir() and list((out / "plots").glob("gap-*.png"))


def test_page_gap_table_shows_the_other_metric_beside_the_primary(board, browser):
    """The board page's gap table: the primary metric's gap, and its other metric's with the
    interval, as results.json's by-length gaps hold them."""
    from browser import errors, open_offline

    out, samples = board
    fc = set(_paired(samples, "forced_choice"))
    gaps = json.loads((out / "results.json").read_text())["gaps"]["by_length"]
    log = open_offline(browser, out / "index.html")
    head = browser.execute_script("return Array.from(document.querySelectorAll("
                                  "'#gap-table thead th')).map(th => th.dataset.key)")
    rows = browser.execute_script("return Array.from(document.querySelectorAll("
                                  "'#gap-table tbody tr')).map(tr => Array.from(tr.children)"
                                  ".map(td => td.textContent))")
    assert errors(log + browser.get_log("browser")) == []
    assert len(rows) == len(gaps) > 0
    col = {k: i for i, k in enumerate(head)}
    shown = {(r[col["task_label"]], r[col["target_length"]]): r for r in rows}
    for g in gaps:
        length = g["target_length"]
        r = shown[(g["task_label"], f"{length // 1024}K" if length % 1024 == 0 else str(length))]
        assert r[col["metric"]] == "word_match"
        other = r[col["other_gap"]]
        if g["task_label"] in fc:
            # JavaScript's toFixed rounds a binary half up where Python's format may not
            m = re.fullmatch(r"forced_choice ([+-]\d\.\d\d)( \*)? \[([+-]\d\.\d\d), ([+-]\d\.\d\d)\]",
                             other)
            assert m, other
            for text, value in ((m[1], g["other_gap"]), (m[3], g["other_ci_low"]),
                                (m[4], g["other_ci_high"])):
                assert abs(float(text) - value) <= 0.005 + 1e-9, (other, g)
            assert bool(m[2]) == (g["other_ci_low"] > 0 or g["other_ci_high"] < 0), other
        else:
            assert other == "-" and g["other_gap"] is None
    assert any(r[col["other_gap"]] != "-" for r in rows) and any(r[col["other_gap"]] == "-" for r in rows)
