"""Shared test helpers (plain functions; fixtures live in conftest.py)."""
from __future__ import annotations

from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
TINY_TOKENIZER = REPO / "model_adapters" / "tiny" / "tokenizer"


def run_worked_example(metric) -> tuple[int, int]:
    """(attempted, failed) of the doctest in a registered metric's docstring."""
    import doctest

    fn = metric.fn
    runner = doctest.DocTestRunner()
    for test in doctest.DocTestFinder(recurse=False).find(
            fn, fn.__name__, globs={**fn.__globals__, fn.__name__: fn}):
        runner.run(test)
    result = runner.summarize(verbose=False)
    return result.attempted, result.failed
