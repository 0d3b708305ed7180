"""Chunked (parallel) GLA: quadratic inside a chunk, recurrent between chunks.

Same signature as `naive_recurrent_gla`: q, k, g: [B, T, H, K]; v: [B, T, H, V];
initial_state / final state [B, H, K, V] (fp32); returns o [B, T, H, V] in q's dtype.

Within a chunk of C tokens, with b = cumsum(g) (log decay since the chunk start: <= 0 and
non-increasing), the decay from token j to token i >= j is exp(b_i - b_j), so
    o_i = (q_i * exp(b_i)) S_0  +  sum_{j<=i} [q_i . (k_j * exp(b_i - b_j))] v_j
    S_C = exp(b_C) S_0  +  sum_j (k_j * exp(b_C - b_j))^T v_j
Computing the scores as (q exp(b)) (k exp(-b))^T overflows once b is very negative. Instead
the scores are built block by block in log space: the lower-left s x s block of each
diagonal 2s x 2s block is (q_i exp(b_i - r)) (k_j exp(r - b_j))^T with r = b at the first row
of the lower half, so j < r-row <= i makes both exponents <= 0 (nothing overflows, whatever
the gates). Going s = 1, 2, 4, ..., C/2 covers the strict lower triangle; the diagonal has
decay 1. Per chunk that is log2(C) small matmuls, all batched over B, H and chunks; the only
Python loop carries the state across chunks (T / C steps).

Fast path: when every chunk's log decay span (-b at the chunk's last token, the largest
|b| in the chunk) is at most FAST_SPAN, the factors exp(b) and exp(-b) lie in
[e^-40, e^40], far inside fp32's range, so the whole chunk's scores are one matmul
(q exp(b)) (k exp(-b))^T, masked to j <= i. Each product carries the same relative error as
the log-space form (the error comes from the cumsum b either way). Gates with
gate_logit_normalizer 16 nearly always qualify (a span of 40 over 128 tokens needs a mean
per-token log decay below -0.31); faster-decaying gates, and traced graphs (no
data-dependent branch there), take the log-space blocks above. Tests cover both paths.
"""
from __future__ import annotations

import math

import torch
import torch.nn.functional as F

FAST_SPAN = 40.0  # largest in-chunk log decay span for the one-matmul scores (e^40 ~ 2e17)
# Tokens per pass: a long input is run as consecutive blocks with the state carried between
# them (exactly the same result), so the per-pass buffers (scores [B, H, C, C] per chunk)
# stay in cache instead of being fresh multi-MB allocations that page-fault on every call:
# on CPU, 16K tokens in one pass ran at half the per-token speed of 1K.
BLOCK_TOKENS = 512


def _times_exp(x: torch.Tensor, e: torch.Tensor) -> torch.Tensor:
    """x * exp(e) for a fresh temporary e; in place (no extra allocations) when autograd is off."""
    if torch.is_grad_enabled() and (x.requires_grad or e.requires_grad):
        return x * e.exp()
    return e.exp_().mul_(x)


def _intra_scores(q: torch.Tensor, k: torch.Tensor, b: torch.Tensor, A: torch.Tensor,
                  log_scale: float) -> None:
    """Write the causal decayed scores scale * sum_k q_ik k_jk exp(b_ik - b_jk), j <= i, into
    A [..., C, C] (zeros above the diagonal must already be there). q, k, b: [..., C, K]."""
    C = q.shape[-2]
    scale = math.exp(log_scale)
    tile = C // (C & -C)  # odd part of C: diagonal tiles done pairwise (1 for powers of two)
    if tile == 1:
        A.diagonal(dim1=-2, dim2=-1).copy_((q * k).sum(-1) * scale)
    else:
        M = C // tile
        qt, kt, bt = (x.unflatten(-2, (M, tile)) for x in (q, k, b))          # [..., M, t, K]
        d = bt.unsqueeze(-2) - bt.unsqueeze(-3) + log_scale                    # [..., M, t, t, K]
        causal = torch.ones(tile, tile, dtype=torch.bool, device=q.device).tril().unsqueeze(-1)
        d = torch.where(causal, d, torch.full_like(d, float("-inf")))
        D = (qt.unsqueeze(-2) * kt.unsqueeze(-3) * d.exp()).sum(-1)            # [..., M, t, t]
        Av = A.unflatten(-1, (M, tile)).unflatten(-3, (M, tile))               # [..., M, t, M, t]
        torch.diagonal(Av, dim1=-4, dim2=-2).copy_(D.movedim(-3, -1))
    s = tile
    while s < C:
        M = C // (2 * s)
        qv, kv, bv = (x.unflatten(-2, (M, 2, s)) for x in (q, k, b))          # [..., M, 2, s, K]
        ref = bv[..., 1, :1, :]                                                # [..., M, 1, K]
        qr = _times_exp(qv[..., 1, :, :], bv[..., 1, :, :] - (ref - log_scale))  # rows: lower half
        kr = _times_exp(kv[..., 0, :, :], ref - bv[..., 0, :, :])                 # cols: upper half
        if s <= 2:  # tiny blocks: elementwise beats batched matmul dispatch
            blk = (qr.unsqueeze(-2) * kr.unsqueeze(-3)).sum(-1)
        else:
            blk = qr @ kr.transpose(-1, -2)                                     # [..., M, s, s]
        Av = A.unflatten(-1, (M, 2, s)).unflatten(-4, (M, 2, s))               # [..., M,2,s, M,2,s]
        torch.diagonal(Av[..., :, 1, :, :, 0, :], dim1=-4, dim2=-2).copy_(blk.movedim(-3, -1))
        s *= 2


