"""One lm-eval task on one evalkit model: scored, or a failure told in one line.

lm-eval evaluates a list of tasks as one call, so one task's exception (a scorer dividing by
an empty gold list, a data set that cannot be fetched) loses every task of the run. Here each
(model, task) pair is its own call: an exception while building or scoring it becomes a
failed entry naming the model, the task, the function that raised and the error, and the
next pair runs.

Documents whose gold answer list is empty (RULER's cwe on a tokenizer too coarse to fit its
word list leaves `outputs` empty) are found before lm-eval scores anything: they are counted
and named, the others are scored; a task with nothing else to score is a failure.
"""
from __future__ import annotations

from typing import Any, Callable

from lm_eval.evaluator_utils import get_sample_size


class NothingToScore(ValueError):
    """Every document lm-eval would evaluate of one task has an empty gold answer list.
    raised_in: the function that built them; empty_gold: {task: report}, as docs_to_score's."""

    def __init__(self, message: str, raised_in: str, empty_gold: dict[str, dict]) -> None:
        super().__init__(message)
        self.raised_in, self.empty_gold = raised_in, empty_gold


def one_line(text: str) -> str:
    return " ".join(str(text).split())


def raised_in(exc: BaseException) -> str:
    """The function the exception came from, as module.qualname; when that is not lm-eval's
    own code (the evalkit bridge, transformers), the lm-eval function it passed through too."""
    frames = []
    tb = exc.__traceback__
    while tb is not None:
        code = tb.tb_frame.f_code
        qual = getattr(code, "co_qualname", code.co_name).split(".<locals>.<")[0]  # genexpr
        frames.append(f"{tb.tb_frame.f_globals.get('__name__', '?')}.{qual}")
        tb = tb.tb_next
    if not frames:
        return "?"
    inner = [f for f in frames if f.startswith("lm_eval.")]
    if not inner or inner[-1] == frames[-1]:
        return frames[-1]
    return f"{frames[-1]} (called from lm-eval's {inner[-1]})"


def failure_line(model: str, task: str, where: str, error: str) -> str:
    return f"lm-eval task {task} on model {model} failed in {where}: {error}"


def dataset_source(task: Any) -> str:
    """What built a task's documents: its custom_dataset function or its dataset_path."""
    fn = getattr(task.config, "custom_dataset", None)
    if callable(fn):
        return f"{getattr(fn, '__module__', '?')}.{getattr(fn, '__qualname__', fn)}"
    return f"datasets.load_dataset({getattr(task.config, 'dataset_path', None)!r})"


def _is_empty_gold(gold: Any) -> bool:
    return isinstance(gold, (list, tuple)) and len(gold) == 0


def docs_to_score(tasks: dict[str, Any], limit: int | float | None
                  ) -> tuple[dict[str, list[int]] | None, dict[str, dict]]:
    """Which documents of each built leaf task lm-eval should evaluate, and the empty-gold
    report: (samples for simple_evaluate, or None when nothing is left out; {task: {"count",
    "of", "doc_ids", "built_by"}} for the tasks that have such documents). The documents are
    lm-eval's own choice under `limit` (its first N); empty-gold ones are left out."""
    keep: dict[str, list[int]] = {}
    empty: dict[str, dict] = {}
    for name, task in tasks.items():
        docs = task.eval_docs
        n = get_sample_size(task, limit)
        n = len(docs) if n is None else min(n, len(docs))
        bad = [i for i in range(n) if _is_empty_gold(task.doc_to_target(docs[i]))]
        left_out = set(bad)
        keep[name] = [i for i in range(n) if i not in left_out]
        if bad:
            empty[name] = {"count": len(bad), "of": n, "doc_ids": bad,
                           "built_by": dataset_source(task)}
            if not keep[name]:
                raise NothingToScore(
                    f"every document to score ({n}: doc ids {_ids(bad)}) came out of it with "
                    f"an empty gold answer list for this model's tokenizer and lengths, so "
                    f"there is nothing to score", dataset_source(task), {name: empty[name]})
    return (keep if empty else None), empty


def empty_gold_line(model: str, task: str, report: dict) -> str:
    return (f"lm-eval task {task} on model {model}: {report['count']} of {report['of']} "
            f"documents have an empty gold answer list (doc ids {_ids(report['doc_ids'])}; "
            f"built by {report['built_by']}); they are not scored, the score is over the "
            f"other {report['of'] - report['count']}")


def _ids(ids: list[int], shown: int = 10) -> str:
    head = ", ".join(map(str, ids[:shown]))
    return head + (f", ... ({len(ids) - shown} more)" if len(ids) > shown else "")


def evaluate_pair(model: str, task: str, run: Callable[[], tuple[dict, dict]]) -> dict:
    """Call `run` (build and score `task`, returning (lm-eval results, empty-gold report));
    returns {"status": "scored", "results", "empty_gold"} or {"status": "failed", "error",
    "raised_in", "line", "empty_gold"}. Only Exception is caught: Ctrl-C still stops the run."""
    try:
        results, empty = run()
    except NothingToScore as e:  # evalkit's own refusal: its message says it all
        return {"status": "failed", "error": one_line(e), "raised_in": e.raised_in,
                "line": failure_line(model, task, e.raised_in, one_line(e)),
                "empty_gold": e.empty_gold}
    except Exception as e:  # noqa: BLE001 -- isolation is the point: any task error is its own
        where, error = raised_in(e), one_line(f"{type(e).__name__}: {e}")
        return {"status": "failed", "error": error, "raised_in": where,
                "line": failure_line(model, task, where, error), "empty_gold": {}}
    return {"status": "scored", "results": results, "empty_gold": empty}
