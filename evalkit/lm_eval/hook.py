"""Startup hook that lets the plain `lm-eval` command resolve `--model evalkit`.

lm-eval 0.4.13 has no plugin mechanism for models: `--model NAME` is looked up in
`lm_eval.api.registry.model_registry`, which holds lm-eval's own lazy entries
(`lm_eval.models.MODEL_MAPPING`) plus whatever was registered by an imported module; no entry
points are read. `python -m evalkit.lm_eval.cli --install-hook` writes a one-line .pth file
into site-packages that runs this file at interpreter start. It only adds an import finder
(no lm-eval, torch or evalkit import): when `lm_eval.api.registry` is first imported, it
registers "evalkit" as a lazy "module:Class" entry, which lm-eval imports only when
`--model evalkit` is asked for; when lm-eval's `run` command module is imported, its runner
gets evalkit.lm_eval.run.supply_tokenizer in front (for `--model evalkit` only), so RULER-style
tasks get the model's tokenizer as with the evalkit-lm-eval wrapper. This file must stay
dependency-free and must never raise.
"""
import importlib.abc
import importlib.machinery
import sys

TARGET = "lm_eval.api.registry"
RUN_COMMAND = "lm_eval._cli.run"
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


def _supply_tokenizer(module) -> None:
    try:
        run = module.Run
        original = run._execute  # bound into the parser when lm-eval builds it, after this

        def _execute(args):
            if getattr(args, "model", None) == "evalkit":
                from evalkit.lm_eval.run import supply_tokenizer

                supply_tokenizer(args)
            return original(args)

        run._execute = staticmethod(_execute)
    except Exception:  # a broken hook must not break lm-eval
        pass


AFTER_IMPORT = {TARGET: _register, RUN_COMMAND: _supply_tokenizer}


class _Finder(importlib.abc.MetaPathFinder):
    evalkit_lm_eval_hook = True  # marker: this file may be loaded more than once

    def __init__(self):
        self.pending = dict(AFTER_IMPORT)

    def find_spec(self, name, path, target=None):
        after = self.pending.pop(name, None)
        if after is None:
            return None
        if not self.pending and self in sys.meta_path:
            sys.meta_path.remove(self)  # one shot per module
        spec = importlib.machinery.PathFinder.find_spec(name, path)
        if spec is None or spec.loader is None:
            return spec
        loader_exec = spec.loader.exec_module

        def exec_module(module):
            loader_exec(module)
            after(module)

        spec.loader.exec_module = exec_module
        return spec


def install() -> None:
    if any(getattr(f, "evalkit_lm_eval_hook", False) for f in sys.meta_path):
        return
    finder = _Finder()
    for name, after in AFTER_IMPORT.items():
        if name in sys.modules:  # lm-eval already imported (hook loaded late): apply now
            after(sys.modules[name])
            finder.pending.pop(name)
    if finder.pending:
        sys.meta_path.insert(0, finder)


install()