def chunk_gla(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, g: torch.Tensor,
              initial_state: torch.Tensor | None = None,
              output_final_state: bool = False,
              scale: float | None = None,
              chunk_size: int = 128) -> tuple[torch.Tensor, torch.Tensor | None]:
    T = q.shape[1]
    block = max(chunk_size, BLOCK_TOKENS // chunk_size * chunk_size)
    if T <= block or torch.compiler.is_compiling():
        return _chunk_gla(q, k, v, g, initial_state, output_final_state, scale, chunk_size)
    S, outs = initial_state, []
    for s in range(0, T, block):
        o, S = _chunk_gla(q[:, s:s + block], k[:, s:s + block], v[:, s:s + block],
                          g[:, s:s + block], S, True, scale, chunk_size)
        outs.append(o)
    return torch.cat(outs, 1), (S if output_final_state else None)


def _chunk_gla(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, g: torch.Tensor,
               initial_state: torch.Tensor | None, output_final_state: bool,
               scale: float | None, chunk_size: int) -> tuple[torch.Tensor, torch.Tensor | None]:
    B, T, H, K = q.shape
    V = v.shape[-1]
    if chunk_size < 1:
        raise ValueError(f"chunk_size must be >= 1, got {chunk_size}")
    scale = K ** -0.5 if scale is None else scale
    dtype = q.dtype
    # A short input gets a short chunk (next power of two) instead of padding to chunk_size.
    C = min(chunk_size, 1 << max(T - 1, 0).bit_length())
    pad = (-T) % C
    N = (T + pad) // C

    def chunks(x: torch.Tensor) -> torch.Tensor:  # [B, T, H, D] -> [B, H, N, C, D] fp32 view
        x = x.float()
        if pad:  # k = 0 and g = 0 in the padding: adds nothing to the state, decays nothing
            x = F.pad(x, (0, 0, 0, 0, 0, pad))
        return x.transpose(1, 2).unflatten(2, (N, C))

    # The scale is folded into the exponents below (exp(b + log scale)): no pass over q.
    log_scale = math.log(scale)
    q, k, v = chunks(q), chunks(k), chunks(v).contiguous()  # q, k only meet elementwise ops
    b = chunks(g).cumsum(-2)                                        # [B, H, N, C, K]

    # State at each chunk start: S_{n+1} = exp(b_last) S_n + (k exp(b_last - b))^T v
    b_last = b[..., -1:, :]                                         # [B, H, N, 1, K]
    U = _times_exp(k, b_last - b).transpose(-1, -2) @ v             # [B, H, N, K, V]
    decay = b_last.transpose(-1, -2).exp()                          # [B, H, N, K, 1]
    S = (initial_state.float() if initial_state is not None
         else q.new_zeros(B, H, K, V))
    starts = []
    for i in range(N):
        starts.append(S)
        S = decay[:, :, i] * S + U[:, :, i]

    # o = A v + (q exp(b)) S_start: intra- and inter-chunk parts in one batched matmul.
    qe = _times_exp(q, b + log_scale)                               # [B, H, N, C, K]
    inter = (qe @ torch.stack(starts, 2)).flatten(0, 2)             # [B*H*N, C, V]
    traced = torch.compiler.is_compiling() or q.device.type == "xla"  # lazy tensors trace too
    if not traced and -float(b_last.detach().min()) <= FAST_SPAN:
        A = (qe @ _times_exp(k, b.neg()).transpose(-1, -2)).tril_()  # [B, H, N, C, C], j <= i
    else:
        A = q.new_zeros(B, H, N, C, C)
        _intra_scores(q, k, b, A, log_scale)
    o = torch.baddbmm(inter, A.flatten(0, 2), v.flatten(0, 2))      # [B*H*N, C, V]
    o = o.view(B, H, N * C, V)[:, :, :T].transpose(1, 2)           # [B, T, H, V]
    return o.to(dtype), (S if output_final_state else None)
