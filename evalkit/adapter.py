"""The model-adapter protocol: the small surface every model is evaluated through.

Recurrent and softmax models differ only behind it. A *state* is whatever the model needs to
continue a sequence: a recurrent state for GLA, a KV cache for softmax models, a token memory
for the reference adapters.

Ownership rules (the runner relies on them):
- `prefill` returns a fresh state.
- `extend` may consume (mutate) the state it is given and returns the advanced state; call
  `fork` first to keep the original.
- `generate`, `score` and `state_bytes` never change the state they are given.
- `fork` returns an independent copy: extending one never changes the other.
"""
from __future__ import annotations

from typing import Any, Protocol, Sequence, runtime_checkable

State = Any


@runtime_checkable
class ModelAdapter(Protocol):
    name: str
    tokenizer: Any  # a transformers PreTrainedTokenizerBase
    # Longest prompt the model is evaluated at (its trained length), or None for no limit.
    # The runner flags longer probes instead of cutting them.
    max_length: int | None

    def prefill(self, token_ids: Sequence[int]) -> State: ...

    def extend(self, state: State, token_ids: Sequence[int]) -> State: ...

    def fork(self, state: State) -> State: ...

    def generate(self, state: State, max_new_tokens: int, stop: Sequence[str] | None = None) -> str:
        """Greedy continuation of `state`, cut at the first stop string (stop string excluded)."""
        ...

    def score(self, state: State, continuations: Sequence[Sequence[int]]) -> list[float]:
        """Summed log-probability of each continuation's tokens after `state`."""
        ...

    def state_bytes(self, state: State) -> int: ...

    def identity(self) -> dict:
        """What makes results from this model distinct: name, weights hash, dtype, backend..."""
        ...


def cut_at_stop(text: str, stop: Sequence[str] | None) -> tuple[str, bool]:
    """Cut `text` at the earliest stop string. Returns (text, stopped)."""
    if not stop:
        return text, False
    hits = [i for i in (text.find(s) for s in stop if s) if i >= 0]
    if not hits:
        return text, False
    return text[: min(hits)], True


def prefill_batch(model: ModelAdapter, batch: Sequence[Sequence[int]]) -> list[State]:
    """Prefill several prompts; adapters with real batching define `prefill_batch` themselves."""
    fn = getattr(model, "prefill_batch", None)
    if fn is not None:
        return fn(batch)
    return [model.prefill(ids) for ids in batch]
