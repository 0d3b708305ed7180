"""Tokenizer loading and fingerprinting. Lengths everywhere are in the evaluated model's tokens."""
from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path
from typing import Any


def load_tokenizer(path: str | os.PathLike, *, trust_remote_code: bool = False) -> Any:
    """Load a transformers tokenizer from a local folder (or a tokenizer.json file). Never downloads."""
    from transformers import AutoTokenizer, PreTrainedTokenizerFast

    p = Path(path).expanduser()
    if not p.exists():
        raise FileNotFoundError(f"tokenizer path {str(p)!r} does not exist (expected a folder with "
                                f"tokenizer files or a tokenizer.json)")
    if p.is_file():
        if p.name.endswith(".json"):
            return PreTrainedTokenizerFast(tokenizer_file=str(p))
        raise ValueError(f"tokenizer path {str(p)!r}: expected a folder or a tokenizer.json file")
    kwargs = {} if trust_remote_code else _blank_config_if_foreign(p)
    return AutoTokenizer.from_pretrained(str(p), local_files_only=True,
                                         trust_remote_code=trust_remote_code, **kwargs)


def _blank_config_if_foreign(folder: Path) -> dict[str, Any]:
    """{"config": blank config} when folder/config.json names a model type transformers lacks (gla).

    AutoTokenizer reads config.json only to let a known model type override the tokenizer class.
    For a type it does not know it re-parses the file as a generic config (warning that `gla` is
    not ``) and then picks the class from tokenizer_config.json anyway; a blank config takes that
    same route without the re-parse. Known types and unreadable files keep the ordinary path.
    """
    from transformers import PreTrainedConfig
    from transformers.models.auto.configuration_auto import CONFIG_MAPPING

    try:
        cfg = json.loads((folder / "config.json").read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return {}
    model_type = cfg.get("model_type") if isinstance(cfg, dict) else None
    if not isinstance(model_type, str) or model_type in CONFIG_MAPPING:
        return {}
    tokenizer_class = cfg.get("tokenizer_class")
    return {"config": PreTrainedConfig(
        tokenizer_class=tokenizer_class if isinstance(tokenizer_class, str) else None)}


def tokenizer_hash(tokenizer: Any) -> str:
    """SHA-256 over everything that changes token ids: vocab/merges/normalizer, specials, template."""
    cached = getattr(tokenizer, "_evalkit_hash", None)
    if cached:
        return cached
    h = hashlib.sha256()
    backend = getattr(tokenizer, "backend_tokenizer", None)
    if backend is not None:
        h.update(backend.to_str().encode())
    else:  # slow tokenizer: fall back to the vocabulary
        h.update(repr(sorted(tokenizer.get_vocab().items())).encode())
    h.update(repr(getattr(tokenizer, "chat_template", None)).encode())
    h.update(repr(sorted((k, str(v)) for k, v in tokenizer.special_tokens_map.items())).encode())
    h.update(repr(_adds_bos(tokenizer)).encode())
    digest = h.hexdigest()
    try:
        tokenizer._evalkit_hash = digest
    except AttributeError:
        pass
    return digest


def _adds_bos(tokenizer: Any) -> bool:
    bos = tokenizer.bos_token_id
    if bos is None:
        return False
    ids = tokenizer("a", add_special_tokens=True)["input_ids"]
    return bool(ids) and ids[0] == bos


def bos_ids(tokenizer: Any) -> list[int]:
    """[bos] when the tokenizer's own default encoding starts with BOS, else []."""
    cached = getattr(tokenizer, "_evalkit_bos", None)
    if cached is None:
        cached = [tokenizer.bos_token_id] if _adds_bos(tokenizer) else []
        try:
            tokenizer._evalkit_bos = cached
        except AttributeError:
            pass
    return list(cached)


def encode(tokenizer: Any, text: str) -> list[int]:
    """Token ids of `text` with no special tokens added."""
    return list(tokenizer(text, add_special_tokens=False)["input_ids"])
