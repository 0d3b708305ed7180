"""The keys a windowed layer attends over: its cached window, the new tokens, and S attention
sinks (the first S tokens of the sequence, kept exact at their true positions beside the
window; StreamingLLM, arXiv 2309.17453). Shared by windowed attention (mixers.Attention) and
the twin layers (window_linear.py), so both keep sinks the same way.

A layer's state holds, as `kv`: the window's K, V [B, H_kv, min(seen, W), d] and, when S > 0,
the sinks' K, V [B, H_kv, min(seen, S), d] (rotated keys, fp32). A sink may also still sit in
the window (while seen < S + W); it is then stored twice, so the state's size is a plain
formula: 2 * d_kv * (min(seen, W) + min(seen, S)) values a layer.

    keys = gather(state, k_new, v_new, sinks)
    ... attend over keys.k / keys.v (keys.n_sink leading sinks) and keys.sink_k / sink_v ...
    kv = keys.next_kv(window, sinks)      # the tensors of the state after these tokens
"""
from __future__ import annotations

from dataclasses import dataclass

import torch

from evalkit.model_adapters.gla.state import STATE_DTYPE, LayerState


@dataclass
class Keys:
    k: torch.Tensor               # [B, H_kv, L+T, d]: the cached window, then the T new tokens
    v: torch.Tensor
    L: int                        # cached entries before the new ones
    start: int                    # position of the first new token
    n_sink: int                   # leading entries of k that are sinks (position < S)
    sink_k: torch.Tensor | None   # [B, H_kv, S', d]: stored sinks older than k's first entry
    sink_v: torch.Tensor | None
    stored: tuple[torch.Tensor, torch.Tensor] | None  # every stored sink (position < min(start, S))

    @property
    def first(self) -> int:
        """Position of k's first entry."""
        return self.start - self.L

    def next_kv(self, window: int | None, sinks: int) -> tuple[torch.Tensor, ...]:
        """The state's kv after these tokens: the last `window` entries, then (S > 0) the
        first S positions of the sequence."""
        k, v = self.k, self.v
        if window is not None:
            k, v = k[:, :, -window:], v[:, :, -window:]
        kv = (k.to(STATE_DTYPE), v.to(STATE_DTYPE))
        if sinks == 0:
            return kv
        have = 0 if self.stored is None else self.stored[0].shape[2]
        end = min(sinks, self.start + self.k.shape[2] - self.L)   # sinks known after the tokens
        # positions [have, end) come from k, where position p sits at index p - first
        lo, hi = have - self.first, end - self.first
        if hi <= lo:
            lo = hi = 0                                       # nothing new
        elif lo < 0:
            raise RuntimeError(f"sink positions {have}..{end} are neither stored nor cached")
        new_k, new_v = self.k[:, :, lo:hi], self.v[:, :, lo:hi]
        if self.stored is not None:
            new_k, new_v = torch.cat([self.stored[0], new_k], 2), torch.cat([self.stored[1], new_v], 2)
        return (*kv, new_k.to(STATE_DTYPE), new_v.to(STATE_DTYPE))


def gather(state: LayerState | None, k: torch.Tensor, v: torch.Tensor, sinks: int) -> Keys:
    """The keys of a layer with `sinks` sinks, given its state before the new (rotated) keys
    and values k, v [B, H_kv, T, d]."""
    start = state.seen if state is not None else 0
    stored = None
    if state is not None and state.kv:
        k = torch.cat([state.kv[0].to(k.dtype), k], 2)
        v = torch.cat([state.kv[1].to(v.dtype), v], 2)
        if len(state.kv) == 4:
            stored = (state.kv[2], state.kv[3])
        elif sinks:
            raise ValueError(f"the state holds no attention sinks, but the layer keeps {sinks}: "
                             f"it was made by a model without sinks")
    T = k.shape[2] if state is None or not state.kv else k.shape[2] - state.kv[0].shape[2]
    L = k.shape[2] - T
    first = start - L
    n_sink = max(0, min(sinks - first, L + T))
    sink_k = sink_v = None
    if stored is not None and first > 0:   # sinks older than the cache's first entry
        n = min(first, stored[0].shape[2])
        sink_k, sink_v = stored[0][:, :, :n].to(k.dtype), stored[1][:, :, :n].to(v.dtype)
    return Keys(k, v, L, start, n_sink, sink_k, sink_v, stored)


def repeat_heads(t: torch.Tensor | None, groups: int) -> torch.Tensor | None:
    """[B, H_kv, n, d] -> [B, H_kv * groups, n, d] (grouped-query attention)."""
    return t if t is None or groups == 1 else t.repeat_interleave(groups, 1)
