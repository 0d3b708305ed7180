"""Reading user YAML files safely, with errors that name the file."""
from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import yaml


def read_yaml(path: str | os.PathLike, error: type[Exception], what: str) -> Any:
    """yaml.safe_load of `path`. A missing file is FileNotFoundError; malformed YAML is `error`."""
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"{what} {path}: no such file")
    try:
        return yaml.safe_load(path.read_text())
    except yaml.YAMLError as e:
        raise error(f"{path}: malformed YAML: {e}") from None
