"""Token-by-token references of the window ops (the signatures of chunk.py; see __init__)."""
from __future__ import annotations

import torch

from evalkit.model_adapters.gla.ops.window_linear.common import sink_kv, visible


def naive_window_linear(q, k, v, fq, fk, u, log_a, mix, window: int, S0, *, n_sink: int = 0,
                        sink_k=None, sink_v=None):
    B, H, T, d = q.shape
    L = k.shape[2] - T
    q, k, v, fq, fk, u, log_a = (t.float() for t in (q, k, v, fq, fk, u, log_a))
    sk, sv = sink_kv(B, H, d, q, sink_k, sink_v)
    w = mix.float().view(1, H, 1)
    S = S0.float().clone()
    ones = u.new_ones(B, H, 1)
    out = []
    for t in range(T):
        S = log_a[:, :, t, None, None].exp() * S + \
            fk[:, :, t, :, None] * torch.cat([u[:, :, t], ones], -1)[:, :, None, :]
        seen = visible(torch.tensor(L + t), torch.arange(L + T), window, n_sink)
        keys, vals = torch.cat([sk, k[:, :, seen]], 2), torch.cat([sv, v[:, :, seen]], 2)
        s = torch.einsum("bhd,bhjd->bhj", q[:, :, t], keys) * d ** -0.5
        p = (s - s.amax(-1, keepdim=True)).exp()                  # [B, H, n]
        lin = torch.einsum("bhf,bhfe->bhe", fq[:, :, t], S)       # [B, H, d + 1]
        num = w * torch.einsum("bhj,bhjd->bhd", p, vals) + (1 - w) * lin[..., :d]
        den = w * p.sum(-1, keepdim=True) + (1 - w) * lin[..., d:]
        out.append(num / den)
    return torch.stack(out, 2), S


def naive_window_softmax(q, k, v, window: int, *, n_sink: int = 0, sink_k=None, sink_v=None):
    """window_softmax's output, one query at a time: the reference it is tested against."""
    B, H, T, d = q.shape
    L = k.shape[2] - T
    q, k, v = q.float(), k.float(), v.float()
    sk, sv = sink_kv(B, H, d, q, sink_k, sink_v)
    out = []
    for t in range(T):
        seen = visible(torch.tensor(L + t), torch.arange(L + T), window, n_sink)
        keys, vals = torch.cat([sk, k[:, :, seen]], 2), torch.cat([sv, v[:, :, seen]], 2)
        p = (torch.einsum("bhd,bhjd->bhj", q[:, :, t], keys) * d ** -0.5).softmax(-1)
        out.append(torch.einsum("bhj,bhjd->bhd", p, vals))
    return torch.stack(out, 2) if T else q
