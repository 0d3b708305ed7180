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


def save_peaked_gla(cfg, folder: Path, scale: float) -> Path:
    """A random GLA checkpoint whose non-norm weights are scaled up: peaked distributions, so
    greedy decoding is not a tie-break lottery."""
    import torch

    from evalkit.model_adapters.gla.checkpoint import save_checkpoint
    from evalkit.model_adapters.gla.model import GLAForCausalLM

    m = GLAForCausalLM(cfg).init_weights(0)
    with torch.no_grad():
        for name, p in m.named_parameters():
            if "norm" not in name:
                p.mul_(scale)
    save_checkpoint(m, cfg, folder)
    return folder
