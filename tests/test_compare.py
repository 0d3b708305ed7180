"""`evalkit compare` (issue 13): drift reports between two runs of one model.

Real runs: recall-gla-tiny in fp32 and in bf16 on a few small needle and multikey probes, and
the oracle / forgetful reference adapters on a small needle grid. Flips and the interval are
checked against a hand computation over the paired samples read from samples.jsonl with plain
Python; flips that real bf16 does not produce at these sizes are made by editing a copy of the
bf16 run, as a rerun that answered differently would have written it.
"""
from __future__ import annotations

import json
import math
import re
import shutil
from pathlib import Path

import numpy as np
import pytest

from evalkit.bootstrap import seed_for
from evalkit.leaderboard.drift import JSON_NAME, MD_NAME, compare_runs, read_report, write_report

from helpers import restamp

GRID = [{"name": "needle", "lengths": [512], "depths": [0.2, 0.8], "samples": 2},
        {"name": "multikey", "lengths": [512], "loads": [4], "depths": [0.5], "samples": 2}]
NEEDLE = [{"name": "needle", "lengths": [256], "depths": [0.5], "samples": 2}]


def _run(out: Path, models: list, tasks: list) -> Path:
    from evalkit.runner import resolve, run_suite
    from evalkit.runner.suite import validate

    suite = {"name": "cmptest", "models": models, "tasks": tasks, "seed": 0}
    res = run_suite(resolve(validate(suite, "test"), "test"), output=out, progress=False)
    assert (res.run_dir / "DONE").exists() and res.failed == 0
    return res.run_dir


