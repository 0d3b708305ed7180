"""Publish runs as a leaderboard folder, atomically.

Everything is built in a stage next to the target and swapped in with renames
(evalkit.owned_folder): any failure before the swap (a bad run, a plotting bug, a full disk)
leaves the previous leaderboard exactly as it was.

publish owns only the files it writes (listed under "files" in results.json); anything else a
user put in the folder (NOTES.md, extra/) is copied into the new folder before the swap. One
publish at a time per parent folder: an flock on the parent serializes concurrent publishes, so
the rename-aside/rename-in pair never interleaves with another one.
"""
from __future__ import annotations

import json
import os
import shutil
from dataclasses import dataclass
from pathlib import Path
from typing import Sequence

import pandas as pd

from evalkit import __version__, atomic
from evalkit.formatting import slug
from evalkit.owned_folder import building, locked, refuse_foreign
from evalkit.leaderboard import plots as P
from evalkit.leaderboard import published, recall_state
from evalkit.leaderboard.board import Board, Options, build, records
from evalkit.leaderboard.derived import KNEE_LEVEL
from evalkit.leaderboard.compare_files import to_json
from evalkit.leaderboard.drift import read_report, summary_rows
from evalkit.leaderboard.load import expand_run_dirs, load_run
from evalkit.leaderboard.shards import combine_shards
from evalkit.leaderboard.page import render_page
from evalkit.leaderboard.readme import render_readme

FORMAT = "evalkit-leaderboard/1"  # marks a folder publish may replace
_REPLACEABLE_EXTRAS = {".gitkeep"}
# What a leaderboard written before results.json listed its files owned.
_LEGACY_OWNED = ("results.csv", "gaps.csv", "results.json", "README.md", "plots/*.png")


@dataclass
class Published:
    path: Path
    board: Board
    files: list[Path]
    skipped: list[str]


def check_target(target: Path) -> None:
    """Refuse to replace a folder that is not a leaderboard (e.g. `--to .` by mistake)."""
    if not target.exists():
        return
    if not target.is_dir():
        raise ValueError(f"--to {target}: exists and is not a folder")
    entries = {p.name for p in target.iterdir()}
    if entries <= _REPLACEABLE_EXTRAS:
        return
    marker = target / "results.json"
    try:
        fmt = json.loads(marker.read_text(encoding="utf-8")).get("format", "")
    except (OSError, ValueError, AttributeError):
        fmt = ""
    if not str(fmt).startswith("evalkit-leaderboard/"):
        raise ValueError(f"--to {target}: a non-empty folder that is not an evalkit leaderboard "
                         f"(no results.json with format {FORMAT!r}); refusing to replace it")


def refuse_random_weights(runs) -> None:
    """A model with random weights (laplace without a checkpoint, random_seed) measures cost,
    not recall: its scores mean nothing, so no board shows them."""
    bad = [f"{m} in {r.path}" for r in runs for m, ident in sorted(r.models.items())
           if (ident or {}).get("random_weights")]
    if bad:
        raise ValueError(f"refusing to publish random-weight model(s): {'; '.join(bad)}. Their "
                         f"scores mean nothing; run them with a checkpoint (e.g. laplace:PATH)")


def publish(run_dirs: Sequence[str | os.PathLike], to: str | os.PathLike,
            options: Options | None = None,
            compare: Sequence[str | os.PathLike] = ()) -> Published:
    """`compare`: folders written by `evalkit compare`, shown as a drift section and table."""
    target = Path(os.path.abspath(to))  # normalized: "leaderboard/", "./x/../leaderboard"
    if target == Path(os.path.abspath(os.curdir)) or target.parent == target:
        raise ValueError(f"--to {to}: give a leaderboard folder, not the current or root folder")
    check_target(target)
    runs = [load_run(p) for p in expand_run_dirs(run_dirs)]  # fail before touching anything
    refuse_random_weights(runs)
    runs = combine_shards(runs)  # the N parts of a --shard run as one
    board = build(runs, options)
    drift = [(str(d), read_report(d)) for d in compare]
    try:
        target.parent.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        raise ValueError(f"--to {to}: cannot create its parent folder ({e.strerror})") from None
    with locked(target.parent):  # one publish at a time per parent folder
        check_target(target)  # again: another publish may have written it meanwhile
        with building(target) as tmp:
            files, skipped = write_board(board, tmp, [str(p) for p in run_dirs], drift,
                                         shown=target)
            _keep_foreign(target, tmp, {f.relative_to(tmp).as_posix() for f in files})
    return Published(target, board, [target / f.relative_to(tmp) for f in files], skipped)


