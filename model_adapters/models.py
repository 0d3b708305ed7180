"""Model declarations and the one way from a name, "name:PATH" or a path to an adapter.

A model is declared once, by decorating its factory:

    @register_model("oracle", kind="reference", state_kind="memory",
                    description="ideal induction copier", describe=_describe)
    def oracle(path: str | None, **options) -> ModelAdapter: ...

The factory is called as `factory(path_or_None, **options)`. `describe(n_tokens) -> dict` gives
`evalkit models` its numbers without loading weights (keys: parameters, state_bytes, dtype,
and optionally max_length and note); a model without one is a path loader, listed as
"NAME:PATH". `config` names a config.json that describes the architecture without weights
(what `evalkit state NAME` reads). `options` is the callable whose keyword parameters are the
model's options (default: the factory itself; a factory that forwards `**options` to an adapter
class names that class): `load_model` refuses an option it does not list, or a value that does
not fit its annotation, with a ModelOptionError naming the option.

A spec is a registered name, "name:PATH" (a registered factory applied to a checkpoint path),
or a path to a checkpoint folder or .gguf file, whose loader is picked from its config.
Built-in models live in BUILTIN_MODULES and are imported on first lookup, so importing evalkit
does not import torch or transformers.
"""
from __future__ import annotations

import importlib
import inspect
import json
import types
import typing
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

from evalkit.model_adapters.protocol import ModelAdapter, check_capabilities
from evalkit.registry import Registry

DEFAULT_TOKENS = 8192
BUILTIN_MODULES = (
    "evalkit.model_adapters.reference",
    "evalkit.model_adapters.gla.adapter",
    "evalkit.model_adapters.softmax",
    "evalkit.model_adapters.hf",
    "evalkit.model_adapters.embedded",
    "evalkit.model_adapters.mqar_models",
    "evalkit.model_adapters.linearized",
    "evalkit.model_adapters.served.adapter",
)


@dataclass(frozen=True)
class ModelInfo:
    name: str
    factory: Callable[..., ModelAdapter]
    kind: str                    # adapter family: "softmax", "gla", "reference", ...
    state_kind: str              # "kv", "kv-window", "recurrent", "hybrid", "memory"; "measured":
                                 # the loaded model's own (its adapter measures it)
    description: str
    describe: Callable[[int], dict] | None = None
    config: Path | None = None
    options: Callable[..., Any] | None = None  # whose keyword parameters are the options


class ModelOptionError(ValueError):
    """A model option that is unknown, mistyped or impossible here (e.g. device=cuda without CUDA)."""


MODELS: Registry[ModelInfo] = Registry("model")


def register_model(name: str, *, kind: str, state_kind: str, description: str,
                   describe: Callable[[int], dict] | None = None,
                   config: str | Path | None = None,
                   options: Callable[..., Any] | None = None) -> Callable:
    """Decorator declaring `factory(path_or_None, **options)` as model `name`."""
    def deco(factory: Callable[..., ModelAdapter]) -> Callable[..., ModelAdapter]:
        info = ModelInfo(name, factory, kind, state_kind, description, describe,
                         None if config is None else Path(config), options)
        MODELS.add(name, info, origin=getattr(factory, "__module__", ""))
        return factory
    return deco


_loaded = False


def _load_builtins() -> None:
    global _loaded
    if not _loaded:
        _loaded = True
        for mod in BUILTIN_MODULES:
            importlib.import_module(mod)


def model_names() -> list[str]:
    _load_builtins()
    return MODELS.names()


def model_info(name: str) -> ModelInfo:
    _load_builtins()
    return MODELS.get(name)


def _loader_for_path(path: Path) -> str:
    if path.suffix == ".gguf":
        return "hf"
    cfg = path / "config.json"
    if not cfg.is_file():
        raise FileNotFoundError(
            f"model path {path}: expected a .gguf file or a folder with config.json; found neither")
    try:
        model_type = json.loads(cfg.read_text()).get("model_type", "")
    except ValueError as e:  # JSONDecodeError, UnicodeDecodeError
        raise ValueError(f"{cfg}: not valid JSON ({e})") from e
    return "gla" if model_type == "gla" else "hf"


def resolve_spec(spec: str) -> tuple[ModelInfo, str | None]:
    """(declaration, checkpoint path or None) for a name, "name:PATH" or a checkpoint path.
    An unknown spec raises RegistryError (a KeyError) with close-match suggestions."""
    _load_builtins()
    if spec in MODELS:
        return MODELS.get(spec), None
    name, sep, rest = spec.partition(":")
    if sep and name in MODELS:
        return MODELS.get(name), rest
    path = Path(spec).expanduser()
    if path.exists():
        return MODELS.get(_loader_for_path(path)), str(path)
    MODELS.get(spec)  # raises with close-match suggestions
    raise AssertionError("unreachable")


