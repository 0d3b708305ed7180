"""Aggregation of merged samples into leaderboard rows (means and 95 % intervals by
evalkit.cell_stats, the definition results.json uses: `<metric>`, `<metric>_lo`, `<metric>_hi`).

n and the means count every sample attempted (`scored`, evalkit.cell_stats): a sample that
failed (error) is a miss (its scores are cell_stats.miss_scores, set by load.py), and counted in
n_failed too; one not evaluated (flag, e.g. longer than the model's maximum length) is counted
in n_flagged only, never scored as 0 nor silently dropped. Prompt tokens and characters are
means over every sample that has them (a flagged prompt still has a length), state bytes over
answered samples; latency_p50_s / p95 / p99 are cell_stats.percentiles of the served samples'
response_s (a failure at its failure, none for a request never sent; p99 from 100 only): the
same conventions as the runner's results.json.
"""
from __future__ import annotations

from typing import Sequence

import numpy as np
import pandas as pd

from evalkit import scoring
from evalkit.cell_stats import mean_ci, per_probe, percentiles
from evalkit.leaderboard.load import SCORE_PREFIX, metric_columns
from evalkit.leaderboard.merge import CELL_KEY, GRID_KEY

NAN = float("nan")
PER_PROBE = "recall_per_probe"  # with_primary: is the sample's primary metric per_probe?
ROW_ID = ["model", "model_label", "model_hash", "arrivals", "task", "task_label", "task_version",
          "task_config_hash"]
LATENCY_QUANTILES = (50, 95, 99)  # latency_p50_s ...: cell_stats.percentiles, served samples


def _mean_ci(g: pd.DataFrame, metric: str) -> tuple[float, float, float]:
    """A group's mean and 95 % interval of `metric` by evalkit.cell_stats, as results.json has
    them: a per_probe metric's samples count as one value per probe (their mean), and the
    interval is then over those values. `recall` is per probe where the sample's task's primary
    metric is (column PER_PROBE, from with_primary). NaN where there is none."""
    col = SCORE_PREFIX + metric
    if col not in g:
        return NAN, NAN, NAN
    g = g[g[col].notna()]
    if g.empty:
        return NAN, NAN, NAN
    flag = (g[PER_PROBE].astype(bool) if metric == "recall" and PER_PROBE in g
            else pd.Series(per_probe(metric), index=g.index))
    probes = scoring.probe_means(list(zip(g.loc[flag, "probe_hash"], g.loc[flag, col])))
    stats = mean_ci(g.loc[~flag, col].astype(float).tolist() + probes, bool(flag.any()))
    return tuple(NAN if v is None else v for v in stats)


def aggregate(samples: pd.DataFrame, by: Sequence[str],
              metrics: Sequence[str] | None = None) -> pd.DataFrame:
    """One row per group: n, n_failed, n_flagged, sizes, and every metric's mean and 95 %
    interval (`<metric>`, `<metric>_lo`, `<metric>_hi`)."""
    metrics = list(metrics if metrics is not None else metric_columns(samples))
    by = list(by)
    out = []
    for key, g in samples.groupby(by, sort=True, dropna=False):
        key = key if isinstance(key, tuple) else (key,)
        s = g[g["scored"]]
        row = dict(zip(by, key))
        row.update(n=int(len(s)), n_failed=int(g["error"].notna().sum()),
                   n_flagged=int((g["error"].isna() & g["flag"].notna()).sum()),
                   prompt_tokens=float(g["prompt_tokens"].mean()),
                   prompt_chars=float(g["prompt_chars"].mean()),
                   state_bytes=float(s["state_bytes"].mean()),
                   state_kind=",".join(sorted(set(g["state_kind"].dropna()))))
        lat = s.loc[s["served"], "response_s"].tolist() if "served" in s else []
        for q, v in percentiles(lat).items():  # response times; none in process
            row[f"latency_{q}_s"] = NAN if v is None else v
        for m in metrics:
            row[m], row[f"{m}_lo"], row[f"{m}_hi"] = _mean_ci(s, m)
        out.append(row)
    return pd.DataFrame(out)


def cell_rows(samples: pd.DataFrame) -> pd.DataFrame:
    """The leaderboard's rows: one per model x task (version, config) x length x depth x load."""
    metrics = metric_columns(samples)
    rows = aggregate(samples, ROW_ID + GRID_KEY, metrics)
    # Each cell comes from exactly one run (see merge.py); carry its id and date.
    src = samples.drop_duplicates(CELL_KEY)[CELL_KEY + ["run_id", "run_created"]]
    rows = rows.merge(src, on=CELL_KEY, how="left")
    rows["run_created"] = rows["run_created"].map(lambda t: t.isoformat())
    front = ROW_ID + ["run_id", "run_created"] + GRID_KEY + [
        "n", "n_failed", "n_flagged", "prompt_tokens", "prompt_chars", "state_bytes", "state_kind",
        *(f"latency_p{q}_s" for q in LATENCY_QUANTILES)]
    return rows[front + [c for c in rows.columns if c not in front]]


