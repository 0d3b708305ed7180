"""KV-cache handling for the softmax adapter: copies, byte accounting, and the sliding-window
mask and eviction behind the memory-matched baseline (see the package docstring)."""
from __future__ import annotations

import copy
import inspect
from dataclasses import dataclass
from typing import Any

import torch


@dataclass(frozen=True)
class KVProfile:
    """Per-layer KV growth: bytes(n) = sum(const + per_token * min(n, cap or n))."""

    per_token: tuple[int, ...]
    const: tuple[int, ...]
    cap: tuple[int | None, ...]

    @property
    def bytes_per_token(self) -> int:
        return sum(self.per_token)

    def bytes_at(self, n_tokens: int) -> int:
        return sum(c + p * (n_tokens if cap is None else min(n_tokens, cap))
                   for p, c, cap in zip(self.per_token, self.const, self.cap))


def cache_classes():
    from transformers.cache_utils import DynamicLayer, DynamicSlidingWindowLayer
    return DynamicLayer, DynamicSlidingWindowLayer


def new_cache(model: Any) -> Any:
    from transformers import DynamicCache

    return DynamicCache(config=model.config)


def cache_kwarg(model: Any) -> str:
    # transformers 5.x renamed `past_key_values` to `cache`; remote-code models may still use the old name
    params = inspect.signature(model.forward).parameters
    return "cache" if "cache" in params else "past_key_values"


def layer_tensors(layer: Any) -> list[torch.Tensor]:
    """The state tensors of one cache layer (public tensor attributes; `_x` are bookkeeping)."""
    out: list[torch.Tensor] = []
    for name, val in vars(layer).items():
        if name.startswith("_"):
            continue
        if isinstance(val, torch.Tensor):
            out.append(val)
        elif isinstance(val, (list, tuple)):
            out.extend(v for v in val if isinstance(v, torch.Tensor))
    return out


def copy_cache(cache: Any, clone: bool) -> Any:
    """Copy a cache. clone=False shares tensors: safe only for layers whose update builds new
    tensors (torch.cat) instead of writing in place -- the dynamic layers checked by the caller."""
    new = copy.copy(cache)
    new.layers = []
    for layer in cache.layers:
        l2 = copy.copy(layer)
        for name, val in vars(layer).items():
            if isinstance(val, torch.Tensor) and clone and not name.startswith("_"):
                setattr(l2, name, val.clone())
            elif isinstance(val, list):
                setattr(l2, name, [v.clone() if clone and isinstance(v, torch.Tensor) else v
                                   for v in val])
        new.layers.append(l2)
    return new


def expand_batch(cache: Any, batch: int) -> Any:
    """View every 4-D cache tensor as `batch` rows (no copy: the next update's cat copies)."""
    if batch > 1:
        for layer in cache.layers:
            for name, val in vars(layer).items():
                if isinstance(val, torch.Tensor) and not name.startswith("_") and val.dim() == 4:
                    setattr(layer, name, val.expand(batch, *val.shape[1:]))
    return cache


def cached_len(cache: Any) -> int:
    if not cache.layers or getattr(cache.layers[0], "keys", None) is None:
        return 0
    return cache.layers[0].keys.shape[-2]


def kv_profile(model: Any, *, window: int | None = None) -> KVProfile:
    """Measure KV bytes per layer after 1 and 2 tokens (works on meta-device models too)."""
    _, sliding_cls = cache_classes()
    device = next(model.parameters()).device
    cache = new_cache(model)
    sizes = []
    with torch.inference_mode():
        for pos in range(2):
            model(input_ids=torch.zeros(1, 1, dtype=torch.long, device=device),
                  position_ids=torch.tensor([[pos]], device=device),
                  **{cache_kwarg(model): cache}, use_cache=True)
            sizes.append([sum(t.nbytes for t in layer_tensors(layer)) for layer in cache.layers])
    per_token = tuple(b - a for a, b in zip(*sizes))
    const = tuple(a - p for a, p in zip(sizes[0], per_token))
    caps = []
    for layer in cache.layers:
        if isinstance(layer, sliding_cls):
            caps.append(layer.sliding_window - 1)  # what DynamicSlidingWindowLayer retains
        else:
            caps.append(window)
    return KVProfile(per_token, const, tuple(caps))


def matched_window(state_bytes: int, bytes_per_token: int) -> int:
    """Largest window W whose KV bytes (W * bytes_per_token) do not exceed `state_bytes`."""
    if bytes_per_token <= 0:
        raise ValueError(f"bytes_per_token must be positive, got {bytes_per_token}")
    w = int(state_bytes) // int(bytes_per_token)
    if w < 1:
        raise ValueError(f"kv_budget_bytes={state_bytes} is less than one token's KV "
                         f"({bytes_per_token} bytes); no window fits")
    return w


def window_mask(pos0: int, q_len: int, n_cached: int, *, window: int, sink: int, attn_impl: str,
                dtype: torch.dtype, device: torch.device) -> torch.Tensor:
    """[1, 1, q, cached+q] mask for KV-budget attention at absolute positions pos0.."""
    n_sink = min(sink, pos0, n_cached)
    recent = n_cached - n_sink
    kpos = torch.cat([torch.arange(n_sink, device=device),
                      torch.arange(pos0 - recent, pos0, device=device),
                      torch.arange(pos0, pos0 + q_len, device=device)])
    qpos = torch.arange(pos0, pos0 + q_len, device=device)[:, None]
    k = kpos[None, :]
    allowed = (k <= qpos) & ((k < sink) | (k >= qpos - (window - sink)))
    if attn_impl == "sdpa":
        return allowed[None, None]
    mask = torch.zeros(allowed.shape, dtype=dtype, device=device)
    return mask.masked_fill(~allowed, torch.finfo(dtype).min)[None, None]


def evict(cache: Any, *, window: int, sink: int) -> None:
    """Keep the first `sink` and the last `window - sink` entries of every layer."""
    keep = window - sink
    for layer in cache.layers:
        n = layer.keys.shape[-2]
        if n <= window:
            continue
        # torch.cat copies, so the evicted entries' storage is freed (state bytes are real)
        layer.keys = torch.cat([layer.keys[..., :sink, :], layer.keys[..., n - keep:, :]], dim=-2)
        layer.values = torch.cat([layer.values[..., :sink, :], layer.values[..., n - keep:, :]],
                                 dim=-2)
