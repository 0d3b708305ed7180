"""Drift reports: the same model on the same probes, run twice under different settings.

`compare_runs(RUN_A, RUN_B)` pairs the two runs' samples by (task, probe hash, question) for
each model, after checking that the models are the same (every identity field outside
SETTINGS agrees: weights, config, tokenizer, window...) and that both runs hold exactly the
same samples. It reports, with B - A as the sign convention:
- recall A, recall B and their paired difference with a paired bootstrap 95 % interval, over
  the pairs scored in both runs (per task and over all tasks);
- every answer that changed: correctness lost or gained, or a different wrong answer;
- mean and max |delta| of the gold answer's log-probability (the summed log-probability of
  the gold candidate, which the runner records first in `candidate_logprobs`);
- pairs not scored in both runs (an error or a flag on either side), listed with the reason.

The settings that differ (dtype, device, backend, package versions) head the report: they are
what a comparison is for. Anything else that differs is an error naming it.
"""
from __future__ import annotations

import json
import math
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from evalkit import __version__, scoring
from evalkit.bootstrap import DEFAULT_BOOTSTRAP, check_resamples, paired_bootstrap, seed_for
from evalkit.formatting import markdown_table, md_cell
from evalkit.leaderboard import compare_files
from evalkit.leaderboard.load import Run, load_run, read_samples

FORMAT = "evalkit-drift/1"
JSON_NAME, MD_NAME = "drift.json", "drift.md"
MD_MARKER = compare_files.marker(FORMAT)
DEFAULT_METRIC = scoring.ANSWER_METRIC
ALL = "all"  # the task label of the row pooled over every task

# Identity fields that are evaluation settings, not the model: they may differ.
SETTINGS = ("dtype", "state_dtype", "device", "pjrt_device", "backend", "compile", "compiled",
            "compile_backend", "batch_buckets", "length_buckets", "chunk_size", "prefill_segment",
            "prefill_chunk", "score_batch", "score_batch_bytes", "max_length", "options",
            "transformers", scoring.FORCED_CHOICE)  # the last: a model entry's metric switch
# Bookkeeping: derived from the rest (hash), or how the model was named (spec, name).
IGNORED = ("hash", "spec", "name")

Key = tuple[str, str, int]  # (task, probe_hash, question)


@dataclass
class Side:
    """One model's samples in one run."""
    run: Run
    model: str
    identity: dict[str, Any]
    samples: dict[Key, dict[str, Any]]


def _load(path: str | os.PathLike, which: str) -> tuple[Run, dict[str, dict[Key, dict]]]:
    try:
        run = load_run(path)
    except FileNotFoundError as e:
        raise FileNotFoundError(f"{which}: {e}") from None
    except ValueError as e:
        raise ValueError(f"{which}: {e}") from None
    by_model: dict[str, dict[Key, dict]] = {}
    for r in read_samples(run.path / "samples.jsonl"):
        by_model.setdefault(r["model"], {})[(r["task"], r["probe_hash"], int(r["question"]))] = r
    return run, by_model


def _pair_models(a: dict[str, Any], b: dict[str, Any]) -> list[tuple[str, str]]:
    """One model on each side pairs whatever its name; several pair by name."""
    if len(a) == 1 and len(b) == 1:
        return [(next(iter(a)), next(iter(b)))]
    if set(a) != set(b):
        raise ValueError(f"the runs hold different models: RUN_A {sorted(a)}, RUN_B {sorted(b)}"
                         f" (compare one model's runs, or runs of the same models; to compare "
                         f"two models question by question, name one of each with --models A,B)")
    return [(m, m) for m in sorted(a)]


def _short(v: Any) -> str:
    s = v if isinstance(v, str) else json.dumps(v, sort_keys=True)
    return s[:12] + "..." if isinstance(v, str) and len(v) == 64 else s  # a sha256: its head


def model_diffs(a: dict[str, Any], b: dict[str, Any]) -> list[str]:
    """The identity fields outside SETTINGS that differ: [] for one model under two settings."""
    keys = sorted(set(a) | set(b))
    return [k for k in keys if k not in SETTINGS and k not in IGNORED and a.get(k) != b.get(k)]


def setting_diffs(a: dict[str, Any], b: dict[str, Any], what: str) -> dict[str, list[Any]]:
    """{field: [A, B]} for the settings that differ; an error naming any model field that does."""
    keys = sorted(set(a) | set(b))
    model = model_diffs(a, b)
    if model:
        what_differs = "; ".join(f"{k}: {_short(a.get(k))} vs {_short(b.get(k))}" for k in model)
        raise ValueError(f"{what}: the models differ ({what_differs}); compare runs of the same "
                         f"model (same weights, architecture and tokenizer) under different "
                         f"settings; `evalkit compare` of two models' runs compares them "
                         f"question by question")
    return {k: [a.get(k), b.get(k)] for k in keys if k in SETTINGS and a.get(k) != b.get(k)}


