"""`load_model(spec, **options)`: the one entry point from names or paths to adapters.

A model factory is registered under one or more names with `@MODELS.register("name")`;
it is called as `factory(path_or_None, **options)` and returns a ModelAdapter. A spec is
- a registered name ("oracle", "smollm2-135m", "recall-gla-tiny"), or
- "name:PATH" (a registered loader applied to a checkpoint path, e.g. "gla:/ckpt/gla-340m"), or
- a path to a checkpoint folder or .gguf file, whose loader is picked from its config.
"""
from __future__ import annotations

import importlib
import json
from pathlib import Path
from typing import Any, Callable

from evalkit.adapter import ModelAdapter
from evalkit.registry import Registry

MODELS: Registry[Callable[..., ModelAdapter]] = Registry("model")
# Short descriptions for `evalkit models`: name -> dict(kind=..., path=...)
MODEL_INFO: dict[str, dict[str, Any]] = {}

# Modules that register built-in models on import. Each is imported lazily (heavy deps).
BUILTIN_MODULES = (
    "evalkit.model_adapters.reference",
    "evalkit.model_adapters.gla_adapter",
    "evalkit.model_adapters.softmax",
    "evalkit.model_adapters.embedded",
)

_loaded = False


def _load_builtins() -> None:
    global _loaded
    if _loaded:
        return
    _loaded = True
    for mod in BUILTIN_MODULES:
        importlib.import_module(mod)


def model_names() -> list[str]:
    _load_builtins()
    return MODELS.names()


def _loader_for_path(path: Path) -> str:
    if path.suffix == ".gguf":
        return "hf"
    cfg = path / "config.json"
    if not cfg.is_file():
        raise FileNotFoundError(
            f"model path {path}: expected a .gguf file or a folder with config.json; found neither")
    try:
        model_type = json.loads(cfg.read_text()).get("model_type", "")
    except json.JSONDecodeError as e:
        raise ValueError(f"{cfg}: not valid JSON ({e})") from e
    return "gla" if model_type == "gla" else "hf"


def load_model(spec: str, **options: Any) -> ModelAdapter:
    """Return an adapter for a registered name, "name:PATH", or a checkpoint path."""
    _load_builtins()
    if spec in MODELS:
        return MODELS.get(spec)(None, **options)
    name, sep, rest = spec.partition(":")
    if sep and name in MODELS:
        return MODELS.get(name)(rest, **options)
    path = Path(spec).expanduser()
    if path.exists():
        return MODELS.get(_loader_for_path(path))(str(path), **options)
    MODELS.get(spec)  # raises with close-match suggestions
    raise AssertionError("unreachable")
