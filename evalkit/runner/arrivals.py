"""`--arrivals`: when a served model's requests are sent, instead of as fast as possible.

    poisson:RATE   RATE requests per second on average, exponential gaps (seeded)
    trace:FILE     offsets in seconds from the start, one per line (a recorded workload)

Each (model, task) pair of a run replays the schedule from its own start: its k-th request in
plan order is due at offset k. A request that is due while `concurrency` are already in flight
waits for a free slot; that wait is the sample's `queue_s` (the server's own queueing shows in
its TTFT). Offsets are a pure function of (arrivals, seed, task), so a rerun sends the same
requests at the same times.

    >>> parse("poisson:2").offsets(3, seed=0, key="needle")  # doctest: +ELLIPSIS
    [0.0..., ...]
"""
from __future__ import annotations

import hashlib
import math
import zlib
from dataclasses import dataclass
from pathlib import Path


MAX_RATE = 10_000.0          # requests per second
MAX_OFFSET_S = 7 * 86_400.0  # a week: a longer schedule is a typo
MAX_TRACE_BYTES = 64 << 20
MAX_TRACE_LINES = 1_000_000


@dataclass(frozen=True)
class Arrivals:
    kind: str                      # "poisson" or "trace"
    rate: float | None = None      # poisson
    file: str | None = None        # trace: absolute path
    sha256: str | None = None      # trace: its content, hashed into the run's config
    times: tuple[float, ...] = ()  # trace: the offsets

    @property
    def label(self) -> str:
        """How results name the load: 'poisson:2/s' or 'trace:NAME@sha8'."""
        if self.kind == "poisson":
            return f"poisson:{self.rate:g}/s"
        return f"trace:{Path(self.file).name}@{self.sha256[:8]}"

    def config(self) -> dict:
        """What changes results, for the config hash and the cache key."""
        if self.kind == "poisson":
            return {"kind": "poisson", "rate": self.rate}
        return {"kind": "trace", "sha256": self.sha256, "offsets": len(self.times)}

    def offsets(self, n: int, *, seed: int, key: str) -> list[float]:
        """The due times (seconds from the pair's start) of its first n requests."""
        if self.kind == "trace":
            if n > len(self.times):
                raise ValueError(f"--arrivals trace:{self.file}: {n} requests to send but only "
                                 f"{len(self.times)} offsets in the file; give one per request")
            return list(self.times[:n])
        import numpy as np

        rng = np.random.default_rng([seed, zlib.crc32(key.encode())])
        gaps = rng.exponential(1.0 / self.rate, size=n)
        gaps[:1] = 0.0  # the first request opens the pair
        return np.cumsum(gaps).tolist()


def parse(text: str, where: str = "--arrivals") -> Arrivals:
    kind, sep, arg = str(text).partition(":")
    if kind == "poisson" and sep:
        try:
            rate = float(arg)
        except ValueError:
            rate = math.nan
        if not (math.isfinite(rate) and 0 < rate <= MAX_RATE):
            raise ValueError(f"{where} {text!r}: RATE should be requests per second in "
                             f"(0, {MAX_RATE:g}], e.g. poisson:2")
        return Arrivals("poisson", rate=rate)
    if kind == "trace" and sep and arg:
        return _trace(Path(arg).expanduser().resolve(), where)
    raise ValueError(f"{where} {text!r}: expected poisson:RATE (requests per second) or "
                     f"trace:FILE (offsets in seconds, one per line)")


def _trace(path: Path, where: str) -> Arrivals:
    if not path.is_file():
        raise ValueError(f"{where} trace:{path}: no such file")
    if path.stat().st_size > MAX_TRACE_BYTES:
        raise ValueError(f"{where} trace:{path}: larger than {MAX_TRACE_BYTES >> 20} MiB")
    times: list[float] = []
    try:
        text = path.read_text(encoding="utf-8")
    except UnicodeDecodeError as e:
        raise ValueError(f"{where} trace:{path}: not UTF-8 text ({e.reason})") from None
    for i, line in enumerate(text.splitlines(), 1):
        value = line.split("#", 1)[0].strip()
        if not value:
            continue
        try:
            t = float(value)
        except ValueError:
            raise ValueError(f"{path}:{i}: {value[:40]!r} is not an offset in seconds") from None
        if not (math.isfinite(t) and 0 <= t <= MAX_OFFSET_S):
            raise ValueError(f"{path}:{i}: offset {value[:40]} should be seconds in "
                             f"[0, {MAX_OFFSET_S:g}]")
        if times and t < times[-1]:
            raise ValueError(f"{path}:{i}: offset {t:g} is before the one above it "
                             f"({times[-1]:g}); offsets go in time order")
        times.append(t)
        if len(times) > MAX_TRACE_LINES:
            raise ValueError(f"{path}: more than {MAX_TRACE_LINES:,} offsets")
    if not times:
        raise ValueError(f"{where} trace:{path}: no offsets in the file")
    return Arrivals("trace", file=str(path), sha256=hashlib.sha256(text.encode()).hexdigest(),
                    times=tuple(times))
