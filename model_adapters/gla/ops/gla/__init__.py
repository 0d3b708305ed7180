"""Three forms of the GLA operator with one signature:
    o, final_state = op(q, k, v, g, initial_state=None, output_final_state=False, scale=None)
q, k, g: [B, T, H, K]; v: [B, T, H, V]; states [B, H, K, V] (fp32); g is the log forget gate.
"""
from evalkit.model_adapters.gla.ops.gla.chunk import chunk_gla
from evalkit.model_adapters.gla.ops.gla.fused_recurrent import fused_recurrent_gla
from evalkit.model_adapters.gla.ops.gla.naive import naive_recurrent_gla

__all__ = ["chunk_gla", "fused_recurrent_gla", "naive_recurrent_gla"]
