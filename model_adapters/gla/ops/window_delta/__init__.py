"""The gated delta-rule twin layer's core: exact softmax attention over the sinks and the last W
tokens (ops/window_linear: window_softmax), plus a gated delta-rule memory (Gated DeltaNet,
arXiv 2412.06464) of the tokens that are neither, mixed by a per-token look-back weight.
Same shape as ops/window_linear: a token-by-token reference (`naive_window_delta`, naive.py) and
the fast path (`chunk_window_delta`, chunk.py: the chunked window softmax and ops/gated_delta's
chunked rule).

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
    q, k, v, window, n_sink, sink_k, sink_v   as ops/window_linear's window_softmax
    qd     [B, H, T, d]      read queries (L2-normalised)
    kd, vd [B, H, T, d]      key (L2-normalised) and value of the token entering at each step
    log_a  [B, H, T]         log decay (<= 0);  beta [B, H, T] write strength in [0, 1]
    lam    [B, H, T]         look-back weight in [0, 1]
    S0     [B, H, d, d]      the memory before the T steps
Returns o [B, H, T, d] and the memory after the T steps [B, H, d, d].
"""
from evalkit.model_adapters.gla.ops.window_delta.chunk import chunk_window_delta
from evalkit.model_adapters.gla.ops.window_delta.naive import naive_window_delta

__all__ = ["chunk_window_delta", "naive_window_delta"]
