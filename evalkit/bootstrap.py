"""Paired bootstrap: a percentile 95 % interval for the mean of paired differences.

Shared by the leaderboard's recall gaps and `evalkit compare`'s drift reports.
"""
from __future__ import annotations

import hashlib

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


def paired_bootstrap(diff: np.ndarray, n_boot: int = DEFAULT_BOOTSTRAP,
                     seed: int = 0) -> tuple[float, float]:
    """Percentile 95 % interval of the mean of paired differences: resample pairs with
    replacement n_boot times. NaN, NaN for no pairs."""
    diff = np.asarray(diff, float)
    if len(diff) == 0:
        return float("nan"), float("nan")
    rng = np.random.default_rng(seed)
    chunk = max(1, min(n_boot, 4_000_000 // len(diff)))  # bound memory on big cells
    means = []
    for start in range(0, n_boot, chunk):
        idx = rng.integers(0, len(diff), size=(min(chunk, n_boot - start), len(diff)))
        means.append(diff[idx].mean(axis=1))
    lo, hi = np.percentile(np.concatenate(means), [2.5, 97.5])
    return float(lo), float(hi)
