"""Reference-adapter subclasses for the runner tests, loaded as a suite plugin.

- slow-oracle: the oracle, sleeping `delay` seconds per generation (a run long enough to kill).
- broken-oracle: the oracle, raising on chosen generate / extend calls (1-based call numbers).
- recording-oracle: the oracle, logging every prefill/extend/fork call.
- weighted-oracle: the oracle whose identity holds the sha256 of a `weights` file (a checkpoint
  that can change under a run, as a served model's can).
"""
from __future__ import annotations

import hashlib
import time
from pathlib import Path

from evalkit.model_adapters.reference import InductionAdapter, MemoryState
from evalkit.model_adapters.models import MODELS, register_model
from evalkit.tokenization import load_tokenizer


class SlowOracle(InductionAdapter):
    def __init__(self, *a, delay: float = 0.02, **k):
        super().__init__(*a, **k)
        self.delay = delay

    def generate(self, state, max_new_tokens, stop=None):
        time.sleep(self.delay)
        return super().generate(state, max_new_tokens, stop)


class BrokenOracle(InductionAdapter):
    def __init__(self, *a, fail_generate=(), fail_extend=(), **k):
        super().__init__(*a, **k)
        self.fail_generate, self.fail_extend = set(fail_generate), set(fail_extend)
        self.n_generate = self.n_extend = 0

    def generate(self, state, max_new_tokens, stop=None):
        self.n_generate += 1
        if self.n_generate in self.fail_generate:
            raise RuntimeError(f"deliberate failure in generate call {self.n_generate}")
        return super().generate(state, max_new_tokens, stop)

    def extend(self, state, token_ids):
        self.n_extend += 1
        if self.n_extend in self.fail_extend:
            raise RuntimeError(f"deliberate failure in extend call {self.n_extend}")
        return super().extend(state, token_ids)


class RecordingOracle(InductionAdapter):
    def __init__(self, *a, **k):
        super().__init__(*a, **k)
        self.calls: list[tuple[str, int]] = []

    def prefill(self, token_ids):
        self.calls.append(("prefill", len(token_ids)))
        if len(token_ids) == 0:
            raise ValueError("prefill needs at least one token")
        return InductionAdapter.extend(self, MemoryState(), token_ids)  # not our logging extend

    def extend(self, state, token_ids):
        self.calls.append(("extend", len(token_ids)))
        return super().extend(state, token_ids)

    def fork(self, state):
        self.calls.append(("fork", state.length))
        return super().fork(state)


class WeightedOracle(InductionAdapter):
    def __init__(self, *a, weights: str, **k):
        super().__init__(*a, **k)
        self.weights_hash = hashlib.sha256(Path(weights).read_bytes()).hexdigest()

    def identity(self):
        return {**super().identity(), "weights_hash": self.weights_hash}


def _declare(cls, name):
    def make(path, *, tokenizer, **options):
        return cls(name, load_tokenizer(tokenizer), **options)
    register_model(name, kind="reference", state_kind="memory",
                   description=f"test oracle ({cls.__name__})")(make)


for _name, _cls in (("slow-oracle", SlowOracle), ("broken-oracle", BrokenOracle),
                    ("recording-oracle", RecordingOracle), ("weighted-oracle", WeightedOracle)):
    if _name not in MODELS:  # the plugin may be imported by several runs in one process
        _declare(_cls, _name)
