"""The board's served section: recall and response time side by side for models behind a
server, under each load (closed loop with C in flight, unloaded = 1 in flight, or open-loop
`--arrivals`), by task and length (pooled over depth and load). The definitions are the load
tester's (DESIGN.md, "Serving engines"):

Every number follows evalkit.cell_stats, as the board's other tables and results.csv do:
- n: samples attempted (answered + failed); flagged samples (over-length) were never sent and
  are not here.
- failures: failed requests by cause (timeout, connect, http_5xx, http_4xx, bad_response,
  other); a failure is a miss in "recall" (the board's recall), and left out of "recall
  answered".
- response time: from when the request was due (its arrival) to its last token, across
  retries; a failed request counts at its failure when it reached the server (attempts >= 1),
  a request never sent has none. p99 needs at least MIN_P99 response times; below that the
  maximum is shown, marked "max" (results.csv leaves latency_p99_s empty there).
- service: from the first send to the last token; TTFT: to the first streamed token;
  attempts: requests sent per sample (1 + retries), mean and maximum.
- numerical tolerance (per model and load): the served answers against the in-process model
  on the same probes (the board's one unserved model with those probes at the same prompt
  token counts, i.e. the same tokenizer; none shown where several qualify): greedy answers that differ, and the largest |served minus
  in-process| forced-choice log-probability where the served run scored candidates.
- goodput (per model and load, every task together): correct answers (primary recall 1) within
  the response-time objective (`evalkit publish --slo S`), per second of the run's span. Open
  loop: the span runs from the schedule's start to the last answer (max of due + response).
  Closed loop of C: the span is sum(response) / C (Little's law), exact only when a sample is
  one request; with forced choice on it also sent scoring requests after its answer, so its
  span is unknown ("—"). vLLM's own `bench serve --goodput` counts requests within a latency
  objective; this counts right answers within it.

Runs made before response times were recorded timed their latency from the send: it is shown
as service time, and their response time is "—" (named below the table), never passed off as
one from the arrival.
"""
from __future__ import annotations

import math
from collections import Counter

import pandas as pd

from evalkit.cell_stats import MIN_P99, percentiles
from evalkit.formatting import fmt_interval, fmt_len, markdown_table
from evalkit.leaderboard.load import SCORE_PREFIX
from evalkit.leaderboard.tables import aggregate

DEFAULT_SLO_S = 10.0
MAX_SLO_S = 86_400.0
KEY = ["model_label", "task_label", "target_length"]
HEADER = ["model", "task", "length (tok)", "n", "failures", "recall", "recall answered",
          "response p50", "response p99", "service p50", "TTFT p50", "attempts"]


def served_rows(samples: pd.DataFrame) -> tuple[list[list[str]], list[str]]:
    """(table rows, notes under the table) for the served samples of `samples`, which carry
    the primary metric as score.recall (tables.with_primary)."""
    sent = samples[samples["served"] & samples["scored"]]  # attempted: answered or failed
    if sent.empty:
        return [], []
    recall = _by_key(sent)  # a failure is a miss (load.py gave it its misses)
    answered = _by_key(sent[sent["answered"]])
    rows, old, capped, shared = [], [], [], []
    for key, g in sent.groupby(KEY, sort=True):
        label, task, length = key
        where = f"{label} | {task} | {fmt_len(int(length))}"
        bad = g["error"].notna()
        ok = g[~bad]
        new = ok["service_s"].notna()  # else a run from before response times were recorded
        causes = Counter(g.loc[bad, "error_cause"].fillna("unrecorded"))
        response = g["response_s"]  # cell_stats.response_time: none for a request never sent
        if not new.all():
            old.append(where)
        waited = int((g["queue_s"].fillna(0) > 0).sum())
        if waited:
            capped.append(f"{where}: {waited}")
        if g["shards"].max() > 1:
            shared.append(label)
        attempts = g["attempts"].dropna().astype(float)
        rows.append([
            label, task, fmt_len(int(length)), str(len(g)),
            f"{int(bad.sum())}" + (" (" + ", ".join(f"{c} {k}" for c, k in sorted(
                causes.items())) + ")" if causes else ""),
            _recall(recall, key), _recall(answered, key), _q(response, 50), _p99(response),
            _q(ok["service_s"].where(new, ok["latency_s"]), 50), _q(ok["ttft_s"], 50),
            f"{attempts.mean():.2f} (max {int(attempts.max())})" if len(attempts) else "—"])
    notes = []
    if old:
        notes.append("Response time not recorded (runs made before it was; their latency is "
                     "timed from the send and shown as service): " + "; ".join(old) + ".")
    if capped:
        notes.append("Requests sent late because the cap on open requests was reached (the "
                     "load was not fully open): " + "; ".join(capped) + ".")
    for label in dict.fromkeys(shared):
        notes.append(f"{label}: the run was split into shards (--shard I/N); each shard "
                     f"sent its part of one schedule, so together they offered the load named.")
    return rows, notes


