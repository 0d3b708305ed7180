"""The run directory: runs/<run-id>/ (or whatever --output names).

    config.json       the suite as given (paths absolute), its resolution and config hash;
                      written first, so a killed run can be resumed from it alone
    provenance.json   versions, git state, model and tokenizer identities, seeds, timestamps
    samples.jsonl     one SampleResult per (model, probe, question), in suite order
    results.json      aggregates (evalkit.runner.aggregate)
    probes.jsonl      with --log-samples: every distinct probe, to re-render any prompt
    execution.json    per invocation: argv, world size, cache hits, wall time, interrupted?
    cache/            the content-addressed sample store (unless --cache-dir points elsewhere)
    DONE              the completion marker, written last: a directory without it is partial;
                      it holds the sha256 of samples.jsonl, results.json and provenance.json
    .lock             flock'ed by the process writing the folder (holds its pid)

Every file is written atomically (evalkit.atomic): a reader sees the old or the new version.
A finished run is only touched once its outputs are rewritten: a resume that fails (a moved
checkpoint, a bad option) leaves DONE and provenance.json as they were. A new run that fails
before evaluating anything is removed again, so the same --output works once the input is fixed.
"""
from __future__ import annotations

import fcntl
import json
import os
import shutil
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path
from typing import Any, Iterable

from evalkit import atomic
from evalkit.digest import sha256_file

CONFIG, PROVENANCE, SAMPLES, RESULTS = "config.json", "provenance.json", "samples.jsonl", "results.json"
PROBES, EXECUTION, CACHE, DONE = "probes.jsonl", "execution.json", "cache", "DONE"
LOCK = ".lock"
SUMMED = (SAMPLES, RESULTS, PROVENANCE)  # the outputs whose sha256 DONE records


class RunDirError(ValueError):
    pass


def default_run_id(config_hash: str, now: datetime | None = None) -> str:
    now = now or datetime.now(timezone.utc)
    return f"{now.strftime('%Y%m%dT%H%M%SZ')}-{config_hash[:8]}"


def new_run_dir(root: Path, config_hash: str) -> Path:
    """Create the default run directory; runs started in the same second get -2, -3, ..."""
    try:
        root.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        raise RunDirError(f"--runs-dir {root}: cannot create the folder ({e.strerror})") from None
    base = default_run_id(config_hash)
    for i in range(1, 1000):
        path = root / (base if i == 1 else f"{base}-{i}")
        try:
            path.mkdir()  # exclusive: of two runs, exactly one gets each name
            return path
        except FileExistsError:
            continue
        except OSError as e:
            raise RunDirError(f"--runs-dir {root}: cannot create {path.name} ({e.strerror})") from None
    raise RunDirError(f"--runs-dir {root}: 999 runs named {base}* already exist")


def read_json(path: Path) -> Any:
    try:
        return json.loads(path.read_text())
    except FileNotFoundError:
        return None
    except ValueError as e:  # JSONDecodeError, UnicodeDecodeError
        raise RunDirError(f"{path}: not valid JSON ({e})") from None
    except OSError as e:
        raise RunDirError(f"{path}: cannot read ({e.strerror})") from None


def stored_config(path: Path) -> dict:
    if path.exists() and not path.is_dir():
        raise RunDirError(f"--resume {path}: expected a run folder, got a file")
    doc = read_json(path / CONFIG)
    if doc is None:
        raise RunDirError(f"{path}: not a run directory (no {CONFIG}); nothing to resume")
    return doc


@dataclass
class RunFolder:
    """A run directory held by this process (its .lock flock'ed) until `release`, `discard` or
    `close_failed`."""
    path: Path
    earlier: dict | None   # a resumed run's earlier provenance; None for a new run
    created: bool          # this process made the folder
    done: bool             # it holds a finished run (DONE)
    lock_fd: int

    def release(self) -> None:
        os.close(self.lock_fd)

    def discard(self) -> None:
        """Remove a new run's folder (everything in it is this process's), then release it."""
        if self.created:
            shutil.rmtree(self.path, ignore_errors=True)
        else:  # the user's empty folder: keep it, empty
            for p in self.path.iterdir():
                shutil.rmtree(p, ignore_errors=True) if p.is_dir() else p.unlink(missing_ok=True)
        self.release()

    def close_failed(self, evaluated: bool) -> None:
        """Let go after a failure: a new run that evaluated nothing (a bad option, a missing
        checkpoint, an impossible grid) is removed, so fixing the input and re-running with
        the same --output works; one that evaluated something stays, resumable."""
        if self.earlier is None and not evaluated:
            self.discard()
        else:
            self.release()


def _entries(path: Path) -> list[str]:
    return [p.name for p in path.iterdir() if p.name != LOCK]


def _lock(path: Path) -> int:
    lock = path / LOCK
    try:
        fd = os.open(lock, os.O_RDWR | os.O_CREAT, 0o644)
    except OSError as e:
        raise RunDirError(f"{path}: cannot write in the run folder ({e.strerror})") from None
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        pid = os.pread(fd, 32, 0).decode(errors="replace").strip() or "unknown"
        os.close(fd)
        raise RunDirError(f"{path} is in use by another evalkit run (pid {pid}, lock {lock}); "
                          f"wait for it to finish, or stop it and resume") from None
    os.ftruncate(fd, 0)
    os.pwrite(fd, f"{os.getpid()}\n".encode(), 0)
    return fd


