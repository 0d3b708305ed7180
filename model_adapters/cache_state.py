"""What a transformers cache holds, counted by role from its tensors: the bytes of one sequence's
state split into fixed / window / growing parts (evalkit.model_adapters.state_kind.StateBytes).

Every tensor a cache holds has one role, read from where transformers' cache classes keep it:

    recurrent   a recurrent state (SSM / delta-rule / linear-attention matrix, RWKV's and
                xLSTM's states, RG-LRU's state): fixed, and it makes the state recurrent
    conv        a convolution tail (the last kernel - 1 inputs of a short convolution): fixed
    window_kv   keys and values of a sliding-window layer: bounded by the window
    kv          keys and values of a full attention layer (MLA's compressed latent too: it is
                what transformers stores as that layer's keys and values): growing
    indexer     a sparse-attention indexer's keys (one row per token): growing
    bookkeeping integer counters and positions (token counts, window sizes): not state, not counted

The roles come from the cache layer classes transformers defines for these parts
(LinearAttentionLayer's conv_states / recurrent_states, DynamicLayer's keys / values,
DynamicSlidingWindowLayer, DynamicIndexedLayer, the hybrid layers, DummyLayer) and from the few
caches a model family defines itself (MiniMaxCache's linear_cache, xLSTMCache's rnn_state).
A family built from these parts needs nothing of its own. States a model keeps on its modules
instead of a cache (RecurrentGemma) travel in a ModuleState (recurrent/module_state.py).

The walker knows holders by their exact class and every tensor attribute by name, so a class it
has never seen, or a tensor in an attribute it has no role for, is an UnknownCacheError naming
the class and the attribute, never a silent "kv, 0 bytes": guessing would miscount.
"""
from __future__ import annotations

import copy
from dataclasses import dataclass
from typing import Any, Iterator

import torch

from evalkit.model_adapters.state_kind import StateBytes


class UnknownCacheError(TypeError):
    """A cache, cache layer or tensor attribute the walker does not know how to count."""


class TensorState:
    """A state the model passes as plain tensors (RWKV's `state` list): all recurrent."""

    def __init__(self, tensors: list[torch.Tensor]) -> None:
        self.tensors = list(tensors)


class ModuleState:
    """A state a model keeps on its own modules (RecurrentGemma's RG-LRU and conv states) beside
    the attention cache it is passed: `modules` maps module path -> attribute -> tensor."""

    def __init__(self, cache: Any, modules: dict[str, dict[str, torch.Tensor | None]]) -> None:
        self.cache = cache
        self.modules = modules


# role -> the part of StateBytes it counts in (None: not counted)
PART = {"recurrent": "fixed", "conv": "fixed", "window_kv": "window", "kv": "growing",
        "indexer": "growing", "bookkeeping": None}
# Module attributes holding a state, by name (ModuleState): RecurrentGemma's temporal block.
MODULE_ROLES = {"conv1d_state": "conv", "recurrent_states": "recurrent"}


@dataclass(frozen=True)
class Entry:
    """One tensor of a state, where it lives and what it is."""
    owner: str       # the holding class (a cache, a cache layer, a module path)
    attribute: str   # the attribute path inside it ("conv_states[0]")
    role: str
    tensor: torch.Tensor


def _layer_roles() -> dict[type, dict[str, str]]:
    from transformers.cache_utils import (DummyLayer, DynamicIndexedLayer, DynamicLayer,
                                          DynamicSlidingWindowLayer,
                                          LinearAttentionAndFullAttentionLayer,
                                          LinearAttentionAndSlidingWindowAttentionLayer,
                                          LinearAttentionLayer)
    kv = {"keys": "kv", "values": "kv"}
    window = {"keys": "window_kv", "values": "window_kv", "_sliding_window_tensor": "bookkeeping"}
    linear = {"conv_states": "conv", "recurrent_states": "recurrent",
              "cumulative_length_linear": "bookkeeping"}
    return {
        DynamicLayer: kv,
        DynamicSlidingWindowLayer: window,
        DynamicIndexedLayer: {**kv, "indexer_keys": "indexer",
                              "indexer_position_ids": "bookkeeping"},
        LinearAttentionLayer: linear,
        LinearAttentionAndFullAttentionLayer: {**linear, **kv},
        LinearAttentionAndSlidingWindowAttentionLayer: {**linear, **window},
        DummyLayer: {"keys": "kv", "values": "kv"},  # None: shares another layer's or holds none
    }


def _cache_roles() -> dict[type, dict[str, str]]:
    """Caches by class: the roles of their own tensor attributes (besides `layers`)."""
    from transformers import DynamicCache

    roles: dict[type, dict[str, str]] = {DynamicCache: {}}
    try:
        from transformers.models.minimax.modeling_minimax import MiniMaxCache
        roles[MiniMaxCache] = {"linear_cache": "recurrent"}  # one K^T V matrix per linear layer
    except ImportError:
        pass
    try:
        from transformers.models.xlstm.modeling_xlstm import xLSTMCache
        # per layer: the mLSTM's C matrix, n normaliser and m stabiliser
        roles[xLSTMCache] = {"rnn_state": "recurrent", "seqlen_offset": "bookkeeping"}
    except ImportError:
        pass
    return roles


