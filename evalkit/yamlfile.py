"""Reading user YAML files safely, with errors that name the file.

Aliases (`*name`) are refused: a few lines of nested aliases expand to gigabytes ("billion
laughs"), and no evalkit file needs them. The file size is bounded for the same reason.
"""
from __future__ import annotations

import os
from collections import Counter
from pathlib import Path
from typing import Any, Sequence

import yaml

MAX_BYTES = 1 << 20  # 1 MiB: far above any suite or task file


def read_yaml(path: str | os.PathLike, error: type[Exception], what: str) -> Any:
    """yaml.safe_load of `path`. A missing file is FileNotFoundError; malformed YAML, an alias
    or a file over MAX_BYTES is `error`."""
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"{what} {path}: no such file")
    size = path.stat().st_size
    if size > MAX_BYTES:
        raise error(f"{path}: {size:,} bytes; a {what} may hold at most {MAX_BYTES:,}")
    try:
        text = path.read_text(encoding="utf-8")
    except UnicodeDecodeError as e:
        raise error(f"{path}: not UTF-8 text ({e})") from None
    try:
        for event in yaml.parse(text, Loader=yaml.SafeLoader):
            if isinstance(event, yaml.AliasEvent):
                line = event.start_mark.line + 1
                raise error(f"{path}: line {line}: YAML alias *{event.anchor} is not allowed "
                            f"(aliases can expand without bound); write the value out")
        return yaml.safe_load(text)
    except yaml.YAMLError as e:
        raise error(f"{path}: malformed YAML: {e}") from None


def read_typed(path: str | os.PathLike, model: Any, what: str) -> Any:
    """A YAML mapping validated by the pydantic `model`; every error names the file and key."""
    from pydantic import ValidationError

    path = Path(path)
    raw = read_yaml(path, ValueError, what)
    if not isinstance(raw, dict):
        raise ValueError(f"{path}: a {what} is a mapping of keys, got {type(raw).__name__}")
    try:
        return model.model_validate(raw)
    except ValidationError as e:
        raise ValueError(validation_message(path, e)) from None


def validation_message(where: str | os.PathLike, e: Any, prefix: str = "") -> str:
    """A pydantic ValidationError as one line per error, each naming `where` and the key
    (`prefix.key` when the model sits under `prefix` in the file): unknown keys, missing keys,
    and wrong values with what was given."""
    lines = []
    for err in e.errors():
        key = ".".join(str(x) for x in ([prefix, *err["loc"]] if prefix else err["loc"]))
        if err["type"] == "extra_forbidden":
            lines.append(f"{where}: unknown key {key!r}")
        elif err["type"] == "missing":
            lines.append(f"{where}: missing required key {key!r}")
        else:
            msg = str(err["msg"]).removeprefix("Value error, ")  # our validators' own words
            lines.append(f"{where}: key {key!r}: {msg} (got {err.get('input')!r})")
    return "\n".join(lines)


def repeated(values: Sequence[Any]) -> list:
    """The values that appear more than once, sorted (a config's names must be unique)."""
    return sorted(v for v, n in Counter(values).items() if n > 1)
