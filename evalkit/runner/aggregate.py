"""results.json: per-cell aggregates of samples, plus the run-level summary.

One row per model x task x target_length x depth x load (the grid cell of each sample's probe).
Every number follows evalkit.cell_stats, the definition the leaderboard uses too:
- n: samples attempted: answered, or failed; n_failed counts the failed among them, and
  n_flagged the samples not attempted (flagged: over the model's length, a fact in its
  sinks), so the cell holds n + n_flagged samples.
- metrics: {metric: {mean, lo, hi, n, answered}}: a failure is a miss (cell_stats.miss_scores:
  0 in every metric its answer would have had), so mean is over the attempted samples that
  have the metric (a forced-choice metric needs two candidates); answered: the mean over the
  answered ones alone (None if none was). [lo, hi] is a 95 % Wilson interval over the n
  values. A metric name not registered in evalkit.scoring is an error. A per_probe metric
  (Zoology's MQAR accuracy) is averaged per probe first: its mean is over its probes' means,
  n_probes counts them, and [lo, hi] is a percentile bootstrap over the probes (None for one).
- prompt_tokens, prompt_chars: means over every sample of the cell.
- state_bytes: mean over answered samples, rounded to whole bytes; state_kind: the adapter's.
- by_kind: the same metric means split by question kind (recall, latest, ...).
Sums use math.fsum over samples in a fixed order, so equal samples give bit-equal results.
Timestamps (TIMESTAMP_KEYS) are the only fields that differ between equal runs.
"""
from __future__ import annotations

import math
from collections import defaultdict
from typing import Any, Iterable, Sequence

from evalkit import scoring
from evalkit.cell_stats import counted, mean_ci, metric_values, miss_scores, per_probe
from evalkit.result import SampleResult
from evalkit.runner.plan import savings_ratio

TIMESTAMP_KEYS = frozenset({"created", "started", "finished", "resumed"})


def metric_summary(samples: Sequence[SampleResult],
                   forced_choice: bool = True) -> dict[str, dict[str, Any]]:
    """{metric: {mean, lo, hi, n, answered}} by evalkit.cell_stats over the attempted
    `samples` (a failed one a miss); a per_probe metric adds n_probes."""
    scored = [(s, cell_scores(s, forced_choice)) for s in samples]
    names = sorted({m for _, sc in scored for m in sc})
    out: dict[str, dict[str, Any]] = {}
    for m in names:
        pairs = [(s.probe_hash, sc[m]) for s, sc in scored if m in sc]
        vals = metric_values(m, pairs)
        mean, lo, hi = mean_ci(vals, per_probe(m))
        got = metric_values(m, [(s.probe_hash, sc[m]) for s, sc in scored
                                if m in sc and s.error is None])
        out[m] = {"mean": mean, "lo": lo, "hi": hi, "n": len(pairs),
                  "answered": mean_ci(got, per_probe(m))[0] if got else None}
        if per_probe(m):
            out[m]["n_probes"] = len(vals)
    return out


def cell_scores(s: SampleResult, forced_choice: bool = True) -> dict[str, float]:
    """What a sample counts with in its cell: its scores, or a failure's misses."""
    if s.error is None:
        return s.scores
    return miss_scores(s.kind, len(s.candidates or ()), forced_choice)


def scored(s: SampleResult) -> bool:
    return s.error is None and s.flag is None


def rows(samples: Iterable[SampleResult], tasks: dict[str, dict],
         models: dict[str, dict] | None = None) -> list[dict[str, Any]]:
    """Aggregate rows in first-seen cell order (samples arrive in suite order). `models`:
    results.json's, for each model's forced_choice (on unless it says false)."""
    cells: dict[tuple, list[SampleResult]] = defaultdict(list)
    for s in samples:
        cells[(s.model, s.task, s.target_length, s.depth, s.load)].append(s)
    out = []
    for (model, task, length, depth, load), cell in cells.items():
        fc = scoring.scores_forced_choice((models or {}).get(model))
        tried = [s for s in cell if counted(s.error, s.flag)]
        ok = [s for s in cell if scored(s)]
        scoring.check_names({m for s in ok for m in s.scores}, f"scores of {model} on {task}")
        kinds = sorted({s.kind for s in tried})
        out.append({
            "model": model, "model_hash": cell[0].model_hash, "task": task,
            "task_version": cell[0].task_version,
            "task_config_hash": tasks.get(task, {}).get("config_hash", ""),
            "target_length": length, "depth": depth, "load": load,
            "n": len(tried), "n_failed": sum(s.error is not None for s in cell),
            "n_flagged": sum(s.error is None and s.flag is not None for s in cell),
            "metrics": metric_summary(tried, fc),
            "by_kind": {k: {"n": sum(s.kind == k for s in tried),
                            "metrics": metric_summary([s for s in tried if s.kind == k], fc)}
                        for k in kinds},
            "prompt_tokens": math.fsum(s.prompt_tokens for s in cell) / len(cell),
            "prompt_chars": math.fsum(s.prompt_chars for s in cell) / len(cell),
            # None (unknown: a served model without a config), never a made-up 0; 0 where
            # nothing was answered (as results.json always had it)
            "state_bytes": (None if any(s.state_bytes is None for s in ok) else
                            round(math.fsum(s.state_bytes for s in ok) / len(ok))) if ok else 0,
            "state_kind": next((s.state_kind for s in cell if s.state_kind), ""),
        })
    return out


