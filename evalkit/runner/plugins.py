"""A suite's `plugins`: Python files or modules that register models, imported once each;
their module names key the sample cache with their code (evalkit.user_modules)."""
from __future__ import annotations

import importlib
from pathlib import Path
from typing import Sequence

from evalkit.runner.errors import SuiteError
from evalkit.user_modules import load_user_file, module_name, owned_imports


def import_plugins(plugins: Sequence[str], where: str) -> None:
    """Import modules that declare models (`register_model`); each at most once."""
    for ref in plugins:
        path = Path(ref)
        is_file = ref.endswith(".py") or path.is_absolute()
        if is_file and not path.is_file():
            raise SuiteError(f"{where}: key 'plugins': {ref}: no such file")
        try:
            if is_file:
                load_user_file(path)
            else:
                with owned_imports(ref):  # what it imports keys the cache with it
                    importlib.import_module(ref)
        except Exception as e:  # the user's plugin fails as it is imported
            if isinstance(e, ModuleNotFoundError) and e.name == ref:
                raise SuiteError(f"{where}: key 'plugins': module {ref!r} not found") from None
            raise SuiteError(f"{where}: key 'plugins': {ref}: importing it failed: "
                             f"{type(e).__name__}: {e}") from None


def plugin_modules(plugins: Sequence[str]) -> list[str]:
    """The module names import_plugins gave `plugins` (their code keys the sample cache)."""
    return [module_name(ref) if ref.endswith(".py") or Path(ref).is_absolute() else ref
            for ref in plugins]
