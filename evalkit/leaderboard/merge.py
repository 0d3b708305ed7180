"""Merge several runs into one set of samples, one run per leaderboard cell.

A cell is (model identity, task, task version, task config hash, length, depth, load). When
several runs cover the same cell, the newest run (results.json "created"; on a tie, the one
given later) supplies all of that cell's samples and the older rows are dropped whole: samples
of two runs are never pooled, so a re-run replaces a result instead of diluting it. Different
task versions or config hashes are different cells and stay apart; so do different model
hashes under one name (a retrained model is a different model).
"""
from __future__ import annotations

from dataclasses import dataclass

import pandas as pd

from evalkit.leaderboard.load import Run
from evalkit.runner.arrivals import describe

MODEL_KEY = ["model", "model_hash", "arrivals"]  # a served model under load is its own row
TASK_KEY = ["task", "task_version", "task_config_hash"]
GRID_KEY = ["target_length", "depth", "load"]
CELL_KEY = MODEL_KEY + TASK_KEY + GRID_KEY


@dataclass
class Merged:
    samples: pd.DataFrame          # the winning samples, with model_label / task_label columns
    runs: list[Run]                # in the order given
    superseded: dict[str, int]     # run id -> cells replaced by a newer run


def merge_runs(runs: list[Run]) -> Merged:
    if not runs:
        raise ValueError("nothing to publish: no runs given")
    seen: dict[str, Run] = {}
    unique: list[Run] = []
    for r in runs:
        prev = seen.get(r.run_id)
        if prev is not None:
            if prev.path.resolve() == r.path.resolve():
                continue  # the same folder twice
            raise ValueError(f"run id {r.run_id!r} appears in both {prev.path} and {r.path}; "
                             f"publish one copy")
        seen[r.run_id] = r
        unique.append(r)

    frames = []
    for order, r in enumerate(unique):
        df = r.samples.copy()
        df["run_order"] = order
        frames.append(df)
    allrows = pd.concat(frames, ignore_index=True)

    # The winner of each cell: latest "created", then latest on the command line.
    per_run = (allrows[CELL_KEY + ["run_id", "run_created", "run_order"]]
               .drop_duplicates(CELL_KEY + ["run_id"])
               .sort_values(["run_created", "run_order"], kind="stable"))
    winners = per_run.drop_duplicates(CELL_KEY, keep="last")[CELL_KEY + ["run_id"]]
    losers = per_run.merge(winners, on=CELL_KEY + ["run_id"], how="left", indicator=True)
    superseded = (losers[losers["_merge"] == "left_only"].groupby("run_id").size()
                  .astype(int).to_dict())
    samples = allrows.merge(winners, on=CELL_KEY + ["run_id"], how="inner")
    samples = samples.sort_values(CELL_KEY + ["seed", "question"], kind="stable")
    samples = add_labels(samples.reset_index(drop=True))
    return Merged(samples=samples, runs=unique,
                  superseded={k: int(v) for k, v in superseded.items()})


def add_labels(df: pd.DataFrame) -> pd.DataFrame:
    """Display names: the plain name unless two identities share it under one load, then
    name@hash; a served model adds its load ("vllm @ poisson:2/s", "vllm @ closed loop, 4 in
    flight"). A served model's options (its concurrency) are in its hash, so its runs under
    two loads may differ in hash and still be one model: the name is unique per load."""
    df = df.copy()
    n_hash = df.groupby(["model", "arrivals"])["model_hash"].nunique()
    df["model_label"] = [(m if n_hash[(m, a)] == 1 else f"{m}@{h[:8]}")
                         + (f" @ {describe(a)}" if a else "")
                         for m, h, a in zip(df["model"], df["model_hash"], df["arrivals"])]
    n_cfg = df.drop_duplicates(TASK_KEY).groupby("task").size()
    df["task_label"] = [t if n_cfg[t] == 1 else f"{t} v{v}@{c[:8]}"
                        for t, v, c in zip(df["task"], df["task_version"], df["task_config_hash"])]
    return df
