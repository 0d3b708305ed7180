"""The board as one self-contained page: index.html, written by `evalkit publish`.

Everything the page shows is computed here from the Board (the rows of results.csv, the same
aggregates the README uses) and embedded as JSON; the page's own script (page_static/) only
filters, sorts and draws. Plotly's JavaScript is inlined from the pinned `plotly` package at
publish time, so the file opens from disk with no network and no server. The output is a
function of the board alone (no clock): republishing the same runs gives the same bytes.
"""
from __future__ import annotations

import html
import re
from importlib import resources
from typing import Any, Sequence

import pandas as pd

from evalkit import atomic
from evalkit.leaderboard.board import Board, records
from evalkit.leaderboard.readme import how_to_read
from evalkit.leaderboard.tables import aggregate


# results.csv columns the table shows, in order (the page keeps every row, not every metric).
ROW_FIELDS = ["task_label", "model_label", "state_kind", "target_length", "depth", "load",
              "recall", "n", "n_failed", "n_flagged", "state_bytes", "prompt_tokens",
              "primary_metric"]


def _with_interval(df: pd.DataFrame, cols: Sequence[str]) -> list[dict[str, Any]]:
    """`cols` of each row and its recall's 95 % interval as lo, hi (the tables', cell_stats)."""
    return records(df[list(cols) + ["recall_lo", "recall_hi"]].rename(
        columns={"recall_lo": "lo", "recall_hi": "hi"}))


def _pooled(board: Board, axis: str) -> list[dict[str, Any]]:
    """Recall per model x task x length x `axis` (depth or load), pooled over the other."""
    keys = ["model_label", "task_label", "target_length", axis]
    agg = aggregate(board.samples, keys, ["recall"])
    return _with_interval(agg, keys + ["recall", "n", "n_flagged", "n_failed"])


def _provenance(board: Board) -> dict[str, Any]:
    runs = []
    for r in board.merged.runs:
        p = r.provenance if isinstance(r.provenance, dict) else {}
        runs.append({"run_id": r.run_id, "created": r.created.isoformat(),
                     "evalkit_version": r.evalkit_version or "", "config_hash": r.config_hash,
                     "git": p.get("git"), "seeds": p.get("seeds"), "packages": p.get("packages"),
                     "python": p.get("python"), "path": r.path.as_posix()})
    models = []
    for m in sorted(board.identities):
        ident = board.identities[m]
        mh = board.samples.loc[board.samples["model_label"] == m, "model_hash"].iat[0]
        models.append({"model": m, "kind": board.kinds.get(m, ""), "hash": mh,
                       "identity": {k: v for k, v in sorted(ident.items()) if k != "hash"}})
    tasks = [{"task": t, **i} for t, i in sorted(board.tasks.items())]
    return {"runs": runs, "models": models, "tasks": tasks}


def page_data(board: Board, version: str) -> dict[str, Any]:
    """Everything the page draws; NaN becomes null (a cell with nothing scored)."""
    bl = board.by_length
    latest = max(r.created for r in board.merged.runs)
    return {
        "version": version,
        "n_runs": len(board.merged.runs),
        "latest": f"{latest:%Y-%m-%d %H:%M} UTC",
        "kinds": dict(sorted(board.kinds.items())),
        # Models declared kind="reference" (oracle, forgetful: token memories that bound a
        # task): the page hides them by default beside language models.
        "references": sorted(m for m, i in board.identities.items()
                             if i.get("kind") == "reference"),
        "rows": _with_interval(board.rows, ROW_FIELDS),
        "by_depth": _pooled(board, "depth"),
        "by_load": _pooled(board, "load"),
        "state": _with_interval(bl, ["model_label", "task_label", "target_length", "recall", "n",
                                     "state_bytes", "n_flagged", "n_failed"]),
        "gaps": records(board.length_gaps),
        "gap_options": {"n_boot": board.options.n_boot, "seed": board.options.seed},
        "provenance": _provenance(board),
    }


def _static(name: str) -> str:
    return resources.files("evalkit.leaderboard").joinpath("page_static", name).read_text(
        encoding="utf-8")


def _plotly_js() -> str:
    try:
        from plotly.offline import get_plotlyjs
    except ImportError:
        raise RuntimeError("evalkit publish writes index.html with plotly's JavaScript: "
                           "install the pinned plotly (pip install -e .)") from None
    return get_plotlyjs()


def _script(text: str) -> str:
    """Text safe inside <script>: no "</script" can close the element early ("<\\/" reads
    as "</" in JSON and in JavaScript strings)."""
    return re.sub(r"</(script)", r"<\\/\1", text, flags=re.IGNORECASE)


def _definitions(board: Board) -> str:
    """The README's "How to read" section, the one source, as HTML."""
    from markdown_it import MarkdownIt

    md = how_to_read(board.options).split("\n", 1)[1]  # its "## How to read" heading: ours
    return MarkdownIt("commonmark").render(md)


def render_page(board: Board, version: str) -> str:
    parts = {"title": html.escape(f"evalkit leaderboard ({len(board.rows)} rows)"),
             "css": _static("page.css"),
             "definitions": _definitions(board),
             "data": _script(atomic.dumps(page_data(board, version), "index.html")),
             "plotly": _script(_plotly_js()),
             "page_js": _script(_static("page.js"))}
    # One pass: a placeholder-like text inside the data or a script is left alone.
    return re.sub(r"\{\{(\w+)\}\}", lambda m: parts[m.group(1)], _static("page.html"))
