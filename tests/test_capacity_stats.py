"""The statistics behind the capacity table and the gaps, against hand computations."""
import math

import numpy as np
import pandas as pd

from evalkit.leaderboard import derived


def test_paired_bootstrap_matches_the_exact_bootstrap_distribution():
    """Baseline recalls [1,1,1,1,1], model [0,0,0,0,1]: differences [1,1,1,1,0], mean 0.8.
    A resample's mean is k/5 with k ~ Binomial(5, 0.8): P(k <= 1) = 0.0067 and
    P(k <= 2) = 0.0579, so the 2.5 % quantile is 2/5; P(k <= 4) = 0.672 < 0.975, so the 97.5 %
    quantile is 5/5. With 2,000 resamples the 50th smallest mean is 0.4 unless at least 50
    fall at k <= 1 (expected 13.4): the interval is [0.4, 1.0]."""
    key = dict(task_label="t", target_length=256, depth=0.5, load=1, question=0, scored=True)
    rows = [dict(key, model_label=m, seed=i, recall=r)
            for m, recalls in (("base", [1, 1, 1, 1, 1]), ("gla", [0, 0, 0, 0, 1]))
            for i, r in enumerate(recalls)]
    g = derived.gaps(pd.DataFrame(rows), [("base", "gla")], ["task_label"], n_boot=2000)
    r = g.iloc[0]
    assert (r["n_pairs"], r["gap"], r["baseline_recall"], r["model_recall"]) == (5, 0.8, 1.0, 0.2)
    assert (r["ci_low"], r["ci_high"]) == (0.4, 1.0)
    assert r["ci_low"] > 0  # the leaderboard marks this gap: its interval excludes zero


def _curve(recalls, n=30):
    """n samples per load whose mean is exactly the given recall."""
    return {L: np.r_[np.ones(round(r * n)), np.zeros(n - round(r * n))]
            for L, r in zip((1, 4, 16, 64, 256), recalls)}


def test_knee_interval_on_a_fixed_sample():
    """A curve symmetric about load 16 in log2 (1, .9, .5, .1, 0) has its knee at 16; the
    resampled knees stay between the neighbouring loads; the same seed repeats exactly."""
    knee, lo, hi = derived.knee_interval(_curve([1, 0.9, 0.5, 0.1, 0]), 200, seed=1)
    assert math.isclose(knee, 16, rel_tol=1e-6)
    assert 4 < lo < 16 < hi < 64
    assert derived.knee_interval(_curve([1, 0.9, 0.5, 0.1, 0]), 200, seed=1) == (knee, lo, hi)
    # a larger state: the same curve two loads later; its interval lies above
    later = {L * 16: v for L, v in _curve([1, 0.9, 0.5, 0.1, 0]).items()}
    knee2, lo2, _ = derived.knee_interval(later, 200, seed=1)
    assert math.isclose(knee2, 256, rel_tol=1e-6) and lo2 > hi


def test_knee_interval_censored_ends():
    assert derived.knee_interval(_curve([1, 1, 1, 1, 1]), 100) == (math.inf, math.inf, math.inf)
    assert derived.knee_interval(_curve([0, 0, 0, 0, 0]), 100) == (0.0, 0.0, 0.0)
    # never below 50 % as observed, but a resample can be: the interval's low end is finite
    knee, lo, hi = derived.knee_interval(_curve([1, 1, 1, 0.9, 0.6]), 200)
    assert math.isinf(knee) and math.isinf(hi) and 64 < lo < math.inf


def test_batched_knees_equal_the_capacity_knee_fit():
    """knees_of solves the same grid as fit_logistic (the capacity-knee table), per curve."""
    rng = np.random.default_rng(0)
    loads, n = np.array([2.0, 8, 32, 128]), np.array([10.0, 20, 30, 40])
    for _ in range(5):
        y = np.sort(rng.random(4))[::-1]
        y[0], y[-1] = 0.9, 0.1
        x0, _ = derived.fit_logistic(np.log2(loads), y, n)
        assert math.isclose(derived.knees_of(loads, y, n)[0], 2 ** x0, rel_tol=1e-9)
