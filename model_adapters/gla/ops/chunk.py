"""Chunked (parallel) GLA: quadratic inside a chunk, recurrent between chunks.

Same signature as `naive_recurrent_gla`: q, k, g: [B, T, H, K]; v: [B, T, H, V];
initial_state / final state [B, H, K, V] (fp32); returns o [B, T, H, V] in q's dtype.

Within a chunk of C tokens, with b = cumsum(g) (log decay from the chunk start, <= 0 and
non-increasing), the decay from token j to token i is exp(b_i - b_j). Then
    o_i = q_i exp(b_i) S_0                                  (inter-chunk, from the carried state)
        + sum_{j<=i} [q_i . (k_j exp(b_i - b_j))] v_j       (intra-chunk)
    S_C = exp(b_C) S_0 + sum_j (k_j exp(b_C - b_j))^T v_j
Computing (q exp(b)) (k exp(-b))^T directly overflows once b is very negative, so the intra
part is split into sub-chunks of `sub_chunk` tokens (as fla does): off-diagonal blocks are
factored around the first position r of the query sub-chunk, exp(b_i - r) * exp(r - b_j), both
factors <= 1; diagonal blocks are computed pairwise in log space. Every exponent is <= 0.
All arithmetic is fp32; the Python loop runs once per chunk (T / C), not per token.
"""
from __future__ import annotations

import torch
import torch.nn.functional as F


def chunk_gla(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, g: torch.Tensor,
              initial_state: torch.Tensor | None = None,
              output_final_state: bool = False,
              scale: float | None = None,
              chunk_size: int = 128,
              sub_chunk: int = 16) -> tuple[torch.Tensor, torch.Tensor | None]:
    B, T, H, K = q.shape
    V = v.shape[-1]
    if chunk_size < 1 or sub_chunk < 1:
        raise ValueError(f"chunk_size ({chunk_size}) and sub_chunk ({sub_chunk}) must be >= 1")
    scale = K ** -0.5 if scale is None else scale
    dtype = q.dtype
    c = min(sub_chunk, chunk_size)
    # A short input gets a short chunk (a multiple of the sub-chunk) instead of padding to C.
    C = min(chunk_size, -(-max(T, 1) // c) * c)
    if C % c:
        raise ValueError(f"chunk_size {chunk_size} must be a multiple of sub_chunk {c}")
    pad = (-T) % C
    # Padding with k = 0 and g = 0 adds nothing to the state and does not decay it.
    q, k, v, g = (F.pad(x.float(), (0, 0, 0, 0, 0, pad)) for x in (q, k, v, g))
    N, n = (T + pad) // C, C // c

    def chunks(x: torch.Tensor) -> torch.Tensor:  # [B, T, H, D] -> [B, H, N, C, D]
        return x.transpose(1, 2).reshape(B, H, N, C, x.shape[-1])

    q, k, v, g = chunks(q) * scale, chunks(k), chunks(v), chunks(g)
    b = g.cumsum(-2)                                            # [B, H, N, C, K]

    # -- intra-chunk scores A [B, H, N, C, C] ----------------------------------------
    bs = b.view(B, H, N, n, c, K)
    ref = bs[..., :1, :]                                        # [B, H, N, n, 1, K]
    q_ref = q.view(B, H, N, n, c, K) * (bs - ref).exp()         # exp(b_i - r) <= 1
    pos = torch.arange(C, device=q.device)
    before = pos.view(1, C) < (torch.arange(n, device=q.device) * c).view(n, 1)  # [n, C]: j < r
    e = ref - b.unsqueeze(3)                                    # [B, H, N, n, C, K]
    e = torch.where(before.view(n, C, 1), e, torch.full_like(e, float("-inf")))
    k_ref = k.unsqueeze(3) * e.exp()                            # exp(r - b_j) <= 1, 0 if j >= r
    A = (q_ref @ k_ref.transpose(-1, -2)).reshape(B, H, N, C, C)
    # Diagonal c x c blocks, pairwise: sum_k q_ik k_jk exp(b_ik - b_jk), j <= i.
    qs, ks = q.view(B, H, N, n, c, K), k.view(B, H, N, n, c, K)
    causal = torch.ones(c, c, dtype=torch.bool, device=q.device).tril()
    d = bs.unsqueeze(-2) - bs.unsqueeze(-3)                     # [B, H, N, n, c, c, K]
    d = torch.where(causal.view(c, c, 1), d, torch.full_like(d, float("-inf")))
    D = (qs.unsqueeze(-2) * ks.unsqueeze(-3) * d.exp()).sum(-1)  # [B, H, N, n, c, c]
    eye = torch.eye(n, device=q.device, dtype=D.dtype)
    A = A + (D.unsqueeze(-2) * eye.view(n, 1, n, 1)).reshape(B, H, N, C, C)
    o = A @ v                                                   # [B, H, N, C, V]

    # -- state carried across chunks -------------------------------------------------
    b_last = b[..., -1:, :]                                     # [B, H, N, 1, K]
    U = (k * (b_last - b).exp()).transpose(-1, -2) @ v          # [B, H, N, K, V]
    decay = b_last.squeeze(-2).exp().unsqueeze(-1)              # [B, H, N, K, 1]
    S = (initial_state.float() if initial_state is not None
         else torch.zeros(B, H, K, V, device=q.device, dtype=torch.float32))
    starts = []
    for i in range(N):
        starts.append(S)
        S = decay[:, :, i] * S + U[:, :, i]
    o = o + (q * b.exp()) @ torch.stack(starts, 2)              # inter-chunk part

    o = o.reshape(B, H, N * C, V)[:, :, :T].transpose(1, 2)
    return o.to(dtype), (S if output_final_state else None)
