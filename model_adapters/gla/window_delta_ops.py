"""The gated delta-rule twin layer's core: exact softmax attention over the sinks and the last W
tokens (window_linear_ops.window_softmax), plus a gated delta-rule memory (Gated DeltaNet,
arXiv 2412.06464) of the tokens that are neither, mixed by a per-token look-back weight.
Same shape as window_linear_ops: a token-by-token reference (`naive_window_delta`) and the fast
path (`chunk_window_delta`: the chunked window softmax and ops/gated_delta's chunked rule).

Per head, with the memory S [d_k, d_v] (fla's [K, V] orientation) and the token leaving the
window at step t (key kd_t, L2-normalised; value vd_t; write strength b_t; zero where none
enters: inside the window, or a sink):

    S_t = a_t (I - b_t kd_t kd_t^T) S_{t-1} + b_t kd_t vd_t^T      (a_t = exp(log_a_t))
    o_t = o_w,t + lam_t (S_t^T qd_t - o_w,t)

o_w,t is softmax attention over the visible keys; qd_t the L2-normalised query. lam_t is the
look-back weight, zero until a token has entered the memory, so on S + W tokens or fewer the
layer is exactly its parent's attention. A delta rule overwrites what a key held instead of
adding to it, which is why it keeps retrieval where additive (GLA-type) states saturate
(arXiv 2504.14366).

Arguments (computed in fp32):
    q, k, v, window, n_sink, sink_k, sink_v   as window_linear_ops.window_softmax
    qd     [B, H, T, d]      read queries (L2-normalised)
    kd, vd [B, H, T, d]      key (L2-normalised) and value of the token entering at each step
    log_a  [B, H, T]         log decay (<= 0);  beta [B, H, T] write strength in [0, 1]
    lam    [B, H, T]         look-back weight in [0, 1]
    S0     [B, H, d, d]      the memory before the T steps
Returns o [B, H, T, d] and the memory after the T steps [B, H, d, d].
"""
from __future__ import annotations

import torch

from evalkit.model_adapters.gla.window_linear_ops import naive_window_softmax, window_softmax


def naive_window_delta(q, k, v, qd, kd, vd, log_a, beta, lam, window: int, S0, *,
                       n_sink: int = 0, sink_k=None, sink_v=None):
    T = q.shape[2]
    o_w = naive_window_softmax(q, k, v, window, n_sink=n_sink, sink_k=sink_k, sink_v=sink_v)
    qd, kd, vd, log_a, beta, lam = (t.float() for t in (qd, kd, vd, log_a, beta, lam))
    S = S0.float().clone()
    out = []
    for t in range(T):
        kt, b = kd[:, :, t, :, None], beta[:, :, t, None, None]               # [B, H, d, 1]
        S = log_a[:, :, t, None, None].exp() * (S - b * kt @ (kt.transpose(-1, -2) @ S))
        S = S + b * kt @ vd[:, :, t, None, :]
        read = (qd[:, :, t, None, :] @ S)[:, :, 0]                            # [B, H, d]
        out.append(o_w[:, :, t] + lam[:, :, t, None] * (read - o_w[:, :, t]))
    return (torch.stack(out, 2) if T else o_w), S


def chunk_window_delta(q, k, v, qd, kd, vd, log_a, beta, lam, window: int, S0, *,
                       n_sink: int = 0, sink_k=None, sink_v=None, chunk_size: int = 64):
    from evalkit.model_adapters.gla.ops.gated_delta import chunk_gated_delta

    o_w, _ = window_softmax(q, k, v, window, n_sink=n_sink, sink_k=sink_k, sink_v=sink_v,
                            chunk_size=chunk_size)
    lay = lambda t: t.float().transpose(1, 2)                                # fla's [B, T, H, .]
    read, S = chunk_gated_delta(lay(qd), lay(kd), lay(vd), lay(log_a), lay(beta), scale=1.0,
                                initial_state=S0.float(), output_final_state=True,
                                chunk_size=chunk_size)
    return o_w + lam.float()[..., None] * (read.float().transpose(1, 2) - o_w), S