def _shown_as(folder: Path) -> str:
    """The board's folder as the Reproduce line gives it: relative to the working folder when
    inside it (leaderboard/quick/), else absolute."""
    folder, cwd = Path(folder).resolve(), Path.cwd().resolve()
    return (folder.relative_to(cwd).as_posix() if folder.is_relative_to(cwd) else str(folder)) + "/"


def _owned(target: Path) -> set[str]:
    """Relative paths of the files the previous publish wrote."""
    try:
        listed = json.loads((target / "results.json").read_text(encoding="utf-8")).get("files")
    except (OSError, ValueError, AttributeError):
        listed = None
    if isinstance(listed, list):
        return {str(f) for f in listed} | {"results.json"}
    return {p.relative_to(target).as_posix() for pat in _LEGACY_OWNED for p in target.glob(pat)}


def _keep_foreign(target: Path, new: Path, written: set[str]) -> None:
    """Copy what publish did not write (a user's notes, folders) from `target` into `new`;
    a foreign file where the new leaderboard writes one is refused, naming it."""
    if not target.is_dir():
        return
    owned = _owned(target)
    refuse_foreign((target / rel for rel in sorted(written)),
                   lambda p: None if p.relative_to(target).as_posix() in owned
                   else "not written by publish", command="publish", flag="--to")
    for root, dirs, names in os.walk(target):
        rel_root = Path(root).relative_to(target)
        for d in dirs:
            src = target / rel_root / d
            if src.is_symlink():  # os.walk does not enter it: keep the link itself
                if (rel_root / d).as_posix() not in owned:
                    os.symlink(os.readlink(src), new / rel_root / d)
            else:
                (new / rel_root / d).mkdir(exist_ok=True)
        for name in names:
            rel = (rel_root / name).as_posix()
            if rel not in owned:
                shutil.copy2(target / rel, new / rel, follow_symlinks=False)


def write_board(board: Board, out: Path, run_paths: Sequence[str],
                drift: Sequence[tuple[str, dict]] = (),
                shown: Path | None = None) -> tuple[list[Path], list[str]]:
    """Write the leaderboard into `out` (`shown`: the folder it will become, for messages)."""
    files: list[Path] = []
    board.rows.to_csv(out / "results.csv", index=False)
    board.cell_gaps.to_csv(out / "gaps.csv", index=False)
    files += [out / "results.csv", out / "gaps.csv"]

    sections, skipped = draw_plots(board, out)
    files += [out / rel for items in sections.values() for _, rel in items]

    doc = {
        "format": FORMAT,
        "evalkit_version": __version__,
        "options": {"threshold": board.options.threshold, "knee_level": KNEE_LEVEL,
                    "primary_metric": board.options.primary_metric,
                    "bootstrap_resamples": board.options.n_boot,
                    "bootstrap_seed": board.options.seed,
                    "served_slo_s": board.options.slo_s,
                    "gap_pairs": [list(p) for p in board.pairs]},
        "primary_metric": board.primary,
        "runs": [{"run_id": r.run_id, "created": r.created.isoformat(), "path": str(r.path),
                  "evalkit_version": r.evalkit_version, "config_hash": r.config_hash,
                  "superseded_cells": board.merged.superseded.get(r.run_id, 0),
                  "provenance": r.provenance} for r in board.merged.runs],
        "models": {m: {"name": board.samples.loc[board.samples["model_label"] == m, "model"].iat[0],
                       "hash": board.samples.loc[board.samples["model_label"] == m,
                                                 "model_hash"].iat[0],
                       "state_kind": board.kinds.get(m, ""), "identity": ident}
                   for m, ident in sorted(board.identities.items())},
        "tasks": board.tasks,
        "rows": records(board.rows),
        "by_length": records(board.by_length),
        "state_bytes": records(board.state_bytes_by_length[["model_label", "target_length", "n",
                                                   "state_bytes", "state_kind"]]),
        "effective_length": records(board.effective_length),
        "capacity_knee": records(board.capacity_knee),
        "gaps": {"cells": records(board.cell_gaps), "by_length": records(board.length_gaps)},
        "perplexity": records(board.perplexity),
        "plots": {k: [rel for _, rel in v] for k, v in sections.items()},
        "skipped_plots": skipped,
    }
    if drift:
        (out / "drift.json").write_text(to_json({"reports": [r for _, r in drift]}),
                                        encoding="utf-8")
        pd.DataFrame([r for _, rep in drift for r in summary_rows(rep)]).to_csv(
            out / "drift.csv", index=False)
        files += [out / "drift.json", out / "drift.csv"]
    files += [out / "results.json", out / "README.md", out / "index.html"]
    doc["files"] = sorted(f.relative_to(out).as_posix() for f in files)
    (out / "results.json").write_text(
        atomic.dumps(doc, (shown or out) / "results.json", indent=1, default=str) + "\n",
        encoding="utf-8")
    (out / "README.md").write_text(render_readme(board, run_paths, sections, skipped, __version__,
                                          drift, to=_shown_as(shown or out)), encoding="utf-8")
    atomic.write_text(out / "index.html", render_page(board, __version__))  # the board as a page
    return files, skipped


