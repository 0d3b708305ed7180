"""Startup hook that lets the plain `lm-eval` command resolve `--model evalkit`.

lm-eval 0.4.13 has no plugin mechanism for models: `--model NAME` is looked up in
`lm_eval.api.registry.model_registry`, which holds lm-eval's own lazy entries
(`lm_eval.models.MODEL_MAPPING`) plus whatever was registered by an imported module; no entry
points are read. `python -m evalkit.lm_eval.cli --install-hook` writes a one-line .pth file
into site-packages that runs this file at interpreter start. It only adds an import finder
(no lm-eval, torch or evalkit import): when `lm_eval.api.registry` is first imported, it
registers "evalkit" as a lazy "module:Class" entry, which lm-eval imports only when
`--model evalkit` is asked for. This file must stay dependency-free and must never raise.
"""
import importlib.abc
import importlib.machinery
import sys

TARGET = "lm_eval.api.registry"
ENTRY = ("evalkit", "evalkit.lm_eval.bridge:EvalkitLM")


def _register(module) -> None:
    try:
        # lm-eval fills its own lazy table only while the registry is empty; fill it first so
        # adding "evalkit" never hides "hf" and the other built-in models.
        import lm_eval.models  # noqa: F401

        name, target = ENTRY
        if name not in module.model_registry:
            module.model_registry.register(name, target=target)
    except Exception:  # a broken hook must not break lm-eval (or any other program)
        pass


class _Finder(importlib.abc.MetaPathFinder):
    evalkit_lm_eval_hook = True  # marker: this file may be loaded more than once

    def find_spec(self, name, path, target=None):
        if name != TARGET:
            return None
        if self in sys.meta_path:
            sys.meta_path.remove(self)  # one shot
        spec = importlib.machinery.PathFinder.find_spec(name, path)
        if spec is None or spec.loader is None:
            return spec
        loader_exec = spec.loader.exec_module

        def exec_module(module):
            loader_exec(module)
            _register(module)

        spec.loader.exec_module = exec_module
        return spec


def install() -> None:
    if TARGET in sys.modules:  # lm-eval already imported (hook loaded late): register now
        _register(sys.modules[TARGET])
    elif not any(getattr(f, "evalkit_lm_eval_hook", False) for f in sys.meta_path):
        sys.meta_path.insert(0, _Finder())


install()
