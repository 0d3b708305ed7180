"""The token-by-token reference of the window delta op (the signature of chunk.py; see __init__)."""
from __future__ import annotations

import torch

from evalkit.model_adapters.gla.ops.window_linear.naive import naive_window_softmax


def naive_window_delta(q, k, v, qd, kd, vd, log_a, beta, lam, window: int, S0, *,
                       n_sink: int = 0, sink_k=None, sink_v=None):
    T = q.shape[2]
    o_w = naive_window_softmax(q, k, v, window, n_sink=n_sink, sink_k=sink_k, sink_v=sink_v)
    qd, kd, vd, log_a, beta, lam = (t.float() for t in (qd, kd, vd, log_a, beta, lam))
    S = S0.float().clone()
    out = []
    for t in range(T):
        kt, b = kd[:, :, t, :, None], beta[:, :, t, None, None]               # [B, H, d, 1]
        S = log_a[:, :, t, None, None].exp() * (S - b * kt @ (kt.transpose(-1, -2) @ S))
        S = S + b * kt @ vd[:, :, t, None, :]
        read = (qd[:, :, t, None, :] @ S)[:, :, 0]                            # [B, H, d]
        out.append(o_w[:, :, t] + lam[:, :, t, None] * (read - o_w[:, :, t]))
    return (torch.stack(out, 2) if T else o_w), S
