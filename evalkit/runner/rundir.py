"""The run directory: runs/<run-id>/ (or whatever --output names).

    config.json       the suite as given (paths absolute), its resolution and config hash;
                      written first, so a killed run can be resumed from it alone
    provenance.json   versions, git state, model and tokenizer identities, seeds, timestamps
    samples.jsonl     one SampleResult per (model, probe, question), in suite order
    results.json      aggregates (evalkit.runner.aggregate)
    probes.jsonl      with --log-samples: every distinct probe, to re-render any prompt
    execution.json    per invocation: argv, world size, cache hits, wall time, interrupted?
    cache/            the content-addressed sample store (unless --cache-dir points elsewhere)
    DONE              the completion marker, written last: a directory without it is partial

Every file is written atomically (evalkit.atomic): a reader sees the old or the new version.
"""
from __future__ import annotations

import json
from datetime import datetime, timezone
from pathlib import Path
from typing import Any, Iterable

from evalkit import atomic

CONFIG, PROVENANCE, SAMPLES, RESULTS = "config.json", "provenance.json", "samples.jsonl", "results.json"
PROBES, EXECUTION, CACHE, DONE = "probes.jsonl", "execution.json", "cache", "DONE"


class RunDirError(ValueError):
    pass


def default_run_id(config_hash: str, now: datetime | None = None) -> str:
    now = now or datetime.now(timezone.utc)
    return f"{now.strftime('%Y%m%dT%H%M%SZ')}-{config_hash[:8]}"


def read_json(path: Path) -> Any:
    try:
        return json.loads(path.read_text())
    except FileNotFoundError:
        return None
    except json.JSONDecodeError as e:
        raise RunDirError(f"{path}: not valid JSON ({e})") from None


def stored_config(path: Path) -> dict:
    doc = read_json(path / CONFIG)
    if doc is None:
        raise RunDirError(f"{path}: not a run directory (no {CONFIG}); nothing to resume")
    return doc


def prepare(path: Path, document: dict, *, resume: bool) -> dict:
    """Create the run directory (or check it for resuming). Returns the earlier provenance
    of a resumed run (for its start time), else {}. Resuming a directory that does not exist
    yet (or is empty) starts it, so `--resume --output DIR` is safe to repeat."""
    fresh = not path.exists() or not any(path.iterdir())
    if not resume or fresh:
        if path.exists() and any(path.iterdir()):
            raise RunDirError(f"{path} already exists and is not empty; pass --resume to "
                              f"continue that run, or choose another --output")
        path.mkdir(parents=True, exist_ok=True)
        atomic.write_json(path / CONFIG, document)
        return {}
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
    (path / DONE).unlink(missing_ok=True)  # it is being rewritten: no longer complete
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
    n = atomic.write_jsonl(path / SAMPLES, samples)
    if probes is not None:
        atomic.write_jsonl(path / PROBES, probes)
    atomic.write_json(path / PROVENANCE, provenance)
    atomic.write_json(path / RESULTS, results)
    atomic.write_json(path / DONE, {"finished": provenance.get("finished"), "samples": n,
                                    "failed": results.get("failures", 0)})
