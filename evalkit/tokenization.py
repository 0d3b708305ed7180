"""Tokenizer loading and fingerprinting. Lengths everywhere are in the evaluated model's tokens."""
from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path
from typing import Any

# files one of which a tokenizer folder holds (fast, sentencepiece, BPE and WordPiece formats)
TOKENIZER_FILES = ("tokenizer.json", "tokenizer.model", "spiece.model", "vocab.json",
                   "vocab.txt", "tokenizer_config.json")
# the JSON files of a tokenizer folder that transformers reads (config.json: the model type)
JSON_FILES = ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json", "config.json")


def load_tokenizer(path: str | os.PathLike, *, trust_remote_code: bool = False) -> Any:
    """Load a transformers tokenizer from a local folder (or a tokenizer.json file). Never downloads."""
    from transformers import AutoTokenizer, PreTrainedTokenizerFast

    p = Path(path).expanduser()
    if not p.exists():
        raise FileNotFoundError(f"tokenizer path {str(p)!r} does not exist (expected a folder with "
                                f"tokenizer files or a tokenizer.json)")
    if p.is_file() and not p.name.endswith(".json"):
        raise ValueError(f"tokenizer path {str(p)!r}: expected a folder or a tokenizer.json file")
    if p.is_dir() and not any((p / f).is_file() for f in TOKENIZER_FILES):
        raise FileNotFoundError(f"tokenizer folder {str(p)!r} holds no tokenizer (expected one of "
                                f"{', '.join(TOKENIZER_FILES)})")
    for f in [p] if p.is_file() else [p / n for n in JSON_FILES]:
        _check_json(f)
    try:
        if p.is_file():
            return PreTrainedTokenizerFast(tokenizer_file=str(p))
        kwargs = {} if trust_remote_code else _blank_config_if_foreign(p)
        return AutoTokenizer.from_pretrained(str(p), local_files_only=True,
                                             trust_remote_code=trust_remote_code, **kwargs)
    except Exception as e:
        # the tokenizers library reports a corrupt tokenizer.json as a bare Exception, and
        # transformers as a JSONDecodeError or OSError: none names the file
        if type(e) is not Exception and not isinstance(e, (OSError, ValueError)):
            raise
        first = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
        raise ValueError(f"tokenizer {str(p)!r}: cannot load it ({first}); expected valid "
                         f"tokenizer files ({', '.join(TOKENIZER_FILES)})") from None


def _check_json(path: Path) -> None:
    """A corrupt JSON file is named here: the libraries below report only the JSON error."""
    if path.is_file():
        try:
            json.loads(path.read_bytes())
        except ValueError as e:  # JSONDecodeError and UnicodeDecodeError
            raise ValueError(f"{path}: not valid JSON ({e})") from None


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
