"""A twin layer's bounded sparse cache (LoLA, arXiv 2505.23666): the load option `sparse=N`.

Beside its sinks, its window and its state, each twin layer (window_linear.py) keeps up to N
older tokens exactly: the ones its state recalls worst. A token leaving the window is scored by
the state's recall error for it (ops/window_sparse: the delta rule's || v - S^T kd ||, GLA's
normalised read-out || v - phi(k) S_v / phi(k) S_z ||), against the state as it stands when the
token leaves; the cache keeps the N largest errors, and the token with the smallest error among
the cache and the newcomer goes into the state, as every leaving token does without a cache.
The cache's tokens are attended exactly with the sinks and the window, in the one softmax
normalisation the state's read-out joins. With N = 0 the layer is exactly the one without.

The cache is per query head (each head's state decides what it recalls badly), held in the
layer state's `sparse`: rotated keys and values [B, H, n, d], errors and positions [B, H, n]
(fp32; n = min(N, non-sink tokens that have left the window)), counted as window bytes: it is
bounded and never grows with the context. It is a load-time setting of the module (like
state_off), never saved in a checkpoint; the adapter names it in the model's name and identity.
"""
from __future__ import annotations

from typing import Any

import torch
import torch.nn.functional as F

from evalkit.model_adapters.gla.ops.window_sparse import chunk_window_sparse, naive_window_sparse
from evalkit.model_adapters.gla.mixers import rotate
from evalkit.model_adapters.gla.state import STATE_DTYPE

MAX_SPARSE = 65536


def sparse_error(n: Any, mixers) -> str | None:
    """Why `sparse=n` cannot be given to a model with these layers, or None."""
    if isinstance(n, bool) or not isinstance(n, int):
        return f"sparse must be an integer (tokens per twin layer's sparse cache), got {n!r}"
    if not 0 <= n <= MAX_SPARSE:
        return f"sparse must be an integer in [0, {MAX_SPARSE}] (tokens per twin layer), got {n}"
    if n and "window_linear" not in mixers:
        return (f"sparse={n} needs window_linear layers (a linearized twin); this model has "
                f"{', '.join(sorted(set(mixers)))} layers")
    return None


def set_sparse(model, n: int) -> None:
    """Give every twin layer of a GLAForCausalLM a sparse cache of n tokens (0: none)."""
    err = sparse_error(n, model.config.mixers)
    if err:
        raise ValueError(err)
    for mixer, block in zip(model.config.mixers, model.model.layers):
        if mixer == "window_linear":
            block.attn.sparse = n


def sparse_bytes(cfg, n: int, context: int, dtype_size: int = 4) -> int:
    """Bytes of one sequence's sparse caches after `context` tokens (state.py: K, V, error,
    position per cached token and query head, in every twin layer)."""
    if not n or cfg.window_linear is None:
        return 0
    w = cfg.window_linear_spec
    heads = cfg.attn_spec["num_heads"]
    kept = min(n, max(0, context - w["window"] - w["sinks"]))
    layers = sum(1 for m in cfg.mixers if m == "window_linear")
    return layers * heads * kept * (2 * (cfg.hidden_size // heads) + 2) * dtype_size


def empty_cache(B: int, H: int, d: int, ref: torch.Tensor) -> tuple[torch.Tensor, ...]:
    z = lambda *s: ref.new_zeros(B, H, 0, *s, dtype=STATE_DTYPE)
    return z(d), z(d), z(), z()


def sparse_forward(layer, x, q_raw, k_raw, q, kr, vr, keys, sinks, state, start, S0):
    """The twin layer's mixing with its sparse cache: o [B, H, T, d], the state and the cache
    after the T tokens. q [B, H, T, d] rotated; kr, vr [B, H, L+T, d] (heads repeated)."""
    B, H, T, d = q.shape
    N = layer.sparse
    cache = state.sparse if state is not None and state.sparse else empty_cache(B, H, d, q)
    L = keys.L
    first = start - L
    pool_k = torch.cat([cache[0], kr.float()], 2)                             # [B, H, P, d]
    pool_v = torch.cat([cache[1], vr.float()], 2)
    pos = torch.cat([cache[3], (first + torch.arange(L + T, device=x.device)).float()
                     .expand(B, H, L + T)], 2)
    log_a = layer.log_gate(x, k_raw)
    if layer.kind == "gated_delta":
        ke = rotate(pool_k, -pos, layer.theta) if layer.theta is not None else pool_k
        pf = F.normalize(torch.einsum("bhtd,hde->bhte", ke, layer.k_map.float()), dim=-1)
        pb = torch.sigmoid(torch.einsum("bhtd,hd->bht", ke, layer.b_key.float())
                           + layer.b_bias.float()[:, None])
        fq = F.normalize(torch.einsum("bhtd,hde->bhte", q_raw.float(), layer.q_map.float()),
                         dim=-1)
        mix = torch.sigmoid(layer.l_proj(x).float()).transpose(1, 2)          # [B, H, T]
    else:
        pf, pb = layer.features(pool_k, "k_map"), None
        fq, mix = layer.features(q, "q_map"), torch.sigmoid(layer.mix_logit)
    kw = {} if layer.mode == "naive" else {"chunk_size": layer.chunk_size}
    op = naive_window_sparse if layer.mode == "naive" else chunk_window_sparse
    o, S, new, entered = op(layer.kind, q, kr, vr, fq, pf, pool_v, pb, log_a, mix, layer.window,
                            S0, N, cache, first, **sinks, **kw)
    if layer.record is not None:   # what entered the state, as window_linear._keep records it
        has = entered[0, 0] >= 0
        idx = (entered - first + cache[0].shape[2]).clamp(min=0)              # pool index
        for i in range(cache[0].shape[2]):   # a cached token: find it by its position
            idx = torch.where(entered == cache[3][:, :, i:i + 1].long(), i, idx)
        pick = lambda t: t.gather(2, idx[..., None].expand(-1, -1, -1, t.shape[-1]))
        extra = ({"beta": pb.gather(2, idx) * has, "lookback": mix * has}
                 if pb is not None else {"state_weight": 1 - mix.detach()})
        layer._keep(key=pick(pf) * has[:, None], value=pick(pool_v) * has[:, None],
                    log_a=log_a, has=has, **extra)
    return o, S, tuple(t.to(STATE_DTYPE) for t in new)
