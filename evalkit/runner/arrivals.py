"""Loads a served model is answered under: open loop (`--arrivals`) or closed loop.

    poisson:RATE   open loop: RATE requests per second on average, exponential gaps (seeded)
    trace:FILE     open loop: offsets in seconds from the start, one per line (a recorded load)
    closed:C       without --arrivals: C requests kept in flight, the next sent when one ends
                   (closed:1 is unloaded, one request at a time)

Open loop: each request is sent when it is due, whatever is in flight (evalkit.runner.
concurrent), so its response time, due time to last token, holds the queueing a user would
meet. One schedule covers a model's whole plan: the requests, every task, length and depth of
it, are put in the order of sha256(seed, request key) and take the schedule's offsets in that
order. So a request's due time is a pure function of (arrivals, seed, its key, the plan), not
of plan order (which is longest prompt first); a resumed run sends what is left at the same
due times, and `--shard I/N` shards each send their part of the one schedule, N shards
together offering RATE.

    >>> sorted(parse("poisson:2").schedule(["a", "b", "c"], seed=0).values())  # doctest: +ELLIPSIS
    [0.0, ...]
"""
from __future__ import annotations

import hashlib
import math
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Sequence


MAX_RATE = 10_000.0          # requests per second
MAX_OFFSET_S = 7 * 86_400.0  # a week: a longer schedule is a typo
MAX_TRACE_BYTES = 64 << 20
MAX_TRACE_LINES = 1_000_000
# a number as a person writes one: ASCII digits, one point, an exponent. float() also takes
# "1_0" (10) and "１０" (fullwidth 10): each is a typo here, never a time
_NUMBER = re.compile(r"[+-]?((\d+\.?\d*|\.\d+)([eE][+-]?\d+)?|inf|infinity|nan)",
                     re.ASCII | re.IGNORECASE)  # inf, nan: read, then refused as out of range


def number(text: str) -> float:
    """`text` as a plain decimal number; ValueError for anything float() would read loosely."""
    if not _NUMBER.fullmatch(text):
        raise ValueError(text)
    return float(text)


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
        if self.kind == "poisson":  # exactly the rate: 12.34567 and 12.34571 are two loads
            short = f"{self.rate:g}"
            return f"poisson:{short if float(short) == self.rate else repr(self.rate)}/s"
        return f"trace:{Path(self.file).name}@{self.sha256[:8]}"

    def config(self) -> dict:
        """What changes results, for the config hash and the cache key."""
        if self.kind == "poisson":
            return {"kind": "poisson", "rate": self.rate}
        return {"kind": "trace", "sha256": self.sha256, "offsets": len(self.times)}

    def offsets(self, n: int, *, seed: int) -> list[float]:
        """The schedule's first n due times, seconds from its start. Raises ValueError for a
        trace with fewer offsets, or a Poisson schedule expected to outlast MAX_OFFSET_S (a
        typo such as poisson:1e-6 would otherwise sleep for days)."""
        if self.kind == "trace":
            if n > len(self.times):
                raise ValueError(f"--arrivals trace:{self.file}: {n} requests to send but only "
                                 f"{len(self.times)} offsets in the file; give one per request")
            return list(self.times[:n])
        expected = self.expected_s(n)
        if expected > MAX_OFFSET_S:
            raise ValueError(f"--arrivals {self.label}: {n} requests take about {expected:,.0f} s "
                             f"at that rate, longer than the cap of {MAX_OFFSET_S:,.0f} s "
                             f"(a week); use a rate of at least "
                             f"{max(n - 1, 1) / MAX_OFFSET_S:.3g} per second")
        import numpy as np

        gaps = np.random.default_rng(seed).exponential(1.0 / self.rate, size=n)
        gaps[:1] = 0.0  # the first request opens the schedule
        return np.cumsum(gaps).tolist()

    def expected_s(self, n: int) -> float:
        """How long sending n requests is expected to take."""
        if self.kind == "trace":
            return self.times[n - 1] if 0 < n <= len(self.times) else 0.0
        return max(n - 1, 0) / self.rate

    def schedule(self, keys: Sequence[str], *, seed: int) -> dict[str, float]:
        """Each request key's due time: the keys in the order of sha256(seed, key) take the
        schedule's offsets, so lengths, depths and tasks interleave at random."""
        order = sorted(set(keys), key=lambda k: hashlib.sha256(f"{seed}\0{k}".encode()).digest())
        return dict(zip(order, self.offsets(len(order), seed=seed)))


def closed(concurrency: int | str) -> str:
    """The label of a closed loop of `concurrency` requests in flight ("?": not recorded)."""
    return f"closed:{concurrency}"


def describe(label: str | None) -> str:
    """A load label in words, for the board: 'closed:1' -> 'unloaded, 1 in flight'."""
    if label and label.startswith("closed:"):
        c = label[len("closed:"):]
        return {"1": "unloaded, 1 in flight", "?": "closed loop, in flight not recorded"}.get(
            c, f"closed loop, {c} in flight")
    return label or ""


def parse(text: str, where: str = "--arrivals") -> Arrivals:
    kind, sep, arg = str(text).partition(":")
    if kind == "poisson" and sep:
        try:
            rate = number(arg.strip())
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
        text = path.read_text(encoding="utf-8-sig")  # a byte-order mark is no offset
    except UnicodeDecodeError as e:
        raise ValueError(f"{where} trace:{path}: not UTF-8 text ({e.reason})") from None
    # lines end at LF (CR LF) only: splitlines() would also end one at \v, \f, U+2028 ...,
    # reading two offsets where an editor shows one line
    for i, line in enumerate(text.split("\n"), 1):
        value = line.split("#", 1)[0].strip()
        if not value:
            continue
        try:
            t = number(value)
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
