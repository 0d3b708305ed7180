"""Derived metrics: effective length, capacity knee, recall per byte, paired bootstrap gaps.

Every definition here is restated in the leaderboard README's "How to read" section
(readme.py); change both together.
"""
from __future__ import annotations

from typing import Sequence

import numpy as np
import pandas as pd

from evalkit.bootstrap import DEFAULT_BOOTSTRAP, paired_bootstrap, seed_for
from evalkit.leaderboard.tables import ROW_ID, aggregate, model_kinds

DEFAULT_THRESHOLD = 0.85   # RULER's bar is 85.6 (Llama-2-7B at 4K); we round to 0.85
KNEE_LEVEL = 0.5           # capacity knee: where recall falls to 50 %
BASELINE_KINDS = ("kv", "kv-window")
SUBJECT_KINDS = ("recurrent",)
REFERENCE_PAIR = ("oracle", "forgetful")  # unbounded vs. bounded memory: a sanity pair


# -- effective length -----------------------------------------------------------------------

def effective_length(by_len: pd.DataFrame, threshold: float = DEFAULT_THRESHOLD) -> pd.DataFrame:
    """Longest tested length L whose recall is >= threshold at L and at every shorter tested
    length. A length with nothing attempted (all over the model's limit) counts as failing.
    censored: "above" when every length passes (the true value may be longer), "below" when
    even the shortest fails (effective_length is then missing)."""
    out = []
    for key, g in by_len.groupby(ROW_ID, sort=True):
        g = g.sort_values("target_length")
        ok = (g["n"] > 0) & (g["recall"] >= threshold)
        passed = ok.astype(int).cumprod().astype(bool)  # stop at the first failing length
        row = dict(zip(ROW_ID, key), threshold=threshold,
                   lengths_tested=[int(x) for x in g["target_length"]])
        if passed.any():
            last = g[passed].iloc[-1]
            row.update(effective_length=int(last["target_length"]),
                       effective_chars=float(last["prompt_chars"]),
                       censored="above" if passed.all() else "")
        else:
            row.update(effective_length=None, effective_chars=float("nan"), censored="below")
        out.append(row)
    df = pd.DataFrame(out)
    if len(df):
        df["effective_length"] = df["effective_length"].astype("Int64")  # None stays missing
    return df


# -- capacity knee --------------------------------------------------------------------------

def logistic(z: np.ndarray) -> np.ndarray:
    return 0.5 * (1.0 - np.tanh(z / 2.0))  # 1 / (1 + e^z) without overflow


def fit_logistic(x: np.ndarray, y: np.ndarray, w: np.ndarray) -> tuple[float, float]:
    """Weighted least squares fit of y = 1 / (1 + exp(s (x - x0))), s > 0, by a dense grid
    search (deterministic, no optimizer to fail): x0 within the data range +-1, step 0.005;
    s log-spaced over [0.05, 50]. Returns (x0, s)."""
    x, y, w = (np.asarray(a, float) for a in (x, y, w))
    x0s = np.arange(x.min() - 1.0, x.max() + 1.0 + 1e-9, 0.005)
    ss = np.geomspace(0.05, 50.0, 160)
    pred = logistic(ss[:, None, None] * (x[None, None, :] - x0s[None, :, None]))
    sse = (w * (pred - y) ** 2).sum(-1)
    i, j = np.unravel_index(np.argmin(sse), sse.shape)
    return float(x0s[j]), float(ss[i])


def capacity_knee(samples: pd.DataFrame) -> pd.DataFrame:
    """Per model x task x length with at least two loads: recall vs. load (pooled over depth),
    a logistic fitted in log2(load), knee = the load where the fit crosses 50 %. When the
    observed recall never drops below 50 % the knee is censored "above" (knee > largest load);
    when it is below 50 % already at the smallest load, "below"."""
    per_load = aggregate(samples, ROW_ID + ["target_length", "load"], ["recall"])
    per_load = per_load[per_load["n"] > 0]
    out = []
    for key, g in per_load.groupby(ROW_ID + ["target_length"], sort=True):
        if g["load"].nunique() < 2:
            continue
        g = g.sort_values("load")
        x, y, n = np.log2(g["load"].to_numpy(float)), g["recall"].to_numpy(), g["n"].to_numpy()
        row = dict(zip(ROW_ID + ["target_length"], key), loads=[int(v) for v in g["load"]],
                   recall=[float(v) for v in y], knee=float("nan"), slope=float("nan"))
        if (y >= KNEE_LEVEL).all():
            row["censored"] = "above"
        elif (y < KNEE_LEVEL).all():
            row["censored"] = "below"
        else:
            x0, s = fit_logistic(x, y, n)
            row.update(knee=float(2.0 ** x0), slope=s, censored="")
        out.append(row)
    cols = ROW_ID + ["target_length", "knee", "censored", "slope", "loads", "recall"]
    return pd.DataFrame(out, columns=cols)


