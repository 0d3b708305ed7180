"""A cell's mean and 95 % interval: the one definition results.json, the leaderboard's tables,
its page and its plots share.

- mean: math.fsum over the values in the order given, so equal samples give bit-equal means
  wherever they are aggregated.
- A per_probe metric (Zoology's MQAR accuracy) is averaged per probe first: its values are the
  probes' means (scoring.probe_means), so its mean and interval are over probes, not questions.
- interval: every score lies in [0, 1] (evalkit.scoring), so a mean over questions is a
  proportion: a 95 % Wilson score interval over its n values (for scores between 0 and 1,
  partial credit, the variance is at most p(1-p): the interval is conservative). A per_probe
  metric's probes are no Bernoulli trials: a percentile bootstrap over the probes
  (evalkit.bootstrap.mean_interval, seeded by the values, so equal samples give equal
  intervals wherever they are aggregated); none for one probe.

    >>> metric_values("contains", [("p1", 1.0), ("p1", 0.0), ("p2", 1.0)])
    [1.0, 0.0, 1.0]
    >>> metric_values("mqar_accuracy", [("p1", 1.0), ("p1", 0.0), ("p2", 1.0)])
    [0.5, 1.0]
    >>> [round(x, 3) for x in mean_ci([1.0, 0.0, 1.0, 1.0], over_probes=False)]
    [0.75, 0.301, 0.954]
    >>> mean_ci([0.5], over_probes=True)
    (0.5, None, None)
"""
from __future__ import annotations

import math
from typing import Sequence

import numpy as np

from evalkit import scoring
from evalkit.bootstrap import DEFAULT_BOOTSTRAP, mean_interval, seed_for

Z95 = 1.959963984540054  # two-sided 95 % normal quantile


def mean_ci(values: Sequence[float], over_probes: bool
            ) -> tuple[float, float | None, float | None]:
    """(mean, lo, hi) of a cell's values (metric_values): Wilson over the values, or with
    `over_probes` (they are probes' means) a percentile bootstrap over them."""
    mean = math.fsum(values) / len(values)
    if not over_probes:
        return (mean, *wilson(mean, len(values)))
    if len(values) < 2:  # one probe has no spread to resample
        return mean, None, None
    ordered = np.sort(np.asarray(values, float))  # the interval depends on the values only
    return (mean, *mean_interval([ordered], DEFAULT_BOOTSTRAP,
                                 seed_for(0, "probes", *ordered.tolist())))


def per_probe(metric: str) -> bool:
    return metric in scoring.METRICS and scoring.METRICS[metric].per_probe


def metric_values(metric: str, scores: Sequence[tuple[str, float]]) -> list[float]:
    """The values a cell's mean and interval are taken over, from (probe hash, score) pairs in
    sample order: the scores, or the probes' means for a per_probe metric."""
    if per_probe(metric):
        return scoring.probe_means(scores)
    return [float(v) for _, v in scores]


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
