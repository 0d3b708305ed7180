"""The recall-state law on the board: MQAR accuracy against state bytes, next to the papers.

Three parts, each usable alone:
- `load_published(path)`: the published points (configs/published/based_mqar.yaml), validated.
- `mqar_points(samples)`: one point per model of ours: Zoology's accuracy (`mqar_accuracy`,
  per probe then the mean) averaged over the test-mix cells with equal weight (as the papers
  average their settings), a 95 % interval from a bootstrap over probes within each cell
  (stratified, so every resample keeps the mix), and the bytes held at a question (the
  largest over the mix: a KV cache's at the last query of the longest length, as the papers'
  2·d·L, a recurrent state's at any).
- `recall_state_plot(points, published, path)`: accuracy against state bytes (log2 axis), our
  models with their intervals, the published points beside them (star markers, labelled);
  `published_comparison(points, published, keys)`: our number next to the published one.

The hook that matches a model of ours to a published point is the suite's model entry key
`published` (configs/mqar.yaml: `{name: mqar-gla-d64, spec: ..., published: gla-d64}`); the
runner records it in results.json's `models[name].published`, which the board's identities carry
(`published_keys(board.identities)`). A key not in the published file is an error naming both.
"""
from __future__ import annotations

import math
import re
from pathlib import Path
from typing import Literal, Mapping, Sequence

import numpy as np
import pandas as pd
from matplotlib.figure import Figure
from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

from evalkit import scoring
from evalkit.bootstrap import DEFAULT_BOOTSTRAP, mean_interval, seed_for
from evalkit.leaderboard.load import SCORE_PREFIX
from evalkit.formatting import fmt_bytes, markdown_table
from evalkit.leaderboard.plots import model_colors
from evalkit.yamlfile import read_yaml, repeated

BASED_TEST_MIX: tuple[tuple[int, int], ...] = (
    (64, 4), (64, 8), (64, 16), (128, 32), (256, 64), (512, 128), (1024, 256))
MAX_POINTS = 1000          # published points in one file: a typo beyond that
_ARXIV = r"^\d{4}\.\d{4,5}$"
_DPI = 110


class PublishedError(ValueError):
    """The published-points file is invalid; the message names the file and the field."""


class PublishedPoint(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)
    key: str = Field(pattern=r"^[a-z0-9][a-z0-9._-]*$")   # what a model's `published` names
    label: str = Field(min_length=1)
    mixer: Literal["gla", "attention", "sliding_window", "based", "conv", "mamba", "other"]
    d_model: int | None = Field(default=None, gt=0)
    state_bytes: float | None = Field(default=None, gt=0)  # None: no fixed state (a KV cache)
    accuracy: float = Field(ge=0, le=1)
    approximate: bool = True                               # read off a figure
    source: str = Field(pattern=_ARXIV)                    # arXiv id
    note: str = ""


class PublishedSet(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)
    name: str = Field(min_length=1)
    description: str = ""
    test_mix: tuple[tuple[int, int], ...] = Field(min_length=1)  # (length, pairs) averaged
    sources: dict[str, str] = Field(min_length=1)                # arXiv id -> title
    points: tuple[PublishedPoint, ...] = Field(min_length=1, max_length=MAX_POINTS)

    @model_validator(mode="after")
    def _consistent(self) -> "PublishedSet":
        dup = repeated([p.key for p in self.points])
        if dup:
            raise ValueError(f"points: key(s) {dup} appear more than once")
        bad = [s for s in self.sources if not re.match(_ARXIV, s)]
        if bad:
            raise ValueError(f"sources: {bad} are not arXiv ids (like 2402.18668)")
        unlisted = sorted({p.source for p in self.points} - set(self.sources))
        if unlisted:
            raise ValueError(f"points cite {unlisted}, which `sources` does not list")
        return self

    def get(self, key: str) -> PublishedPoint:
        for p in self.points:
            if p.key == key:
                return p
        raise KeyError(key)


def load_published(path: str | Path) -> PublishedSet:
    """The published points of `path`, validated; errors name the file and the field."""
    path = Path(path)
    raw = read_yaml(path, PublishedError, "published-points file")
    try:
        return PublishedSet.model_validate(raw)
    except ValidationError as e:
        lines = [f"{path}: field {'.'.join(map(str, err['loc'])) or '(top)'}: {err['msg']} "
                 f"(got {err.get('input')!r})" for err in e.errors()]
        raise PublishedError("\n".join(lines)) from None


# -- our points ------------------------------------------------------------------------------

def _label_col(samples: pd.DataFrame) -> str:
    return "model_label" if "model_label" in samples else "model"


