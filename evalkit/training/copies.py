"""Copy sequences for the recall stage of `evalkit linearize`: prose in which earlier snippets
come back, far enough behind that only a state can carry them.

A sliding window + state twin trained on plain prose learns to lean on its window: almost every
next token of prose is predicted from the last few dozen, so nothing asks the state to keep one
particular token for long (arXiv 2510.05901; measured on our twins: the state's read-out of a
token 128+ tokens back is within +-0.06 of nothing). Retrieval is induction over a distance: a
needle's question repeats the fact's key and the parent copies the value that followed it.
So the recall stage shows the twin exactly that, on its own training prose, with no task
template (the board's needle, multikey and conversation probes never appear in training):

    row    = a training sequence of prose [T]
    copy j = row[s_j : s_j + L] written over row[d_j : d_j + L],   d_j - s_j >= min_distance + L

at `spans` destinations in increasing order, each source whole before its destination's window
(min_distance >= the twin's window: checked by the recipe). The first token of a copy cannot be
foreseen; every later one can, by the parent (its induction heads) and, if it kept the snippet,
by the twin. `mask[i]` marks the positions i whose next token i + 1 is such a token.

Everything is a pure function of (row, config, seed, index):

    ids, mask = copy_sequence(row, cfg, sinks=4, seed=0, index=7)      # [T] int64, [T] bool

Worked example: row = 0 1 2 ... 23 (T = 24), CopySpec(spans=1, span_len=3, min_distance=8,
max_distance=14), sinks 0, seed 2, index 0: distance 11, source 6, destination 17 ->
ids = 0 1 ... 16 6 7 8 20 21 22 23, mask True at 17 and 18 (they predict 7 and 8).
"""
from __future__ import annotations

import math

import numpy as np
import torch
from pydantic import BaseModel, ConfigDict, Field, model_validator


class CopySpec(BaseModel):
    """How a recall sequence is made (the recipe's `recall.copies`)."""
    model_config = ConfigDict(extra="forbid", frozen=True)
    spans: int = Field(default=4, ge=1, le=64)             # copies a sequence
    span_len: int = Field(default=16, ge=2, le=256)        # tokens a copy (L)
    min_distance: int = Field(ge=1, le=65536)              # source end -> destination start
    max_distance: int = Field(ge=2, le=65536)              # source start -> destination start
    weight: float = Field(default=0.5, gt=0, lt=1)         # the copies' share of the loss

    @model_validator(mode="after")
    def _distances(self) -> "CopySpec":
        if self.max_distance < self.min_distance + self.span_len:
            raise ValueError(f"max_distance {self.max_distance} must be at least min_distance "
                             f"+ span_len ({self.min_distance + self.span_len})")
        return self

    def check_fits(self, seq_len: int, sinks: int, where: str) -> None:
        """Every copy must fit in a sequence: its source after the sinks, its destination
        inside, all `spans` destinations side by side after the farthest source."""
        need = sinks + self.max_distance + self.spans * self.span_len
        if need > seq_len:
            raise ValueError(f"{where}: seq_len {seq_len} is too short for {self.spans} copies "
                             f"of {self.span_len} tokens up to {self.max_distance} tokens back "
                             f"after {sinks} sinks (needs {need})")


def copy_plan(T: int, cfg: CopySpec, *, sinks: int, seed: int, index: int
              ) -> list[tuple[int, int]]:
    """The copies of a sequence of T tokens, [(source, destination)] by destination: distances
    d - s log-uniform in [min_distance + L, max_distance], destinations disjoint, every source
    at or past the sinks. Pure in (T, cfg, sinks, seed, index)."""
    L = cfg.span_len
    cfg.check_fits(T, sinks, "copy_sequence")
    rng = np.random.default_rng([seed, index, 0xC0])
    lo, hi = cfg.min_distance + L, cfg.max_distance
    dist = np.exp(rng.uniform(math.log(lo), math.log(hi), cfg.spans)).astype(np.int64)
    dist = np.sort(np.clip(dist, lo, hi))
    # each destination at least its distance past the sinks, the copies side by side, the
    # room left (T minus the farthest floor and the copies) spread by sorted uniform shifts
    floor = sinks + dist
    room = T - (floor[-1] + cfg.spans * L)          # >= 0 by check_fits
    shift = np.sort(rng.integers(0, room + 1, cfg.spans))
    plan, prev_end = [], 0
    for j in range(cfg.spans):
        d = int(max(floor[j] + shift[j], prev_end))
        plan.append((d - int(dist[j]), d))
        prev_end = d + L
    if prev_end > T:  # cannot happen given room; a loud check rather than a silent cut
        raise AssertionError(f"copies end at {prev_end}, past {T}")
    return plan


def copy_sequence(row: torch.Tensor, cfg: CopySpec, *, sinks: int, seed: int, index: int
                  ) -> tuple[torch.Tensor, torch.Tensor]:
    """`row` [T] with copy_plan's snippets copied forward, in destination order (a source
    may lie in an earlier copy: it is final by then); returns (ids [T], mask [T])."""
    L = cfg.span_len
    ids, mask = row.clone(), torch.zeros(row.shape[0], dtype=torch.bool)
    for s, d in copy_plan(row.shape[0], cfg, sinks=sinks, seed=seed, index=index):
        ids[d:d + L] = ids[s:s + L].clone()
        mask[d:d + L - 1] = True
    return ids, mask


def copy_batch(rows: torch.Tensor, cfg: CopySpec, *, sinks: int, seed: int, first: int
               ) -> tuple[torch.Tensor, torch.Tensor]:
    """copy_sequence over rows [B, T], row b with index first + b: ([B, T], [B, T])."""
    pairs = [copy_sequence(r, cfg, sinks=sinks, seed=seed, index=first + b)
             for b, r in enumerate(rows)]
    return torch.stack([p[0] for p in pairs]), torch.stack([p[1] for p in pairs])


def loss_weights(mask: torch.Tensor, weight: float) -> torch.Tensor:
    """Per-position weights [B, T] summing to 1: `weight` spread over the masked (copy)
    positions, 1 - weight over the others (the last position predicts nothing: 0)."""
    w = torch.zeros(mask.shape, dtype=torch.float32)
    body = torch.ones_like(mask)
    body[:, -1] = False
    copy, prose = mask & body, ~mask & body
    n_copy, n_prose = int(copy.sum()), int(prose.sum())
    if n_copy == 0 or n_prose == 0:
        raise ValueError(f"a recall batch needs copy and prose positions ({n_copy}, {n_prose})")
    w[copy] = weight / n_copy
    w[prose] = (1 - weight) / n_prose
    return w