def summary(samples: Sequence[SampleResult]) -> dict[str, Any]:
    flags: dict[str, int] = defaultdict(int)
    for s in samples:
        if s.error is None and s.flag is not None:
            flags[s.flag] += 1
    return {"samples": len(samples), "scored": sum(scored(s) for s in samples),
            "failed": sum(s.error is not None for s in samples),
            "flagged": sum(flags.values()), "flags": dict(sorted(flags.items()))}


def prefill_block(pairs: Sequence[dict], samples: Iterable[SampleResult] = ()) -> dict[str, Any]:
    """The run's prefill figures, per (model, task) pair and in all; savings_ratio as
    plan.savings_ratio defines it.

    In process, a pair's tokens_prefilled is its plan's (plan.build_plan: each shared prefix
    once). A served pair's ("served": true) is the sum of its samples' `tokens_sent`: the
    greedy prompt and each scoring prompt, each prefilled whole by the server (a prefix cache
    may reuse some, which the client cannot see), so its ratio is below 1 when forced choice
    sends the context once per candidate; `requests` beside it, and `uncounted`: answered
    samples without a count (from a run before it was kept). "served" sums the served pairs
    (absent without any)."""
    sent: dict[tuple, list[int]] = defaultdict(lambda: [0, 0, 0])
    for s in samples:
        got = sent[(s.model, s.task)]
        if s.tokens_sent is None:  # nothing sent (flagged, failed first), or from before
            got[2] += scored(s)
        else:
            got[0] += s.tokens_sent
            got[1] += s.requests or 0
    by_pair = []
    for p in pairs:
        if p.get("served"):
            tokens, requests, uncounted = sent[(p["model"], p["task"])]
            p = {**p, "tokens_prefilled": tokens, "requests": requests, "uncounted": uncounted}
        by_pair.append(p)
    tokens = sum(p["tokens_prefilled"] for p in by_pair)
    prompt = sum(p["prompt_tokens"] for p in by_pair)
    served = [p for p in by_pair if p.get("served")]
    return {"tokens_prefilled": tokens, "prompt_tokens": prompt,
            "savings_ratio": savings_ratio(prompt, tokens),
            "saved_fraction": 1 - tokens / prompt if prompt else 0.0,
            **({"served": {k: sum(p[k] for p in served) for k in
                           ("tokens_prefilled", "prompt_tokens", "requests", "uncounted")}}
               if served else {}),
            "by_model_task": by_pair}


def prefill_line(block: dict) -> str:
    """The run summary's prefill line (evalkit run prints it) from prefill_block's figures."""
    line = (f"prefilled {block['tokens_prefilled']:,} tokens for {block['prompt_tokens']:,} "
            f"prompt tokens: savings ratio {block['savings_ratio']:.2f}x")
    served = block.get("served")
    if not served:
        return f"{line} ({100 * block['saved_fraction']:.1f}% saved)"
    line += (f"; served models sent {served['tokens_prefilled']:,} of them for "
             f"{served['prompt_tokens']:,} prompt tokens in {served['requests']:,} requests "
             f"(a served request's prompts are prefilled whole: the greedy prompt and, with "
             f"forced choice, the context again for each candidate)")
    if served["uncounted"]:
        line += f", {served['uncounted']} samples uncounted (from before the count was kept)"
    return line


def build_results(*, run_id: str, version: str, created: str, config_hash: str,
                  provenance: dict, models: dict, tasks: dict,
                  samples: Sequence[SampleResult], prefill: dict, suite: str) -> dict[str, Any]:
    s = summary(samples)
    return {"run_id": run_id, "evalkit_version": version, "created": created,
            "config_hash": config_hash, "suite": suite, "provenance": provenance,
            "models": models, "tasks": tasks, "rows": rows(samples, tasks, models),
            "prefill": prefill,
            "summary": s, "failures": s["failed"]}


def strip_timestamps(obj: Any) -> Any:
    """`obj` without TIMESTAMP_KEYS at any depth: what must be equal between equal runs."""
    if isinstance(obj, dict):
        return {k: strip_timestamps(v) for k, v in obj.items() if k not in TIMESTAMP_KEYS}
    if isinstance(obj, list):
        return [strip_timestamps(v) for v in obj]
    return obj
