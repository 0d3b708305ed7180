"""`evalkit run --shard I/N`: the I-th of N disjoint parts of a suite's plan, so N machines
(or N jobs of a scheduler) split one suite, each into its own run folder.

    every shard builds the same probes and plans -> takes plan units I-1, I-1+N, ... of each
    (model, task) -> a normal run folder whose config.json and results.json say "shard: I/N"
    `evalkit publish` of all N folders -> one run (evalkit.leaderboard.shards), refused when a
    shard is missing, given twice, or of another suite

Units are sorted longest first (evalkit.runner.plan), so the shards are balanced, and a shared
prefix never straddles two shards. Inside a shard, torchrun's ranks split it further. Under
`--arrivals poisson:R`, the schedule covers the whole plan and each shard sends its own
requests at their due times in it, so N shards started together offer R between them (about
R/N each), not N copies of R.
"""
from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Sequence, TypeVar

T = TypeVar("T")
MAX_SHARDS = 4096
_FORM = re.compile(r"^\s*(\d+)\s*/\s*(\d+)\s*$")


@dataclass(frozen=True)
class Shard:
    index: int   # 1-based, as the user writes it
    count: int

    def take(self, seq: Sequence[T]) -> list[T]:
        return list(seq[self.index - 1::self.count])

    def as_dict(self) -> dict:
        return {"index": self.index, "count": self.count}

    def __str__(self) -> str:
        return f"{self.index}/{self.count}"


WHOLE = Shard(1, 1)


def parse(text: str, where: str = "--shard") -> Shard:
    """'2/4' -> Shard(2, 4); anything else is an error saying what was expected."""
    m = _FORM.match(str(text))
    if not m:
        raise ValueError(f"{where} {text!r}: expected I/N, e.g. 2/4 (the 2nd of 4 parts)")
    i, n = int(m.group(1)), int(m.group(2))
    if not 1 <= n <= MAX_SHARDS:
        raise ValueError(f"{where} {text!r}: N must be in 1..{MAX_SHARDS}")
    if not 1 <= i <= n:
        raise ValueError(f"{where} {text!r}: I must be in 1..{n}")
    return Shard(i, n)


def from_dict(d: object, where: str) -> Shard:
    if d is None:
        return WHOLE
    if not (isinstance(d, dict) and isinstance(d.get("index"), int)
            and isinstance(d.get("count"), int)):
        raise ValueError(f"{where}: field 'shard' should be {{index, count}}, got {d!r}")
    return parse(f"{d['index']}/{d['count']}", f"{where}: field 'shard'")
