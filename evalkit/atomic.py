"""Atomic file writes: write to a temporary file in the same folder, fsync, then rename.

A reader never sees a half-written file, and a crash leaves the previous version intact.
"""
from __future__ import annotations

import json
import math
import os
import tempfile
from contextlib import contextmanager
from pathlib import Path
from typing import IO, Any, Iterable, Iterator


_UMASK = os.umask(0)
os.umask(_UMASK)


@contextmanager
def atomic_open(path: str | os.PathLike, mode: str = "w") -> Iterator[IO]:
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, mode, **({} if "b" in mode else {"encoding": "utf-8"})) as f:
            yield f
            f.flush()
            os.fsync(f.fileno())
        os.chmod(tmp, 0o666 & ~_UMASK)  # mkstemp makes 0600; give the usual permissions
        os.replace(tmp, path)
    except BaseException:
        if os.path.exists(tmp):
            os.unlink(tmp)
        raise


def write_text(path: str | os.PathLike, text: str) -> None:
    with atomic_open(path) as f:
        f.write(text)


def nonfinite_at(obj: Any, where: str = "") -> str | None:
    """The key path of the first NaN or infinity in `obj` (None if there is none)."""
    if isinstance(obj, float) and not math.isfinite(obj):
        return where or "(top level)"
    items = obj.items() if isinstance(obj, dict) else enumerate(obj) if isinstance(obj, (list, tuple)) else ()
    for k, v in items:
        found = nonfinite_at(v, f"{where}.{k}" if where else str(k))
        if found:
            return found
    return None


def dumps(obj: Any, path: str | os.PathLike, **kw: Any) -> str:
    """json.dumps that refuses NaN/Infinity (bare NaN is not JSON: other readers reject the
    file), naming the file and the key."""
    try:
        return json.dumps(obj, allow_nan=False, sort_keys=True, ensure_ascii=False, **kw)
    except ValueError:
        where = nonfinite_at(obj)
        if where is None:
            raise
        raise ValueError(f"{path}: refusing to write a non-finite number at {where!r} "
                         f"(NaN or infinity is not valid JSON)") from None


def write_json(path: str | os.PathLike, obj: Any) -> None:
    write_text(path, dumps(obj, path, indent=2) + "\n")


def write_jsonl(path: str | os.PathLike, rows: Iterable[Any]) -> int:
    n = 0
    with atomic_open(path) as f:
        for row in rows:
            f.write(dumps(row, path) + "\n")
            n += 1
    return n
