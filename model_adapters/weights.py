"""Weight-file hashes for model identities, remembered on disk so a large file is read once."""
from __future__ import annotations

import hashlib
import json
import os
import threading
from pathlib import Path
from typing import Iterable

from evalkit import atomic

_lock = threading.Lock()
_memo: dict[str, str] = {}


def evalkit_cache_dir() -> Path:
    """`$EVALKIT_CACHE`, else ~/.cache/evalkit (converted weights, file hashes)."""
    return Path(os.environ.get("EVALKIT_CACHE") or "~/.cache/evalkit").expanduser()


def file_sha256(path: str | os.PathLike) -> str:
    """SHA-256 of a file, computed once per (path, size, mtime) and remembered in the cache dir."""
    p = Path(path).resolve()
    st = p.stat()
    key = f"{p}|{st.st_size}|{st.st_mtime_ns}"
    with _lock:
        if key in _memo:
            return _memo[key]
    store = evalkit_cache_dir() / "sha256-cache.json"
    try:
        known = json.loads(store.read_text())
    except (OSError, ValueError):
        known = {}
    digest = known.get(key)
    if digest is None:
        h = hashlib.sha256()
        with open(p, "rb") as f:
            for block in iter(lambda: f.read(1 << 22), b""):
                h.update(block)
        digest = h.hexdigest()
        known[key] = digest
        try:
            atomic.write_json(store, known)
        except OSError:
            pass  # a read-only cache dir only costs a re-hash next time
    with _lock:
        _memo[key] = digest
    return digest


def weights_hash(files: Iterable[str | os.PathLike]) -> str:
    """The `weights_hash` identity key: one file's SHA-256, or for shards the SHA-256 of their
    sorted "name:sha256" lines (so a single-file checkpoint's hash is its file's)."""
    hashes = {Path(f).name: file_sha256(f) for f in files}
    if not hashes:
        raise ValueError("weights_hash: no weight files")
    if len(hashes) == 1:
        return next(iter(hashes.values()))
    return hashlib.sha256("".join(f"{k}:{v}\n" for k, v in sorted(hashes.items()))
                          .encode()).hexdigest()
