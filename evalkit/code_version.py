"""The hash of the evalkit source a process runs: what a cached sample or a stored lm-eval pair
is keyed on, so a change to scoring, rendering or an adapter is never answered from an older
code's cache. (The package version string has said 0.1.0 since the first commit.) A core module
with no evalkit import, so the runner and the lm-eval bridge both read it without a cycle.
"""
from __future__ import annotations

import functools
import hashlib
import importlib.util
from pathlib import Path


def source_hash(roots: list[Path]) -> str:
    """sha256 over the .py files under `roots` (their paths relative to each root, and bytes)."""
    h = hashlib.sha256()
    for root in roots:
        for p in sorted(root.rglob("*.py")):
            h.update(f"{root.name}/{p.relative_to(root).as_posix()}\0".encode())
            h.update(p.read_bytes())
            h.update(b"\0")
    return h.hexdigest()


def source_roots() -> list[Path]:
    """The folders of the evalkit source this process runs: evalkit/ and its model_adapters
    (installed as evalkit.model_adapters from the top-level folder)."""
    roots = [Path(__file__).resolve().parent]
    spec = importlib.util.find_spec("evalkit.model_adapters")
    return roots + [Path(p) for p in (spec.submodule_search_locations or [])] if spec else roots


@functools.lru_cache(maxsize=1)
def code_hash() -> str:
    """The hash of the evalkit source this process runs. The version string has said 0.1.0
    since the first commit, so it tells no two codes apart. Once per process: about 150
    files, milliseconds."""
    return source_hash(source_roots())
