"""State bytes of a recurrent or hybrid transformers model from its config alone (no weights).

Which layers hold what comes from transformers' own reading of the config (the layer types its
DynamicCache is built from: linear_attention, conv, hybrid, full/sliding attention); how big each
part is comes from the family's formula below, in elements per sequence:

    conv tail    channels x kernel          (Mamba: intermediate; Mamba-2: intermediate + 2*groups*d_state)
    recurrent    Mamba: intermediate x d_state; Mamba-2: heads x head_dim x d_state;
                 gated delta net (Qwen3-Next): value heads x key dim x value dim
                 (recurrent states are fp32 whatever the model's dtype; the rest is in its dtype)
    KV per token 2 x kv_heads x head_dim    (sliding layers capped at the window)
    RWKV         5 x hidden x layers        (2 in the model dtype, 3 in fp32: num, den, max)

The adapter test checks every formula against the tensors of an actual prefill.
"""
from __future__ import annotations

from typing import Any, Callable

import torch

from evalkit.model_adapters.state_kind import StateBytes


class UnsupportedFamily(ValueError):
    """A model_type evalkit has no state formula (and no adapter) for."""


def _g(cfg: Any, *names: str, default: Any = None) -> Any:
    for n in names:
        v = getattr(cfg, n, None)
        if v is not None:
            return v
    if default is not None:
        return default
    raise KeyError(f"config of model_type {cfg.model_type!r} lacks {' / '.join(names)}")


