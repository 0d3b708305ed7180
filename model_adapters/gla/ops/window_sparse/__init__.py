"""The twin layer with a bounded sparse cache (LoLA, arXiv 2505.23666): exact softmax attention
over the sinks, the last W tokens and up to N older tokens the state recalls worst, plus the
state (a GLA state with a normaliser, ops/window_linear, or a gated delta-rule memory,
ops/window_delta) over every other token, in the same combination as the ops without a cache.
Two implementations with one signature, fla style: a token-by-token reference, one (batch,
head) at a time with a Python list as the cache (`naive_window_sparse`, naive.py), and the path
the model runs (`chunk_window_sparse`, chunk.py): the selection vectorised over batch and heads,
the exact part in blocks of queries.

At step t (query index L + t of k) the token leaving the window is k index j = L + t - W; it is
a candidate unless it is a sink (j < n_sink) or there is none (j < 0). A candidate is scored by
how badly the state, as it stands before step t, recalls it (common.recall_error):

    delta rule:  e = || vd_j - S^T kd_j ||              (the memory's own read-out at its key)
    GLA:         e = || u_j - (phi_k(k_j) S[:, :d]) / (phi_k(k_j) S[:, d]) ||   (0 / 0 read as 0)

The GLA state is an unnormalised sum that grows with every token entered, so its raw read-out
measures how much it holds, not how well; the normalised read-out is what the linear branch
alone answers for that key (LoLCATs' linear attention), the value the error is comparable to.
The score is kept with the token and never recomputed. While the cache holds fewer than N
tokens the candidate is admitted; once full, the lowest error among the cache and the candidate
(first in slot order on a tie, the candidate last) goes into the state at step t, with step t's
decay (and its own key, value and write strength), and the candidate takes that slot. With N = 0
every candidate enters the state at once: exactly the ops without a cache. Query t then sees the
sinks, its window and the cache after step t exactly, and the state after step t; the delta
rule's look-back weight lam_t counts only when a token entered at step t (as without a cache,
where that is "the memory is not empty"). Since a token enters only once the cache is full,
whether one enters at step t is the same for every batch row and head.

Arguments (fp32):
    kind            "gla" | "gated_delta"
    q [B, H, T, d]  rotated queries;  k, v [B, H, L+T, d] the cached window then the T new ones
    fq [B, H, T, F] read features (GLA: phi_q(q); delta rule: qd)
    pf, pu          [B, H, P, F | d] key features (phi_k, or kd) and values of the pool: the
                    n0 cached tokens, then k's L + T tokens (P = n0 + L + T)
    pb [B, H, P]    write strength (delta rule), None for GLA
    log_a [B, H, T] step t's log decay;  mix: GLA's window weight [H] or the delta rule's
                    look-back weight [B, H, T]
    S0              the state before the T steps;  N the cache's bound
    cache           (K, V, error, position) [B, H, n0, .] as the layer state keeps them
    first           position of k's first entry
    n_sink, sink_k, sink_v   as ops/window_linear
Returns o [B, H, T, d], the state after the T steps, the cache after them and `entered`
[B, H, T]: the position of the token that entered the state at each step (-1: none).
"""
from evalkit.model_adapters.gla.ops.window_sparse.chunk import chunk_window_sparse
from evalkit.model_adapters.gla.ops.window_sparse.common import recall_error
from evalkit.model_adapters.gla.ops.window_sparse.naive import naive_window_sparse

__all__ = ["chunk_window_sparse", "naive_window_sparse", "recall_error"]