def _describe(keys: list[Key], samples: dict[Key, dict]) -> str:
    probes = {(k[0], k[1]) for k in keys}
    shown = ", ".join(f"{samples[k]['task']} {samples[k]['probe_id']} q{k[2]}"
                      for k in sorted(keys)[:5])
    more = f" and {len(keys) - 5} more" if len(keys) > 5 else ""
    plural = lambda n, word: f"{n} {word}" + ("" if n == 1 else "s")  # noqa: E731
    return f"{plural(len(keys), 'sample')} ({plural(len(probes), 'probe')}): {shown}{more}"


def check_same_samples(a: Side, b: Side) -> None:
    """Both sides answered exactly the same (probe, question) pairs: never a partial pairing."""
    for x, y, nx, ny in ((a, b, "RUN_A", "RUN_B"), (b, a, "RUN_B", "RUN_A")):
        missing = [k for k in x.samples if k not in y.samples]
        if missing:
            raise ValueError(f"{ny} ({y.run.path}, model {y.model}) lacks {nx}'s "
                             f"{_describe(missing, x.samples)}; the runs must cover the same "
                             f"probes (same tasks, grid, seed and tokenizer)")


def gold_logprob(s: dict[str, Any]) -> float | None:
    """The gold candidate's log-probability (candidates list gold first), if scored."""
    lp, cands = s.get("candidate_logprobs") or [], s.get("candidates") or []
    return float(lp[0]) if len(cands) >= 2 and len(lp) == len(cands) else None


def _unscored_reason(s: dict[str, Any], metric: str) -> str | None:
    if s.get("error"):
        return f"error: {s['error']}"
    if s.get("flag"):
        return f"flag: {s['flag']}"
    if metric not in (s.get("scores") or {}):
        return f"no {metric} score"
    return None


def _finite(x: float) -> float | None:
    return x if x is not None and math.isfinite(x) else None


SUMMARY_FIELDS = ("task", "n_pairs", "recall_a", "recall_b", "delta", "ci_low", "ci_high", "lost",
                  "gained", "changed_answers", "n_logprob", "nonfinite_logprob",
                  "mean_abs_dlogprob", "max_abs_dlogprob")


def _summary(task: str, pairs: list[tuple[dict, dict]], metric: str, n_boot: int,
             seed: int) -> dict[str, Any]:
    sa = np.array([p[0]["scores"][metric] for p in pairs], float)
    sb = np.array([p[1]["scores"][metric] for p in pairs], float)
    lp = [(gold_logprob(x), gold_logprob(y)) for x, y in pairs]
    lp = [(x, y) for x, y in lp if x is not None and y is not None]
    dl = np.array([abs(y - x) for x, y in lp if math.isfinite(x) and math.isfinite(y)], float)
    lo, hi = paired_bootstrap(sb, sa, n_boot, seed)
    n = len(pairs)
    return {"task": task, "n_pairs": n,
            "recall_a": _finite(float(sa.mean())) if n else None,
            "recall_b": _finite(float(sb.mean())) if n else None,
            "delta": _finite(float((sb - sa).mean())) if n else None,
            "ci_low": _finite(lo), "ci_high": _finite(hi),
            "lost": int((sb < sa).sum()), "gained": int((sb > sa).sum()),
            "changed_answers": sum(x.get("prediction") != y.get("prediction") for x, y in pairs),
            "n_logprob": len(dl), "nonfinite_logprob": len(lp) - len(dl),
            "mean_abs_dlogprob": float(dl.mean()) if len(dl) else None,
            "max_abs_dlogprob": float(dl.max()) if len(dl) else None}


def _change(x: dict, y: dict, metric: str) -> dict[str, Any] | None:
    sa, sb = x["scores"][metric], y["scores"][metric]
    if sa == sb and x.get("prediction") == y.get("prediction"):
        return None
    kind = "lost" if sb < sa else "gained" if sb > sa else "changed"
    la, lb = gold_logprob(x), gold_logprob(y)
    return {"change": kind, "task": x["task"], "probe_id": x["probe_id"],
            "probe_hash": x["probe_hash"], "question": int(x["question"]), "kind": x["kind"],
            "target_length": x["target_length"], "depth": x["depth"], "load": x["load"],
            "gold": x["gold"], "prediction_a": x.get("prediction"),
            "prediction_b": y.get("prediction"), "score_a": sa, "score_b": sb,
            "gold_logprob_a": _finite(la), "gold_logprob_b": _finite(lb)}


def _run_info(run: Run) -> dict[str, Any]:
    return {"path": str(run.path), "run_id": run.run_id, "created": run.created.isoformat(),
            "evalkit_version": run.evalkit_version, "config_hash": run.config_hash}


