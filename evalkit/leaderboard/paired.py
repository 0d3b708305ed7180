"""Two different models on the same questions (`evalkit compare A B` when the models differ).

A drift report (drift.py) compares one model with itself under other settings; this compares
two models question by question, A the baseline. Samples pair on the logical question (task,
length, depth, load, probe seed, question), as the board's gaps do, so models with different
tokenizers pair too; the task's config must be the same in both runs. Per task x length and
per metric (the generated answer's, and forced choice's where the samples have it):
- the paired table: both right, only A, only B, neither ("right": a score of 1);
- McNemar's exact test on the discordant pairs (two-sided binomial, p = 1/2; scipy's
  binomtest): does one model get right what the other misses more often than chance?
- the gap A - B (what B loses against A, the board's sign) with a paired bootstrap 95 %
  interval (evalkit.bootstrap, the board's);
and every question only A got right, with the gold, each model's answer and, for forced
choice, each model's pick among the candidates.
"""
from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any, Sequence

import numpy as np
from scipy.stats import binomtest

from evalkit import __version__, scoring
from evalkit.bootstrap import DEFAULT_BOOTSTRAP, check_resamples, paired_bootstrap, seed_for
from evalkit.formatting import markdown_table, md_cell
from evalkit.leaderboard import compare_files
from evalkit.leaderboard.load import Run, load_run, read_samples

FORMAT = "evalkit-paired/1"
JSON_NAME, MD_NAME = "paired.json", "paired.md"
MD_MARKER = compare_files.marker(FORMAT)
KEY = ("task", "target_length", "depth", "load", "seed", "question")


def _load(path: str | os.PathLike, which: str) -> tuple[Run, list[dict[str, Any]]]:
    try:
        run = load_run(path)
    except FileNotFoundError as e:
        raise FileNotFoundError(f"{which}: {e}") from None
    except ValueError as e:
        raise ValueError(f"{which}: {e}") from None
    return run, read_samples(run.path / "samples.jsonl")


def two_models(run_a: str | os.PathLike, run_b: str | os.PathLike) -> bool:
    """Whether RUN_A and RUN_B each hold one model and the two differ (an identity field
    outside drift.SETTINGS: weights, architecture, tokenizer...): a comparison question by
    question, not a drift report. Unreadable runs answer False: drift names the problem."""
    from evalkit.leaderboard.drift import model_diffs

    try:
        res = [json.loads((Path(r) / "results.json").read_text(encoding="utf-8"))
               for r in (run_a, run_b)]
        ids = [r["models"] for r in res]
    except (OSError, ValueError, KeyError, TypeError):
        return False
    if not all(isinstance(m, dict) and len(m) == 1 for m in ids):
        return False
    (ia,), (ib,) = (list(m.values()) for m in ids)
    return isinstance(ia, dict) and isinstance(ib, dict) and bool(model_diffs(ia, ib))


def pick_model(run: Run, samples: list[dict], name: str | None, which: str) -> str:
    """The model of `run` to compare: `name`, or the run's only model."""
    models = sorted({s["model"] for s in samples})
    if name is not None:
        if name not in models:
            raise ValueError(f"{which} ({run.path}): no model {name!r} in its samples "
                             f"(models: {', '.join(models)})")
        return name
    if len(models) != 1:
        raise ValueError(f"{which} ({run.path}) holds {len(models)} models ({', '.join(models)}): "
                         f"name one of each run with --models A,B")
    return models[0]


def metrics_of(samples: Sequence[dict], metric: str | None) -> list[str]:
    """The metrics to compare: `metric` (default: the best-ranked generation metric the
    samples have for every question, as the board's recall) and each forced-choice metric."""
    have = {m for s in samples for m in (s.get("scores") or {})}
    if metric is not None:
        if metric not in have:
            raise ValueError(f"--metric {metric!r}: no sample has it (metrics: "
                             f"{', '.join(sorted(have)) or 'none'})")
        first = metric
    else:
        first = next((m for m in scoring.recall_preference() if m in have
                      and scoring.get(m).kind == scoring.GENERATION
                      and not scoring.get(m).question_kinds), None)
    out = [first] if first else []
    return out + [m.name for m in scoring.of_kind(scoring.FORCED_CHOICE)
                  if m.name in have and m.name not in out]