def kv_per_token(cfg: Any) -> int:
    """Elements one token adds to one attention layer's KV cache: 2 x kv heads x head dim."""
    heads = _g(cfg, "num_attention_heads")
    kv = _g(cfg, "num_key_value_heads", default=heads)
    head_dim = _g(cfg, "head_dim", "attention_head_dim", default=cfg.hidden_size // heads)
    return 2 * kv * head_dim


def _mamba(cfg: Any) -> tuple[int, int]:
    inner = _g(cfg, "intermediate_size")
    return inner * cfg.conv_kernel, inner * cfg.state_size


def _jamba(cfg: Any) -> tuple[int, int]:
    inner = cfg.mamba_expand * cfg.hidden_size
    return inner * cfg.mamba_d_conv, inner * cfg.mamba_d_state


def _ssd(inner: int, groups: int, d_state: int, heads: int, head_dim: int, kernel: int
         ) -> tuple[int, int]:
    """Mamba-2 (SSD) mixer: conv over x, B and C; a d_state matrix per head."""
    return (inner + 2 * groups * d_state) * kernel, heads * head_dim * d_state


def _mamba2(cfg: Any) -> tuple[int, int]:
    return _ssd(cfg.expand * cfg.hidden_size, cfg.n_groups, cfg.state_size, cfg.num_heads,
                cfg.head_dim, cfg.conv_kernel)


def _bamba(cfg: Any) -> tuple[int, int]:
    inner = cfg.mamba_n_heads * cfg.mamba_d_head
    return _ssd(inner, cfg.mamba_n_groups, cfg.mamba_d_state, cfg.mamba_n_heads,
                cfg.mamba_d_head, cfg.mamba_d_conv)


def _falcon_h1(cfg: Any) -> tuple[int, int]:
    inner = cfg.mamba_d_ssm or cfg.mamba_expand * cfg.hidden_size
    return _ssd(inner, cfg.mamba_n_groups, cfg.mamba_d_state, cfg.mamba_n_heads,
                cfg.mamba_d_head, cfg.mamba_d_conv)


def _zamba2(cfg: Any) -> tuple[int, int]:
    return _ssd(cfg.mamba_expand * cfg.hidden_size, cfg.mamba_ngroups, cfg.mamba_d_state,
                cfg.n_mamba_heads, cfg.mamba_headdim, cfg.mamba_d_conv)


def _lfm2(cfg: Any) -> tuple[int, int]:
    return cfg.hidden_size * cfg.conv_L_cache, 0  # a short convolution: no recurrent state


def _qwen3_next(cfg: Any) -> tuple[int, int]:
    k = cfg.linear_num_key_heads * cfg.linear_key_head_dim
    v = cfg.linear_num_value_heads * cfg.linear_value_head_dim
    rec = cfg.linear_num_value_heads * cfg.linear_key_head_dim * cfg.linear_value_head_dim
    return (2 * k + v) * cfg.linear_conv_kernel_dim, rec


# model_type -> (conv elements, recurrent elements) of one linear / conv layer
LINEAR_LAYER: dict[str, Callable[[Any], tuple[int, int]]] = {
    "mamba": _mamba, "falcon_mamba": _mamba, "mamba2": _mamba2, "jamba": _jamba,
    "bamba": _bamba, "falcon_h1": _falcon_h1, "zamba2": _zamba2, "lfm2": _lfm2,
    "qwen3_next": _qwen3_next,
}
FAMILIES = tuple(sorted(LINEAR_LAYER)) + ("rwkv",)
# transformers' PyTorch scans compute every recurrent state in fp32 and the cache keeps it so,
# whatever the model's dtype (measured at bf16 for each family; fused CUDA kernels may differ).
RECURRENT_ITEMSIZE = 4


def _rwkv(cfg: Any, itemsize: int) -> StateBytes:
    per = cfg.hidden_size * cfg.num_hidden_layers
    return StateBytes(fixed=2 * per * itemsize + 3 * per * 4, recurrent=True)


def state_at(config: Any, n_tokens: int, dtype: torch.dtype) -> StateBytes:
    """Bytes one sequence's state holds after `n_tokens` tokens, from the config."""
    from transformers.cache_utils import get_layer_types_and_kwargs

    cfg = config.get_text_config(decoder=True)
    size = torch.empty(0, dtype=dtype).element_size()
    if cfg.model_type == "rwkv":
        return _rwkv(cfg, size)
    linear = LINEAR_LAYER.get(cfg.model_type)
    if linear is None:
        raise UnsupportedFamily(f"model_type {cfg.model_type!r} has no state formula (supported: "
                                f"{', '.join(FAMILIES)})")
    types, kwargs = get_layer_types_and_kwargs(cfg)
    total = StateBytes()
    for t, kw in zip(types, kwargs):
        if t in ("linear_attention", "conv", "hybrid", "hybrid_sliding"):
            conv, rec = linear(cfg)
            total = total + StateBytes(fixed=conv * size + rec * RECURRENT_ITEMSIZE,
                                       recurrent=rec > 0)
        if t in ("full_attention", "hybrid"):
            total = total + StateBytes(growing=kv_per_token(cfg) * n_tokens * size)
        elif t in ("sliding_attention", "chunked_attention", "hybrid_sliding"):
            # DynamicSlidingWindowLayer keeps the last window - 1 tokens
            kept = min(n_tokens, kw["sliding_window"] - 1)
            total = total + StateBytes(window=kv_per_token(cfg) * kept * size)
        elif t not in ("linear_attention", "conv", "dummy"):
            raise UnsupportedFamily(f"model_type {cfg.model_type!r}: layer type {t!r} has no "
                                    f"state formula")
    return total


def config_state_at(config: Any, n_tokens: int, dtype: torch.dtype) -> StateBytes:
    """Any transformers decoder's state after `n_tokens` tokens, from its config alone: its
    family's formula (state_at) where it has one; else every layer is attention, full layers
    growing by kv_per_token a token and sliding ones keeping their last window - 1 tokens (as
    transformers' DynamicSlidingWindowLayer). The one KV formula `evalkit cost` and a served
    model's state both read."""
    from transformers.cache_utils import get_layer_types_and_kwargs

    cfg = config.get_text_config(decoder=True)
    if cfg.model_type in FAMILIES:
        return state_at(config, n_tokens, dtype)
    per = kv_per_token(cfg) * torch.empty(0, dtype=dtype).element_size()
    types, kwargs = get_layer_types_and_kwargs(cfg)
    total = StateBytes()
    for t, kw in zip(types, kwargs):
        if t in ("sliding_attention", "chunked_attention"):
            total = total + StateBytes(window=per * min(n_tokens, kw["sliding_window"] - 1))
        else:
            total = total + StateBytes(growing=per * n_tokens)
    return total
