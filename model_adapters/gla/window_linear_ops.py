"""The window_linear mixer's core (LoLCATs, arXiv 2410.10254): exact softmax attention over the
last W tokens plus a gated linear-attention state over the tokens that have left the window,
in one normalised combination. Two implementations with the same signature, fla style: a
token-by-token reference (`naive_window_linear`) and the blocked fast path
(`chunk_window_linear`) that the model runs.

For query t of head h, window weight w = mix[h] (in (0, 1)), scores s_tj = q_t k_j / sqrt(d)
over the window j in (t - W, t], m_t = max_j s_tj:

    S_t = a_t S_{t-1} + phi_k(k_{t-W}) [v_{t-W}, 1]          (the token leaving the window)
    num = w sum_j exp(s_tj - m_t) v_j + (1 - w) phi_q(q_t) S_t[:, :d]
    den = w sum_j exp(s_tj - m_t)     + (1 - w) phi_q(q_t) S_t[:, d]
    o_t = num / den

The last column of S is the normaliser (the sum of the entered features). Like LoLCATs, the
window terms are scaled by exp(-m_t) and the linear ones are not (their own hybrid_attention_
quadratic). Before any token has left the window S = 0, so o_t is exactly softmax attention.

Arguments (all computed in fp32):
    q      [B, H, T, d]      queries (rotated), the last T positions
    k, v   [B, H, L+T, d]    the window's cached keys/values (L <= W, oldest first), then the
                             T new ones (heads already repeated for GQA)
    fq     [B, H, T, F]      query features
    fk, u  [B, H, T, F | d]  features and value of the token entering the state at each step
                             (zero where none has left the window yet)
    log_a  [B, H, T]         log forget gate (<= 0) applied to the state at each step
    mix    [H]               window weight w
    S0     [B, H, F, d + 1]  the state before the T steps
Returns o [B, H, T, d] and the state after the T steps [B, H, F, d + 1].
"""
from __future__ import annotations

import torch
import torch.nn.functional as F


def naive_window_linear(q, k, v, fq, fk, u, log_a, mix, window: int, S0):
    B, H, T, d = q.shape
    L = k.shape[2] - T
    q, k, v, fq, fk, u, log_a = (t.float() for t in (q, k, v, fq, fk, u, log_a))
    w = mix.float().view(1, H, 1)
    S = S0.float().clone()
    ones = u.new_ones(B, H, 1)
    out = []
    for t in range(T):
        S = log_a[:, :, t, None, None].exp() * S + \
            fk[:, :, t, :, None] * torch.cat([u[:, :, t], ones], -1)[:, :, None, :]
        lo, hi = max(0, L + t - window + 1), L + t + 1            # window (t - W, t]
        s = torch.einsum("bhd,bhjd->bhj", q[:, :, t], k[:, :, lo:hi]) * d ** -0.5
        p = (s - s.amax(-1, keepdim=True)).exp()                  # [B, H, n]
        lin = torch.einsum("bhf,bhfe->bhe", fq[:, :, t], S)       # [B, H, d + 1]
        num = w * torch.einsum("bhj,bhjd->bhd", p, v[:, :, lo:hi]) + (1 - w) * lin[..., :d]
        den = w * p.sum(-1, keepdim=True) + (1 - w) * lin[..., d:]
        out.append(num / den)
    return torch.stack(out, 2), S


def chunk_window_linear(q, k, v, fq, fk, u, log_a, mix, window: int, S0, chunk_size: int = 64):
    """Blocks of `chunk_size` queries. The window's softmax output o_w comes from
    scaled_dot_product_attention, the parent's own call (is_causal when no key is outside the
    window), and the linear part corrects it:

        o = o_w + (1 - w) (num_lin - den_lin o_w) / (w Z + (1 - w) den_lin),  Z = sum_j exp(s_tj - m_t)

    the same o as the naive form, and bit for bit the parent's while nothing has left the
    window (num_lin = den_lin = 0). The linear part is the chunked form of scalar-gated linear
    attention: intra-block scores exp(G_i - G_j) fq_i fk_j, inter-block exp(G_i) fq_i S, every
    exponent <= 0."""
    B, H, T, d = q.shape
    L = k.shape[2] - T
    q, k, v, fq, fk, u, log_a = (t.float() for t in (q, k, v, fq, fk, u, log_a))
    w = mix.float().view(1, H, 1, 1)
    S = S0.float()
    U = torch.cat([u, u.new_ones(B, H, T, 1)], -1)                # [B, H, T, d + 1]
    whole = F.scaled_dot_product_attention(q, k, v, is_causal=True) if L == 0 and T <= window \
        else None                                                 # nothing outside the window
    out = []
    for t0 in range(0, T, chunk_size):
        t1 = min(T, t0 + chunk_size)
        # -- window: queries t0..t1-1 see key indices (L + t - W, L + t]
        lo = max(0, L + t0 - window + 1)
        qi = torch.arange(L + t0, L + t1, device=q.device)[:, None]
        kj = torch.arange(lo, L + t1, device=q.device)[None, :]
        inside = (kj <= qi) & (kj > qi - window)                  # [c, n]
        qc, kc, vc = q[:, :, t0:t1], k[:, :, lo:L + t1], v[:, :, lo:L + t1]
        o_w = whole[:, :, t0:t1] if whole is not None else \
            F.scaled_dot_product_attention(qc, kc, vc, attn_mask=inside)
        s = (qc @ kc.transpose(-1, -2) * d ** -0.5).masked_fill(~inside, float("-inf"))
        Z = (s - s.amax(-1, keepdim=True)).exp().sum(-1, keepdim=True)   # [B, H, c, 1]
        # -- linear state over the tokens that left the window
        G = log_a[:, :, t0:t1].cumsum(-1)                         # [B, H, c]
        diff = G[..., :, None] - G[..., None, :]                  # [B, H, c, c]
        causal = torch.ones(t1 - t0, t1 - t0, dtype=torch.bool, device=q.device).tril()
        A = (fq[:, :, t0:t1] @ fk[:, :, t0:t1].transpose(-1, -2)) * \
            diff.masked_fill(~causal, float("-inf")).exp()
        lin = A @ U[:, :, t0:t1] + (fq[:, :, t0:t1] * G[..., None].exp()) @ S
        num, den = lin[..., :d], lin[..., d:]
        out.append(o_w + (1 - w) * (num - den * o_w) / (w * Z + (1 - w) * den))
        decay = (G[..., -1:] - G).exp()                           # [B, H, c]
        S = G[..., -1, None, None].exp() * S + \
            (fk[:, :, t0:t1] * decay[..., None]).transpose(-1, -2) @ U[:, :, t0:t1]
    return torch.cat(out, 2), S