def mcnemar_p(only_a: int, only_b: int) -> float:
    """McNemar's exact two-sided p: the discordant pairs as a binomial with p = 1/2.

    >>> mcnemar_p(6, 0), mcnemar_p(3, 3), mcnemar_p(0, 0)
    (0.03125, 1.0, 1.0)
    """
    n = only_a + only_b
    return 1.0 if n == 0 else float(binomtest(only_a, n, 0.5).pvalue)


def _key(s: dict) -> tuple:
    return tuple(float(s[k]) if k == "depth" else s[k] for k in KEY)


def _scored(s: dict) -> bool:
    return s.get("error") is None and s.get("flag") is None


def _pick(s: dict) -> str | None:
    """The candidate forced choice picks (highest log-probability), if it scored one."""
    lp, cands = s.get("candidate_logprobs") or [], s.get("candidates") or []
    return cands[int(np.argmax(lp))] if len(cands) >= 2 and len(lp) == len(cands) else None


def _row(task: str, length: int | str, metric: str, pairs: list[tuple[dict, dict]],
         n_boot: int, seed: int) -> dict[str, Any]:
    a = np.array([x["scores"][metric] for x, _ in pairs], float)
    b = np.array([y["scores"][metric] for _, y in pairs], float)
    ra, rb = a >= 1.0, b >= 1.0
    lo, hi = paired_bootstrap(a, b, n_boot, seed)
    return {"task": task, "target_length": length, "metric": metric, "n_pairs": len(pairs),
            "both": int((ra & rb).sum()), "only_a": int((ra & ~rb).sum()),
            "only_b": int((~ra & rb).sum()), "neither": int((~ra & ~rb).sum()),
            "recall_a": float(a.mean()), "recall_b": float(b.mean()),
            "gap": float((a - b).mean()), "ci_low": lo, "ci_high": hi,
            "mcnemar_p": mcnemar_p(int((ra & ~rb).sum()), int((~ra & rb).sum()))}


def compare_models(run_a: str | os.PathLike, run_b: str | os.PathLike,
                   models: Sequence[str] | None = None, metric: str | None = None,
                   n_boot: int = DEFAULT_BOOTSTRAP, seed: int = 0) -> dict[str, Any]:
    """The paired report of model B against baseline A (a JSON-ready dict)."""
    check_resamples(n_boot)
    ra, sa = _load(run_a, "RUN_A")
    rb, sb = _load(run_b, "RUN_B")
    ma = pick_model(ra, sa, models[0] if models else None, "RUN_A")
    mb = pick_model(rb, sb, models[1] if models else None, "RUN_B")
    if ra.path.resolve() == rb.path.resolve() and ma == mb:
        raise ValueError(f"RUN_A and RUN_B are the same folder ({ra.path}) and the same model "
                         f"{ma!r}: give two runs, or two models of one run with --models A,B")
    a = {_key(s): s for s in sa if s["model"] == ma}
    b = {_key(s): s for s in sb if s["model"] == mb}
    for t in sorted({k[0] for k in a} & {k[0] for k in b}):
        ca, cb = ra.tasks[t]["config_hash"], rb.tasks[t]["config_hash"]
        if ca != cb:
            raise ValueError(f"task {t!r}: its config differs between the runs ({ca[:12]} in "
                             f"{ra.path}, {cb[:12]} in {rb.path}): its questions do not pair")
    keys = sorted(k for k in a if k in b)
    if not keys:
        raise ValueError(f"{ma} ({ra.path}) and {mb} ({rb.path}) answered no question in common "
                         f"(same task, length, depth, load and seed)")
    both = [(a[k], b[k]) for k in keys if _scored(a[k]) and _scored(b[k])]
    names = metrics_of([s for p in both for s in p], metric)
    rows, only_a = [], []
    for m in names:
        groups: dict[tuple, list[tuple[dict, dict]]] = {}
        for x, y in both:
            if m in x["scores"] and m in y["scores"]:
                groups.setdefault((x["task"], x["target_length"]), []).append((x, y))
        for (t, L), pairs in sorted(groups.items()):
            rows.append(_row(t, L, m, pairs, n_boot, seed_for(seed, ma, mb, t, L, m)))
            for x, y in pairs:
                if x["scores"][m] >= 1.0 > y["scores"][m]:
                    only_a.append({"metric": m, "task": t, "target_length": L,
                                   "depth": x["depth"], "load": x["load"],
                                   "probe_id": x["probe_id"], "question": x["question"],
                                   "gold": x["gold"], "answer_a": x.get("prediction"),
                                   "answer_b": y.get("prediction"),
                                   **({"pick_a": _pick(x), "pick_b": _pick(y)}
                                      if scoring.get(m).kind == scoring.FORCED_CHOICE else {})})
    order = {m: i for i, m in enumerate(names)}  # per task x length, the metrics side by side
    rows.sort(key=lambda r: (r["task"], r["target_length"], order[r["metric"]]))
    only_a.sort(key=lambda d: (d["task"], d["target_length"], order[d["metric"]], d["depth"],
                               d["load"], d["probe_id"], d["question"]))
    unpaired = len(set(a) ^ set(b))
    return {"format": FORMAT, "evalkit_version": __version__, "sign": "A - B",
            "bootstrap_resamples": n_boot, "bootstrap_seed": seed,
            "a": {"path": str(ra.path), "run_id": ra.run_id, "model": ma},
            "b": {"path": str(rb.path), "run_id": rb.run_id, "model": mb},
            "n_questions": len(keys), "n_scored_in_both": len(both),
            "n_unpaired": unpaired, "metrics": names, "rows": rows, "only_a": only_a}


