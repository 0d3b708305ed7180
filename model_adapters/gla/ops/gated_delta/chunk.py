"""Chunked gated delta rule: the WY / UT-transform form of fla's chunk_gated_delta_rule.

Same signature, shapes and conventions as `naive_recurrent_gated_delta` (see naive.py):
q, k: [B, T, H, K] (L2-normalised by the caller); v: [B, T, H, V]; g, beta: [B, T, H];
state [B, H, K, V] fp32 (S^T: row i is what key direction e_i reads); o in q's dtype.

In the state's [K, V] layout one step is S_t = a_t S_{t-1} + k_t u_t^T with the pseudo-value
    u_t = b_t (v_t - a_t S_{t-1}^T k_t)      (the part of v_t the state does not already hold).
Inside a chunk of C tokens starting from state S_0, with c_i = g_1 + ... + g_i (cumulative log
decay since the chunk start, <= 0 and non-increasing):
    S_i = exp(c_i) S_0 + sum_{j<=i} exp(c_i - c_j) k_j u_j^T
so the u's solve the unit lower-triangular system (UT transform)
    (I + A) U = diag(b) V - diag(b exp(c)) K S_0,   A_ij = b_i exp(c_i - c_j) k_i.k_j  (j < i)
i.e. U = U0 - W S_0 with [U0 | W] = (I + A)^-1 [diag(b) V | diag(b exp(c)) K]. Then
    o_i = scale * (exp(c_i) q_i^T S_0 + sum_{j<=i} exp(c_i - c_j) (q_i.k_j) u_j^T)
    S_C = exp(c_C) S_0 + sum_j exp(c_C - c_j) k_j u_j^T.
Everything except S_0 is independent across chunks, so A, the solve (one batched
solve_triangular over B, H and all chunks) and the q.k scores are computed at once; the only
Python loop carries S_0 from chunk to chunk (T / C steps of two small matmuls).

Stability: every exponent used is c_i - c_j with j <= i (masked to -inf above the diagonal
before the exp), c_i or c_C - c_j, all <= 0, so no factor exceeds 1 whatever the decay. With
normalised keys and b in (0, 1], |A_ij| <= 1; the tests find the solve accurate to ~1e-6 at
C = 64 with b near 1 (unnormalised keys would void both the bound and the test).
"""
from __future__ import annotations

import torch
import torch.nn.functional as F

from evalkit.model_adapters.gla.ops.gated_delta.naive import check_inputs


def chunk_gated_delta(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
                      g: torch.Tensor, beta: torch.Tensor, *,
                      scale: float | None = None,
                      initial_state: torch.Tensor | None = None,
                      output_final_state: bool = False,
                      chunk_size: int = 64) -> tuple[torch.Tensor, torch.Tensor | None]:
    B, T, H, K, V = check_inputs(q, k, v, g, beta, initial_state)
    if chunk_size < 1:
        raise ValueError(f"chunk_size must be >= 1, got {chunk_size}")
    scale = K ** -0.5 if scale is None else scale
    dtype = q.dtype
    S = (initial_state.float().clone() if initial_state is not None
         else torch.zeros(B, H, K, V, device=q.device, dtype=torch.float32))
    if T == 0:
        return v.new_zeros(B, 0, H, V, dtype=dtype), (S if output_final_state else None)
    C = min(chunk_size, T)  # a short input is one short chunk, not padded to chunk_size
    pad = (-T) % C
    N = (T + pad) // C

    def chunks(x: torch.Tensor) -> torch.Tensor:
        """[B, T, H, ...] -> [N, B, H, C, ...] fp32, chunk index first so the loop's
        per-chunk slices are contiguous. Padding is zeros: beta = 0 writes nothing and
        g = 0 decays nothing, so padded tokens leave the state as it was."""
        x = x.float()
        if pad:
            x = F.pad(x, (0, 0) * (x.dim() - 2) + (0, pad))
        x = x.unflatten(1, (N, C)).movedim(1, 0)          # [N, B, C, H, ...]
        return x.transpose(2, 3).contiguous()              # [N, B, H, C, ...]

    q, k, v = chunks(q), chunks(k), chunks(v)             # [N, B, H, C, D]
    b = chunks(beta)                                        # [N, B, H, C]
    c = chunks(g).cumsum(-1)                                # [N, B, H, C], <= 0, non-increasing

    # Pairwise decay exp(c_i - c_j) for j <= i; the mask goes on before the exp, so the
    # (positive) exponents above the diagonal never get evaluated.
    causal = torch.ones(C, C, dtype=torch.bool, device=q.device).tril()
    diff = c.unsqueeze(-1) - c.unsqueeze(-2)               # [N, B, H, C, C], row i, col j
    decay = torch.where(causal, diff, diff.new_tensor(float("-inf"))).exp()

    # UT transform. unitriangular=True takes the diagonal as 1, so A (zero diagonal after
    # tril(-1)) stands for I + A; one right-hand side block gives U0 and W together.
    A = (k @ k.transpose(-1, -2) * decay).tril(-1) * b.unsqueeze(-1)
    rhs = torch.cat([v, k * c.exp().unsqueeze(-1)], -1) * b.unsqueeze(-1)
    sol = torch.linalg.solve_triangular(A, rhs, upper=False, unitriangular=True)
    U0, W = sol[..., :V].contiguous(), sol[..., V:].contiguous()   # [N, B, H, C, V|K]

    # Per-chunk pieces that depend only on the chunk: k decayed to the chunk end (state
    # update), the chunk's total decay, and the causal in-chunk scores for the output.
    c_last = c[..., -1:]                                    # [N, B, H, 1]
    k_end = (k * (c_last - c).exp().unsqueeze(-1)).transpose(-1, -2).contiguous()  # [.., K, C]
    a_chunk = c_last.exp().unsqueeze(-1)                    # [N, B, H, 1, 1]
    scores = q @ k.transpose(-1, -2) * decay * scale       # [N, B, H, C, C], zero for j > i

    starts, us = [], []
    for n in range(N):
        starts.append(S)
        u = torch.baddbmm(U0[n].flatten(0, 1), W[n].flatten(0, 1), S.flatten(0, 1), alpha=-1)
        u = u.view(B, H, C, V)                              # u = U0 - W S_0
        us.append(u)
        S = torch.baddbmm((a_chunk[n] * S).flatten(0, 1), k_end[n].flatten(0, 1),
                          u.flatten(0, 1)).view(B, H, K, V)

    # o = scale exp(c) q S_0 + scores U, both batched over all chunks at once.
    qs = q * (c.exp() * scale).unsqueeze(-1)
    o = qs @ torch.stack(starts) + scores @ torch.stack(us)   # [N, B, H, C, V]
    o = o.transpose(2, 3).movedim(0, 1).reshape(B, N * C, H, V)[:, :T]
    return o.to(dtype), (S if output_final_state else None)
