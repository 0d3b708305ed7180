"""A task's grid sizes (lengths x depths x loads x samples): their bounds and their precedence.

One model, `Grid`, is every layer that may set a size: a task file's `defaults`, a suite, a
suite's task entry, the command line. Each size comes from the first layer that sets it,
highest first (`Grid.over`): a command-line flag > the task entry > the suite > the task's
defaults. Every size is bounded here, once: beyond these a typo, not an experiment.

    >>> Grid(lengths=(512,)).over(Grid(lengths=(64,), samples=3), Grid(depths=(0.5,)))
    Grid(lengths=(512,), depths=(0.5,), loads=None, samples=3)
"""
from __future__ import annotations

import math
import numbers
from typing import Any

from pydantic import BaseModel, ConfigDict, field_validator

from evalkit.probe import MAX_LENGTH

MAX_LOAD = 1 << 16         # facts per probe
MAX_SAMPLES = 100_000      # probes per grid cell
MAX_POINTS = 1_000_000     # probes per task

SIZES = ("lengths", "depths", "loads", "samples")


def _whole(x: Any) -> bool:
    return isinstance(x, numbers.Integral) and not isinstance(x, bool)


def length_error(x: Any) -> str | None:
    if not _whole(x) or not 0 < x <= MAX_LENGTH:
        return f"length={x!r} must be a positive integer number of tokens up to {MAX_LENGTH:,}"
    return None


def depth_error(x: Any) -> str | None:
    if (isinstance(x, bool) or not isinstance(x, numbers.Real)
            or not 0.0 <= x <= 1.0):  # NaN fails the comparison too
        return f"depth={x!r} outside [0, 1]"
    return None


def load_error(x: Any) -> str | None:
    if not _whole(x) or not 0 < x <= MAX_LOAD:
        return f"load={x!r} must be a positive integer number of facts up to {MAX_LOAD:,}"
    return None


def samples_error(x: Any) -> str | None:
    if not _whole(x) or not 0 < x <= MAX_SAMPLES:
        return f"samples={x!r} must be a positive integer up to {MAX_SAMPLES:,}"
    return None


def point_error(length: Any, depth: Any, load: Any) -> str | None:
    """What is wrong with one (length, depth, load) point, None if nothing: the bounds a
    generator called directly checks (nothing is ever clamped)."""
    return length_error(length) or depth_error(depth) or load_error(load)


_CHECKS = {"lengths": length_error, "depths": depth_error, "loads": load_error}


class Grid(BaseModel):
    """Grid sizes, each None where this layer leaves it to the next one down."""
    model_config = ConfigDict(extra="forbid", frozen=True)
    lengths: tuple[int, ...] | None = None
    depths: tuple[float, ...] | None = None
    loads: tuple[int, ...] | None = None
    samples: int | None = None

    @field_validator("lengths", "depths", "loads")
    @classmethod
    def _values(cls, v, info):
        if v is None:
            return v
        if not v:
            raise ValueError(f"{info.field_name}: empty; expected at least one value")
        for x in v:
            if (why := _CHECKS[info.field_name](x)):
                raise ValueError(why)
        return v

    @field_validator("samples")
    @classmethod
    def _samples(cls, v):
        if v is not None and (why := samples_error(v)):
            raise ValueError(why)
        return v

    def sizes(self) -> dict[str, Any]:
        return {k: getattr(self, k) for k in SIZES}

    def over(self, *lower: Grid) -> Grid:
        """Each size from the first of (self, *lower) that sets it: the one precedence rule."""
        out = self.sizes()
        for layer in lower:
            out = {k: layer.sizes()[k] if v is None else v for k, v in out.items()}
        return Grid(**out)

    def total(self) -> int:
        """Probes in the full product (every size set), checked against MAX_POINTS."""
        n = math.prod(len(getattr(self, k)) for k in SIZES[:3]) * self.samples
        if n > MAX_POINTS:
            raise ValueError(f"the grid holds {n:,} probes ({len(self.lengths)} lengths x "
                             f"{len(self.depths)} depths x {len(self.loads)} loads x "
                             f"{self.samples} samples); at most {MAX_POINTS:,} per task")
        return n


def errors_text(e: Any) -> str:
    """A Grid ValidationError as its messages alone (for flags and direct calls, where
    there is no file key to name)."""
    return "; ".join(str(err["msg"]).removeprefix("Value error, ") for err in e.errors())
