"""The board's served section: recall and latency side by side for models behind a server,
unloaded and under each `--arrivals` load, by task and length (pooled over depth and load).

Latency is the greedy request from its send to its last token; TTFT to its first streamed
token; queue the client-side wait of a request that was due while every slot was busy. All
are percentiles over scored samples; in-process models have none and are not listed.
"""
from __future__ import annotations

import numpy as np
import pandas as pd

from evalkit.formatting import fmt_len, markdown_table
from evalkit.leaderboard.tables import aggregate


def served_rows(samples: pd.DataFrame, primary_recall: pd.DataFrame) -> list[list[str]]:
    s = samples[samples["served"] & samples["scored"]] if "served" in samples else samples[:0]
    out = []
    for (label, task, length), g in s.groupby(["model_label", "task_label", "target_length"],
                                              sort=True):
        rec = primary_recall[(primary_recall["model_label"] == label)
                             & (primary_recall["task_label"] == task)
                             & (primary_recall["target_length"] == length)]
        r = rec.iloc[0] if len(rec) else None
        pct = lambda col, q: _s(np.percentile(g[col].dropna().astype(float), q)
                                if g[col].notna().any() else None)
        out.append([label, task, fmt_len(int(length)), str(len(g)),
                    "—" if r is None else f"{r['recall']:.2f} ± {r['recall_stderr']:.2f}",
                    pct("latency_s", 50), pct("latency_s", 99), pct("ttft_s", 50),
                    pct("queue_s", 99)])
    return out


def served_section(samples: pd.DataFrame) -> str:
    """Markdown, or "" when no served model is on the board."""
    recall = aggregate(samples, ["model_label", "task_label", "target_length"], ["recall"])
    rows = served_rows(samples, recall)
    if not rows:
        return ""
    return ("## Served models: recall and latency\n\n"
            "Models evaluated behind an inference server (`served:URL`), unloaded (requests "
            "sent as fast as `concurrency` allows) and under `--arrivals` (the label after "
            "`@`). Recall: mean primary recall ± standard error, as above. Seconds, over "
            "scored samples: latency = request sent to last token, TTFT = to the first "
            "streamed token, queue = waiting for a free request slot after it was due. "
            "Latencies are this machine's and this server's, not the model's.\n\n"
            + markdown_table(["model", "task", "length (tok)", "n", "recall", "latency p50",
                              "latency p99", "TTFT p50", "queue p99"], rows) + "\n")


def _s(x: float | None) -> str:
    return "—" if x is None else f"{x:.2f}"
