"""A folder a command writes: the one way every writing command treats it.

Two rules, the same for `publish`, `compare`, `lm-eval-export`, `train-tiny` / `train-mqar` and
the SmolLM2 conversion cache:

1. A command replaces or removes only what it wrote. Before any work, `refuse_foreign` names
   the first path it would replace or remove that is not its own, and nothing is touched: a
   user's file is never lost. How a command knows its own files is its own evidence, given as
   `why_not_ours(path) -> reason | None`: a manifest of digests (lm-eval-export), a format
   marker (compare, publish), a fixed set of names (train-*).
2. A folder written whole is built in a stage beside it (`.<name>.tmp`, same file system)
   and swapped in by renames (`swap_in`): a failure anywhere before the swap leaves the
   previous folder exactly as it was. `building` is the whole sequence. Writers that may run
   at once hold `locked(parent)` around it, so they take turns; a stage left by a killed run
   is removed by the next one.
"""
from __future__ import annotations

import fcntl
import os
import shutil
import uuid
from contextlib import contextmanager
from pathlib import Path
from typing import Callable, Iterable, Iterator

_UMASK = os.umask(0)
os.umask(_UMASK)


def refuse_foreign(paths: Iterable[Path], why_not_ours: Callable[[Path], str | None], *,
                   command: str, flag: str) -> None:
    """Raise ValueError naming the first existing path of `paths` that is not ours."""
    for path in paths:
        if not (path.exists() or path.is_symlink()):
            continue
        why = why_not_ours(path)
        if why:
            raise ValueError(f"{path}: {why}; {command} never replaces or removes a file it "
                             f"did not write (move it away, or choose another {flag})")


def stage_for(target: Path) -> Path:
    """An empty folder beside `target` to build it in (a leftover of a killed run removed)."""
    stage = target.parent / f".{target.name}.tmp"
    if stage.is_symlink() or stage.is_file():
        stage.unlink()
    elif stage.exists():
        shutil.rmtree(stage)
    stage.mkdir(parents=True, mode=0o777 & ~_UMASK)
    return stage


def swap_in(stage: Path, target: Path) -> None:
    """Replace `target` by the finished `stage`: the old one is renamed aside, the new one
    renamed in (the old one put back if that fails), then the old one removed."""
    if not target.exists():
        os.rename(stage, target)
        return
    old = target.parent / f".{target.name}.old-{uuid.uuid4().hex[:8]}"
    os.rename(target, old)
    try:
        os.rename(stage, target)
    except BaseException:
        os.rename(old, target)
        raise
    shutil.rmtree(old, ignore_errors=True)


@contextmanager
def locked(folder: Path) -> Iterator[None]:
    """An exclusive flock on `folder` itself (nothing is written in it)."""
    fd = os.open(folder, os.O_RDONLY)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        os.close(fd)  # releases the lock


@contextmanager
def building(target: Path) -> Iterator[Path]:
    """Build `target` whole: yields its stage; on a normal exit the stage is swapped in, on
    any exception it is removed and `target` is as it was."""
    stage = stage_for(target)
    try:
        yield stage
        swap_in(stage, target)
    except BaseException:
        shutil.rmtree(stage, ignore_errors=True)
        raise