def config_file(spec: str) -> Path:
    """The config.json a spec names: a file, a checkpoint folder, NAME:PATH, or a registered
    model's `config` (what `evalkit state` and `evalkit cost` read)."""
    path = Path(spec).expanduser()
    if not path.exists():
        info, rest = resolve_spec(spec)
        if rest:
            path = Path(rest).expanduser()
        elif info.config is not None:
            path = info.config
        else:
            raise ValueError(f"model {spec!r} has no config without a checkpoint; pass a "
                             f"config.json, a checkpoint folder or {spec}:PATH")
    cfg = path / "config.json" if path.is_dir() else path
    if not cfg.is_file():
        raise FileNotFoundError(f"{spec}: no config file at {cfg}")
    return cfg


def option_types(info: ModelInfo) -> dict[str, Any] | None:
    """{option: its annotation (None when unknown)} for a model, or None when it takes any
    keyword (a factory with **options and no `options=` declaration)."""
    target = info.options or info.factory
    params = list(inspect.signature(target).parameters.values())[1:]  # [0] is the path
    if any(p.kind is p.VAR_KEYWORD for p in params):
        return None
    try:
        hints = typing.get_type_hints(target.__init__ if inspect.isclass(target) else target)
    except Exception:  # an annotation that does not resolve: check names only
        hints = {}
    return {p.name: hints.get(p.name) for p in params
            if p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY)}


def check_options(info: ModelInfo, options: dict[str, Any]) -> None:
    """Raise ModelOptionError for an option `info` does not take or a value of the wrong type."""
    types = option_types(info)
    if types is None:
        return
    unknown = sorted(set(options) - set(types))
    if unknown:
        raise ModelOptionError(f"model {info.name!r}: unknown option(s) {', '.join(unknown)} "
                               f"(accepted: {', '.join(sorted(types))})")
    from pydantic import TypeAdapter, ValidationError

    for key, value in options.items():
        hint = types[key]
        if hint is None or hint is Any:
            continue
        try:
            adapter = TypeAdapter(hint)
        except Exception:  # a type pydantic cannot check (torch.dtype, ...): the adapter checks
            continue
        try:  # strict: YAML already parsed numbers and booleans, so "12" is not an int here
            adapter.validate_python(value, strict=True)
        except ValidationError:
            raise ModelOptionError(f"model {info.name!r}: option {key}={value!r}: expected "
                                   f"{_readable(hint)}") from None


_TYPE_WORDS = {int: "an integer", float: "a number", bool: "true or false", str: "a string",
               type(None): "none"}


def _readable(hint: Any) -> str:
    """An option's type in words: `int | None` -> "an integer or none"."""
    origin, args = typing.get_origin(hint), typing.get_args(hint)
    if origin is typing.Literal:
        return "one of " + ", ".join(map(repr, args))
    if args and origin in (typing.Union, types.UnionType):
        return " or ".join(map(_readable, args))
    return _TYPE_WORDS.get(hint) or (str(hint).replace("typing.", "").replace("<class '", "")
                                     .replace("'>", ""))


def load_model(spec: str, **options: Any) -> ModelAdapter:
    """Return an adapter for a registered name, "name:PATH", or a checkpoint path."""
    info, path = resolve_spec(spec)
    check_options(info, options)
    adapter = info.factory(path, **options)
    check_capabilities(adapter, info.name)  # declared once, here: never probed later
    if (adapter.serving is not None) != (info.kind == "served"):
        raise TypeError(f"model {info.name!r}: registered kind {info.kind!r} but its adapter "
                        f"{'serves' if adapter.serving is not None else 'does not serve'}: "
                        f"a served model is registered kind='served' and declares `serving`")
    return adapter


def describe_model(name: str, n_tokens: int = DEFAULT_TOKENS) -> dict:
    """One `evalkit models` row for `name`, without loading weights; raises when the model's
    describe function fails."""
    info = model_info(name)
    row: dict[str, Any] = {"name": name, "kind": info.kind, "parameters": None,
                           "state_kind": info.state_kind, "state_bytes": None,
                           "n_tokens": n_tokens, "dtype": None, "description": info.description}
    if info.describe is None:
        row["note"] = f"path loader: {name}:PATH"
        return row
    d = info.describe(n_tokens)
    unknown = sorted(set(d) - {"parameters", "state_bytes", "dtype", "max_length", "trained_length",
                              "note"})
    if unknown:
        raise ValueError(f"model {name!r}: describe() returned unknown keys {unknown}")
    row.update(d)
    return row
