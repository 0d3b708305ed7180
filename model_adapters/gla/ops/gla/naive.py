"""The GLA recurrence, one token at a time: the reference the other forms are tested against.

Shapes (fla's [B, T, H, D] layout): q, k, g: [B, T, H, K]; v: [B, T, H, V];
initial_state / final state: [B, H, K, V] (fp32). g is the log forget gate (<= 0).
Per head:  S_t = diag(exp(g_t)) S_{t-1} + k_t^T v_t ;  o_t = (scale * q_t) S_t.
"""
from __future__ import annotations

import torch


def naive_recurrent_gla(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, g: torch.Tensor,
                        initial_state: torch.Tensor | None = None,
                        output_final_state: bool = False,
                        scale: float | None = None) -> tuple[torch.Tensor, torch.Tensor | None]:
    B, T, H, K = q.shape
    V = v.shape[-1]
    scale = K ** -0.5 if scale is None else scale
    dtype = q.dtype
    q, k, v, g = (x.float() for x in (q, k, v, g))
    S = q.new_zeros(B, H, K, V)
    if initial_state is not None:
        S = S + initial_state.float()
    outs = []
    for t in range(T):
        kv = k[:, t, :, :, None] * v[:, t, :, None, :]            # [B, H, K, V]
        S = S * g[:, t].exp()[..., None] + kv
        outs.append((q[:, t, :, :, None] * scale * S).sum(-2))    # [B, H, V]
    o = torch.stack(outs, 1) if outs else v.new_zeros(B, 0, H, V)
    return o.to(dtype), (S if output_final_state else None)