# -- recall per byte ------------------------------------------------------------------------

def add_recall_per_byte(by_len: pd.DataFrame) -> pd.DataFrame:
    """Primary recall divided by the mean state bytes held at the question (recurrent state,
    KV cache or reference memory); the README shows it per MB (x 1e6)."""
    df = by_len.copy()
    df["recall_per_byte"] = df["recall"] / df["state_bytes"].where(df["state_bytes"] > 0)
    return df


# -- paired bootstrap gaps ------------------------------------------------------------------

def default_pairs(samples: pd.DataFrame) -> list[tuple[str, str]]:
    """(baseline, model) label pairs: every softmax baseline (kv, kv-window) against every
    recurrent model, plus oracle vs. forgetful when both are present."""
    kinds = model_kinds(samples)
    base = sorted(m for m, k in kinds.items() if k in BASELINE_KINDS)
    subj = sorted(m for m, k in kinds.items() if k in SUBJECT_KINDS)
    pairs = [(b, s) for b in base for s in subj]
    names = samples.drop_duplicates("model_label").set_index("model_label")["model"]
    refs = [[m for m, n in names.items() if n == r] for r in REFERENCE_PAIR]
    pairs += [(b, s) for b in refs[0] for s in refs[1]]
    return pairs


def resolve_pairs(samples: pd.DataFrame, specs: Sequence[str]) -> list[tuple[str, str]]:
    """--gap BASELINE:MODEL, by label or plain model name."""
    labels = set(samples["model_label"])
    names = samples.drop_duplicates("model_label").groupby("model")["model_label"].agg(list)
    out = []
    for spec in specs:
        if spec.count(":") != 1:
            raise ValueError(f"--gap {spec!r}: expected BASELINE:MODEL")
        pair = []
        for part in spec.split(":"):
            if part in labels:
                pair.append(part)
            elif part in names and len(names[part]) == 1:
                pair.append(names[part][0])
            else:
                raise ValueError(f"--gap {spec!r}: no model {part!r} in these runs "
                                 f"(models: {', '.join(sorted(labels))})")
        out.append((pair[0], pair[1]))
    return out


PAIR_KEY = ["task_label", "target_length", "depth", "load", "seed", "question"]


def paired_samples(samples: pd.DataFrame, base: str, model: str) -> pd.DataFrame:
    """Samples attempted by both models (`scored`: answered, or failed, a miss), matched on
    the logical probe: same task
    config, grid point, probe seed and question. The seed is derived from the task and grid
    point, never from the tokenizer, so this pairs models with different tokenizers too.
    Columns recall_base / recall_model, and other_base / other_model where the samples have
    the task's other metric (tables.with_primary)."""
    s = samples[samples["scored"] & samples["recall"].notna()]
    keep = PAIR_KEY + [c for c in ("recall", "recall_metric", "other", "other_metric") if c in s]
    a = s[s["model_label"] == base][keep]
    b = s[s["model_label"] == model][keep]
    return a.merge(b, on=PAIR_KEY, suffixes=("_base", "_model"))


GAP_COLUMNS = ["n_pairs", "baseline_recall", "model_recall", "gap", "ci_low", "ci_high"]
OTHER = "other_"  # prefix of the other metric's gap columns (other_gap, other_ci_low, ...)


def _gap(a: np.ndarray, b: np.ndarray, n_boot: int, seed: int) -> dict:
    lo, hi = paired_bootstrap(a, b, n_boot, seed)
    return dict(n_pairs=len(a), baseline_recall=float(a.mean()), model_recall=float(b.mean()),
                gap=float((a - b).mean()), ci_low=lo, ci_high=hi)


def gaps(samples: pd.DataFrame, pairs: Sequence[tuple[str, str]], by: Sequence[str],
         n_boot: int = DEFAULT_BOOTSTRAP, seed: int = 0) -> pd.DataFrame:
    """Recall gap = baseline minus model, per group `by` (subset of PAIR_KEY), over paired
    samples, with a paired bootstrap 95 % interval. Positive: the model forgets more.

    Each row holds the gap in the task's primary metric (`metric`; gap, ci_low, ...) and,
    side by side, in its other metric (`other_metric`; other_gap, other_ci_low, ...: forced
    choice beside a generated answer's recall), over the pairs that have it; NaN where the
    task has no other metric."""
    by = list(by)
    out = []
    for base, model in pairs:
        p = paired_samples(samples, base, model)
        for key, g in p.groupby(by, sort=True):
            key = key if isinstance(key, tuple) else (key,)
            row = dict(baseline=base, model=model, **dict(zip(by, key)),
                       metric=g["recall_metric_base"].iat[0] if "recall_metric_base" in g else "")
            row.update(_gap(g["recall_base"].to_numpy(float), g["recall_model"].to_numpy(float),
                            n_boot, seed_for(seed, base, model, *key)))
            name = g["other_metric_base"].iat[0] if "other_metric_base" in g else ""
            o = g[g["other_base"].notna() & g["other_model"].notna()] if name else g.iloc[:0]
            row["other_metric"] = name if len(o) else ""
            other = (_gap(o["other_base"].to_numpy(float), o["other_model"].to_numpy(float),
                          n_boot, seed_for(seed, base, model, *key, name)) if len(o) else
                     dict.fromkeys(GAP_COLUMNS, float("nan")))
            row.update({OTHER + k: v for k, v in other.items()})
            out.append(row)
    cols = (["baseline", "model"] + by + ["metric"] + GAP_COLUMNS + ["other_metric"]
            + [OTHER + c for c in GAP_COLUMNS])
    return pd.DataFrame(out, columns=cols)


