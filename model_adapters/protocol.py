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

Optional capabilities are declared, never probed: every adapter has these three attributes,
None where it lacks the capability (AdapterBase gives the Nones; load_model checks them once):
- `serving`: a Serving when the model answers behind a server (requests in flight, each timed
  and metered); the runner, the executor and the board ask this one attribute;
- `prefill_batch(batch)`: real batching (see prefill_batch below);
- `state_parts(state)`: the state's bytes split into fixed / window / growing (an
  evalkit.model_adapters.state_kind.StateBytes, or None when unknown); without it a sample records
  `state_bytes` and the adapter's `state_kind`;
- `num_parameters()`: the weights' parameter count (what lm-eval's model info reports).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import (Any, Callable, Collection, ContextManager, Protocol, Sequence,
                    runtime_checkable)

State = Any


@dataclass(frozen=True)
class Serving:
    """What a model behind a server adds to the protocol. `generate_timed(state, max_new_tokens,
    stop=None) -> (text, Timing)` is generate() with the request's timing (TTFT, service,
    attempts); `metered()` is a context manager yielding what the requests inside it sent
    (`.tokens`, `.requests`); `abort()`, from any thread, ends every request in flight
    (Ctrl-C, SIGTERM); `concurrency` is how many requests a closed loop keeps in flight."""
    concurrency: int
    generate_timed: Callable[..., tuple[str, Any]]
    metered: Callable[[], ContextManager[Any]]
    abort: Callable[[], None]


class AdapterBase:
    """The optional capabilities, declared absent; an adapter with one overrides it (a method
    for prefill_batch / state_parts, an instance attribute for serving)."""
    serving: Serving | None = None
    prefill_batch: Callable[[Sequence[Sequence[int]]], list[State]] | None = None
    state_parts: Callable[[State], Any] | None = None
    num_parameters: Callable[[], int] | None = None


CAPABILITIES = ("serving", "prefill_batch", "state_parts", "num_parameters")


@runtime_checkable
class ModelAdapter(Protocol):
    name: str
    tokenizer: Any  # a transformers PreTrainedTokenizerBase
    # Longest prompt the model is evaluated at (its trained length), or None for no limit.
    # The runner flags longer probes instead of cutting them.
    max_length: int | None
    # Longest sequence the model was trained on, or None when unknown. Results beyond it are
    # marked on the board (a model may still be evaluated there, as a recurrent one often is).
    trained_length: int | None
    # What the state is, for reports: "kv", "kv-window", "recurrent", "memory", ...
    state_kind: str
    # The optional capabilities (module docstring), None where absent.
    serving: Serving | None
    prefill_batch: Callable[[Sequence[Sequence[int]]], list[State]] | None
    state_parts: Callable[[State], Any] | None
    num_parameters: Callable[[], int] | None

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
        """What makes results from this model distinct; see IDENTITY_KEYS."""
        ...


# Every adapter's identity() carries these keys (hashes are SHA-256 hex digests); anything else
# that changes results (dtype, device, backend, window, ...) goes beside them under its own name.
# The runner hashes the whole dict, so an adapter must not put paths or timestamps in it.
IDENTITY_KEYS = ("name", "kind", "weights_hash", "tokenizer_hash")


def check_capabilities(adapter: Any, model: str) -> Any:
    """`adapter` if it declares every optional capability (CAPABILITIES) with a value of the
    right type; else a TypeError naming what is missing or wrong. Called once, at load."""
    missing = [n for n in CAPABILITIES if not hasattr(adapter, n)]
    if missing:
        raise TypeError(f"model {model!r}: {type(adapter).__name__} does not declare "
                        f"{', '.join(missing)} (inherit evalkit.model_adapters.protocol.AdapterBase, which "
                        f"declares them absent, or set each to None or its capability)")
    if adapter.serving is not None and not isinstance(adapter.serving, Serving):
        raise TypeError(f"model {model!r}: serving must be an evalkit.model_adapters.protocol.Serving or None, "
                        f"got {type(adapter.serving).__name__}")
    for n in CAPABILITIES[1:]:
        value = getattr(adapter, n)
        if value is not None and not callable(value):
            raise TypeError(f"model {model!r}: {n} must be a method or None, got "
                            f"{type(value).__name__}")
    return adapter


def check_identity(identity: dict, model: str) -> dict:
    """`identity` if it has every IDENTITY_KEYS entry; else a ValueError naming the missing ones."""
    missing = [k for k in IDENTITY_KEYS if not identity.get(k)]
    if missing:
        raise ValueError(f"model {model!r}: identity() lacks {', '.join(missing)} "
                         f"(every adapter reports {', '.join(IDENTITY_KEYS)})")
    return identity


def cut_at_stop(text: str, stop: Sequence[str] | None) -> tuple[str, bool]:
    """Cut `text` at the earliest stop string. Returns (text, stopped)."""
    if not stop:
        return text, False
    hits = [i for i in (text.find(s) for s in stop if s) if i >= 0]
    if not hits:
        return text, False
    return text[: min(hits)], True


def greedy_token(logits: Any) -> int:
    """The argmax token id of [V] logits, refusing non-finite logits: argmax would otherwise
    turn a NaN model into a confident answer. One scalar leaves the device either way."""
    import torch

    tok = int(torch.where(torch.isfinite(logits).all(), logits.argmax(), -1))
    if tok < 0:
        raise ValueError("the model produced non-finite logits while generating (NaN or inf in "
                         "its weights, config or activations)")
    return tok


def greedy_generate(first: int | None, step: Callable[[int], int | None], *,
                    decode: Callable[[list[int]], str], eos: Collection[int],
                    max_new_tokens: int, stop: Sequence[str] | None = None) -> str:
    """The greedy decoding loop every adapter shares.

    `first` is the predicted first token and `step(token)` feeds one token and returns the next
    prediction (None: the model has nothing to say). Ends at an end-of-sequence token, a stop
    string (excluded from the text) or `max_new_tokens`; the last token is never fed, since
    nothing reads its prediction.
    """
    out: list[int] = []
    nxt = first
    for i in range(int(max_new_tokens)):
        if nxt is None or nxt in eos:
            break
        out.append(nxt)
        if stop:
            text, stopped = cut_at_stop(decode(out), stop)
            if stopped:
                return text
        if i + 1 < max_new_tokens:
            nxt = step(nxt)
    return cut_at_stop(decode(out), stop)[0]


def prefill_batch(model: ModelAdapter, batch: Sequence[Sequence[int]]) -> list[State]:
    """Prefill several prompts; adapters with real batching define `prefill_batch` themselves."""
    if model.prefill_batch is not None:
        return model.prefill_batch(batch)
    return [model.prefill(ids) for ids in batch]
