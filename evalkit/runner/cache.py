"""Content-addressed store of finished samples: what makes runs resumable and re-runs cheap.

Key material, every input of a score: the model identity hash (weights by content, the
options with their files by content, a served model's identity as its server reports it),
the probe hash, the question index, the generation settings (the load included: a closed
loop's requests in flight, an open loop's exact schedule), the code (evalkit's source, the
user's imported modules by content, the computing packages' versions:
provenance.code_key) and the cache schema. An entry lives at
`<root>/entries/<h[:2]>/<h>.json` with h = sha256(canonical JSON of the key material), and
stores that material next to the SampleResult. So:
- two different models (or the same model with other weights, dtype or options) never share
  an entry: their identity hashes differ;
- a sample scored by other code (a changed scorer, renderer, adapter or plugin) is not
  found: the code is part of its key, so `--resume` and a shared `--cache-dir` score it again;
- a sample measured under one load is never reused under another: an open loop's key holds
  its schedule exactly (the arrival process with its exact rate, the seed, every request of
  the schedule, the shard and rank that sent it, the cap on open requests), not a label;
- a store of another cache schema is detected when it is opened (`CACHE.json` manifest) and
  refused with a clear error, never reused;
- an entry whose stored material does not match the key it was looked up under (a copied or
  tampered file), or whose content does not match its stored sha256 (a hand-edited result),
  is reported and recomputed.
Only successful samples are stored: failures are retried by a resumed run. Over-length flags are
not stored either (they cost nothing to recompute).

An open loop's samples are reused only together: `<root>/schedules/<h[:2]>/<h>.json` records a
schedule part that was offered whole in one invocation and answered without a failure
(`schedule_done`). Without that record (the run was interrupted, or a request failed), a
resume offers the whole schedule again, never the requests left alone: those would meet a
lighter load than the one the label names (evalkit.runner.run).

The default root is `<run dir>/cache/`, so a run directory is self-contained and `--resume`
needs nothing else; `--cache-dir` (or `cache_dir:` in a suite) shares one store between runs.
"""
from __future__ import annotations

import hashlib
import json
import sys
from pathlib import Path
from typing import Any

from evalkit import atomic
from evalkit.probe import canonical_json
from evalkit.result import SampleResult

CACHE_SCHEMA = 1
MANIFEST = "CACHE.json"


class CacheError(ValueError):
    """The store cannot be used (its root is a file, an unreadable manifest, ...)."""


class CacheMismatch(CacheError):
    """The store was written with another cache schema."""


def _checksum(key: dict, result: dict) -> str:
    return hashlib.sha256(canonical_json({"key": key, "result": result}).encode()).hexdigest()


class SampleCache:
    def __init__(self, root: str | Path) -> None:
        self.root = Path(root)
        self.hits = self.misses = self.stale = 0
        self._open()

    def _manifest(self) -> dict:
        return {"cache_schema": CACHE_SCHEMA}

    def _open(self) -> None:
        path = self.root / MANIFEST
        want = self._manifest()
        if self.root.exists() and not self.root.is_dir():
            raise CacheError(f"--cache-dir {self.root}: expected a folder, got a file")
        if not path.exists():
            try:
                atomic.write_json(path, want)
            except OSError as e:
                raise CacheError(f"--cache-dir {self.root}: cannot write {MANIFEST} "
                                 f"({e.strerror})") from None
            return
        try:
            have = json.loads(path.read_text())
        except (OSError, ValueError) as e:  # JSONDecodeError, UnicodeDecodeError
            raise CacheMismatch(f"cache {self.root}: unreadable manifest {MANIFEST} ({e})") from None
        diff = {k: (have.get(k), v) for k, v in want.items() if have.get(k) != v}
        if diff:
            what = "; ".join(f"{k} {a!r} there, {b!r} here" for k, (a, b) in diff.items())
            raise CacheMismatch(
                f"cache {self.root} was written with another layout ({what}): its entries are "
                f"not reused. Start a new run (or point --cache-dir elsewhere), or delete the "
                f"cache to recompute.")

    def key(self, run: dict, probe_hash: str, question: int) -> dict:
        """A sample's key: `run` is its model's material (model_hash, code, generation; the
        same for every sample of the model in this run), then the probe and question."""
        return {"cache_schema": CACHE_SCHEMA, **run, "probe_hash": probe_hash,
                "question": question}

    def path(self, key: dict, folder: str = "entries") -> Path:
        h = hashlib.sha256(canonical_json(key).encode()).hexdigest()
        return self.root / folder / h[:2] / f"{h}.json"

    def schedule_done(self, key: dict) -> bool:
        """Whether the open-loop schedule part `key` was offered whole and answered without a
        failure (mark_schedule_done); a record that does not check out is reported, not
        trusted."""
        path = self.path(key, "schedules")
        try:
            entry = json.loads(path.read_text())
        except FileNotFoundError:
            return False
        except (OSError, ValueError) as e:
            self._report(path, f"unreadable ({e})")
            return False
        if not isinstance(entry, dict) or entry.get("key") != key or \
                entry.get("sha256") != _checksum(key, entry.get("result")):
            self._report(path, "its stored key or checksum does not match")
            return False
        return True

    def mark_schedule_done(self, key: dict, samples: int) -> None:
        result = {"samples": samples}
        atomic.write_json(self.path(key, "schedules"),
                          {"key": key, "result": result, "sha256": _checksum(key, result)})

    def get(self, key: dict) -> SampleResult | None:
        path = self.path(key)
        try:
            entry = json.loads(path.read_text())
        except FileNotFoundError:
            self.misses += 1
            return None
        except (OSError, ValueError) as e:  # JSONDecodeError, UnicodeDecodeError
            self._report(path, f"unreadable ({e})")
            return None
        if not isinstance(entry, dict) or entry.get("key") != key:
            self._report(path, "its stored key material differs from the key it was read for")
            return None
        if entry.get("sha256") != _checksum(key, entry.get("result")):
            self._report(path, "its content does not match its sha256 (edited or corrupt)")
            return None
        self.hits += 1
        return SampleResult.from_dict(entry["result"])

    def _report(self, path: Path, why: str) -> None:
        self.stale += 1
        self.misses += 1
        print(f"evalkit run: warning: cache entry {path} not reused: {why}; recomputing",
              file=sys.stderr)

    def put(self, key: dict, sample: SampleResult) -> None:
        if sample.error is not None or sample.flag is not None:
            return
        result = sample.to_dict()
        atomic.write_json(self.path(key), {"key": key, "result": result,
                                           "sha256": _checksum(key, result)})

    def stats(self) -> dict[str, Any]:
        return {"hits": self.hits, "misses": self.misses, "stale": self.stale}
