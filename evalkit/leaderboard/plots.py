"""Leaderboard figures, one PNG per function call.

Figures are drawn on matplotlib's object API (Figure + Agg through savefig), never pyplot, so
publishing neither needs a display nor touches a caller's pyplot state. Each function returns
the path written, or None when its data is absent (the README then says why it was skipped).
"""
from __future__ import annotations

from pathlib import Path
from typing import Sequence

import numpy as np
import pandas as pd
from matplotlib.figure import Figure

from evalkit.cell_stats import wilson
from evalkit.formatting import fmt_bytes, fmt_len
from evalkit.leaderboard.derived import KNEE_LEVEL, logistic
from evalkit.leaderboard.published import PublishedCurve
from evalkit.leaderboard.tables import aggregate

_DPI = 110
_KIND_MARKER = {"recurrent": "o", "hybrid": "P", "kv": "s", "kv-window": "D", "memory": "^"}


def model_colors(labels: Sequence[str]) -> dict[str, tuple]:
    from matplotlib import colormaps

    cmap = colormaps["tab10"]
    return {m: cmap(i % 10) for i, m in enumerate(sorted(labels))}


def _grid(n: int, w: float = 4.2, h: float = 3.4) -> tuple[Figure, list]:
    cols = min(n, 3)
    rows = -(-n // cols)
    fig = Figure(figsize=(w * cols, h * rows + 0.5), layout="constrained")
    axes = fig.subplots(rows, cols, squeeze=False).ravel().tolist()
    for ax in axes[n:]:
        ax.set_visible(False)
    return fig, axes[:n]


def _int_ticks(ax, values: Sequence, fmt) -> None:
    """Ticks at the tested values, written out (not 2^k), at most ~12 of them."""
    step = max(1, -(-len(values) // 12))
    values = list(values)[::step]
    ax.set_xticks(values, [fmt(v) for v in values])
    ax.minorticks_off()


def _save(fig: Figure, path: Path) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=_DPI)
    return path


def _annotate(ax, data: np.ndarray, fmt: str = "{:.2f}", marks: np.ndarray | None = None,
              diverging: bool = False) -> None:
    for (i, j), v in np.ndenumerate(data):
        if np.isnan(v):
            continue
        text = fmt.format(v) + ("*" if marks is not None and marks[i, j] else "")
        # Readable on the cell: viridis is dark at 0, RdBu dark at both ends.
        dark = abs(v) > 0.6 if diverging else v < 0.5
        ax.text(j, i, text, ha="center", va="center", fontsize=7,
                color="white" if dark else "black")


# -- 1. needle heatmaps: depth x length per model -------------------------------------------

def depth_length_heatmaps(samples: pd.DataFrame, task: str, path: Path) -> Path | None:
    t = samples[samples["task_label"] == task]
    if t["depth"].nunique() < 2:
        return None
    cells = aggregate(t, ["model_label", "depth", "target_length"], ["recall"])
    lengths = sorted(t["target_length"].unique())
    depths = sorted(t["depth"].unique())
    models = sorted(cells["model_label"].unique())
    fig, axes = _grid(len(models))
    for ax, m in zip(axes, models):
        piv = (cells[cells["model_label"] == m].pivot(index="depth", columns="target_length",
                                                       values="recall")
               .reindex(index=depths, columns=lengths))
        im = ax.imshow(piv.to_numpy(float), vmin=0, vmax=1, cmap="viridis", aspect="auto",
                       origin="upper")
        _annotate(ax, piv.to_numpy(float))
        ax.set_xticks(range(len(lengths)), [fmt_len(x) for x in lengths])
        ax.set_yticks(range(len(depths)), [f"{d:.0%}" for d in depths])
        ax.set_xlabel("context length (model tokens)")
        ax.set_ylabel("needle depth")
        ax.set_title(m, fontsize=10)
    fig.colorbar(im, ax=axes, shrink=0.8, label="recall")
    fig.suptitle(f"{task}: recall by depth and length")
    return _save(fig, path)


# -- 2. recall vs. load ---------------------------------------------------------------------

def _load_axes(ax, loads: Sequence, length: float) -> None:
    """A recall-vs-load panel: log2 load axis at the tested loads, the 50 % knee level."""
    ax.axhline(KNEE_LEVEL, color="grey", lw=0.7, ls=":")
    ax.set_xscale("log", base=2)
    _int_ticks(ax, loads, str)
    ax.set_ylim(-0.03, 1.03)
    ax.set_xlabel("load (facts in context)")
    ax.set_ylabel("recall")
    ax.set_title(f"length {fmt_len(length)} tokens", fontsize=10)
    ax.legend(fontsize=7)


def recall_vs_load(samples: pd.DataFrame, knees: pd.DataFrame, task: str,
                   path: Path) -> Path | None:
    t = samples[samples["task_label"] == task]
    if t["load"].nunique() < 2:
        return None
    per = aggregate(t, ["model_label", "target_length", "load"], ["recall"])
    per = per[per["n"] > 0]
    lengths = sorted(per["target_length"].unique())
    colors = model_colors(samples["model_label"].unique())
    fig, axes = _grid(len(lengths), w=4.8)
    for ax, L in zip(axes, lengths):
        for m, g in per[per["target_length"] == L].groupby("model_label"):
            g = g.sort_values("load")
            ax.plot(g["load"], g["recall"], "o-", color=colors[m], label=m, ms=4)
            k = knees[(knees["task_label"] == task) & (knees["model_label"] == m)
                      & (knees["target_length"] == L)]
            if len(k) and not np.isnan(k["knee"].iat[0]):
                x0, s = np.log2(k["knee"].iat[0]), k["slope"].iat[0]
                xs = np.linspace(np.log2(g["load"].min()), np.log2(g["load"].max()), 200)
                ax.plot(2 ** xs, logistic(s * (xs - x0)), "--", color=colors[m], lw=1)
                ax.plot([2 ** x0], [KNEE_LEVEL], "x", color=colors[m], ms=9, mew=2)
        _load_axes(ax, sorted(per["load"].unique()), L)
    fig.suptitle(f"{task}: recall vs. load\n(dashed: logistic fit; x: capacity knee)",
                 fontsize=10)
    return _save(fig, path)


# -- 3. recall vs. context length -----------------------------------------------------------

def _yerr(g: pd.DataFrame) -> list:
    """Error bars from the 95 % interval [recall_lo, recall_hi] (none where there is none)."""
    return [(g["recall"] - g["recall_lo"]).fillna(0), (g["recall_hi"] - g["recall"]).fillna(0)]


def recall_vs_length(by_len: pd.DataFrame, task: str, path: Path, threshold: float,
                     use_chars: bool, published: Sequence[PublishedCurve] = ()) -> Path | None:
    """Recall per model against context length; `published` curves (published.curves_for)
    drawn beside ours, hollow and dashed, labelled as theirs (on the token axis only: their
    characters are unknown)."""
    t = by_len[(by_len["task_label"] == task) & (by_len["n"] > 0)]
    if t["target_length"].nunique() < 2:
        return None
    colors = model_colors(by_len["model_label"].unique())
    fig = Figure(figsize=(6.4, 4.2), layout="constrained")
    ax = fig.subplots()
    x = "prompt_chars" if use_chars else "target_length"
    for m, g in t.groupby("model_label"):
        g = g.sort_values(x)
        ax.errorbar(g[x], g["recall"], yerr=_yerr(g), fmt="o-", color=colors[m], label=m, ms=4,
                    capsize=2)
    ticks = set(t["target_length"].unique())
    for c, marker in zip(() if use_chars else published, "^v<>sp"):
        ax.plot(c.lengths, c.recall, ls="--", marker=marker, mfc="none", color="black", lw=0.9,
                ms=5, label=c.label)
        ticks |= set(c.lengths)
    ax.axhline(threshold, color="grey", lw=0.8, ls="--", label=f"threshold {threshold:g}")
    ax.set_xscale("log", base=2)
    if not use_chars:
        _int_ticks(ax, sorted(ticks), fmt_len)
    ax.set_ylim(-0.03, 1.03)
    ax.set_xlabel("prompt length (characters; tokenizers differ)" if use_chars
                  else "context length (model tokens)")
    ax.set_ylabel("recall")
    ax.set_title(f"{task}: recall vs. context length")
    if published and not use_chars:  # more labels than the plot has free corners
        ax.legend(fontsize=7, loc="upper center", bbox_to_anchor=(0.5, -0.16), ncol=2)
    else:
        ax.legend(fontsize=7)
    return _save(fig, path)


# -- 4. recall vs. state bytes: the signature figure -----------------------------------------

def recall_vs_state_bytes(by_len: pd.DataFrame, kinds: dict[str, str], task: str,
                          path: Path) -> Path | None:
    t = by_len[(by_len["task_label"] == task) & (by_len["n"] > 0) & (by_len["state_bytes"] > 0)]
    if t.empty:
        return None
    colors = model_colors(by_len["model_label"].unique())
    fig = Figure(figsize=(7.0, 4.6), layout="constrained")
    ax = fig.subplots()
    for m, g in t.groupby("model_label"):
        g = g.sort_values("target_length")
        kind = kinds.get(m, "")
        ax.plot(g["state_bytes"], g["recall"], "-", color=colors[m], lw=1, alpha=0.6)
        ax.scatter(g["state_bytes"], g["recall"], color=colors[m],
                   marker=_KIND_MARKER.get(kind, "o"), label=f"{m} ({kind})", zorder=3)
        for _, r in g.iterrows():
            ax.annotate(fmt_len(r["target_length"]), (r["state_bytes"], r["recall"]),
                        textcoords="offset points", xytext=(4, 3), fontsize=6,
                        color=colors[m])
    ax.set_xscale("log")
    ax.set_ylim(-0.03, 1.06)
    ax.set_xlabel("bytes held at the question (recurrent state / KV cache / memory), log")
    ax.set_ylabel("recall")
    ax.set_title(f"{task}: recall vs. state bytes (labels: context length)")
    ax.legend(fontsize=7)
    return _save(fig, path)


# -- 5. recall gap per cell -----------------------------------------------------------------

def _cell_label(depth: float, load: int, t: pd.DataFrame) -> str:
    """Name only what varies: depth, load, or both."""
    parts = []
    if t["depth"].nunique() > 1 or t["load"].nunique() == 1:
        parts.append(f"depth {depth:.0%}")
    if t["load"].nunique() > 1:
        parts.append(f"load {load}")
    return ", ".join(parts)


def gap_heatmaps(cell_gaps: pd.DataFrame, task: str, path: Path) -> Path | None:
    """One panel per (baseline, model) pair in the task's primary metric and, where the
    task has one, a panel beside it in its other metric (forced choice beside a generated
    answer's recall: a model can lose a fact in one and keep it in the other)."""
    t = cell_gaps[cell_gaps["task_label"] == task]
    if t.empty:
        return None
    lengths = sorted(t["target_length"].unique())
    rows = sorted(set(zip(t["depth"], t["load"])))
    panels = []  # (baseline, model, its rows, column prefix, metric name)
    for b, m in sorted(set(zip(t["baseline"], t["model"]))):
        g = t[(t["baseline"] == b) & (t["model"] == m)]
        panels.append((b, m, g, "", _metric_name(g, "metric")))
        other = (g[(g["other_metric"].fillna("").astype(str) != "") & g["other_gap"].notna()]
                 if "other_metric" in g else g.iloc[:0])
        if len(other):
            panels.append((b, m, other, "other_", _metric_name(other, "other_metric")))
    fig, axes = _grid(len(panels), w=max(4.2, 0.9 * len(lengths) + 2), h=max(3.0, 0.3 * len(rows) + 1.5))
    for ax, (b, m, g, pre, metric) in zip(axes, panels):
        data = np.full((len(rows), len(lengths)), np.nan)
        sig = np.zeros_like(data, dtype=bool)
        for _, r in g.iterrows():
            i, j = rows.index((r["depth"], r["load"])), lengths.index(r["target_length"])
            data[i, j] = r[pre + "gap"]
            sig[i, j] = r[pre + "ci_low"] > 0 or r[pre + "ci_high"] < 0
        im = ax.imshow(data, vmin=-1, vmax=1, cmap="RdBu_r", aspect="auto")
        _annotate(ax, data, "{:+.2f}", sig, diverging=True)
        ax.set_xticks(range(len(lengths)), [fmt_len(x) for x in lengths])
        ax.set_yticks(range(len(rows)), [_cell_label(d, n, t) for d, n in rows], fontsize=7)
        ax.set_xlabel("context length (model tokens)")
        ax.set_title(f"{b} minus {m}" + (f" ({metric})" if metric else ""), fontsize=9)
    fig.colorbar(im, ax=axes, shrink=0.8, label="recall gap (baseline - model)")
    fig.suptitle(f"{task}: recall gap per cell (* = 95 % CI excludes 0)")
    return _save(fig, path)


def _metric_name(g: pd.DataFrame, column: str) -> str:
    names = [n for n in g[column].fillna("").unique() if n] if column in g else []
    return ", ".join(sorted(map(str, names)))


# -- 6. capacity by state size: recall vs. load, and recall vs. state bytes at one load -------

BEYOND_NOTE = "hollow: past the model's trained length"


def _by_state(samples: pd.DataFrame, identities: dict, task: str) -> pd.DataFrame | None:
    """Recall per model x length x load for the task, with state bytes and the trained-length
    mark; None without a load sweep."""
    from evalkit.leaderboard.tables import beyond_trained

    t = samples[samples["task_label"] == task]
    if t["load"].nunique() < 2:
        return None
    per = aggregate(t, ["model_label", "target_length", "load"], ["recall"])
    per = per[per["n"] > 0].copy()
    per["beyond"] = beyond_trained(per, identities)
    return per


def _style(m: str, kinds: dict, rank: dict) -> dict:
    """Recurrent models light to dark by state size; softmax black, its window grey; hybrids
    purple, with their own marker."""
    from matplotlib import colormaps

    kind = kinds.get(m, "")
    if kind == "recurrent":
        color = colormaps["viridis"](0.15 + 0.7 * rank.get(m, 0))
    else:
        color = {"kv": "black", "kv-window": "grey", "hybrid": "tab:purple"}.get(kind, "tab:red")
    return {"color": color, "marker": _KIND_MARKER.get(kind, "o"),
            "ls": "--" if kind == "kv-window" else "-"}


def _ranks(per: pd.DataFrame, kinds: dict) -> dict[str, float]:
    rec = (per[per["model_label"].map(kinds) == "recurrent"]
           .groupby("model_label")["state_bytes"].mean().sort_values())
    return {m: i / max(1, len(rec) - 1) for i, m in enumerate(rec.index)}


def _points(ax, g: pd.DataFrame, x: str, style: dict, label: str) -> None:
    ax.plot(g[x], g["recall"], ls=style["ls"], color=style["color"], lw=1.2)
    ax.plot([], [], ls=style["ls"], marker=style["marker"], color=style["color"], label=label)
    for beyond, part in g.groupby("beyond"):
        ax.scatter(part[x], part["recall"], marker=style["marker"], s=26, zorder=3,
                   facecolors="none" if beyond else style["color"], edgecolors=style["color"])


def capacity_curves(samples: pd.DataFrame, kinds: dict, identities: dict, task: str,
                    path: Path) -> Path | None:
    """Recall vs. number of facts at each swept length: one line per model, recurrent models
    ordered by state size, the softmax twin and its memory-matched window alongside."""
    per = _by_state(samples, identities, task)
    if per is None:
        return None
    rank = _ranks(per, kinds)
    lengths = sorted(L for L, g in per.groupby("target_length") if g["load"].nunique() > 1)
    if not lengths:
        return None
    fig, axes = _grid(len(lengths), w=5.2, h=3.8)
    for ax, L in zip(axes, lengths):
        g = per[per["target_length"] == L]
        for m in g.groupby("model_label")["state_bytes"].mean().sort_values().index:
            mg = g[g["model_label"] == m].sort_values("load")
            _points(ax, mg, "load", _style(m, kinds, rank),
                    f"{m} ({fmt_bytes(mg['state_bytes'].mean())})")
        _load_axes(ax, sorted(g["load"].unique()), L)
    fig.suptitle(f"{task}: recall vs. number of facts by state size\n({BEYOND_NOTE})",
                 fontsize=10)
    return _save(fig, path)


def capacity_vs_state(samples: pd.DataFrame, kinds: dict, identities: dict, task: str,
                      path: Path, load: int | None = None) -> Path | None:
    """Recall vs. state bytes at one load (default: 16 if swept, else the median load), one
    panel per length: where along the state axis recall gives out."""
    per = _by_state(samples, identities, task)
    if per is None:
        return None
    loads = sorted(per["load"].unique())
    load = load if load is not None else (16 if 16 in loads else loads[len(loads) // 2])
    per = per[(per["load"] == load) & (per["state_bytes"] > 0)]
    if per["model_label"].nunique() < 2:
        return None
    rank = _ranks(per, kinds)
    lengths = sorted(per["target_length"].unique())
    fig, axes = _grid(len(lengths), w=5.2, h=3.8)
    for ax, L in zip(axes, lengths):
        g = per[per["target_length"] == L]
        rec = g[g["model_label"].map(kinds) == "recurrent"].sort_values("state_bytes")
        if len(rec):
            _points(ax, rec, "state_bytes", {"color": "tab:green", "marker": "o", "ls": "-"},
                    "recurrent (GLA) models")
        for m, mg in g[g["model_label"].map(kinds) != "recurrent"].groupby("model_label"):
            st = _style(m, kinds, rank)
            _points(ax, mg, "state_bytes", {**st, "ls": "none"}, m)
        for _, r in g.iterrows():
            ax.annotate(r["model_label"], (r["state_bytes"], r["recall"]), fontsize=5,
                        textcoords="offset points", xytext=(3, 3))
        ax.set_xscale("log")
        ax.set_ylim(-0.03, 1.06)
        ax.set_xlabel("bytes held at the question (state / KV cache), log")
        ax.set_ylabel("recall")
        ax.set_title(f"length {fmt_len(L)} tokens, {load} facts", fontsize=10)
        ax.legend(fontsize=6)
    fig.suptitle(f"{task}: recall vs. state bytes at load {load}\n({BEYOND_NOTE})", fontsize=10)
    return _save(fig, path)


# -- 8. recall vs. distance of the fact, windows marked ----------------------------------------

def distance_bins(distance: pd.Series) -> pd.Series:
    """Octave bins of the distance (tokens from the fact to the question): bin b holds
    [2^b, 2^(b+1)); 0 counts in the first bin. Returns each sample's bin's lower edge.

        >>> distance_bins(pd.Series([0, 1, 63, 64, 100])).tolist()
        [1, 1, 32, 64, 64]
    """
    d = np.maximum(distance.to_numpy(dtype=float), 1.0)
    return pd.Series(2 ** np.floor(np.log2(d)), index=distance.index).astype("int64")


def recall_by_distance(samples: pd.DataFrame, task: str) -> pd.DataFrame:
    """Per model x octave bin of distance: recall (mean of the scored samples), n and the 95 %
    Wilson interval [recall_lo, recall_hi]."""
    t = samples[(samples["task_label"] == task) & samples["scored"] & samples["recall"].notna()]
    per = (t.assign(bin=distance_bins(t["distance"]))
           .groupby(["model_label", "bin"])["recall"].agg(recall="mean", n="size").reset_index())
    bounds = [wilson(p, n) for p, n in zip(per["recall"], per["n"])]
    return per.assign(recall_lo=[b[0] for b in bounds], recall_hi=[b[1] for b in bounds])


def recall_vs_distance(samples: pd.DataFrame, identities: dict, task: str,
                       path: Path) -> Path | None:
    """Recall against how far back the asked fact lies (recall_by_distance), one line per
    model; each model's exact window (identity `window`) drawn as a vertical line: a windowed
    twin sees facts left of its line exactly, and only its state (or nothing) holds those right
    of it. None unless some model of the task has a window and the distances span at least
    three octaves."""
    per = recall_by_distance(samples, task)
    windows = {m: identities.get(m, {}).get("window") for m in per["model_label"].unique()}
    windows = {m: w for m, w in windows.items() if isinstance(w, int) and w > 0}
    sinks = {m: identities.get(m, {}).get("sinks") or 0 for m in windows}
    if not windows or per["bin"].nunique() < 3:
        return None
    colors = model_colors(samples["model_label"].unique())
    fig = Figure(figsize=(7.0, 4.4), layout="constrained")
    ax = fig.subplots()
    for m, g in per.groupby("model_label"):
        ax.errorbar(g["bin"] * np.sqrt(2), g["recall"],  # at the bin's geometric centre
                    yerr=_yerr(g), fmt="o-", color=colors[m], label=m, ms=4, capsize=2, lw=1.2)
    for w in sorted(set(windows.values())):
        ax.axvline(w, color="grey", ls=":", lw=1)
        ax.annotate(f"W = {w}", (w, 1.04), ha="center", fontsize=7, color="grey",
                    annotation_clip=False)
        for n_sinks in sorted({sinks[m] for m, v in windows.items() if v == w}):
            # sinks sit at the context's start, not at a distance: they are named, not drawn
            who = ", ".join(m for m, v in windows.items() if v == w and sinks[m] == n_sinks)
            ax.plot([], [], ls=":", color="grey",
                    label=f"W = {w}" + (f", S = {n_sinks} sinks" if n_sinks else "") + f": {who}")
    ax.set_xscale("log", base=2)
    edges = sorted(per["bin"].unique())
    _int_ticks(ax, edges + [edges[-1] * 2], fmt_len)
    ax.set_ylim(-0.03, 1.08)
    ax.set_xlabel("distance from the fact to the question (tokens; octave bins, 95 % Wilson)")
    ax.set_ylabel("recall")
    ax.set_title(f"{task}: recall vs. distance of the fact")
    ax.legend(fontsize=6, loc="center right")  # recall sits near 0 or 1: the middle is free
    return _save(fig, path)