def choose_primary(samples: pd.DataFrame, override: str | None = None) -> dict[str, str]:
    """task_label -> primary metric: `override` where the task has it, else the task's own
    metric where it declares one (lm-eval's RULER tasks keep RULER's substring match, for
    parity), else the first of scoring.recall_preference() it has."""
    metrics = metric_columns(samples)
    if override is not None:
        if not scoring.get(override).higher_is_better:
            raise ValueError(f"--primary-metric {override!r}: recall needs a higher-is-better "
                             f"metric")
        if override not in metrics:
            raise ValueError(f"--primary-metric {override!r}: no run has it "
                             f"(metrics present: {', '.join(metrics) or 'none'})")
    out = {}
    for label, g in samples[samples["scored"]].groupby("task_label"):
        present = [m for m in metrics if g[SCORE_PREFIX + m].notna().any()]
        # a task's own metric (an lm-eval RULER task's string_match_all, load's task_metric)
        own = sorted(set(g["task_metric"]) - {""}) if "task_metric" in g else []
        order = (([override] if override else []) + own + scoring.recall_preference()
                 + sorted(present))
        out[label] = next((m for m in order if m in present), "")
    for label in samples["task_label"].unique():
        out.setdefault(label, "")  # nothing scored at all
    return out


def other_metric(samples: pd.DataFrame, task: str, primary: str) -> str:
    """The metric a task's gaps show beside its primary one: the task's best-ranked metric of
    the other kind (forced choice beside a generated answer's recall, and the reverse), so a
    loss that one kind hides (both models 0.00 by generation) shows in the other; "" if none."""
    if not primary:
        return ""
    g = samples[samples["scored"] & (samples["task_label"] == task)]
    present = [m for m in metric_columns(samples) if g[SCORE_PREFIX + m].notna().any()]
    kind = scoring.get(primary).kind
    order = scoring.recall_preference() + sorted(present)
    return next((m for m in order if m in present and scoring.get(m).kind != kind
                 and not scoring.get(m).question_kinds), "")


def with_primary(samples: pd.DataFrame, primary: dict[str, str]) -> pd.DataFrame:
    """Add a `recall` column: each sample's primary metric for its task, named in
    `recall_metric`; and `other`: the task's other_metric, named in `other_metric`."""
    df = samples.copy()
    df["recall"] = np.nan
    df[PER_PROBE] = False
    df["recall_metric"] = df["task_label"].map(primary).fillna("")
    df["other"] = np.nan
    df["other_metric"] = ""
    for label, m in primary.items():
        if m:
            sel = df["task_label"] == label
            df.loc[sel, "recall"] = df.loc[sel, SCORE_PREFIX + m]
            df.loc[sel, PER_PROBE] = per_probe(m)
            other = other_metric(samples, label, m)
            if other:
                df.loc[sel, "other"] = df.loc[sel, SCORE_PREFIX + other]
                df.loc[sel, "other_metric"] = other
    df[SCORE_PREFIX + "recall"] = df["recall"]
    return df


def secondary_metrics(samples: pd.DataFrame) -> list[str]:
    """Forced-choice metrics the samples have, reported beside recall by length."""
    return [m.name for m in scoring.of_kind(scoring.FORCED_CHOICE)
            if SCORE_PREFIX + m.name in samples]


def by_length(samples: pd.DataFrame) -> pd.DataFrame:
    """Primary recall per model x task x length, pooled over depth and load (what the README
    tables, effective length and the length plots use)."""
    return aggregate(samples, ROW_ID + ["target_length"], ["recall"] + secondary_metrics(samples))


def model_kinds(samples: pd.DataFrame) -> dict[str, str]:
    """model_label -> state kind (the most common among its samples)."""
    return {m: g["state_kind"].mode().iat[0] for m, g in samples.groupby("model_label")}


def beyond_trained(df: pd.DataFrame, identities: dict[str, dict]) -> pd.Series:
    """Per row: is its length past the model's trained length? Recurrent models run at any
    length and record the longest sequence they were trained on (identity `trained_length`);
    a softmax model's prompts past its range are flagged over-length instead, not scored."""
    trained = pd.to_numeric(df["model_label"].map(
        lambda m: (identities.get(m) or {}).get("trained_length")), errors="coerce")
    return (df["target_length"] > trained).fillna(False).astype(bool)
