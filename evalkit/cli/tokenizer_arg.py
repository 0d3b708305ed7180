"""`--tokenizer`: a tokenizer folder or tokenizer.json, or a registered model's name.

A name (`--tokenizer recall-gla-tiny`, `--tokenizer smollm2-135m`) gives the tokenizer of the
model it names, so lengths come out in that model's tokens from any working directory (a
relative folder such as model_adapters/tiny/tokenizer works only from the repository root).
The tokenizer is read from beside the model's config when it is there (the tiny GLA and
Mamba2 models), else the model is loaded for it (`evalkit models` lists the names).
"""
from __future__ import annotations

from pathlib import Path
from typing import Any

from evalkit.tokenization import TOKENIZER_FILES, load_tokenizer


def tokenizer_from_arg(text: str | Path) -> Any:
    path = Path(text).expanduser()
    if path.exists():
        return load_tokenizer(path)
    from evalkit.model_adapters.models import load_model, model_info, model_names

    name = str(text)
    if name not in model_names():
        raise FileNotFoundError(
            f"--tokenizer {name!r}: no such tokenizer folder or tokenizer.json (relative to "
            f"{Path.cwd()}), and no registered model of that name; give a folder, a "
            f"tokenizer.json, or a model name such as recall-gla-tiny (`evalkit models`)")
    config = model_info(name).config
    if config is not None and any((config.parent / f).is_file() for f in TOKENIZER_FILES):
        return load_tokenizer(config.parent)
    return load_model(name).tokenizer
