"""A cell's numbers: the one definition results.json, the leaderboard's tables, its served
section, its page and its plots share.

- n: every sample attempted (`counted`): answered, or failed; a flagged sample (longer than the
  model's maximum, a fact in its attention sinks) was never attempted and is counted apart.
- a failure is a miss: it scores 0 in every metric its answer would have been scored on
  (`miss_scores`: scoring.score_sample's choice), so a metric's mean is over the n samples
  attempted; the mean over the answered ones alone is reported beside it where useful.
- response time (`response_time`): an answer's latency; a failed request's time to its failure,
  when the request reached the server (attempts >= 1); a request never sent has none.
- percentiles (`percentiles`): p50 and p95 over the response times, p99 only from MIN_P99 of
  them (fewer make the p99 the maximum or below it); None where there are none, never NaN.

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
    >>> sorted(miss_scores("recall", n_candidates=3, forced_choice=True).items())[:2]
    [('contains', 0.0), ('exact_match', 0.0)]
    >>> response_time(0.4, "HTTP 503", attempts=1), response_time(0.05, "not sent", attempts=0)
    (0.4, None)
    >>> percentiles([1.0, 2.0, 3.0])
    {'p50': 2.0, 'p95': 2.9, 'p99': None}
"""
from __future__ import annotations

import math
from typing import Sequence

import numpy as np

from evalkit import scoring
from evalkit.bootstrap import DEFAULT_BOOTSTRAP, mean_interval, seed_for

Z95 = 1.959963984540054  # two-sided 95 % normal quantile
MIN_P99 = 100  # response times a p99 needs: from fewer it is the maximum, or below it
PERCENTILES = (50, 95, 99)


def counted(error: object, flag: object) -> bool:
    """Does a sample count in its cell's n? Answered or failed, yes; flagged (never attempted:
    over the model's length, a fact in its sinks), no. `error` wins over `flag`."""
    return error is not None or flag is None


def miss_scores(question_kind: str | None, n_candidates: int,
                forced_choice: bool = True) -> dict[str, float]:
    """The scores of a failed sample: 0 (a miss) in every metric an answer to its question
    would have had (scoring.score_sample): each generation metric that applies to its kind,
    and with forced choice on (the model's `forced_choice`) and two candidates or more, each
    forced-choice one."""
    names = [m.name for m in scoring.of_kind(scoring.GENERATION) if m.applies_to(question_kind)]
    if forced_choice and n_candidates >= 2:
        names += [m.name for m in scoring.of_kind(scoring.FORCED_CHOICE)
                  if m.applies_to(question_kind)]
    return {name: 0.0 for name in names}


def response_time(latency_s: float | None, error: object, attempts: int | None
                  ) -> float | None:
    """A sample's response time: its latency when answered; when it failed, its time to the
    failure if its request reached the server (attempts >= 1), else none: a request never
    sent (a prompt refused before it, a server already known down) is no response time."""
    if latency_s is None or not math.isfinite(latency_s):
        return None
    if error is None:
        return float(latency_s)
    return float(latency_s) if attempts is not None and attempts >= 1 else None


def percentiles(times: Sequence[float]) -> dict[str, float | None]:
    """{"p50", "p95", "p99"} of response times (numpy's linear interpolation); "p99" only from
    MIN_P99 times; None without any."""
    xs = np.asarray([t for t in times if t is not None and math.isfinite(t)], float)
    return {f"p{q}": (float(np.percentile(xs, q)) if len(xs) and (q < 99 or len(xs) >= MIN_P99)
                      else None) for q in PERCENTILES}


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
