"""The window_linear mixer's core (LoLCATs, arXiv 2410.10254): exact softmax attention over the
first S tokens (attention sinks, StreamingLLM arXiv 2309.17453) and the last W tokens, plus a
gated linear-attention state over the tokens that are neither, in one normalised combination.
Two implementations with the same signature, fla style: a token-by-token reference
(`naive_window_linear`) and the blocked fast path (`chunk_window_linear`) that the model runs;
`window_softmax` is the exact part alone (the sink + window reference, and the delta-rule twin's
exact part, gla/window_delta_ops.py).

For query t of head h, window weight w = mix[h] (in (0, 1)), scores s_tj = q_t k_j / sqrt(d)
over the visible keys j (the window (t - W, t] and the sinks), m_t = max_j s_tj:

    S_t = a_t S_{t-1} + phi_k(k_{t-W}) [v_{t-W}, 1]          (the token leaving the window,
                                                               unless it is a sink)
    num = w sum_j exp(s_tj - m_t) v_j + (1 - w) phi_q(q_t) S_t[:, :d]
    den = w sum_j exp(s_tj - m_t)     + (1 - w) phi_q(q_t) S_t[:, d]
    o_t = num / den

The last column of S is the normaliser (the sum of the entered features). Like LoLCATs, the
window terms are scaled by exp(-m_t) and the linear ones are not (their own hybrid_attention_
quadratic). Before any token has entered the state S = 0, so o_t is exactly softmax attention
over the sinks and the window: on S + W tokens or fewer, the parent's own attention.

Arguments (all computed in fp32):
    q      [B, H, T, d]      queries (rotated), the last T positions
    k, v   [B, H, L+T, d]    the window's cached keys/values (L <= W, oldest first), then the
                             T new ones (heads already repeated for GQA)
    fq     [B, H, T, F]      query features
    fk, u  [B, H, T, F | d]  features and value of the token entering the state at each step
                             (zero where none does: inside the window, or a sink)
    log_a  [B, H, T]         log forget gate (<= 0) applied to the state at each step
    mix    [H]               window weight w
    S0     [B, H, F, d + 1]  the state before the T steps
Sinks (keyword, default none):
    n_sink                   how many leading entries of k are sinks (positions < S): seen by
                             every later query even outside the window
    sink_k, sink_v [B, H, S', d]  sinks that are not in k any more (older than the cache)
Returns o [B, H, T, d] and the state after the T steps [B, H, F, d + 1].
"""
from __future__ import annotations

import torch
import torch.nn.functional as F


def _visible(qi: torch.Tensor, kj: torch.Tensor, window: int, n_sink: int) -> torch.Tensor:
    """Which keys (indices kj into k) query index qi sees: causal, and inside the window or a
    sink. [c, 1] x [1, n] -> [c, n]."""
    return (kj <= qi) & ((kj > qi - window) | (kj < n_sink))


def _sinks(B: int, H: int, d: int, ref: torch.Tensor, sink_k, sink_v):
    if sink_k is None:
        return ref.new_zeros(B, H, 0, d), ref.new_zeros(B, H, 0, d)
    return sink_k.float(), sink_v.float()


def naive_window_linear(q, k, v, fq, fk, u, log_a, mix, window: int, S0, *, n_sink: int = 0,
                        sink_k=None, sink_v=None):
    B, H, T, d = q.shape
    L = k.shape[2] - T
    q, k, v, fq, fk, u, log_a = (t.float() for t in (q, k, v, fq, fk, u, log_a))
    sk, sv = _sinks(B, H, d, q, sink_k, sink_v)
    w = mix.float().view(1, H, 1)
    S = S0.float().clone()
    ones = u.new_ones(B, H, 1)
    out = []
    for t in range(T):
        S = log_a[:, :, t, None, None].exp() * S + \
            fk[:, :, t, :, None] * torch.cat([u[:, :, t], ones], -1)[:, :, None, :]
        seen = _visible(torch.tensor(L + t), torch.arange(L + T), window, n_sink)
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
    sk, sv = _sinks(B, H, d, q, sink_k, sink_v)
    out = []
    for t in range(T):
        seen = _visible(torch.tensor(L + t), torch.arange(L + T), window, n_sink)
        keys, vals = torch.cat([sk, k[:, :, seen]], 2), torch.cat([sv, v[:, :, seen]], 2)
        p = (torch.einsum("bhd,bhjd->bhj", q[:, :, t], keys) * d ** -0.5).softmax(-1)
        out.append(torch.einsum("bhj,bhjd->bhd", p, vals))
    return torch.stack(out, 2) if T else q


