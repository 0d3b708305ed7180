"""Tasks no model answered by generation: every model's generated answers score 0.

Then the generated answers tell no model from another, and the run's summary (evalkit run)
and the board (evalkit publish) say so and point to what does measure something (NOTE)."""
from __future__ import annotations

from typing import Any, Iterable

from evalkit import scoring

NOTE = (
    "a score of 0 for every model tells no model from another. Either the models do not answer "
    "this prompt at all (the tiny pair, `recall-gla-tiny` and `recall-softmax-tiny`, answers "
    "only the prompt templates it was trained on, listed in its model cards: a task of your own "
    "scores 0 on it) or none recalls the value by generation here. Read forced choice (the "
    "gold's log-probability against the in-context candidates: no instruction following "
    "needed), or evaluate a model that follows instructions (e.g. `smollm2-135m`).")


def generation_metric(metrics: Iterable[str]) -> str | None:
    """The best-ranked generation recall metric among `metrics` (the board's default)."""
    have = set(metrics)
    return next((m for m in scoring.recall_preference() if m in have
                 and scoring.get(m).kind == scoring.GENERATION), None)


def unanswered_tasks(rows: Iterable[dict[str, Any]]) -> dict[str, str]:
    """{task: metric} for the tasks of results.json `rows` (one per model x cell) whose every
    scored cell has a mean of 0 in its generation recall metric, across every model.

    >>> row = lambda m, v: {"task": "t", "model": m, "n": 2, "metrics": {"word_match": {"mean": v}}}
    >>> unanswered_tasks([row("a", 0.0), row("b", 0.0)]), unanswered_tasks([row("a", 0.5)])
    ({'t': 'word_match'}, {})
    """
    by_task: dict[str, list[dict]] = {}
    for r in rows:
        if r.get("n"):
            by_task.setdefault(r["task"], []).append(r.get("metrics") or {})
    out = {}
    for task, cells in sorted(by_task.items()):
        m = generation_metric({k for c in cells for k in c})
        if m and all((c.get(m) or {}).get("mean", 0.0) == 0.0 for c in cells):
            out[task] = m
    return out