def compare_sides(a: Side, b: Side, metric: str, n_boot: int, seed: int) -> dict[str, Any]:
    settings = setting_diffs(a.identity, b.identity,
                             f"{a.run.path} model {a.model} vs {b.run.path} model {b.model}")
    pa, pb = (s.run.provenance.get("packages") or {} for s in (a, b))
    for pkg in sorted(set(pa) | set(pb)):
        if pa.get(pkg) != pb.get(pkg):
            settings[f"package {pkg}"] = [pa.get(pkg), pb.get(pkg)]
    loads = [sorted({str(r.get("arrivals") or "none") for r in side.samples.values()})
             for side in (a, b)]
    if loads[0] != loads[1]:  # a loaded run against an unloaded one (batching is not exact)
        settings["arrivals"] = [", ".join(x) for x in loads]
    check_same_samples(a, b)
    by_task: dict[str, list[tuple[dict, dict]]] = {}
    changes, unscored = [], []
    for k in sorted(a.samples):
        x, y = a.samples[k], b.samples[k]
        ra, rb = _unscored_reason(x, metric), _unscored_reason(y, metric)
        if ra or rb:
            unscored.append({"task": x["task"], "probe_id": x["probe_id"], "question": k[2],
                             "reason_a": ra, "reason_b": rb})
            continue
        by_task.setdefault(k[0], []).append((x, y))
        c = _change(x, y, metric)
        if c:
            changes.append(c)
    label = a.model if a.model == b.model else f"{a.model} / {b.model}"
    rows = [_summary(t, p, metric, n_boot, seed_for(seed, label, t))
            for t, p in sorted(by_task.items())]
    if len(rows) != 1:  # the pooled row; with one task it would repeat that task's row
        every = [p for t in sorted(by_task) for p in by_task[t]]
        rows.append(_summary(ALL, every, metric, n_boot, seed_for(seed, label, ALL)))
    return {"model": label, "identity": {k: v for k, v in a.identity.items()
                                             if k not in SETTINGS and k != "hash"},
            "settings": settings, "n_samples": len(a.samples), "summary": rows,
            "changes": changes, "unscored": unscored}


def compare_runs(run_a: str | os.PathLike, run_b: str | os.PathLike,
                 metric: str = DEFAULT_METRIC, n_boot: int = DEFAULT_BOOTSTRAP,
                 seed: int = 0) -> dict[str, Any]:
    """The drift report of RUN_B against RUN_A (a JSON-ready dict)."""
    check_resamples(n_boot)
    ra, sa = _load(run_a, "RUN_A")
    rb, sb = _load(run_b, "RUN_B")
    if ra.path.resolve() == rb.path.resolve():
        raise ValueError(f"RUN_A and RUN_B are the same folder ({ra.path}); give two runs")
    metrics = {m for side in (sa, sb) for rows in side.values() for r in rows.values()
               for m in (r.get("scores") or {})}
    if metric not in metrics:
        raise ValueError(f"--metric {metric!r}: no sample of either run has it "
                         f"(metrics: {', '.join(sorted(metrics)) or 'none'})")
    comparisons = []
    for ma, mb in _pair_models(sa, sb):
        a = Side(ra, ma, ra.models.get(ma) or {}, sa[ma])
        b = Side(rb, mb, rb.models.get(mb) or {}, sb[mb])
        for side, which in ((a, "RUN_A"), (b, "RUN_B")):
            if not side.identity:
                raise ValueError(f"{which}: {side.run.path / 'results.json'}: no identity for "
                                 f"model {side.model!r} under 'models'")
        comparisons.append(compare_sides(a, b, metric, n_boot, seed))
    return {"format": FORMAT, "evalkit_version": __version__, "metric": metric,
            "bootstrap_resamples": n_boot, "bootstrap_seed": seed, "sign": "B - A",
            "run_a": _run_info(ra), "run_b": _run_info(rb), "comparisons": comparisons}


# -- rendering ----------------------------------------------------------------------------

def fmt_num(v: float | None, fmt: str = ".3f", signed: bool = False) -> str:
    return "-" if v is None else format(v, ("+" if signed else "") + fmt)


def _cell(v: Any) -> str:
    """A setting's value as one table cell: strings as they are, anything else as JSON."""
    return md_cell(v if isinstance(v, str) else json.dumps(v, sort_keys=True, ensure_ascii=False))


def summary_rows(report: dict[str, Any]) -> list[dict[str, Any]]:
    """One flat row per comparison x task (the table a leaderboard shows, and its CSV)."""
    out = []
    for c in report["comparisons"]:
        settings = "; ".join(f"{k}: {_cell(a)} -> {_cell(b)}" for k, (a, b) in
                             c["settings"].items() if not k.startswith("package ")
                             and k != "options") or "no setting differs"
        for r in c["summary"]:
            out.append({"model": c["model"], "settings": settings, "metric": report["metric"],
                        "run_a": report["run_a"]["path"], "run_b": report["run_b"]["path"],
                        **{k: r[k] for k in SUMMARY_FIELDS}})
    return out