def window_softmax(q, k, v, window: int, *, n_sink: int = 0, sink_k=None, sink_v=None,
                   chunk_size: int = 64, want_z: bool = False):
    """Softmax attention of q [B, H, T, d] over its visible keys (see the module docstring),
    in blocks of `chunk_size` queries. Returns o_w [B, H, T, d] and, with want_z, Z [B, H, T, 1]
    = sum_j exp(s_tj - m_t) (else None). o_w is scaled_dot_product_attention's, the parent's
    own call (is_causal when every key is visible), so the twin is bit for bit its parent
    while nothing has entered the state."""
    B, H, T, d = q.shape
    L = k.shape[2] - T
    q, k, v = q.float(), k.float(), v.float()
    sk, sv = _sinks(B, H, d, q, sink_k, sink_v)
    # every key visible to every earlier-or-equal query: the parent's causal call
    whole = F.scaled_dot_product_attention(q, k, v, is_causal=True) \
        if L == 0 and T <= window + n_sink and sk.shape[2] == 0 else None
    if whole is not None and not want_z:
        return whole, None
    outs, zs = [], []
    for t0 in range(0, T, chunk_size):
        t1 = min(T, t0 + chunk_size)
        # keys: the stored sinks, the sinks in k before the block's window, then the window
        lo = max(0, L + t0 - window + 1)
        early = min(n_sink, lo)
        qi = torch.arange(L + t0, L + t1, device=q.device)[:, None]
        kj = torch.arange(lo, L + t1, device=q.device)[None, :]
        seen = torch.cat([qi.new_ones(t1 - t0, sk.shape[2] + early, dtype=torch.bool),
                          _visible(qi, kj, window, n_sink)], 1)                  # [c, n]
        kc = torch.cat([sk, k[:, :, :early], k[:, :, lo:L + t1]], 2)
        vc = torch.cat([sv, v[:, :, :early], v[:, :, lo:L + t1]], 2)
        qc = q[:, :, t0:t1]
        outs.append(whole[:, :, t0:t1] if whole is not None else
                    F.scaled_dot_product_attention(qc, kc, vc, attn_mask=seen))
        if want_z:
            s = (qc @ kc.transpose(-1, -2) * d ** -0.5).masked_fill(~seen, float("-inf"))
            zs.append((s - s.amax(-1, keepdim=True)).exp().sum(-1, keepdim=True))
    return torch.cat(outs, 2), (torch.cat(zs, 2) if want_z else None)


def chunk_window_linear(q, k, v, fq, fk, u, log_a, mix, window: int, S0, *, n_sink: int = 0,
                        sink_k=None, sink_v=None, chunk_size: int = 64):
    """Blocks of `chunk_size` queries. The exact part's output o_w and Z come from
    window_softmax, and the linear part corrects it:

        o = o_w + (1 - w) (num_lin - den_lin o_w) / (w Z + (1 - w) den_lin),  Z = sum_j exp(s_tj - m_t)

    the same o as the naive form, and bit for bit the parent's while nothing has entered the
    state (num_lin = den_lin = 0). The linear part is the chunked form of scalar-gated linear
    attention: intra-block scores exp(G_i - G_j) fq_i fk_j, inter-block exp(G_i) fq_i S, every
    exponent <= 0."""
    B, H, T, d = q.shape
    fq, fk, u, log_a = (t.float() for t in (fq, fk, u, log_a))
    w = mix.float().view(1, H, 1, 1)
    S = S0.float()
    U = torch.cat([u, u.new_ones(B, H, T, 1)], -1)                # [B, H, T, d + 1]
    o_w, Z = window_softmax(q, k, v, window, n_sink=n_sink, sink_k=sink_k, sink_v=sink_v,
                            chunk_size=chunk_size, want_z=True)
    out = []
    for t0 in range(0, T, chunk_size):
        t1 = min(T, t0 + chunk_size)
        G = log_a[:, :, t0:t1].cumsum(-1)                         # [B, H, c]
        diff = G[..., :, None] - G[..., None, :]                  # [B, H, c, c]
        causal = torch.ones(t1 - t0, t1 - t0, dtype=torch.bool, device=q.device).tril()
        A = (fq[:, :, t0:t1] @ fk[:, :, t0:t1].transpose(-1, -2)) * \
            diff.masked_fill(~causal, float("-inf")).exp()
        lin = A @ U[:, :, t0:t1] + (fq[:, :, t0:t1] * G[..., None].exp()) @ S
        num, den = lin[..., :d], lin[..., d:]
        ow = o_w[:, :, t0:t1]
        out.append(ow + (1 - w) * (num - den * ow) / (w * Z[:, :, t0:t1] + (1 - w) * den))
        decay = (G[..., -1:] - G).exp()                           # [B, H, c]
        S = G[..., -1, None, None].exp() * S + \
            (fk[:, :, t0:t1] * decay[..., None]).transpose(-1, -2) @ U[:, :, t0:t1]
    return torch.cat(out, 2), S
