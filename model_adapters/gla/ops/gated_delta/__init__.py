"""Two forms of the gated delta-rule operator (Gated DeltaNet) with one signature:
    o, final_state = op(q, k, v, g, beta, *, scale=None, initial_state=None, output_final_state=False)
q, k: [B, T, H, K] (L2-normalised by the caller); v: [B, T, H, V]; g (log decay, <= 0) and
beta (write strength): [B, T, H]; states [B, H, K, V] fp32, stored as S^T like fla's.
Both forms take g before beta (fla's chunk order; fla's naive recurrent op takes beta
first), and everything after beta is keyword-only; pass g= and beta= by name when porting.
"""
from evalkit.model_adapters.gla.ops.gated_delta.chunk import chunk_gated_delta
from evalkit.model_adapters.gla.ops.gated_delta.naive import naive_recurrent_gated_delta

__all__ = ["chunk_gated_delta", "naive_recurrent_gated_delta"]
