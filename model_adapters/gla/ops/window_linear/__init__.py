"""The window_linear mixer's core (LoLCATs, arXiv 2410.10254): exact softmax attention over the
first S tokens (attention sinks, StreamingLLM arXiv 2309.17453) and the last W tokens, plus a
gated linear-attention state over the tokens that are neither, in one normalised combination.
Two implementations with the same signature, fla style: a token-by-token reference
(`naive_window_linear`, naive.py) and the blocked fast path (`chunk_window_linear`, chunk.py)
that the model runs; `window_softmax` is the exact part alone (the sink + window reference,
and the delta-rule twin's exact part, ops/window_delta/).

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
from evalkit.model_adapters.gla.ops.window_linear.chunk import chunk_window_linear, window_softmax
from evalkit.model_adapters.gla.ops.window_linear.naive import naive_window_linear, naive_window_softmax

__all__ = ["chunk_window_linear", "naive_window_linear", "naive_window_softmax", "window_softmax"]
