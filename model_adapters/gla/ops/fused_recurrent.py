"""Recurrent GLA for decoding: a few tokens per call against a carried state.

Same signature and shapes as `naive_recurrent_gla` (q, k, g: [B, T, H, K]; v: [B, T, H, V];
state [B, H, K, V] fp32). Written for T == 1 (one batched matmul per step, no Python-side
stacking); for longer inputs it loops, so prefill should use `chunk_gla`.
"""
from __future__ import annotations

import torch


def fused_recurrent_gla(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, g: torch.Tensor,
                        initial_state: torch.Tensor | None = None,
                        output_final_state: bool = False,
                        scale: float | None = None) -> tuple[torch.Tensor, torch.Tensor | None]:
    B, T, H, K = q.shape
    V = v.shape[-1]
    scale = K ** -0.5 if scale is None else scale
    dtype = q.dtype
    S = (initial_state.float() if initial_state is not None
         else torch.zeros(B, H, K, V, device=q.device, dtype=torch.float32))
    q, k, v, g = (x.float() for x in (q, k, v, g))
    outs = []
    for t in range(T):
        # S <- exp(g) * S + k^T v   (as one fused multiply-add: baddbmm over B*H)
        decay = g[:, t].exp().reshape(B * H, K, 1)
        S = torch.baddbmm(S.reshape(B * H, K, V) * decay,
                          k[:, t].reshape(B * H, K, 1), v[:, t].reshape(B * H, 1, V))
        o_t = torch.bmm(q[:, t].reshape(B * H, 1, K) * scale, S)    # [B*H, 1, V]
        S = S.reshape(B, H, K, V)
        outs.append(o_t.reshape(B, H, V))
    if T == 0:
        return q.new_zeros(B, 0, H, V).to(dtype), (S if output_final_state else None)
    o = torch.stack(outs, 1) if T != 1 else outs[0].unsqueeze(1)
    return o.to(dtype), (S if output_final_state else None)