def _name(cls: type) -> str:
    return f"{cls.__module__}.{cls.__qualname__}"


def _tensors(value: Any, path: str) -> Iterator[tuple[str, torch.Tensor]]:
    """Every tensor inside an attribute's value (dicts, lists and tuples walked)."""
    if isinstance(value, torch.Tensor):
        yield path, value
    elif isinstance(value, dict):
        for k, v in value.items():
            yield from _tensors(v, f"{path}[{k}]")
    elif isinstance(value, (list, tuple)):
        for i, v in enumerate(value):
            yield from _tensors(v, f"{path}[{i}]")


def _owned(obj: Any, roles: dict[str, str], owner: str, skip: tuple[str, ...] = ()
           ) -> Iterator[Entry]:
    """Entries of obj's tensor attributes by `roles`; any other tensor attribute is refused."""
    for attr, value in vars(obj).items():
        if attr in skip:
            continue
        for path, t in _tensors(value, attr):
            role = roles.get(attr)
            if role is None:
                raise UnknownCacheError(
                    f"{owner} holds a tensor in attribute {path!r} whose role evalkit does not "
                    f"know (known attributes: {', '.join(sorted(roles)) or 'none'})")
            yield Entry(owner, path, role, t)


def layer_entries(layer: Any, index: int | None = None) -> list[Entry]:
    roles = _layer_roles().get(type(layer))
    if roles is None:
        raise UnknownCacheError(
            f"cache layer class {_name(type(layer))} is not one evalkit can count (known: "
            f"{', '.join(sorted(c.__name__ for c in _layer_roles()))})")
    owner = type(layer).__name__ + ("" if index is None else f" (layer {index})")
    return list(_owned(layer, roles, owner))


def entries(cache: Any) -> list[Entry]:
    """Every tensor `cache` holds, with its role (UnknownCacheError for anything unknown)."""
    if type(cache) is TensorState:
        return [Entry("state", f"[{i}]", "recurrent", t) for i, t in enumerate(cache.tensors)]
    if type(cache) is ModuleState:
        out = [] if cache.cache is None else entries(cache.cache)
        for path, attrs in cache.modules.items():
            for attr, t in attrs.items():
                if t is None:
                    continue
                role = MODULE_ROLES.get(attr)
                if role is None:
                    raise UnknownCacheError(f"module {path} holds state attribute {attr!r} whose "
                                            f"role evalkit does not know")
                out.append(Entry(path, attr, role, t))
        return out
    roles = _cache_roles().get(type(cache))
    if roles is None:
        raise UnknownCacheError(
            f"cache class {_name(type(cache))} is not one evalkit can count (known: "
            f"{', '.join(sorted(c.__name__ for c in _cache_roles()))}, TensorState, ModuleState)")
    out = list(_owned(cache, roles, type(cache).__name__, skip=("layers",)))
    for i, layer in enumerate(getattr(cache, "layers", [])):
        out.extend(layer_entries(layer, i))
    return out


def _dedup(es: list[Entry]) -> list[Entry]:
    """One entry per tensor (a layer may hand the same tensor to two slots)."""
    seen: set[int] = set()
    out = []
    for e in es:
        if id(e.tensor) not in seen:
            seen.add(id(e.tensor))
            out.append(e)
    return out


def state_of(es: list[Entry]) -> StateBytes:
    parts = {"fixed": 0, "window": 0, "growing": 0}
    recurrent = False
    for e in _dedup(es):
        part = PART[e.role]
        if part is not None:
            parts[part] += e.tensor.nbytes
            recurrent = recurrent or e.role == "recurrent"
    return StateBytes(recurrent=recurrent, **parts)


def layer_state(layer: Any) -> StateBytes:
    return state_of(layer_entries(layer))


def cache_state(cache: Any) -> StateBytes:
    """The bytes `cache` holds for its sequences, by part."""
    return state_of(entries(cache))


def cache_tensors(cache: Any) -> list[torch.Tensor]:
    """Every tensor `cache_state` counts (for checks: their nbytes sum to its total)."""
    return [e.tensor for e in _dedup(entries(cache)) if PART[e.role] is not None]


def roles_of(cache: Any) -> dict[str, int]:
    """Bytes by role (bookkeeping left out): what `evalkit state` and the family table show."""
    out: dict[str, int] = {}
    for e in _dedup(entries(cache)):
        if PART[e.role] is not None:
            out[e.role] = out.get(e.role, 0) + e.tensor.nbytes
    return out


def fork_cache(cache: Any) -> Any:
    """An independent copy. Linear-attention layers update their tensors in place (copy_), so a
    shallow copy would let one fork's step overwrite another's state: every tensor is cloned.
    Walking it first refuses a holder whose tensors the copy could not be trusted to cover."""
    entries(cache)
    if type(cache) is TensorState:
        return TensorState([t.clone() for t in cache.tensors])
    return copy.deepcopy(cache)
