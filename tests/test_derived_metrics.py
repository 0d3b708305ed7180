"""Derived metrics of the leaderboard (evalkit.leaderboard.derived) on fixed inputs: the
effective-length rule, the logistic knee fit, and the paired bootstrap against the normal
approximation."""
import math

import numpy as np
import pandas as pd
import pytest

from evalkit.leaderboard import derived


def test_effective_length_rules():
    def frame(model, recalls, ns=None):
        ns = ns or [4] * len(recalls)
        return pd.DataFrame({"model": model, "model_label": model, "model_hash": "h",
                             "arrivals": "", "task": "t", "task_label": "t", "task_version": "1",
                             "task_config_hash": "c", "target_length": [128, 256, 512, 1024],
                             "recall": recalls, "n": ns, "prompt_chars": [500, 1000, 2000, 4000]})
    df = pd.concat([frame("a", [1.0, 0.9, 0.5, 0.95]),   # a later pass does not count
                    frame("b", [0.9, 0.9, 0.9, 0.85]),   # all pass: censored above
                    frame("c", [0.5, 0.9, 0.9, 0.9]),    # shortest fails: censored below
                    frame("d", [1.0, 1.0, np.nan, 1.0], [4, 4, 0, 4])])  # nothing scored: fail
    eff = derived.effective_length(df, 0.85).set_index("model")
    assert eff.loc["a", "effective_length"] == 256 and eff.loc["a", "censored"] == ""
    assert eff.loc["a", "effective_chars"] == 1000
    assert eff.loc["b", "effective_length"] == 1024 and eff.loc["b", "censored"] == "above"
    assert pd.isna(eff.loc["c", "effective_length"]) and eff.loc["c", "censored"] == "below"
    assert eff.loc["d", "effective_length"] == 256


def test_capacity_knee_fit_recovers_known_curve():
    loads = np.array([1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1024])
    x = np.log2(loads)
    y = 1 / (1 + np.exp(1.3 * (x - 5.0)))       # knee at 2^5 = 32 facts
    x0, s = derived.fit_logistic(x, y, np.ones_like(x))
    assert 2 ** x0 == pytest.approx(32, rel=0.01) and s == pytest.approx(1.3, rel=0.1)
    # Noisy, weighted data still lands near the knee.
    rng = np.random.default_rng(1)
    n = np.full(len(x), 200)
    noisy = rng.binomial(n, y) / n
    x0, _ = derived.fit_logistic(x, noisy, n)
    assert 2 ** x0 == pytest.approx(32, rel=0.15)


def test_paired_bootstrap_interval():
    rng = np.random.default_rng(7)
    a, b = rng.binomial(1, 0.3, 400), rng.binomial(1, 0.1, 400)  # pairs (a[i], b[i])
    d = a - b
    lo, hi = derived.paired_bootstrap(a, b, 2000, seed=3)
    se = d.std(ddof=1) / np.sqrt(len(d))
    assert lo == pytest.approx(d.mean() - 1.96 * se, abs=0.015)
    assert hi == pytest.approx(d.mean() + 1.96 * se, abs=0.015)
    assert derived.paired_bootstrap(a, b, 2000, seed=3) == (lo, hi)  # reproducible
    # the interval of the mean difference: what the two sides of a pair share cancels
    assert derived.paired_bootstrap(a + 0.25, a, 500, seed=0) == (0.25, 0.25)
    assert all(math.isnan(v) for v in derived.paired_bootstrap([], [], 500))
    with pytest.raises(ValueError, match="not pairs"):
        derived.paired_bootstrap(a, b[:-1])
