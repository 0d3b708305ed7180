"""What a transformers cache holds, counted from its tensors: the bytes of one sequence's state
split into fixed / window / growing parts (evalkit.model_adapters.state_kind.StateBytes).

The walker knows cache layers by their exact class, so a class it has never seen (a quantized
or static layer, a model's own cache type) is an UnknownCacheError naming it, never a silent
"kv, 0 bytes": those classes store their tensors differently, and guessing would miscount.
"""
from __future__ import annotations

import copy
from typing import Any, Callable

import torch

from evalkit.model_adapters.state_kind import StateBytes


class UnknownCacheError(TypeError):
    """A cache or cache layer of a class the walker does not know how to count."""


class TensorState:
    """A state the model passes as plain tensors (RWKV's `state` list): all recurrent."""

    def __init__(self, tensors: list[torch.Tensor]) -> None:
        self.tensors = list(tensors)


def _nbytes(t: Any) -> int:
    return t.nbytes if isinstance(t, torch.Tensor) else 0


def _kv(layer: Any) -> int:
    return _nbytes(getattr(layer, "keys", None)) + _nbytes(getattr(layer, "values", None))


def _linear(layer: Any) -> StateBytes:
    """Convolution tails (fixed, not recurrent) and recurrent states of a linear-attention layer."""
    conv = sum(_nbytes(t) for t in layer.conv_states.values())
    rec = sum(_nbytes(t) for t in layer.recurrent_states.values())
    return StateBytes(fixed=conv + rec, recurrent=rec > 0)


def _layer_rules() -> dict[type, Callable[[Any], StateBytes]]:
    from transformers.cache_utils import (DummyLayer, DynamicLayer, DynamicSlidingWindowLayer,
                                          LinearAttentionAndFullAttentionLayer,
                                          LinearAttentionAndSlidingWindowAttentionLayer,
                                          LinearAttentionLayer)
    return {
        DynamicLayer: lambda l: StateBytes(growing=_kv(l)),
        DynamicSlidingWindowLayer: lambda l: StateBytes(window=_kv(l)),
        LinearAttentionLayer: _linear,
        LinearAttentionAndFullAttentionLayer: lambda l: _linear(l) + StateBytes(growing=_kv(l)),
        LinearAttentionAndSlidingWindowAttentionLayer:
            lambda l: _linear(l) + StateBytes(window=_kv(l)),
        DummyLayer: lambda l: StateBytes(),  # shares another layer's cache or holds none
    }


def _known_caches() -> tuple[type, ...]:
    from transformers import DynamicCache
    return (DynamicCache,)


def layer_state(layer: Any) -> StateBytes:
    rule = _layer_rules().get(type(layer))
    if rule is None:
        raise UnknownCacheError(
            f"cache layer class {type(layer).__module__}.{type(layer).__qualname__} is not one "
            f"evalkit can count (known: {', '.join(sorted(c.__name__ for c in _layer_rules()))})")
    return rule(layer)


def _check_cache(cache: Any) -> None:
    if type(cache) not in _known_caches():
        raise UnknownCacheError(
            f"cache class {type(cache).__module__}.{type(cache).__qualname__} is not one evalkit "
            f"can count (known: DynamicCache, TensorState)")


def cache_state(cache: Any) -> StateBytes:
    """The bytes `cache` holds for its sequences, by part."""
    if type(cache) is TensorState:
        return StateBytes(fixed=sum(_nbytes(t) for t in cache.tensors), recurrent=True)
    _check_cache(cache)
    total = StateBytes()
    for layer in cache.layers:
        total = total + layer_state(layer)
    return total


def cache_tensors(cache: Any) -> list[torch.Tensor]:
    """Every tensor `cache_state` counts (for checks: their nbytes sum to its total)."""
    if type(cache) is TensorState:
        return list(cache.tensors)
    _check_cache(cache)
    out: list[torch.Tensor] = []
    for layer in cache.layers:
        layer_state(layer)  # refuses unknown layer classes
        for name in ("keys", "values"):
            if isinstance(getattr(layer, name, None), torch.Tensor):
                out.append(getattr(layer, name))
        for name in ("conv_states", "recurrent_states"):
            out.extend(t for t in getattr(layer, name, {}).values() if isinstance(t, torch.Tensor))
    return out


def fork_cache(cache: Any) -> Any:
    """An independent copy. Linear-attention layers update their tensors in place (copy_), so a
    shallow copy would let one fork's step overwrite another's state: every tensor is cloned."""
    if type(cache) is TensorState:
        return TensorState([t.clone() for t in cache.tensors])
    _check_cache(cache)
    return copy.deepcopy(cache)
