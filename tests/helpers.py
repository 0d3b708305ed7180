"""Shared test helpers (plain functions; fixtures live in conftest.py)."""
from __future__ import annotations

import importlib.util
import json
import sys
from pathlib import Path
from types import ModuleType

REPO = Path(__file__).resolve().parent.parent
TINY_TOKENIZER = REPO / "model_adapters" / "tiny" / "tokenizer"


def benchmark(name: str) -> ModuleType:
    """benchmarks/NAME.py as a module, loaded once (benchmarks/ holds scripts, not a package:
    under its own name, as the scripts import each other when run)."""
    if name not in sys.modules:
        spec = importlib.util.spec_from_file_location(name, REPO / "benchmarks" / f"{name}.py")
        module = importlib.util.module_from_spec(spec)
        sys.modules[name] = module
        spec.loader.exec_module(module)
    return sys.modules[name]


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


def restamp(run_dir: Path) -> Path:
    """Record a finished run's edited files in its DONE: readers refuse outputs changed after
    the run finished, and the tests that edit a run on purpose stand for a rerun that wrote
    them. Returns run_dir."""
    from evalkit.runner.rundir import DONE, output_sums

    done = json.loads((run_dir / DONE).read_text())
    (run_dir / DONE).write_text(json.dumps({**done, "sha256": output_sums(run_dir)}))
    return run_dir


def assert_streams_like_one_forward(m, ids, prefills, atol: float = 1e-5) -> None:
    """A GLAForCausalLM's streamed prefills (`prefills`: [(end, segment), ...] from token 0),
    then decoding the rest, and a fork decoding other tokens, each equal one full forward."""
    import torch

    full = m(ids)                                                        # [B, T, V]
    state, start = None, 0
    for end, segment in prefills:
        last, state = m.prefill(ids[:, start:end], state, segment=segment)
        torch.testing.assert_close(last, full[:, end - 1], atol=atol, rtol=atol)
        start = end
    fork = state.clone()
    for t in range(start, ids.shape[1]):
        logits, state = m.decode_step(ids[:, t], state)
        torch.testing.assert_close(logits, full[:, t], atol=atol, rtol=atol)
    other = ids.clone()      # the fork continues with other tokens, unaffected by the above
    other[:, start:] = (ids[:, start:] + 1) % m.config.vocab_size
    want = m(other)
    for t in range(start, ids.shape[1]):
        logits, fork = m.decode_step(other[:, t], fork)
        torch.testing.assert_close(logits, want[:, t], atol=atol, rtol=atol)
