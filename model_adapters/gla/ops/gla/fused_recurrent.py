"""Recurrent GLA for decoding: a few tokens per call against a carried state.

Same signature and shapes as `naive_recurrent_gla` (q, k, g: [B, T, H, K]; v: [B, T, H, V];
state [B, H, K, V] fp32). Written for T == 1 (decoding): a handful of broadcast ops, which on
CPU beat batched matmuls of 1-row matrices; for longer inputs it loops, so prefill should use
`chunk_gla`.
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
        # S <- exp(g) * S + k^T v ;  o = scale * q S
        S = torch.addcmul(S * g[:, t].exp().unsqueeze(-1), k[:, t].unsqueeze(-1), v[:, t].unsqueeze(-2))
        outs.append((q[:, t].unsqueeze(-1) * S).sum(-2) * scale)   # [B, H, V]
    if T == 0:
        return q.new_zeros(B, 0, H, V).to(dtype), (S if output_final_state else None)
    o = torch.stack(outs, 1) if T != 1 else outs[0].unsqueeze(1)
    return o.to(dtype), (S if output_final_state else None)