def summary_table(rows: list[dict[str, Any]]) -> str:
    head = ["model", "settings (A -> B)", "task", "pairs", "recall A", "recall B",
            "delta recall (95 % CI)", "lost / gained", "answers changed",
            "mean |delta log p(gold)|", "max |delta log p(gold)|"]
    body = []
    for r in rows:
        ci = (f"{fmt_num(r['delta'], signed=True)} [{fmt_num(r['ci_low'], signed=True)}, "
              f"{fmt_num(r['ci_high'], signed=True)}]")
        cells = [r["model"], r["settings"], r["task"], str(r["n_pairs"]), fmt_num(r["recall_a"]),
                 fmt_num(r["recall_b"]), ci, f"{r['lost']} / {r['gained']}",
                 str(r["changed_answers"]), fmt_num(r["mean_abs_dlogprob"], ".3g"),
                 fmt_num(r["max_abs_dlogprob"], ".3g")]
        body.append(cells)
    return markdown_table(head, body) + "\n"


def render_markdown(report: dict[str, Any]) -> str:
    a, b = report["run_a"], report["run_b"]
    out = [MD_MARKER, "", f"# Drift: `{b['path']}` against `{a['path']}`", "",
           f"- A: `{a['path']}` (run {a['run_id']}, {a['created']})",
           f"- B: `{b['path']}` (run {b['run_id']}, {b['created']})",
           f"- recall = {report['metric']} over the pairs scored in both runs; delta = B - A "
           f"with a paired bootstrap 95 % interval ({report['bootstrap_resamples']} resamples, "
           f"seed {report['bootstrap_seed']}); log p(gold) = the summed log-probability of the "
           f"gold candidate", "", "## Summary", "", summary_table(summary_rows(report))]
    for c in report["comparisons"]:
        out += [f"## {c['model']}", "", "Settings that differ:", ""]
        if c["settings"]:
            out.append(markdown_table(["setting", "A", "B"], [[k, _cell(x), _cell(y)] for k, (x, y)
                                                               in c["settings"].items()]))
        else:
            out.append("none: the same identity and package versions.")
        out += ["", f"{c['n_samples']} samples paired; answers that changed "
                    f"({len(c['changes'])}):", ""]
        if c["changes"]:
            out.append(markdown_table(
                ["change", "task", "probe", "q", "gold", "A", "B", "log p(gold) A", "log p(gold) B"],
                [[d["change"], d["task"], d["probe_id"], d["question"], ", ".join(d["gold"]),
                  json.dumps(d["prediction_a"], ensure_ascii=False),
                  json.dumps(d["prediction_b"], ensure_ascii=False),
                  fmt_num(d["gold_logprob_a"], ".4f"), fmt_num(d["gold_logprob_b"], ".4f")]
                 for d in c["changes"]]))
        else:
            out.append("none.")
        if c["unscored"]:
            out += ["", f"Not scored in both runs, left out of the recall ({len(c['unscored'])}):",
                    "", markdown_table(["task", "probe", "q", "A", "B"],
                                       [[u["task"], u["probe_id"], u["question"],
                                         u["reason_a"] or "scored", u["reason_b"] or "scored"]
                                        for u in c["unscored"]])]
        out.append("")
    return "\n".join(out)


# -- files --------------------------------------------------------------------------------

def write_report(report: dict[str, Any], out: str | os.PathLike) -> list[Path]:
    """drift.json and drift.md in `out`, each atomically; a file of that name that compare
    did not write is never replaced."""
    return compare_files.write_report(report, out, fmt=FORMAT, json_name=JSON_NAME,
                                      md_name=MD_NAME, render_markdown=render_markdown)


def read_report(folder: str | os.PathLike) -> dict[str, Any]:
    """A drift report written by write_report (for `evalkit publish --compare DIR`)."""
    path = Path(folder) / JSON_NAME
    if not path.is_file():
        raise FileNotFoundError(f"--compare {folder}: no {JSON_NAME} (write one with "
                                f"`evalkit compare RUN_A RUN_B --out {folder}`)")
    try:
        doc = json.loads(path.read_text(encoding="utf-8"))
    except ValueError as e:
        raise ValueError(f"{path}: not valid JSON ({e})") from None
    if not isinstance(doc, dict) or doc.get("format") != FORMAT:
        raise ValueError(f"{path}: not a drift report (expected format {FORMAT!r})")
    for key in ("metric", "run_a", "run_b", "comparisons"):
        if key not in doc:
            raise ValueError(f"{path}: missing field {key!r}")
    return doc