def draw_plots(board: Board, out: Path) -> tuple[dict[str, list[tuple[str, str]]], list[str]]:
    """Every figure, per task. Returns {section: [(title, relative path)]} and skip notes."""
    sections: dict[str, list[tuple[str, str]]] = {
        "Recall vs. state bytes (the signature figure)": [],
        "Recall vs. context length": [],
        "Needle heatmaps (depth x length)": [],
        "Recall vs. load": [],
        "Capacity by state size": [],
        "Recall gap per cell": [],
        "Recall vs. distance of the fact": [],
    }
    skipped: list[str] = []
    o = board.options

    def models_of(task: str) -> set[str]:
        return set(board.samples.loc[board.samples["task_label"] == task, "model_label"])

    def add(section: str, title: str, name: str, fn, why: str) -> None:
        path = fn(out / "plots" / name)  # None: the data for this figure is absent
        if path is None:
            skipped.append(f"{title}: {why}")
        else:
            sections[section].append((title, Path(path).relative_to(out).as_posix()))

    for task in sorted(board.tasks):
        s = slug(task)
        add("Recall vs. state bytes (the signature figure)", f"{task}: recall vs. state bytes",
            f"state-bytes-{s}.png", lambda p: P.recall_vs_state_bytes(board.by_length, board.kinds,
                                                                       task, p),
            why="no state bytes recorded")
        add("Recall vs. context length", f"{task}: recall vs. context length",
            f"length-{s}.png", lambda p: P.recall_vs_length(
                board.by_length, task, p, o.threshold, board.use_chars.get(task, False),
                published.curves_for(task, board.identities, models_of(task))),
            why="fewer than two lengths scored")
        add("Needle heatmaps (depth x length)", f"{task}: depth x length heatmap",
            f"heatmap-{s}.png", lambda p: P.depth_length_heatmaps(board.samples, task, p),
            why="only one depth")
        add("Recall vs. load", f"{task}: recall vs. load", f"load-{s}.png",
            lambda p: P.recall_vs_load(board.samples, board.capacity_knee, task, p),
            why="no load sweep (one load)")
        add("Capacity by state size", f"{task}: recall vs. number of facts by state size",
            f"capacity-{s}.png",
            lambda p: P.capacity_curves(board.samples, board.kinds, board.identities, task, p),
            why="no load sweep (one load)")
        add("Capacity by state size", f"{task}: recall vs. state bytes at a fixed load",
            f"capacity-bytes-{s}.png",
            lambda p: P.capacity_vs_state(board.samples, board.kinds, board.identities, task, p),
            why="no load sweep, or fewer than two models at the load")
        add("Recall gap per cell", f"{task}: recall gap per cell", f"gap-{s}.png",
            lambda p: P.gap_heatmaps(board.cell_gaps, task, p),
            why="no baseline/model pair answered its probes")
        add("Recall vs. distance of the fact", f"{task}: recall vs. distance, windows marked",
            f"distance-{s}.png",
            lambda p: P.recall_vs_distance(board.samples, board.identities, task, p),
            why="no model with a window, or distances in fewer than three octaves")
    # The recall-state law (tasks/mqar.py), first: only when a run holds the Based test mix.
    law = recall_state.board_figure(board.samples, out / "plots" / "mqar-state-bytes.png")
    if law is not None:
        sections = {recall_state.SECTION: [("mqar: accuracy vs. state bytes",
                                            law.relative_to(out).as_posix())], **sections}
    return sections, skipped
