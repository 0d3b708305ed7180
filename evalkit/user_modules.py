"""Loading users' Python files (task generators, model plugins): the one way evalkit does it,
and what they imported, by content, for the sample cache's key.

Each file is imported once, under a module name unique to its resolved path, so two folders'
`gen.py` are two modules, never one reused for the other, and a file loaded by several runs in
one process declares its tasks or models once. A file that fails as it is imported leaves no
half-made module behind.

User code: a module evalkit runs for the user (a plugin, a task generator, a model factory)
owns every module imported while evalkit ran it (`owned_imports`: as it was imported, as its
model loaded) that lies outside the Python installation (stdlib, site-packages) and outside
evalkit's own source (which code_version.code_hash covers): its neighbours, a library of the
user's on PYTHONPATH. `code_of(owners)` lists those modules by content, so a plugin edited
between two runs keys the second run's samples apart, and the same plugin in two clones keys
them alike. A module's content is taken as it was imported (a user file's bytes are hashed and
compiled in one read) or as first seen: a file edited after its module was imported does not
run in this process, so it must not key this process's samples.
"""
from __future__ import annotations

import contextlib
import hashlib
import importlib.util
import marshal
import os
import site
import sys
import sysconfig
import types
import weakref
from pathlib import Path
from typing import Iterable, Iterator

from evalkit.code_version import source_roots

# owner module name -> the user modules imported while it ran (its own name included)
_owned: dict[str, set[str]] = {}
# each module's content as first seen
_seen: "weakref.WeakKeyDictionary[types.ModuleType, str]" = weakref.WeakKeyDictionary()


def module_name(file: str | Path, stem: str | None = None) -> str:
    """The name load_user_file gives `file`'s module."""
    file = Path(file).resolve()
    digest = hashlib.sha256(str(file).encode()).hexdigest()[:12]
    return f"evalkit_user_{digest}_{(stem or file.stem).replace('.', '_')}"


def load_user_file(file: str | Path, stem: str | None = None) -> types.ModuleType:
    """The module in `file`, imported once as evalkit_user_<path digest>_<stem>."""
    file = Path(file).resolve()
    name = module_name(file, stem)
    if name in sys.modules:
        return sys.modules[name]
    source = file.read_bytes()
    spec = importlib.util.spec_from_file_location(name, file)
    module = importlib.util.module_from_spec(spec)
    module.__evalkit_sha256__ = hashlib.sha256(source).hexdigest()
    sys.modules[name] = module
    try:
        with owned_imports(name):
            # compiled from the bytes hashed above, never from a __pycache__ file: Python
            # trusts a .pyc whose source has the same size and mtime, so a same-size edit
            # with the mtime put back would run the old code under the new file's hash
            exec(compile(source, str(file), "exec"), module.__dict__)
    except BaseException:
        del sys.modules[name]
        _owned.pop(name, None)
        raise
    return module


@contextlib.contextmanager
def owned_imports(owner: str) -> Iterator[None]:
    """Count the user modules imported inside the block as `owner`'s (see the module doc)."""
    before = set(sys.modules)
    try:
        yield
    finally:
        new = {n for n in list(sys.modules) if n not in before and _file_of(sys.modules[n])}
        _owned.setdefault(owner, {owner}).update(new)


def code_of(owners: Iterable[str]) -> list[str]:
    """'file name:sha256' of the user modules `owners` are or imported (owned_imports),
    sorted; evalkit's own and installed modules are left out (keyed elsewhere)."""
    names = set()
    for o in owners:
        names |= _owned.get(o, {o})
    out = set()
    for n in names:
        mod = sys.modules.get(n)
        f = _file_of(mod) if mod is not None else None
        if f is not None:
            out.add(f"{os.path.basename(f)}:{_digest(mod, f)}")
    return sorted(out)


def _file_of(mod: object) -> str | None:
    """The real path of a user module's file; None for a module without one, an installed
    one, or evalkit's own."""
    if not isinstance(mod, types.ModuleType):
        return None
    f = mod.__dict__.get("__file__")  # not getattr: some modules answer any name (torch)
    if not isinstance(f, str) or not f or f.startswith("<"):
        return None
    real = os.path.realpath(f)
    return None if real.startswith(_not_user()) else real


def _not_user() -> tuple[str, ...]:
    """Where installed code lives (this environment's and the base interpreter's stdlib and
    site-packages, the user site) and evalkit's own source, as real folder paths."""
    base = {"base": sys.base_prefix, "platbase": sys.base_exec_prefix,
            "installed_base": sys.base_prefix, "installed_platbase": sys.base_exec_prefix}
    dirs = {str(r) for r in source_roots()}
    for paths in (sysconfig.get_paths(), sysconfig.get_paths(vars=base)):
        dirs.update(paths[k] for k in ("stdlib", "platstdlib", "purelib", "platlib"))
    dirs.update(site.getsitepackages())
    dirs.add(site.getusersitepackages())
    return tuple(os.path.join(os.path.realpath(d), "") for d in dirs if d)


def _digest(mod: types.ModuleType, f: str) -> str:
    known = mod.__dict__.get("__evalkit_sha256__") or _seen.get(mod)
    if known is None:
        try:
            source = Path(f).read_bytes()
            known = hashlib.sha256(source).hexdigest() + _stale_bytecode(mod, f, source)
        except OSError:
            known = "unreadable"
        _seen[mod] = known
    return known


def _stale_bytecode(mod: types.ModuleType, f: str, source: bytes) -> str:
    """'' unless Python ran a __pycache__ file that is not this source compiled: it trusts a
    .pyc whose recorded size and mtime match the source's, so a same-size edit with the mtime
    put back runs the old code. Then '+pyc:<sha256 of the .pyc>', so the key names the code
    that ran, not the file's text."""
    cached = mod.__dict__.get("__cached__")
    if not f.endswith(".py") or not isinstance(cached, str):
        return ""
    try:
        pyc = Path(cached).read_bytes()
        flags = int.from_bytes(pyc[4:8], "little")
        st = os.stat(f)
        if flags != 0 or pyc[8:16] != (int(st.st_mtime) & 0xFFFFFFFF).to_bytes(4, "little") + (
                st.st_size & 0xFFFFFFFF).to_bytes(4, "little"):
            return ""  # Python would not have used it (or checks it by hash itself)
        if marshal.loads(pyc[16:]) == compile(source, f, "exec", dont_inherit=True):
            return ""
    except (OSError, ValueError, EOFError, TypeError, SyntaxError):
        return ""
    return "+pyc:" + hashlib.sha256(pyc).hexdigest()