def prepare(path: Path, document: dict, *, resume: bool, created: bool = False) -> RunFolder:
    """Create the run directory (or check it for resuming) and lock it. Resuming a directory
    that does not exist yet (or is empty) starts it, so `--resume --output DIR` is safe to
    repeat. `created`: the caller made the (empty) folder."""
    if path.exists() and not path.is_dir():
        raise RunDirError(f"--output {path}: expected a run folder, got a file")
    if not resume and path.exists() and _entries(path):
        raise RunDirError(f"{path} already exists and is not empty; pass --resume to "
                          f"continue that run, or choose another --output")
    created = created or not path.exists()
    try:
        path.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        raise RunDirError(f"--output {path}: cannot create the run folder ({e.strerror})") from None
    prep = RunFolder(path, None, created, False, _lock(path))
    if not _entries(path):
        try:
            atomic.write_json(path / CONFIG, document)
        except OSError as e:
            prep.discard()
            raise RunDirError(f"{path / CONFIG}: cannot write ({e.strerror})") from None
        return prep
    try:
        if not resume:  # another run filled it between the check above and the lock
            raise RunDirError(f"{path} already exists and is not empty; pass --resume to "
                              f"continue that run, or choose another --output")
        prep.earlier = _check_resumable(path, document)
    except BaseException:
        prep.release()
        raise
    prep.done = (path / DONE).exists()
    return prep


def _check_resumable(path: Path, document: dict) -> dict:
    stored = stored_config(path)
    if stored.get("config_hash") != document["config_hash"]:
        old, new = stored.get("resolved", {}), document["resolved"]
        keys = sorted(k for k in set(old) | set(new) if old.get(k) != new.get(k))
        raise RunDirError(
            f"cannot resume {path}: it was started with config hash "
            f"{str(stored.get('config_hash'))[:12]}, this config hashes to "
            f"{document['config_hash'][:12]} (differs in: {', '.join(keys) or 'unknown'}). "
            f"Resume with the same settings (`evalkit run --resume {path}` alone reuses its "
            f"config.json), or start a new run.")
    if stored.get("shard") != document.get("shard"):
        show = lambda d: "{index}/{count}".format(**d) if isinstance(d, dict) else "the whole suite"
        raise RunDirError(f"cannot resume {path}: it runs shard {show(stored.get('shard'))}, "
                          f"this is {show(document.get('shard'))} (`evalkit run --resume "
                          f"{path}` alone keeps its shard)")
    return read_json(path / PROVENANCE) or {}


def write_start(path: Path, provenance: dict) -> None:
    atomic.write_json(path / PROVENANCE, provenance)


def append_execution(path: Path, record: dict) -> None:
    doc = read_json(path / EXECUTION) or {"invocations": []}
    doc["invocations"].append(record)
    atomic.write_json(path / EXECUTION, doc)


def finish(path: Path, *, samples: Iterable[dict], results: dict, provenance: dict,
           probes: Iterable[dict] | None = None) -> None:
    """Write the outputs, then DONE (last: its presence means everything else is complete)."""
    (path / DONE).unlink(missing_ok=True)  # being rewritten: no longer complete until DONE
    n = atomic.write_jsonl(path / SAMPLES, samples)
    if probes is not None:
        atomic.write_jsonl(path / PROBES, probes)
    atomic.write_json(path / PROVENANCE, provenance)
    atomic.write_json(path / RESULTS, results)
    atomic.write_json(path / DONE, {"finished": provenance.get("finished"), "samples": n,
                                    "failed": results.get("failures", 0),
                                    "sha256": output_sums(path)})


def output_sums(path: Path) -> dict[str, str]:
    """The checksums DONE records: a reader refuses a file changed after the run finished."""
    return {name: sha256_file(path / name) for name in SUMMED}


def check_output_sums(path: Path, done: dict) -> None:
    """Raise, naming the file, if an output differs from the bytes the run wrote. A DONE
    without "sha256" was written before DONE recorded checksums: there is nothing to check,
    and refusing would strand every older finished run (rebuilding needs its models)."""
    sums = done.get("sha256")
    if sums is None:
        return
    if not isinstance(sums, dict) or not all(isinstance(sums.get(n), str) for n in SUMMED):
        raise RunDirError(f"{path / DONE}: field 'sha256' should map {', '.join(SUMMED)} to "
                          f"their sha256 (hex); the marker is corrupt, rebuild it with "
                          f"`evalkit run --resume {path}`")
    for name in SUMMED:
        f, want = path / name, sums[name]
        if not f.is_file() or sha256_file(f) != want:
            raise RunDirError(f"{f}: not the file the run wrote (gone, or its sha256 differs "
                              f"from the one in {path / DONE}): corrupt or hand-edited; rebuild "
                              f"it with `evalkit run --resume {path}`")
