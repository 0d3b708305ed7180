"""The N shards of one suite run (`evalkit run --shard I/N`), published as the one run they
split: their samples together, under one id.

Shards belong together when they share the suite's config hash and N. The set must be complete
(every I in 1..N exactly once) and disjoint (no sample in two shards), and each model must be
the same model in every shard (one identity hash): otherwise publishing is refused, naming the
folders, since half a grid or a grid answered by two models would pass for a whole one.
"""
from __future__ import annotations

from collections import defaultdict

import pandas as pd

from evalkit.leaderboard.load import Run

SAMPLE_KEY = ["model_hash", "task", "probe_hash", "question"]


def combine_shards(runs: list[Run]) -> list[Run]:
    """`runs` with each complete set of shards replaced by one run, in the place of its first."""
    groups: dict[tuple[str, int], list[Run]] = defaultdict(list)
    for r in runs:
        if r.shard.count > 1:
            groups[(r.config_hash, r.shard.count)].append(r)
    counts: dict[str, set[int]] = defaultdict(set)
    for cfg, n in groups:
        counts[cfg].add(n)
    for cfg, ns in counts.items():
        if len(ns) > 1:
            ways = " and ".join(map(str, sorted(ns)))
            raise ValueError(f"the shards of config {cfg[:12]} split it {ways} ways: publish "
                             f"the shards of one split")
    merged = {key: _merge(parts) for key, parts in groups.items()}
    out, placed = [], set()
    for r in runs:
        key = (r.config_hash, r.shard.count)
        if r.shard.count <= 1:
            out.append(r)
        elif key not in placed:
            placed.add(key)
            out.append(merged[key])
    return out


def _merge(parts: list[Run]) -> Run:
    n, cfg = parts[0].shard.count, parts[0].config_hash
    by_index: dict[int, Run] = {}
    for r in parts:
        other = by_index.get(r.shard.index)
        if other is not None and other.path.resolve() != r.path.resolve():
            raise ValueError(f"shard {r.shard} of config {cfg[:12]} is given twice: {other.path} "
                             f"and {r.path} (overlapping parts); publish one of them")
        by_index[r.shard.index] = r
    missing = [i for i in range(1, n + 1) if i not in by_index]
    if missing:
        given = ", ".join(f"{i}/{n} ({by_index[i].path})" for i in sorted(by_index))
        raise ValueError(f"incomplete shards of config {cfg[:12]}: given {given}; missing "
                         f"{', '.join(f'{i}/{n}' for i in missing)}. Publish all {n} shard "
                         f"folders together")
    ordered = [by_index[i] for i in range(1, n + 1)]
    models: dict[str, dict] = {}
    for r in ordered:
        for name, ident in r.models.items():
            prev = models.setdefault(name, ident)
            if prev.get("hash") != ident.get("hash"):
                raise ValueError(f"model {name!r} is not the same model in every shard of config "
                                 f"{cfg[:12]} (identity hash {str(prev.get('hash'))[:12]} vs "
                                 f"{str(ident.get('hash'))[:12]} in {r.path}); rerun that shard")
    samples = pd.concat([r.samples for r in ordered], ignore_index=True)
    twice = samples[samples.duplicated(SAMPLE_KEY, keep=False)]
    if len(twice):
        row = twice.iloc[0]
        where = sorted(set(twice[(twice[SAMPLE_KEY] == row[SAMPLE_KEY]).all(axis=1)]["run_dir"]))
        raise ValueError(f"shards of config {cfg[:12]} overlap: sample {row['task']} probe "
                         f"{row['probe_hash'][:12]} q{row['question']} of {row['model']} is in "
                         f"{' and '.join(where)}")
    run_id = f"{ordered[0].run_id}+{n - 1}-shards"
    samples["run_id"] = run_id
    samples["run_created"] = max(r.created for r in ordered)
    first = ordered[0]
    provenance = {**first.provenance, "shards": [
        {"shard": str(r.shard), "run_id": r.run_id, "path": str(r.path)} for r in ordered]}
    return Run(path=first.path, run_id=run_id, created=max(r.created for r in ordered),
               evalkit_version=first.evalkit_version, config_hash=cfg, provenance=provenance,
               models=models, tasks={k: v for r in ordered for k, v in r.tasks.items()},
               samples=samples)