def larger_gap(r: pd.Series) -> str:
    """The metric with the larger gap in a gaps() row (the headline names it): the other
    metric where its gap exceeds the primary's, else the primary."""
    other = r.get(OTHER + "gap")
    if r.get("other_metric") and other == other and other > r["gap"]:
        return r["other_metric"]
    return r["metric"]


# -- capacity knee with a bootstrap interval (per state size) --------------------------------

DEFAULT_KNEE_BOOT = 200  # each resample refits the logistic: ~5 ms per curve


def knees_of(loads: np.ndarray, recall: np.ndarray, n: np.ndarray) -> np.ndarray:
    """Capacity knees of many recall-vs-load curves at once (recall [B, L]; weights n [L]),
    each as capacity_knee computes it: the fit_logistic grid, solved for every curve by one
    matrix product (sse = sum w pred^2 - 2 sum w pred y + const). Censored curves give +inf
    (never below 50 %) or 0.0 (below 50 % at every load)."""
    x, w = np.log2(np.asarray(loads, float)), np.asarray(n, float)
    recall = np.atleast_2d(np.asarray(recall, float))
    x0s = np.arange(x.min() - 1.0, x.max() + 1.0 + 1e-9, 0.005)  # fit_logistic's grid
    ss = np.geomspace(0.05, 50.0, 160)
    pred = logistic(ss[:, None, None] * (x[None, None, :] - x0s[None, :, None])).reshape(-1, len(x))
    sq, wp = (w * pred ** 2).sum(-1), (w * pred).T
    best = np.concatenate([np.argmin(sq[None, :] - 2.0 * recall[i:i + 16] @ wp, axis=1)
                           for i in range(0, len(recall), 16)]) % len(x0s)  # 16 curves: ~40 MB
    out = 2.0 ** x0s[best]
    out[(recall >= KNEE_LEVEL).all(1)] = np.inf
    out[(recall < KNEE_LEVEL).all(1)] = 0.0
    return out


def knee_interval(values_by_load: dict[int, np.ndarray], n_boot: int = DEFAULT_KNEE_BOOT,
                  seed: int = 0) -> tuple[float, float, float]:
    """(knee, low, high): the knee of the observed curve and a 95 % percentile interval from
    resampling the attempted samples (probe questions) with replacement within each load.
    Order statistics, not interpolation, so an infinite (censored) end stays infinite."""
    loads = np.array(sorted(values_by_load), float)
    vals = [np.asarray(values_by_load[int(L)], float) for L in loads]
    n = np.array([len(v) for v in vals], float)
    knee = float(knees_of(loads, np.array([v.mean() for v in vals]), n)[0])
    rng = np.random.default_rng(seed)
    boot = np.stack([v[rng.integers(0, len(v), (n_boot, len(v)))].mean(1) for v in vals], 1)
    knees = np.sort(knees_of(loads, boot, n))
    lo = knees[int(np.floor(0.025 * n_boot))]
    hi = knees[max(0, int(np.ceil(0.975 * n_boot)) - 1)]
    return knee, float(lo), float(hi)


def capacity_knee_ci(samples: pd.DataFrame, n_boot: int = DEFAULT_KNEE_BOOT,
                     seed: int = 0) -> pd.DataFrame:
    """Per model x task x length with at least two loads: knee and its bootstrap interval,
    with the model's mean state bytes (the capacity table orders rows by it)."""
    s = samples[samples["scored"] & samples["recall"].notna()]
    out = []
    for key, g in s.groupby(ROW_ID + ["target_length"], sort=True):
        by_load = {int(L): lg["recall"].to_numpy() for L, lg in g.groupby("load")}
        if len(by_load) < 2:
            continue
        knee, lo, hi = knee_interval(by_load, n_boot, seed_for(seed, *key))
        out.append(dict(zip(ROW_ID + ["target_length"], key), knee=knee, ci_low=lo, ci_high=hi,
                        loads=sorted(by_load), n=int(len(g)),
                        state_bytes=float(g["state_bytes"].mean())))
    cols = ROW_ID + ["target_length", "knee", "ci_low", "ci_high", "loads", "n", "state_bytes"]
    return pd.DataFrame(out, columns=cols)
