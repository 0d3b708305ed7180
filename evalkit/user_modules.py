"""Loading users' Python files (task generators, model plugins): the one way evalkit does it.

Each file is imported once, under a module name unique to its resolved path, so two folders'
`gen.py` are two modules, never one reused for the other, and a file loaded by several runs in
one process declares its tasks or models once. A file that fails as it is imported leaves no
half-made module behind.
"""
from __future__ import annotations

import hashlib
import importlib.util
import sys
from pathlib import Path
from types import ModuleType


def load_user_file(file: str | Path, stem: str | None = None) -> ModuleType:
    """The module in `file`, imported once as evalkit_user_<path digest>_<stem>."""
    file = Path(file).resolve()
    digest = hashlib.sha256(str(file).encode()).hexdigest()[:12]
    name = f"evalkit_user_{digest}_{(stem or file.stem).replace('.', '_')}"
    if name in sys.modules:
        return sys.modules[name]
    spec = importlib.util.spec_from_file_location(name, file)
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    try:
        spec.loader.exec_module(module)
    except BaseException:
        del sys.modules[name]
        raise
    return module
