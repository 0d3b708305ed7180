"""Everything the leaderboard shows, computed once from merged samples."""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Sequence

import numpy as np
import pandas as pd

from evalkit.bootstrap import check_resamples
from evalkit.leaderboard import derived, served
from evalkit.leaderboard.perplexity import perplexity_table
from evalkit.leaderboard.load import Run
from evalkit.leaderboard.merge import Merged, merge_runs
from evalkit.leaderboard.merge import GRID_KEY
from evalkit.leaderboard.tables import (ROW_ID, aggregate, by_length, cell_rows, choose_primary,
                                        model_kinds, with_primary)




@dataclass
class Options:
    threshold: float = derived.DEFAULT_THRESHOLD
    primary_metric: str | None = None
    gap_pairs: Sequence[str] = ()          # "BASELINE:MODEL"; empty = derived.default_pairs
    n_boot: int = derived.DEFAULT_BOOTSTRAP
    seed: int = 0
    slo_s: float = served.DEFAULT_SLO_S    # the served section's response-time objective

    def __post_init__(self) -> None:
        if not 0.0 < self.threshold <= 1.0:
            raise ValueError(f"--threshold must be in (0, 1], got {self.threshold}")
        check_resamples(self.n_boot)
        served.check_slo(self.slo_s)


@dataclass
class Board:
    options: Options
    merged: Merged
    samples: pd.DataFrame              # merged samples with a `recall` column
    primary: dict[str, str]            # task_label -> metric
    rows: pd.DataFrame                 # one per model x task x length x depth x load
    by_length: pd.DataFrame            # per model x task x length (pooled over depth, load)
    state_bytes_by_length: pd.DataFrame         # per model x length (pooled over tasks)
    effective_length: pd.DataFrame
    capacity_knee: pd.DataFrame
    pairs: list[tuple[str, str]]
    cell_gaps: pd.DataFrame
    length_gaps: pd.DataFrame
    kinds: dict[str, str]
    use_chars: dict[str, bool]         # task_label -> tokenizers differ: plot in characters
    identities: dict[str, dict[str, Any]] = field(default_factory=dict)  # model_label -> identity
    tasks: dict[str, dict[str, Any]] = field(default_factory=dict)       # task_label -> info
    perplexity: pd.DataFrame = field(default_factory=pd.DataFrame)     # from twins' cards


def tokenizers_differ(samples: pd.DataFrame, identities: dict[str, dict]) -> dict[str, bool]:
    """Per task: do its models count tokens differently? From the identities' tokenizer_hash
    where every model has one, else from characters per token (more than 2 % apart)."""
    out = {}
    for task, g in samples.groupby("task_label"):
        labels = sorted(g["model_label"].unique())
        hashes = [identities.get(m, {}).get("tokenizer_hash") for m in labels]
        if all(hashes):
            out[task] = len(set(hashes)) > 1
            continue
        s = g[g["scored"] & (g["prompt_tokens"] > 0)]
        ratio = (s["prompt_chars"] / s["prompt_tokens"]).groupby(s["model_label"]).mean()
        out[task] = bool(len(ratio) > 1 and (ratio.max() - ratio.min()) / ratio.mean() > 0.02)
    return out


def with_answered(rows: pd.DataFrame, samples: pd.DataFrame) -> pd.DataFrame:
    """`rows` with `recall_answered` after `recall_hi`: the primary recall over the answered
    samples alone (NaN where none was), beside `recall`, which counts a failure as a miss."""
    key = ROW_ID + GRID_KEY
    got = samples[samples["answered"]]
    answered = (aggregate(got, key, ["recall"])[key + ["recall"]] if len(got) else
                pd.DataFrame(columns=key + ["recall"]))
    out = rows.merge(answered.rename(columns={"recall": "recall_answered"}), on=key, how="left")
    cols = [c for c in out.columns if c != "recall_answered"]
    cols.insert(cols.index("recall_hi") + 1, "recall_answered")
    return out[cols]


def build(runs: list[Run], options: Options | None = None) -> Board:
    options = options or Options()
    merged = merge_runs(runs)
    primary = choose_primary(merged.samples, options.primary_metric)
    samples = with_primary(merged.samples, primary)
    rows = cell_rows(samples)  # every metric, plus `recall` = the task's primary metric
    rows.insert(rows.columns.get_loc("recall"), "primary_metric", rows["task_label"].map(primary))
    rows = with_answered(rows, samples)
    bl = derived.add_recall_per_byte(by_length(samples))
    state_bytes_by_length = aggregate(samples, ["model_label", "target_length"], [])
    pairs = (derived.resolve_pairs(samples, options.gap_pairs) if options.gap_pairs
             else derived.default_pairs(samples))
    cell_gaps = derived.gaps(samples, pairs, ["task_label", "target_length", "depth", "load"],
                             options.n_boot, options.seed)
    length_gaps = derived.gaps(samples, pairs, ["task_label", "target_length"],
                               options.n_boot, options.seed)

    # Identity and task info from the newest run that supplied each model / task.
    identities: dict[str, dict] = {}
    tasks: dict[str, dict] = {}
    by_id = {r.run_id: r for r in merged.runs}
    newest = samples.sort_values(["run_created", "run_order"], kind="stable")
    for _, r in newest.drop_duplicates("model_label", keep="last").iterrows():
        ident = by_id[r["run_id"]].models.get(r["model"], {})
        identities[r["model_label"]] = dict(ident) if isinstance(ident, dict) else {}
    for _, r in newest.drop_duplicates("task_label", keep="last").iterrows():
        info = by_id[r["run_id"]].tasks.get(r["task"], {})
        tasks[r["task_label"]] = {"task": r["task"], "version": r["task_version"],
                                  "config_hash": r["task_config_hash"],
                                  "source": info.get("source", ""),
                                  "primary_metric": primary.get(r["task_label"], "")}
    return Board(options=options, merged=merged, samples=samples, primary=primary, rows=rows,
                 by_length=bl, state_bytes_by_length=state_bytes_by_length,
                 effective_length=derived.effective_length(bl, options.threshold),
                 capacity_knee=derived.capacity_knee(samples), pairs=pairs, cell_gaps=cell_gaps,
                 length_gaps=length_gaps, kinds=model_kinds(samples),
                 use_chars=tokenizers_differ(samples, identities), identities=identities,
                 tasks=tasks, perplexity=perplexity_table(identities))


def records(df: pd.DataFrame) -> list[dict[str, Any]]:
    """JSON-ready rows: NaN -> None, numpy scalars -> Python."""
    out = []
    for rec in df.to_dict(orient="records"):
        clean = {}
        for k, v in rec.items():
            if v is pd.NA:
                v = None
            if isinstance(v, (np.generic,)):
                v = v.item()
            if isinstance(v, float) and np.isnan(v):
                v = None
            if isinstance(v, pd.Timestamp):
                v = v.isoformat()
            clean[k] = v
        out.append(clean)
    return out
