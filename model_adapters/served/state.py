"""A served model's state, from its config alone (the server's tensors are out of reach).

    GLA config (model_type gla)               GLAConfig.state_parts   (evalkit state's formula)
    transformers recurrent / hybrid families  recurrent.formula.state_at
    any other decoder                         KV per token x tokens per attention layer
                                              (sliding layers capped at their window)

Bytes are at the server's dtype. Every result is labelled "from config"; a model without a
config has kind "unknown" and no bytes (None, never 0).
"""
from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from evalkit.state_kind import StateBytes


def _read(config: Path) -> dict:
    try:
        return json.loads(config.read_text())
    except (OSError, ValueError) as e:
        raise ValueError(f"{config}: not a readable JSON config ({e})") from None


def state_from_config(folder: Path | None, n_tokens: int, dtype: Any) -> StateBytes | None:
    """The state one sequence holds after `n_tokens` tokens, or None without a config."""
    if folder is None or not (folder / "config.json").is_file():
        return None
    cfg_path = folder / "config.json"
    if _read(cfg_path).get("model_type") == "gla":
        from evalkit.model_adapters.gla.config import GLAConfig

        return GLAConfig.from_json(cfg_path).state_parts(n_tokens, dtype)
    from transformers import AutoConfig

    from evalkit.model_adapters.recurrent.formula import LINEAR_LAYER, state_at

    config = AutoConfig.from_pretrained(str(folder), local_files_only=True)
    family = config.get_text_config(decoder=True).model_type
    if family in LINEAR_LAYER or family == "rwkv":
        return state_at(config, n_tokens, dtype)
    return _kv_state(config, n_tokens, dtype)


def _kv_state(config: Any, n_tokens: int, dtype: Any) -> StateBytes:
    """A decoder whose every layer is attention: full layers grow, sliding ones stop at the
    window (transformers' DynamicSlidingWindowLayer keeps window - 1 tokens)."""
    import torch
    from transformers.cache_utils import get_layer_types_and_kwargs

    from evalkit.model_adapters.recurrent.formula import _kv_per_token

    cfg = config.get_text_config(decoder=True)
    size = torch.empty(0, dtype=dtype).element_size()
    per = _kv_per_token(cfg) * size
    types, kwargs = get_layer_types_and_kwargs(cfg)
    total = StateBytes()
    for t, kw in zip(types, kwargs):
        if t in ("sliding_attention", "chunked_attention"):
            total = total + StateBytes(window=per * min(n_tokens, kw["sliding_window"] - 1))
        else:
            total = total + StateBytes(growing=per * n_tokens)
    return total
