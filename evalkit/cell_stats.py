"""A cell's mean and stderr: the one definition results.json and the leaderboard's tables share.

- stderr = sample std (ddof=1) / sqrt(n), 0 for one value; sums with math.fsum in the order
  given, so equal samples give bit-equal figures wherever they are aggregated.
- A per_probe metric (Zoology's MQAR accuracy) is averaged per probe first: its values are the
  probes' means (scoring.probe_means), so mean and stderr are over probes, not questions.

    >>> metric_values("contains", [("p1", 1.0), ("p1", 0.0), ("p2", 1.0)])
    [1.0, 0.0, 1.0]
    >>> metric_values("mqar_accuracy", [("p1", 1.0), ("p1", 0.0), ("p2", 1.0)])
    [0.5, 1.0]
    >>> mean_stderr([0.5, 1.0])
    (0.75, 0.25)
"""
from __future__ import annotations

import math
from typing import Sequence

from evalkit import scoring


def mean_stderr(values: Sequence[float]) -> tuple[float, float]:
    n = len(values)
    mean = math.fsum(values) / n
    if n == 1:
        return mean, 0.0
    var = math.fsum((v - mean) ** 2 for v in values) / (n - 1)
    return mean, math.sqrt(var / n)


def per_probe(metric: str) -> bool:
    return metric in scoring.METRICS and scoring.METRICS[metric].per_probe


def metric_values(metric: str, scores: Sequence[tuple[str, float]]) -> list[float]:
    """The values a cell's mean and stderr are taken over, from (probe hash, score) pairs in
    sample order: the scores, or the probes' means for a per_probe metric."""
    if per_probe(metric):
        return scoring.probe_means(scores)
    return [float(v) for _, v in scores]


Z95 = 1.959963984540054  # two-sided 95 % normal quantile


def wilson(p: float, n: int) -> tuple[float | None, float | None]:
    """95 % Wilson score interval for a mean recall p over n scored samples. Recall lies in
    [0, 1], so p(1-p) bounds its variance and the interval stays inside [0, 1] even at n = 2
    or p = 1, where mean +- 1.96 se collapses to a point. (None, None) without a score."""
    if not n or p is None or not math.isfinite(p):
        return None, None
    z2 = Z95 * Z95
    centre = (p + z2 / (2 * n)) / (1 + z2 / n)
    half = Z95 * math.sqrt(max(p * (1 - p), 0.0) / n + z2 / (4 * n * n)) / (1 + z2 / n)
    # the interval always holds p; min/max only undo rounding (p = 0 gave lo = 1e-17 > p)
    return min(p, max(0.0, centre - half)), max(p, min(1.0, centre + half))
