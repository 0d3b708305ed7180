"""The window delta op's fast path, run by the model (tested against naive.py)."""
from __future__ import annotations

from evalkit.model_adapters.gla.ops.gated_delta import chunk_gated_delta
from evalkit.model_adapters.gla.ops.window_linear.chunk import window_softmax


def chunk_window_delta(q, k, v, qd, kd, vd, log_a, beta, lam, window: int, S0, *,
                       n_sink: int = 0, sink_k=None, sink_v=None, chunk_size: int = 64):
    o_w, _ = window_softmax(q, k, v, window, n_sink=n_sink, sink_k=sink_k, sink_v=sink_v,
                            chunk_size=chunk_size)
    lay = lambda t: t.float().transpose(1, 2)                                # fla's [B, T, H, .]
    read, S = chunk_gated_delta(lay(qd), lay(kd), lay(vd), lay(log_a), lay(beta), scale=1.0,
                                initial_state=S0.float(), output_final_state=True,
                                chunk_size=chunk_size)
    return o_w + lam.float()[..., None] * (read.float().transpose(1, 2) - o_w), S
