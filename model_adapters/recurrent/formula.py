"""State bytes of a recurrent or hybrid transformers model from its config alone (no weights):
the second, independent figure beside the count of a prefill's cache (cache_state.py), by the
same roles (recurrent, conv, window_kv, kv, indexer).

Which layers hold what comes from transformers' own reading of the config
(get_layer_types_and_kwargs: linear_attention / conv / hybrid / hybrid_sliding carry a linear
mixer's conv tail and recurrent state; full / sliding / chunked / indexed attention carry KV).
How big a linear mixer's parts are comes from the mixer its config describes, recognised by the
config keys the mixer's own code reads, not by the family's name, so every family built from the
same mixer shares one formula (elements per sequence; "kernel" is the conv width kept):

    short conv (LFM2, LFM2-MoE, LFM3)   conv  hidden x conv_L_cache
    Mamba (Mamba, FalconMamba, Jamba, Zamba)
                                        conv  inner x kernel; recurrent inner x d_state
    Mamba-2 / SSD (Mamba2, Bamba, GraniteMoeHybrid, NemotronH, FalconH1, Zamba2)
                                        conv  (heads x head_dim + 2 x groups x d_state) x kernel
                                        recurrent heads x head_dim x d_state
    gated delta net (Qwen3-Next, Qwen3.5, Qwen4-exp, Lara-mini, OLMo-hybrid)
                                        conv  (2 x key heads x key dim + value heads x value dim) x kernel
                                        recurrent value heads x key dim x value dim
    KDA (Kimi Linear, Bailing hybrid)   conv  3 x heads x head dim x kernel; recurrent heads x dim^2
    short convs (Inkling)               conv  (2 x kv heads x head dim + 2 x hidden) x kernel, fp32
    CCA (ZAYA)                          conv  (heads + kv heads) x head dim x (t0 - 1 + t1 - 1);
                                        recurrent kv heads x head dim / 2 (the delayed value)

and the families with caches of their own: RWKV (5 x hidden a layer: 2 in the model dtype, 3 in
fp32), xLSTM (heads x (qk x v + qk + 1) a layer), MiniMax (heads x head_dim^2 a linear layer, in
the model dtype), RecurrentGemma (RG-LRU lru_width in fp32, conv hidden x (width - 1)).
KV per token of an attention layer: 2 x kv heads x head dim; MLA's compressed latent
kv_lora_rank + qk_rope_head_dim; an indexer's keys indexer heads x indexer head dim. Sliding
layers keep their last window - 1 tokens (transformers' DynamicSlidingWindowLayer). A looped
model (Inkling2-loop) holds its looped layers' cache once per pass.
Recurrent states are fp32 whatever the model's dtype (transformers' PyTorch scans keep them so;
measured at bf16 for every family by tests/test_families_discovery.py), everything else is in
the model's dtype.
"""
from __future__ import annotations

from typing import Any, Callable

import torch

from evalkit.model_adapters.state_kind import StateBytes


class UnsupportedFamily(ValueError):
    """A config evalkit cannot run or has no state formula for (the message says why)."""


RECURRENT_ITEMSIZE = 4
LINEAR_TYPES = ("linear_attention", "conv", "hybrid", "hybrid_sliding")
ROLE_PART = {"recurrent": "fixed", "conv": "fixed", "window_kv": "window", "kv": "growing",
             "indexer": "growing"}


def _g(cfg: Any, *names: str, default: Any = None) -> Any:
    for n in names:
        v = getattr(cfg, n, None)
        if v is not None:
            return v
    if default is not None:
        return default
    raise KeyError(f"config of model_type {cfg.model_type!r} lacks {' / '.join(names)}")


def _has(cfg: Any, *names: str) -> bool:
    return any(getattr(cfg, n, None) is not None for n in names)


