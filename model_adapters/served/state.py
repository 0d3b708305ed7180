"""A served model's state, from its config alone (the server's tensors are out of reach).

    GLA config (model_type gla)               GLAConfig.state_parts   (evalkit state's formula)
    any transformers decoder                  recurrent.formula.config_state_at (the
                                              family's formula, else KV per token x tokens
                                              per attention layer, sliding ones capped)

Bytes are at the server's dtype. Every result is labelled "from config"; a model without a
config has kind "unknown" and no bytes (None, never 0).
"""
from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from evalkit.model_adapters.state_kind import StateBytes


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

    from evalkit.model_adapters.recurrent.formula import config_state_at

    return config_state_at(AutoConfig.from_pretrained(str(folder), local_files_only=True),
                           n_tokens, dtype)
