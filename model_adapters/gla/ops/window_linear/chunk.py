"""The blocked fast paths of the window ops, run by the model (tested against naive.py)."""
from __future__ import annotations

import torch
import torch.nn.functional as F

from evalkit.model_adapters.gla.ops.window_linear.common import sink_kv, visible


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
    sk, sv = sink_kv(B, H, d, q, sink_k, sink_v)
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
                          visible(qi, kj, window, n_sink)], 1)                  # [c, n]
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