# -- rendering ----------------------------------------------------------------------------

def _p(p: float) -> str:
    return f"{p:.2g}" if p < 0.01 else f"{p:.2f}"


def table_rows(report: dict[str, Any]) -> list[list[str]]:
    return [[r["task"], f"{r['target_length']:,}", r["metric"], str(r["n_pairs"]), str(r["both"]),
             str(r["only_a"]), str(r["only_b"]), str(r["neither"]),
             f"{r['recall_a']:.2f}", f"{r['recall_b']:.2f}",
             f"{r['gap']:+.2f} [{r['ci_low']:+.2f}, {r['ci_high']:+.2f}]"
             + (" *" if r["ci_low"] > 0 or r["ci_high"] < 0 else ""), _p(r["mcnemar_p"])]
            for r in report["rows"]]


HEADER = ["task", "length (tok)", "metric", "pairs", "both right", "only A", "only B", "neither",
          "A", "B", "gap A - B [95 % CI]", "McNemar p"]


def render_markdown(report: dict[str, Any]) -> str:
    a, b = report["a"], report["b"]
    out = [MD_MARKER, "", f"# {b['model']} against {a['model']}, question by question", "",
           f"- A (baseline): {a['model']} in `{a['path']}` (run {a['run_id']})",
           f"- B: {b['model']} in `{b['path']}` (run {b['run_id']})",
           f"- {report['n_questions']} questions in both runs, {report['n_scored_in_both']} "
           f"scored in both (the rest failed or were flagged on a side); "
           f"{report['n_unpaired']} asked in one run only, left out",
           "- right: a score of 1; gap = A - B (what B loses) with a paired bootstrap 95 % "
           f"interval ({report['bootstrap_resamples']} resamples, seed "
           f"{report['bootstrap_seed']}), `*` where it excludes 0; McNemar p: exact two-sided, "
           "over the questions only one model got right", "",
           markdown_table(HEADER, table_rows(report)), ""]
    out += [f"## Only {a['model']} (A) right ({len(report['only_a'])})", ""]
    if report["only_a"]:
        rows = [[d["metric"], d["task"], f"{d['target_length']:,}", f"{d['depth']:g}",
                 str(d["load"]), d["probe_id"], str(d["question"]), md_cell(", ".join(d["gold"])),
                 md_cell(json.dumps(d["answer_a"], ensure_ascii=False)),
                 md_cell(json.dumps(d["answer_b"], ensure_ascii=False)),
                 md_cell(d.get("pick_a") or ""), md_cell(d.get("pick_b") or "")]
                for d in report["only_a"]]
        out.append(markdown_table(["metric", "task", "length", "depth", "load", "probe", "q",
                                   "gold", "A's answer", "B's answer", "A's pick", "B's pick"],
                                  rows))
    else:
        out.append("none.")
    return "\n".join(out) + "\n"


def write_report(report: dict[str, Any], out: str | os.PathLike) -> list[Path]:
    """paired.json and paired.md in `out`, each atomically; a file of that name that compare
    did not write is never replaced."""
    return compare_files.write_report(report, out, fmt=FORMAT, json_name=JSON_NAME,
                                      md_name=MD_NAME, render_markdown=render_markdown)