@pytest.fixture(scope="module")
def runs(tmp_path_factory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("cmpruns")
    gla = lambda dtype: [{"name": "recall-gla-tiny", "options": {"dtype": dtype}}]  # noqa: E731
    return {
        "fp32": _run(root / "fp32", gla("fp32"), GRID),
        "bf16": _run(root / "bf16", gla("bf16"), GRID),
        "oracle": _run(root / "oracle", ["oracle"], NEEDLE),
        "oracle_more": _run(root / "oracle_more", ["oracle"],
                            [{**NEEDLE[0], "depths": [0.5, 0.9]}]),
        "forgetful": _run(root / "forgetful", [{"name": "forgetful", "options": {"capacity": 64}}],
                          NEEDLE),
        "both": _run(root / "both", ["oracle", "forgetful"], NEEDLE),
    }


def samples_of(run: Path) -> list[dict]:
    return [json.loads(line) for line in (run / "samples.jsonl").read_text().splitlines()]


def copy_run(src: Path, dst: Path, edit) -> Path:
    shutil.copytree(src, dst, ignore=shutil.ignore_patterns("cache"))
    rows = [edit(i, s) for i, s in enumerate(samples_of(dst))]
    (dst / "samples.jsonl").write_text("".join(json.dumps(s) + "\n" for s in rows if s))
    res = json.loads((dst / "results.json").read_text())
    res["run_id"] = dst.name
    (dst / "results.json").write_text(json.dumps(res))
    return restamp(dst)


def hand_stats(a_run: Path, b_run: Path, model: str, n_boot: int = 2000, seed: int = 0):
    """Per task: paired exact-match differences (B - A), the bootstrap interval drawn by hand
    in the documented pair order (probe hash, question), and |delta| of the gold log-prob."""
    key = lambda s: (s["task"], s["probe_hash"], s["question"])  # noqa: E731
    a = {key(s): s for s in samples_of(a_run)}
    b = {key(s): s for s in samples_of(b_run)}
    ok = lambda s: s["error"] is None and s["flag"] is None  # noqa: E731
    out = {}
    for task in sorted({k[0] for k in a}):
        keys = sorted(k for k in a if k[0] == task and ok(a[k]) and ok(b[k]))
        d = np.array([b[k]["scores"]["exact_match"] - a[k]["scores"]["exact_match"]
                      for k in keys])
        rng = np.random.default_rng(seed_for(seed, model, task))
        means = d[rng.integers(0, len(d), size=(n_boot, len(d)))].mean(axis=1)
        lo, hi = np.percentile(means, [2.5, 97.5])
        dl = [abs(b[k]["candidate_logprobs"][0] - a[k]["candidate_logprobs"][0]) for k in keys]
        dl = [x for x in dl if math.isfinite(x)]
        out[task] = dict(n=len(keys), delta=d.mean(), lo=lo, hi=hi,
                         lost=int((d < 0).sum()), gained=int((d > 0).sum()),
                         mean_dl=sum(dl) / len(dl), max_dl=max(dl))
    return out


def row(report: dict, task: str, i: int = 0) -> dict:
    return next(r for r in report["comparisons"][i]["summary"] if r["task"] == task)


# -- real fp32 vs bf16 -----------------------------------------------------------------------

def test_fp32_vs_bf16_matches_hand_computation(runs, tmp_path):
    rep = compare_runs(runs["fp32"], runs["bf16"])
    (c,) = rep["comparisons"]
    assert c["model"] == "recall-gla-tiny"
    assert c["settings"]["dtype"] == ["fp32", "bf16"]
    assert set(c["settings"]) == {"dtype", "options"}  # the same packages: one process
    assert c["identity"]["weights_hash"] and "dtype" not in c["identity"]
    assert c["n_samples"] == 6 and not c["unscored"]
    hand = hand_stats(runs["fp32"], runs["bf16"], "recall-gla-tiny")
    for task, h in hand.items():
        r = row(rep, task)
        assert r["n_pairs"] == h["n"]
        assert r["delta"] == pytest.approx(h["delta"])
        assert (r["ci_low"], r["ci_high"]) == pytest.approx((h["lo"], h["hi"]))
        assert (r["lost"], r["gained"]) == (h["lost"], h["gained"])
        assert r["mean_abs_dlogprob"] == pytest.approx(h["mean_dl"])
        assert r["max_abs_dlogprob"] == pytest.approx(h["max_dl"])
        assert 0 < r["max_abs_dlogprob"] < 1.0  # bf16 moves log-probs, but not wildly
    assert row(rep, "all")["n_pairs"] == 6
    # Every answer whose text differs is listed, and nothing else.
    a, b = samples_of(runs["fp32"]), samples_of(runs["bf16"])
    differ = {(x["probe_id"], x["question"]) for x, y in zip(a, b)
              if x["prediction"] != y["prediction"]}
    assert {(d["probe_id"], d["question"]) for d in c["changes"]} == differ

    paths = write_report(rep, tmp_path / "drift")
    assert [p.name for p in paths] == [JSON_NAME, MD_NAME]
    assert read_report(tmp_path / "drift") == json.loads(json.dumps(rep))
    md = (tmp_path / "drift" / MD_NAME).read_text()
    assert "| dtype | fp32 | bf16 |" in md and "| recall-gla-tiny | dtype: fp32 -> bf16 |" in md


def test_flips_and_unscored_by_hand(runs, tmp_path):
    base = samples_of(runs["bf16"])
    flip = {0, 3}                          # a needle and a multikey sample: correctness flips
    broken, inf = 1, 4                     # one failed sample, one -inf gold log-prob

    def edit(i, s):
        if i in flip:
            right = s["scores"]["exact_match"] == 0.0
            s["prediction"] = " " + s["gold"][0] if right else " 0"
            s["scores"] = {**s["scores"], "exact_match": 1.0 if right else 0.0}
        if i == broken:
            s.update(prediction=None, scores={}, candidate_logprobs=[],
                     error="RuntimeError: boom (at x.py:1)")
        if i == inf:
            s["candidate_logprobs"][0] = float("-inf")
        return s
    b = copy_run(runs["bf16"], tmp_path / "edited", edit)
    rep = compare_runs(runs["fp32"], b, n_boot=500, seed=4)
    (c,) = rep["comparisons"]
    hand = hand_stats(runs["fp32"], b, "recall-gla-tiny", n_boot=500, seed=4)
    a = samples_of(runs["fp32"])
    expect = {}
    for i in flip:
        lost = a[i]["scores"]["exact_match"] == 1.0
        expect[(base[i]["probe_id"], base[i]["question"])] = "lost" if lost else "gained"
    got = {(d["probe_id"], d["question"]): d["change"] for d in c["changes"]
           if d["change"] != "changed"}
    assert got == expect
    assert sum(h["lost"] + h["gained"] for h in hand.values()) == len(flip)
    for task, h in hand.items():
        r = row(rep, task)
        assert r["n_pairs"] == h["n"] and r["delta"] == pytest.approx(h["delta"])
        assert (r["ci_low"], r["ci_high"]) == pytest.approx((h["lo"], h["hi"]))
        assert r["ci_low"] <= r["delta"] <= r["ci_high"]
        assert (r["lost"], r["gained"]) == (h["lost"], h["gained"])
        assert r["max_abs_dlogprob"] == pytest.approx(h["max_dl"])
    assert row(rep, base[inf]["task"])["nonfinite_logprob"] == 1
    assert c["unscored"] == [{"task": base[broken]["task"], "probe_id": base[broken]["probe_id"],
                              "question": base[broken]["question"], "reason_a": None,
                              "reason_b": "error: RuntimeError: boom (at x.py:1)"}]
    assert row(rep, "all")["n_pairs"] == 5
    write_report(rep, tmp_path / "out")
    text = (tmp_path / "out" / JSON_NAME).read_text()
    assert "Infinity" not in text and "NaN" not in text


def test_same_models_pair_by_name(runs):
    twin = copy_run(runs["both"], runs["both"].parent / "both-again", lambda i, s: s)
    rep = compare_runs(runs["both"], twin)
    assert [c["model"] for c in rep["comparisons"]] == ["forgetful", "oracle"]
    for c in rep["comparisons"]:
        assert c["settings"] == {} and c["changes"] == [] and c["n_samples"] == 2
        assert row(rep, "needle", rep["comparisons"].index(c))["ci_low"] == 0.0


# -- bad input ---------------------------------------------------------------------------------

def test_different_models_are_an_error(runs):
    with pytest.raises(ValueError, match=r"the models differ \(capacity: null vs 64; .*"
                                         r"weights_hash: "):
        compare_runs(runs["oracle"], runs["forgetful"])
    with pytest.raises(ValueError, match=r"the models differ \(.*config_hash"):
        compare_runs(runs["fp32"], runs["oracle"])
    with pytest.raises(ValueError, match=r"different models: RUN_A \['forgetful', 'oracle'\], "
                                         r"RUN_B \['oracle'\]"):
        compare_runs(runs["both"], runs["oracle"])


def test_different_probes_are_an_error(runs, tmp_path):
    with pytest.raises(ValueError, match=r"RUN_A \(.*oracle, model oracle\) lacks RUN_B's "
                                         r"2 samples \(2 probes\): needle needle-L256-d0\.9"):
        compare_runs(runs["oracle"], runs["oracle_more"])
    with pytest.raises(ValueError, match=r"RUN_B \(.*oracle, model oracle\) lacks RUN_A's "
                                         r"2 samples"):
        compare_runs(runs["oracle_more"], runs["oracle"])
    # One sample short (a run whose line was lost): named, never a partial pairing.
    short = copy_run(runs["bf16"], tmp_path / "short", lambda i, s: None if i == 5 else s)
    gone = samples_of(runs["bf16"])[5]
    with pytest.raises(ValueError, match=rf"lacks RUN_A's 1 sample \(1 probe\): "
                                         rf"{gone['task']} {gone['probe_id']} q0;"):
        compare_runs(runs["fp32"], short)


def test_missing_or_unfinished_runs_are_named(runs, tmp_path):
    with pytest.raises(FileNotFoundError, match=r"RUN_B: .*nowhere: no such run folder"):
        compare_runs(runs["oracle"], tmp_path / "nowhere")
    partial = copy_run(runs["oracle"], tmp_path / "partial", lambda i, s: s)
    (partial / "DONE").unlink()
    with pytest.raises(ValueError, match=r"RUN_A: .*partial: incomplete run \(no DONE marker\)"):
        compare_runs(partial, runs["oracle"])
    with pytest.raises(ValueError, match=r"same folder"):
        compare_runs(runs["oracle"], runs["oracle"])
    with pytest.raises(ValueError, match=r"--metric 'bleu': no sample of either run has it "
                                         r"\(metrics: contains, exact_match"):
        compare_runs(runs["fp32"], runs["bf16"], metric="bleu")
    with pytest.raises(ValueError, match=r"--bootstrap must be between 100 and 100,000"):
        compare_runs(runs["fp32"], runs["bf16"], n_boot=10)


def test_output_files_it_did_not_write_are_kept(runs, tmp_path):
    rep = compare_runs(runs["fp32"], runs["bf16"])
    out = tmp_path / "mine"
    out.mkdir()
    (out / MD_NAME).write_text("my notes\n")
    (out / "other.txt").write_text("keep\n")
    with pytest.raises(ValueError, match=r"mine/drift\.md: not written by evalkit compare; "
                                         r"evalkit compare never replaces or removes"):
        write_report(rep, out)
    assert (out / MD_NAME).read_text() == "my notes\n" and not (out / JSON_NAME).exists()
    (out / MD_NAME).unlink()
    write_report(rep, out)
    write_report(rep, out)  # its own files: replaced
    assert (out / "other.txt").read_text() == "keep\n"
    (tmp_path / "file").write_text("x")
    with pytest.raises(ValueError, match=r"exists and is not a folder"):
        write_report(rep, tmp_path / "file")


# -- command line and publish ------------------------------------------------------------------

def test_cli_compare_and_publish(runs, tmp_path, capsys):
    from evalkit.cli import main

    out = tmp_path / "drift"
    assert main(["compare", str(runs["fp32"]), str(runs["bf16"]), "--out", str(out),
                 "--bootstrap", "500"]) == 0
    printed = capsys.readouterr().out
    assert "recall-gla-tiny [dtype: fp32 -> bf16] all: 6 pairs" in printed
    before = (out / JSON_NAME).read_bytes()
    assert main(["compare", str(runs["both"]), str(runs["oracle"]), "--out", str(out)]) == 2
    assert "name one of each with --models A,B" in capsys.readouterr().err
    assert (out / JSON_NAME).read_bytes() == before  # a failed compare leaves the report as it was

    lb = tmp_path / "lb"
    assert main(["publish", str(runs["fp32"]), "--to", str(lb), "--bootstrap", "200",
                 "--compare", str(out)]) == 0
    rep = read_report(out)
    assert json.loads((lb / "drift.json").read_text()) == {"reports": [rep]}
    csv = (lb / "drift.csv").read_text().splitlines()
    assert csv[0].startswith("model,settings,metric,run_a,run_b,task,n_pairs,recall_a")
    assert len(csv) == 1 + len(rep["comparisons"][0]["summary"])
    readme = (lb / "README.md").read_text()
    assert "## Numerical drift" in readme and f"--compare {out}" in readme
    assert "| recall-gla-tiny | dtype: fp32 -> bf16 | all | 6 |" in readme

    capsys.readouterr()
    assert main(["publish", str(runs["fp32"]), "--to", str(lb), "--compare",
                 str(tmp_path / "nothing")]) == 2
    assert "no drift.json" in capsys.readouterr().err
    assert (lb / "drift.json").exists()  # the previous leaderboard is untouched


# -- two different models, question by question ----------------------------------------------

def _right(s: dict, metric: str) -> bool:
    return s["scores"][metric] >= 1.0


def _by_question(samples: list[dict]) -> dict[tuple, dict]:
    return {(s["task"], s["target_length"], s["depth"], s["load"], s["seed"], s["question"]): s
            for s in samples}


def _check_by_hand(rep: dict, a: dict[tuple, dict], b: dict[tuple, dict], n_boot: int) -> list:
    """The report's table against plain Python; returns the (metric, key) pairs only A got."""
    assert set(a) == set(b) and rep["n_scored_in_both"] == len(a)
    assert rep["metrics"] == ["word_match", "forced_choice"]
    assert [(r["task"], r["metric"]) for r in rep["rows"]] == [("needle", "word_match"),
                                                               ("needle", "forced_choice")]
    ma, mb = rep["a"]["model"], rep["b"]["model"]
    for r in rep["rows"]:
        m, keys = r["metric"], sorted(a)
        counts = [sum(_right(a[k], m) == x and _right(b[k], m) == y for k in keys)
                  for x, y in ((True, True), (True, False), (False, True), (False, False))]
        assert [r["both"], r["only_a"], r["only_b"], r["neither"]] == counts
        n, k = counts[1] + counts[2], min(counts[1], counts[2])
        p = min(1.0, 2 * sum(math.comb(n, i) for i in range(k + 1)) / 2 ** n) if n else 1.0
        assert r["mcnemar_p"] == pytest.approx(p)
        d = np.array([a[k]["scores"][m] - b[k]["scores"][m] for k in keys])
        rng = np.random.default_rng(seed_for(0, ma, mb, "needle", 256, m))
        means = d[rng.integers(0, len(d), size=(n_boot, len(d)))].mean(axis=1)
        assert (r["gap"], r["ci_low"], r["ci_high"]) == pytest.approx(
            (d.mean(), *np.percentile(means, [2.5, 97.5])))
    lost = [(m, k) for m in rep["metrics"] for k in sorted(a)
            if _right(a[k], m) and not _right(b[k], m)]
    assert [(d["metric"], d["probe_id"], d["question"]) for d in rep["only_a"]] == \
        [(m, a[k]["probe_id"], k[5]) for m, k in lost]
    for d in rep["only_a"]:
        k = next(k for k in a if a[k]["probe_id"] == d["probe_id"] and k[5] == d["question"])
        assert (d["gold"], d["answer_a"], d["answer_b"]) == \
            (a[k]["gold"], a[k]["prediction"], b[k]["prediction"])
    return lost


def test_two_models_question_by_question_by_hand(runs, tmp_path, capsys):
    """oracle (A, the baseline) against forgetful with 64 entries (B): the paired table, McNemar's
    exact p and the bootstrap interval recomputed from samples.jsonl with plain Python, and every
    question only the oracle got right listed with its gold and both answers; from two runs of
    one model each, and from one run holding both (--models)."""
    from evalkit.cli import main
    from evalkit.leaderboard.paired import JSON_NAME as PJSON, MD_NAME as PMD

    out = tmp_path / "pair"
    assert main(["compare", str(runs["oracle"]), str(runs["forgetful"]), "--out", str(out),
                 "--bootstrap", "500"]) == 0
    printed = capsys.readouterr().out
    rep = json.loads((out / PJSON).read_text())
    lost = _check_by_hand(rep, _by_question(samples_of(runs["oracle"])),
                          _by_question(samples_of(runs["forgetful"])), 500)
    assert lost, "forgetful with 64 entries forgets some needle"
    md = (out / PMD).read_text()
    assert f"## Only oracle (A) right ({len(lost)})" in md
    assert "| needle | 256 | word_match |" in printed and str(out / PMD) in printed

    one = tmp_path / "pair-one"
    assert main(["compare", str(runs["both"]), str(runs["both"]), "--models", "oracle,forgetful",
                 "--out", str(one), "--bootstrap", "500"]) == 0
    again = json.loads((one / PJSON).read_text())
    both = samples_of(runs["both"])
    assert (again["a"]["model"], again["b"]["model"]) == ("oracle", "forgetful")
    _check_by_hand(again, _by_question([s for s in both if s["model"] == "oracle"]),
                   _by_question([s for s in both if s["model"] == "forgetful"]), 500)


def test_two_models_bad_input_is_named(runs, tmp_path, capsys):
    from evalkit.cli import main

    out = tmp_path / "p"
    for argv, msg in (
            ([str(runs["both"]), str(runs["both"]), "--models", "oracle,oracle"],
             "the same folder .* and the same model 'oracle'"),
            ([str(runs["both"]), str(runs["both"]), "--models", "oracle"], "expected A,B"),
            ([str(runs["both"]), str(runs["both"]), "--models", "oracle,nope"],
             "RUN_B .*: no model 'nope' in its samples \\(models: forgetful, oracle\\)"),
            ([str(runs["oracle"]), str(runs["fp32"])],
             "answered no question in common"),
            ([str(runs["oracle"]), str(runs["forgetful"]), "--metric", "bleu"],
             "--metric 'bleu': no sample has it")):
        assert main(["compare", *argv, "--out", str(out)]) == 2
        assert re.search(msg, capsys.readouterr().err), msg
    assert not out.exists()  # nothing written by a refused comparison