def head_dim(cfg: Any) -> int:
    heads = _g(cfg, "num_attention_heads")
    return _g(cfg, "head_dim", "attention_head_dim", default=cfg.hidden_size // heads)


def kv_per_token(cfg: Any, layer_type: str = "full_attention") -> int:
    """Elements one token adds to one attention layer's KV cache."""
    if _has(cfg, "kv_lora_rank"):  # MLA: the compressed latent and the shared rope key
        return cfg.kv_lora_rank + cfg.qk_rope_head_dim
    if layer_type in ("sliding_attention", "hybrid_sliding") and _has(cfg, "swa_num_key_value_heads"):
        return 2 * cfg.swa_num_key_value_heads * _g(cfg, "swa_head_dim")
    heads = _g(cfg, "num_attention_heads")
    return 2 * _g(cfg, "num_key_value_heads", default=heads) * head_dim(cfg)


# -- linear mixers: (conv elements, recurrent elements) of one layer, by the keys they read

def _short_conv(cfg: Any) -> tuple[int, int]:
    return cfg.hidden_size * cfg.conv_L_cache, 0


def _mamba2(cfg: Any) -> tuple[int, int]:
    heads = _g(cfg, "mamba_n_heads", "mamba_num_heads", "n_mamba_heads", "num_heads")
    hd = _g(cfg, "mamba_d_head", "mamba_head_dim", "mamba_headdim", "head_dim")
    d_state = _g(cfg, "mamba_d_state", "ssm_state_size", "state_size")
    groups = _g(cfg, "mamba_n_groups", "mamba_ngroups", "n_groups")
    kernel = _g(cfg, "mamba_d_conv", "conv_kernel")
    return (heads * hd + 2 * groups * d_state) * kernel, heads * hd * d_state


def _mamba(cfg: Any) -> tuple[int, int]:
    inner = getattr(cfg, "intermediate_size", None) if _has(cfg, "state_size") else None
    inner = inner or _g(cfg, "mamba_expand", "expand") * cfg.hidden_size
    return (inner * _g(cfg, "mamba_d_conv", "conv_kernel"),
            inner * _g(cfg, "mamba_d_state", "state_size"))


def _gated_delta(cfg: Any) -> tuple[int, int]:
    k = cfg.linear_num_key_heads * cfg.linear_key_head_dim
    v = cfg.linear_num_value_heads * cfg.linear_value_head_dim
    rec = cfg.linear_num_value_heads * cfg.linear_key_head_dim * cfg.linear_value_head_dim
    return (2 * k + v) * cfg.linear_conv_kernel_dim, rec


def _kda(cfg: Any) -> tuple[int, int]:
    width = cfg.linear_num_heads * cfg.linear_head_dim
    return 3 * width * cfg.linear_conv_kernel_dim, cfg.linear_num_heads * cfg.linear_head_dim ** 2


def _qkv_convs(cfg: Any, layer_type: str) -> tuple[int, int]:
    if layer_type == "hybrid_sliding" and _has(cfg, "swa_num_key_value_heads"):
        kv = cfg.swa_num_key_value_heads * cfg.swa_head_dim
    else:
        kv = cfg.num_key_value_heads * head_dim(cfg)
    return (2 * kv + 2 * cfg.hidden_size) * cfg.conv_kernel_size, 0


def _cca(cfg: Any) -> tuple[int, int]:
    hd = head_dim(cfg)
    width = (cfg.num_attention_heads + cfg.num_key_value_heads) * hd
    return width * (cfg.cca_time0 - 1 + cfg.cca_time1 - 1), cfg.num_key_value_heads * hd // 2


# (recognising keys, formula, conv tail in fp32, recurrent state in fp32): the first whose keys
# the config sets. The dtypes are what transformers' code keeps (measured at bf16 for each).
MIXERS: tuple[tuple[tuple[str, ...], Callable[..., tuple[int, int]], bool, bool], ...] = (
    (("conv_L_cache",), _short_conv, False, True),
    (("cca_time0",), _cca, False, False),
    (("linear_key_head_dim",), _gated_delta, False, True),
    (("linear_head_dim", "linear_num_heads"), _kda, False, True),
    (("mamba_d_head",), _mamba2, False, True), (("mamba_head_dim",), _mamba2, False, True),
    (("mamba_headdim",), _mamba2, False, True),
    (("num_heads", "n_groups", "state_size"), _mamba2, False, True),
    (("mamba_d_state",), _mamba, False, True), (("state_size",), _mamba, False, True),
    (("conv_kernel_size", "number_of_conv_states"), _qkv_convs, True, True),
)


def linear_mixer(cfg: Any) -> tuple[str, Callable[..., tuple[int, int]], bool, bool] | None:
    """(name, formula, conv in fp32, recurrent in fp32) of the config's linear mixer, or None."""
    for keys, fn, conv32, rec32 in MIXERS:
        if all(_has(cfg, k) for k in keys):
            return fn.__name__.lstrip("_"), fn, conv32, rec32
    return None


# -- families with caches (or module states) of their own

def _rwkv(cfg: Any, n: int, size: int) -> dict[str, int]:
    per = cfg.hidden_size * cfg.num_hidden_layers
    return {"recurrent": 2 * per * size + 3 * per * 4}


def _xlstm(cfg: Any, n: int, size: int) -> dict[str, int]:
    qk = int(cfg.hidden_size * cfg.qk_dim_factor) // cfg.num_heads
    v = int(cfg.hidden_size * cfg.v_dim_factor) // cfg.num_heads
    return {"recurrent": cfg.num_hidden_layers * cfg.num_heads * (qk * v + qk + 1) * size}


OWN_CACHE: dict[str, Callable[[Any, int, int], dict[str, int]]] = {
    "rwkv": _rwkv, "xlstm": _xlstm}


def _linear_layer(cfg: Any, layer_type: str, size: int) -> dict[str, int]:
    if cfg.model_type == "minimax":  # lightning attention: one K^T V matrix per head
        hd = getattr(cfg, "head_dim", None) or cfg.hidden_size // cfg.num_attention_heads
        return {"recurrent": cfg.num_attention_heads * hd * hd * size}
    if cfg.model_type == "recurrent_gemma":  # RG-LRU state (fp32) and conv tail on the modules
        return {"recurrent": cfg.lru_width * 4,
                "conv": cfg.hidden_size * (cfg.conv1d_width - 1) * size}
    mixer = linear_mixer(cfg)
    if mixer is None:
        raise UnsupportedFamily(f"model_type {cfg.model_type!r}: its {layer_type} layers' mixer "
                                f"is not one evalkit has a config formula for")
    name, fn, conv32, rec32 = mixer
    conv, rec = fn(cfg, layer_type) if fn is _qkv_convs else fn(cfg)
    out = {"conv": conv * (4 if conv32 else size)}
    if rec:
        out["recurrent"] = rec * (RECURRENT_ITEMSIZE if rec32 else size)
    return out


def cache_layer_types(cfg: Any) -> tuple[list[str], list[dict]]:
    """The layer types of the cache the model fills: transformers' reading of the config, plus
    the extra cache layers a looped model appends for its repeated passes (Inkling2-loop: the
    layers loop_layer_index_start..end again, loop_num_passes - 1 times)."""
    from transformers.cache_utils import get_layer_types_and_kwargs

    types, kwargs = (list(x) for x in get_layer_types_and_kwargs(cfg))
    passes = getattr(cfg, "loop_num_passes", None)
    if passes and getattr(cfg, "loop_layer_index_end", None) is not None:
        lo, hi = cfg.loop_layer_index_start, cfg.loop_layer_index_end
        types += types[lo:hi] * (passes - 1)
        kwargs += kwargs[lo:hi] * (passes - 1)
    return types, kwargs


def roles_at(config: Any, n_tokens: int, dtype: torch.dtype) -> dict[str, int]:
    """Bytes by role one sequence's state holds after `n_tokens` tokens, from the config."""
    cfg = config.get_text_config(decoder=True)
    size = torch.empty(0, dtype=dtype).element_size()
    if cfg.model_type in OWN_CACHE:
        return OWN_CACHE[cfg.model_type](cfg, n_tokens, size)
    types, kwargs = cache_layer_types(cfg)
    out: dict[str, int] = {}

    def add(role: str, nbytes: int) -> None:
        if nbytes:
            out[role] = out.get(role, 0) + nbytes

    for t, kw in zip(types, kwargs):
        if t in LINEAR_TYPES:
            for role, b in _linear_layer(cfg, t, size).items():
                add(role, b)
        if t in ("full_attention", "hybrid", "indexed_attention"):
            add("kv", kv_per_token(cfg, t) * n_tokens * size)
        if t == "indexed_attention":
            heads = getattr(cfg, "indexer_kv_heads", None) or 1
            add("indexer", heads * _g(cfg, "indexer_head_dim", "index_head_dim") * n_tokens * size)
        elif t in ("sliding_attention", "chunked_attention", "hybrid_sliding"):
            # DynamicSlidingWindowLayer keeps the last window - 1 tokens
            kept = min(n_tokens, kw["sliding_window"] - 1)
            add("window_kv", kv_per_token(cfg, t) * kept * size)
        elif t not in LINEAR_TYPES + ("full_attention", "hybrid", "dummy"):
            raise UnsupportedFamily(f"model_type {cfg.model_type!r}: layer type {t!r} has no "
                                    f"state formula")
    return out


def to_state(roles: dict[str, int]) -> StateBytes:
    parts = {"fixed": 0, "window": 0, "growing": 0}
    for role, b in roles.items():
        parts[ROLE_PART[role]] += b
    return StateBytes(recurrent=roles.get("recurrent", 0) > 0, **parts)


def state_at(config: Any, n_tokens: int, dtype: torch.dtype) -> StateBytes:
    """Bytes one sequence's state holds after `n_tokens` tokens, from the config."""
    return to_state(roles_at(config, n_tokens, dtype))


def config_state_at(config: Any, n_tokens: int, dtype: torch.dtype) -> StateBytes:
    """Any transformers decoder's state after `n_tokens` tokens, from its config alone: the
    role formula above (attention layers included), for recurrent, hybrid and plain attention
    models alike. The one KV formula `evalkit cost` and a served model's state both read."""
    from transformers.cache_utils import get_layer_types_and_kwargs

    cfg = config.get_text_config(decoder=True)
    if cfg.model_type in OWN_CACHE or any(t in LINEAR_TYPES
                                          for t in get_layer_types_and_kwargs(cfg)[0]):
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
