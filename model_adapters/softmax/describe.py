"""Softmax checkpoints described from their config alone: paths, trained length, parameters and
KV bytes (a meta-device model, so no weights are read)."""
from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import torch

from evalkit.model_adapters.dtypes import dtype_name, parse_dtype
from evalkit.model_adapters.facts import hf_facts
from evalkit.model_adapters.softmax.kv_cache import kv_profile


def split_path(path: str | os.PathLike) -> tuple[Path, str | None]:
    """(folder, gguf file name or None); raises when neither a .gguf file nor a model folder."""
    p = Path(path).expanduser()
    if p.is_file() and p.suffix == ".gguf":
        return p.parent, p.name
    if p.is_dir():
        if not (p / "config.json").is_file():
            raise FileNotFoundError(f"model folder {p}: no config.json (expected a Hugging Face "
                                    f"model folder or a .gguf file)")
        return p, None
    if p.exists():
        raise ValueError(f"model path {p}: expected a folder with config.json or a .gguf file")
    raise FileNotFoundError(f"model path {p} does not exist")


def describe_checkpoint(path: str | os.PathLike, *, dtype: Any = "fp32", window: int | None = None,
                        n_tokens: int = 8192, trust_remote_code: bool = False) -> dict:
    """Parameters and KV bytes at `n_tokens` from the config alone (a meta-device model: no
    weights). The KV bytes are the adapter's own accounting (kv_profile: what one and two tokens
    add to a cache of this model), so that a window or a sliding layer counts as it will run."""
    from transformers import AutoConfig, AutoModelForCausalLM

    folder, gguf = split_path(path)
    kw = {"gguf_file": gguf} if gguf else {}
    config = AutoConfig.from_pretrained(str(folder), local_files_only=True,
                                        trust_remote_code=trust_remote_code, **kw)
    facts = hf_facts(config, source=Path(path).expanduser(), trust_remote_code=trust_remote_code)
    if hasattr(config, "quantization_config"):
        del config.quantization_config  # GGUF configs carry it; the meta model is dequantised
    with torch.device("meta"):
        model = AutoModelForCausalLM.from_config(config, dtype=parse_dtype(dtype),
                                                 trust_remote_code=trust_remote_code)
    prof = kv_profile(model, window=window)
    return {
        "parameters": facts.parameters(),
        "state_kind": "kv-window" if window else "kv",
        "state_bytes": prof.bytes_at(n_tokens),
        "n_tokens": n_tokens,
        "kv_bytes_per_token": prof.bytes_per_token,
        "dtype": dtype_name(dtype),
        "max_length": facts.max_length,
    }


def describe_row(path: str | os.PathLike, n_tokens: int, **options: Any) -> dict:
    """The `describe` keys `evalkit models` reads, for a softmax checkpoint."""
    d = describe_checkpoint(path, n_tokens=n_tokens, **options)
    return {k: d[k] for k in ("parameters", "state_bytes", "dtype", "max_length")}
