"""Percentile bootstrap 95 % intervals: of a mean over units, and of a mean of paired differences.

- `mean_interval(strata)`: the mean of the strata's means, each stratum's values resampled with
  replacement (one stratum: the plain bootstrap of a mean). A per_probe metric's cell, over its
  probes (evalkit.cell_stats), and the MQAR test mix, stratified by cell
  (evalkit.leaderboard.recall_state).
- `paired_bootstrap(a, b)`: the mean of a - b over pairs (a[i], b[i]), whole pairs resampled:
  the leaderboard's recall gaps and `evalkit compare`'s drift reports.
"""
from __future__ import annotations

import hashlib
from typing import Sequence

import numpy as np

DEFAULT_BOOTSTRAP = 2000
# Each gap cell holds all its resamples in memory: 10^9 reached 18 GB in a minute.
MIN_BOOTSTRAP, MAX_BOOTSTRAP = 100, 100_000


def check_resamples(n_boot: int) -> int:
    if not MIN_BOOTSTRAP <= n_boot <= MAX_BOOTSTRAP:
        raise ValueError(f"--bootstrap must be between {MIN_BOOTSTRAP:,} and {MAX_BOOTSTRAP:,} "
                         f"resamples, got {n_boot}")
    return n_boot


def seed_for(seed: int, *key: object) -> int:
    """A seed per cell, so each interval is reproducible whatever else is computed."""
    digest = hashlib.sha256(repr((seed,) + key).encode()).digest()
    return int.from_bytes(digest[:8], "big")


def mean_interval(strata: Sequence[np.ndarray], n_boot: int = DEFAULT_BOOTSTRAP,
                  seed: int = 0) -> tuple[float, float]:
    """Percentile 95 % interval of the mean of the strata's means: each stratum's values
    resampled with replacement, n_boot times. NaN, NaN when a stratum is empty."""
    strata = [np.asarray(s, float) for s in strata]
    if not strata or any(len(s) == 0 for s in strata):
        return float("nan"), float("nan")
    rng = np.random.default_rng(seed)
    total = np.zeros(n_boot)
    for arr in strata:
        chunk = max(1, min(n_boot, 4_000_000 // len(arr)))  # bound memory on big cells
        for start in range(0, n_boot, chunk):
            k = min(chunk, n_boot - start)
            total[start:start + k] += arr[rng.integers(0, len(arr), (k, len(arr)))].mean(1)
    lo, hi = np.percentile(total / len(strata), [2.5, 97.5])
    return float(lo), float(hi)


def paired_bootstrap(a: np.ndarray, b: np.ndarray, n_boot: int = DEFAULT_BOOTSTRAP,
                     seed: int = 0) -> tuple[float, float]:
    """Percentile 95 % interval of the mean of a - b over the pairs (a[i], b[i]), the pairs
    resampled whole, so what a pair's two sides share cancels. NaN, NaN for no pairs."""
    a, b = np.asarray(a, float), np.asarray(b, float)
    if a.shape != b.shape:
        raise ValueError(f"paired_bootstrap: {len(a)} values against {len(b)}: not pairs")
    return mean_interval([a - b], n_boot, seed)