GOODPUT_HEADER = ["model", "requests", "correct", "correct within objective", "span (s)",
                  "goodput (/s)", "offered (/s)"]


def check_slo(slo_s: float) -> float:
    if not (isinstance(slo_s, (int, float)) and math.isfinite(slo_s) and 0 < slo_s <= MAX_SLO_S):
        raise ValueError(f"--slo {slo_s!r}: expected a response-time objective in seconds, "
                         f"in (0, {MAX_SLO_S:g}]")
    return float(slo_s)


def goodput_rows(samples: pd.DataFrame, slo_s: float) -> list[list[str]]:
    """One row per served model and load (see the module docstring)."""
    sent = samples[samples["served"] & samples["scored"]]
    rows = []
    for label, g in sent.groupby("model_label", sort=True):
        ok = g["error"].isna() & (g[SCORE_PREFIX + "recall"] == 1.0)
        good = ok & (g["latency_s"] <= slo_s)
        load = str(g["arrivals"].iloc[0]) if g["arrivals"].nunique() == 1 else ""
        span = _span(g, load)
        offered = load.split(":", 1)[1].removesuffix("/s") if load.startswith("poisson:") else "—"
        rows.append([label, str(len(g)), str(int(ok.sum())), str(int(good.sum())),
                     "—" if span is None else f"{span:.1f}",
                     "—" if span is None else f"{good.sum() / span:.3g}", offered])
    return rows


TOLERANCE_HEADER = ["model", "in-process reference", "pairs", "answers differ",
                    "max |Δ log p| (pairs scored)"]


def tolerance_rows(samples: pd.DataFrame) -> list[list[str]]:
    """One row per served model and load: its answers against the in-process reference."""
    key = ["task", "probe_hash", "question"]
    rows = []
    local = samples[~samples["served"]]
    for label, g in samples[samples["served"]].groupby("model_label", sort=True):
        refs = [m for m, h in local.groupby("model_label") if _same_probes(g, h, key)]
        if len(refs) != 1:
            continue  # no in-process twin here, or several: nothing to say which
        h = local[local["model_label"] == refs[0]]
        both = g[g["answered"]].merge(h[h["answered"]], on=key, suffixes=("", "_ref"))
        if both.empty:
            continue
        differ = int((both["prediction"] != both["prediction_ref"]).sum())
        deltas = [abs(a - b) for x, y in zip(both["candidate_logprobs"],
                                             both["candidate_logprobs_ref"])
                  if x and len(x) == len(y) for a, b in zip(x, y)]
        scored = sum(1 for x in both["candidate_logprobs"] if x)
        rows.append([label, refs[0], str(len(both)), str(differ),
                     f"{max(deltas):.2e} ({scored})" if deltas else "— (forced choice off)"])
    return rows


def _same_probes(served: pd.DataFrame, local: pd.DataFrame, key: list[str]) -> bool:
    a = served.set_index(key)["prompt_tokens"]
    b = local.set_index(key)["prompt_tokens"]
    common = a.index.intersection(b.index)
    return len(common) > 0 and bool((a[common] == b[common]).all())


