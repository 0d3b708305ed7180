"""What the window ops share: which keys a query sees, and the sinks older than the cache."""
from __future__ import annotations

import torch


def visible(qi: torch.Tensor, kj: torch.Tensor, window: int, n_sink: int) -> torch.Tensor:
    """Which keys (indices kj into k) query index qi sees: causal, and inside the window or a
    sink. [c, 1] x [1, n] -> [c, n]."""
    return (kj <= qi) & ((kj > qi - window) | (kj < n_sink))


def sink_kv(B: int, H: int, d: int, ref: torch.Tensor, sink_k, sink_v):
    if sink_k is None:
        return ref.new_zeros(B, H, 0, d), ref.new_zeros(B, H, 0, d)
    return sink_k.float(), sink_v.float()