def _cell_probe_means(g: pd.DataFrame, col: str) -> np.ndarray:
    """Zoology's per-example accuracy of one cell (scoring.probe_means: the one definition)."""
    return np.asarray(scoring.probe_means(list(zip(g["probe_hash"], g[col]))))


def mqar_points(samples: pd.DataFrame, *, task: str = "mqar",
                cells: Sequence[tuple[int, int]] = BASED_TEST_MIX,
                n_boot: int = DEFAULT_BOOTSTRAP, seed: int = 0) -> pd.DataFrame:
    """One row per model that answered every cell of `cells` on `task`: model, accuracy,
    lo, hi (95 %), state_bytes, state_kind, n_probes, per_cell ({"L/n": accuracy}).
    Models missing a cell are left out (their average would be over another mix)."""
    col = SCORE_PREFIX + scoring.MQAR_METRIC
    cols = ["model", "accuracy", "lo", "hi", "state_bytes", "state_kind", "n_probes", "per_cell"]
    if col not in samples:
        return pd.DataFrame(columns=cols)
    s = samples[(samples["task"] == task) & samples["scored"] & samples[col].notna()]
    label = _label_col(s)
    out = []
    for model, g in s.groupby(label, sort=True):
        by_cell = {c: cg for c, cg in g.groupby(["target_length", "load"])}
        if any(tuple(c) not in by_cell for c in cells):
            continue
        means = [_cell_probe_means(by_cell[tuple(c)], col) for c in cells]
        lo, hi = mean_interval(means, n_boot, seed_for(seed, "mqar_points", model, task))
        out.append({
            "model": model, "accuracy": float(np.mean([m.mean() for m in means])),
            "lo": lo, "hi": hi,
            # the most held at any question of the mix: a recurrent state's (constant), a KV
            # cache's near the longest length (the papers' 2·d·L), a memory's at its fullest
            "state_bytes": float(max(by_cell[tuple(c)]["state_bytes"].max() for c in cells)),
            "state_kind": g["state_kind"].mode().iat[0],
            "n_probes": int(sum(len(m) for m in means)),
            "per_cell": {f"{L}/{n}": float(m.mean()) for (L, n), m in zip(cells, means)}})
    return pd.DataFrame(out, columns=cols)


def published_keys(identities: Mapping[str, Mapping]) -> dict[str, str]:
    """model label -> published key, from the identities (results.json `models`) that have one."""
    return {m: str(i["published"]) for m, i in identities.items() if i and i.get("published")}


# -- the headline plot -----------------------------------------------------------------------

_KIND_MARKER = {"recurrent": "o", "kv": "s", "kv-window": "D", "memory": "^"}