def _span(g: pd.DataFrame, load: str) -> float | None:
    """Seconds the load ran for, or None where the samples cannot say."""
    lat = g["latency_s"].astype(float)
    if not len(g) or not lat.notna().all():
        return None
    if load.startswith(("poisson:", "trace:")) and g["due_s"].notna().all():
        span = float((g["due_s"].astype(float) + lat).max())
    elif load.startswith("closed:") and load[len("closed:"):].isdigit() and \
            (g["requests"] == 1).all() and g["shards"].max() == 1:
        span = float(lat.sum()) / int(load[len("closed:"):])
    else:
        return None
    return span if math.isfinite(span) and span > 0 else None


def served_section(samples: pd.DataFrame, slo_s: float = DEFAULT_SLO_S) -> str:
    """Markdown, or "" when no served model is on the board."""
    rows, notes = served_rows(samples)
    if not rows:
        return ""
    slo_s = check_slo(slo_s)
    return ("## Served models: recall and response time\n\n"
            "Models evaluated behind an inference server (`served:URL`), under the load after "
            "`@`: a closed loop keeps C requests in flight (1: unloaded); `poisson:R/s` and "
            "`trace:` send each request when it is due, whatever is in flight (open loop). n: "
            "samples attempted (answered + failed); failures by cause. Recall: mean primary "
            "recall [95 % interval] with failures as misses, as in every table of this board; "
            "recall answered: over the answered requests only. Seconds: response = from when "
            "the request was due to its last token, across retries (failures at their failure; "
            "a request never sent has none); p99 from "
            f"{MIN_P99} response times, else the maximum (marked max); service = first send to last token; TTFT = to the first streamed "
            "token; attempts = requests sent per sample, mean (max). Times are this machine's "
            "and this server's, not the model's.\n\n"
            + markdown_table(HEADER, rows) + "\n"
            + "".join(f"{n}\n\n" for n in notes)
            + _tolerance(samples)
            + f"### Goodput: correct answers within {slo_s:g} s\n\n"
            "Per served model and load, every task together: correct = primary recall 1 "
            f"(failures are not); within objective = correct with a response time ≤ {slo_s:g} s "
            "(`evalkit publish --slo S`); span = the schedule's start to its last answer "
            "(open loop), or the sum of response times / C (closed loop of C, where each "
            "sample was one request; — where it also sent scoring requests); goodput = "
            "correct within the objective per second of span; offered = the open loop's "
            "rate.\n\n"
            + markdown_table(GOODPUT_HEADER, goodput_rows(samples, slo_s)) + "\n")


def _tolerance(samples: pd.DataFrame) -> str:
    rows = tolerance_rows(samples)
    if not rows:
        return ""
    return ("### Numerical tolerance: served against in-process\n\n"
            "Per served model and load, on the same probes as the in-process model (same "
            "tokenizer): pairs answered by both, greedy answers that differ, and the "
            "largest |served − in-process| forced-choice log-probability over the candidates "
            "of the pairs scored served (in brackets). Batched kernels need not be bit-exact; "
            "a changed answer is named in the drift reports below.\n\n"
            + markdown_table(TOLERANCE_HEADER, rows) + "\n\n")


def _by_key(samples: pd.DataFrame) -> pd.DataFrame:
    """Recall per KEY (tables.aggregate), indexed by KEY; empty (no row) without samples."""
    if samples.empty:
        return pd.DataFrame(columns=["n", "recall"],
                            index=pd.MultiIndex.from_tuples([], names=KEY))
    return aggregate(samples, KEY, ["recall"]).set_index(KEY)


def _recall(table: pd.DataFrame, key: tuple) -> str:
    if key not in table.index or not table.loc[key, "n"] or pd.isna(table.loc[key, "recall"]):
        return "—"
    r = table.loc[key]
    return f"{r['recall']:.2f}" + fmt_interval(r)


def _q(values: pd.Series, q: int) -> str:
    """The q-th percentile (cell_stats.percentiles) of `values`, or "—"."""
    got = percentiles(values.dropna().astype(float).tolist())[f"p{q}"]
    return "—" if got is None else f"{got:.2f}"


def _p99(values: pd.Series) -> str:
    xs = values.dropna().astype(float)
    if xs.empty:
        return "—"
    return _q(xs, 99) if len(xs) >= MIN_P99 else f"max {xs.max():.2f}"
