"""The state a batch of sequences carries through the model: one LayerState per layer.

A GLA layer holds S [B, H, K, V] and, with short convolutions, the last `conv_size` inputs of
each q/k/v channel (fla's conv-cache layout [B, D, W]); a gated-convolution layer holds its
tail [B, D, kernel]; an attention layer its KV cache [B, H_kv, T', d] and the number of tokens
seen; a twin layer loaded with `sparse=N` its sparse cache as `sparse` (gla/sparse_cache.py:
K, V [B, H, n, d], recall errors and positions [B, H, n], n <= N; bounded, counted as window).
Every state tensor is fp32 whatever the weights' dtype.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Sequence

import torch

from evalkit.model_adapters.state_kind import StateBytes

STATE_DTYPE = torch.float32


def _nbytes(ts: Sequence[torch.Tensor]) -> int:
    return sum(t.numel() * t.element_size() for t in ts)


@dataclass
class LayerState:
    recurrent: torch.Tensor | None = None   # GLA: [B, H, K, V]
    conv: tuple[torch.Tensor, ...] = ()     # conv tails: [B, D, W] each
    kv: tuple[torch.Tensor, ...] = ()       # attention: K, V [B, H_kv, T', d]
    seen: int = 0                           # attention: tokens consumed (next rotary position)
    window: int | None = None               # attention: cache bounded to the last `window`
    sparse: tuple[torch.Tensor, ...] = ()   # twin with sparse=N: K, V, error, position (n <= N)

    def tensors(self) -> list[torch.Tensor]:
        return [*([self.recurrent] if self.recurrent is not None else []), *self.conv, *self.kv,
                *self.sparse]

    def map(self, fn: Callable[[torch.Tensor], torch.Tensor]) -> "LayerState":
        return LayerState(fn(self.recurrent) if self.recurrent is not None else None,
                          tuple(fn(t) for t in self.conv), tuple(fn(t) for t in self.kv),
                          self.seen, self.window, tuple(fn(t) for t in self.sparse))

    def parts(self) -> StateBytes:
        """Bytes per sequence, split into fixed / window / growing (evalkit.model_adapters.state_kind)."""
        batch = self.tensors()[0].shape[0]
        fixed = _nbytes(([self.recurrent] if self.recurrent is not None else []) + list(self.conv))
        kv = _nbytes(self.kv) + _nbytes(self.sparse)   # a sparse cache is bounded, like the window
        return StateBytes(fixed=fixed // batch, recurrent=self.recurrent is not None,
                          **({"window": kv // batch} if self.window is not None
                             else {"growing": kv // batch}))


@dataclass
class GLAState:
    """A batch of sequences' state: one LayerState per layer."""
    layers: list[LayerState]

    @property
    def batch_size(self) -> int:
        return self.layers[0].tensors()[0].shape[0]

    def tensors(self) -> list[torch.Tensor]:
        return [t for layer in self.layers for t in layer.tensors()]

    def nbytes(self) -> int:
        return _nbytes(self.tensors())

    def parts(self) -> StateBytes:
        """One sequence's bytes by part (the batch's mean row; rows are the same size)."""
        total = StateBytes()
        for layer in self.layers:
            total += layer.parts()
        return total

    def map(self, fn: Callable[[torch.Tensor], torch.Tensor]) -> "GLAState":
        return GLAState([layer.map(fn) for layer in self.layers])

    def clone(self) -> "GLAState":
        return self.map(torch.clone)

    def rows(self, index: Sequence[int] | slice) -> "GLAState":
        idx = index if isinstance(index, slice) else list(index)
        return self.map(lambda t: t[idx])

    @staticmethod
    def cat(states: Sequence["GLAState"]) -> "GLAState":
        """Stack batches row-wise; attention layers must have seen the same number of tokens."""
        out = []
        for i, first in enumerate(states[0].layers):
            layers = [s.layers[i] for s in states]
            if len({layer.seen for layer in layers}) > 1:
                raise ValueError("cannot batch attention states of different lengths")
            out.append(LayerState(
                torch.cat([x.recurrent for x in layers]) if first.recurrent is not None else None,
                tuple(torch.cat([x.conv[j] for x in layers]) for j in range(len(first.conv))),
                tuple(torch.cat([x.kv[j] for x in layers]) for j in range(len(first.kv))),
                first.seen, first.window,
                tuple(torch.cat([x.sparse[j] for x in layers]) for j in range(len(first.sparse)))))
        return GLAState(out)

    @staticmethod
    def from_tensors(tensors: Sequence[torch.Tensor], per_layer: int) -> "GLAState":
        """The inverse of tensors() for a model of GLA layers only (the compiled paths)."""
        ts = list(tensors)
        return GLAState([LayerState(ts[i], tuple(ts[i + 1:i + per_layer]))
                         for i in range(0, len(ts), per_layer)])