def recall_state_plot(points: pd.DataFrame, published: PublishedSet | None, path: Path,
                      title: str = "MQAR: accuracy vs. state bytes") -> Path | None:
    """Accuracy (Based test mix) against state bytes, log2 x axis. Ours: coloured markers
    with 95 % intervals, labelled; published: black stars (or a dashed level line for a
    point without a state size), labelled "(published)". None when we have no point."""
    ours = points[points["state_bytes"] > 0] if len(points) else points
    if ours.empty:
        return None
    colors = model_colors(ours["model"].unique())
    fig = Figure(figsize=(7.4, 4.8), layout="constrained")
    ax = fig.subplots()
    # a label goes below its point, or above when the point just before it (in state) is close
    # in both bytes and accuracy and labelled below: neighbours' labels never run together
    prev, below = None, True
    for _, r in ours.sort_values("state_bytes").iterrows():
        near = prev is not None and (r["state_bytes"] < 2.5 * prev["state_bytes"]
                                     and abs(r["accuracy"] - prev["accuracy"]) < 0.03)
        below = not (near and below)
        prev = r
        yerr = [[r["accuracy"] - r["lo"]], [r["hi"] - r["accuracy"]]]
        ax.errorbar([r["state_bytes"]], [r["accuracy"]], yerr=yerr, capsize=3, ms=6,
                    fmt=_KIND_MARKER.get(r["state_kind"], "o"), color=colors[r["model"]],
                    label=f"{r['model']} ({r['state_kind']})", zorder=3)
        ax.annotate(r["model"], (r["state_bytes"], r["accuracy"]), textcoords="offset points",
                    xytext=(5, -10 if below else 5), fontsize=6, color=colors[r["model"]])
    xs = list(ours["state_bytes"])
    for p in (published.points if published else ()):
        tag = f"{p.label} (published, arXiv {p.source})"
        if p.state_bytes is None:
            ax.axhline(p.accuracy, color="black", ls="--", lw=0.8, label=tag, zorder=1)
            continue
        xs.append(p.state_bytes)
        ax.scatter([p.state_bytes], [p.accuracy], marker="*", s=120, facecolors="none",
                   edgecolors="black", linewidths=1.1, label=tag, zorder=4)
        ax.annotate(f"{p.key} (pub.)", (p.state_bytes, p.accuracy), textcoords="offset points",
                    xytext=(5, 4), fontsize=6)
    ax.set_xscale("log", base=2)
    lo, hi = math.floor(math.log2(min(xs))) - 1, math.ceil(math.log2(max(xs))) + 1
    ticks = [2.0 ** k for k in range(lo, hi + 1, max(1, (hi - lo) // 10))]
    ax.set_xticks(ticks, [fmt_bytes(t) for t in ticks], fontsize=7)
    ax.minorticks_off()
    ax.set_ylim(-0.03, 1.06)
    ax.set_xlabel("state bytes at the question (fp32; KV cache at the longest test length), log2")
    ax.set_ylabel("MQAR accuracy (Zoology), test-mix mean")
    ax.set_title(title, fontsize=10)
    ax.legend(fontsize=6, loc="lower right")
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=_DPI)
    return path


# -- ours next to the published numbers ------------------------------------------------------

def published_comparison(points: pd.DataFrame, published: PublishedSet,
                         keys: Mapping[str, str]) -> pd.DataFrame:
    """One row per model of ours that names a published point (`keys`: model -> key):
    ours with its interval, the published value, ours minus published, both state sizes."""
    known = [p.key for p in published.points]
    rows = []
    by_model = {r["model"]: r for _, r in points.iterrows()}
    for model, key in sorted(keys.items()):
        if key not in known:
            raise ValueError(f"model {model!r}: published key {key!r} is not in {published.name} "
                             f"(known: {', '.join(known)})")
        r = by_model.get(model)
        if r is None:  # no complete test mix for this model: nothing to set beside it
            continue
        p = published.get(key)
        rows.append({"model": model, "published": key, "ours": r["accuracy"], "ours_lo": r["lo"],
                     "ours_hi": r["hi"], "published_accuracy": p.accuracy,
                     "difference": r["accuracy"] - p.accuracy,
                     "ours_state_bytes": r["state_bytes"],
                     "published_state_bytes": p.state_bytes, "source": p.source,
                     "approximate": p.approximate})
    return pd.DataFrame(rows, columns=[
        "model", "published", "ours", "ours_lo", "ours_hi", "published_accuracy", "difference",
        "ours_state_bytes", "published_state_bytes", "source", "approximate"])


def comparison_markdown(table: pd.DataFrame) -> str:
    """The comparison as a Markdown table ("≈" marks a value read off a figure)."""
    head = ["model", "published as", "ours [95 % CI]", "published", "ours − published",
            "our state", "published state", "source"]
    rows = [[r["model"], r["published"], f"{r['ours']:.3f} [{r['ours_lo']:.3f}, {r['ours_hi']:.3f}]",
             ("≈ " if r["approximate"] else "") + f"{r['published_accuracy']:.2f}",
             f"{r['difference']:+.3f}", fmt_bytes(r["ours_state_bytes"]),
             fmt_bytes(r["published_state_bytes"]), f"arXiv {r['source']}"]
            for _, r in table.iterrows()]
    return markdown_table(head, rows) + "\n"


# -- the board's hook (evalkit.leaderboard.publish.draw_plots) -------------------------------

SECTION = "MQAR: accuracy vs. state bytes, beside the published points"
DEFAULT_PUBLISHED = Path(__file__).resolve().parents[2] / "configs" / "published" / "based_mqar.yaml"


def board_figure(samples: pd.DataFrame, path: Path,
                 published_path: Path = DEFAULT_PUBLISHED) -> Path | None:
    """The headline plot of a board whose runs hold the whole Based test mix of `mqar` (None
    otherwise). The published points are drawn when the file is there (a source checkout)."""
    points = mqar_points(samples)
    if points.empty:
        return None
    published = load_published(published_path) if published_path.is_file() else None
    return recall_state_plot(points, published, path)


def board_table(samples: pd.DataFrame, identities: Mapping[str, Mapping],
                published_path: Path = DEFAULT_PUBLISHED) -> str:
    """The README's comparison under the headline plot: each model whose identity names a
    published point (suite key `published`) beside that point; a note when none does."""
    if not published_path.is_file():
        return ""
    points = mqar_points(samples)
    keys = {m: k for m, k in published_keys(identities).items() if m in set(points["model"])}
    if not keys:
        return ("No model here names a published point (give its suite entry "
                "`published: <key>`, keys in configs/published/based_mqar.yaml).\n\n")
    table = published_comparison(points, load_published(published_path), keys)
    return ("Ours next to the published values (Zoology's accuracy, mean over the Based test "
            "mix; ≈: read off the paper's figure; our interval: bootstrap over probes):\n\n"
            + comparison_markdown(table) + "\n")
