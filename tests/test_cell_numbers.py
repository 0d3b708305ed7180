"""One definition of a cell's numbers (issue 59, findings 1, 2 and 14; evalkit.cell_stats), held
by every output a served run reaches: samples.jsonl -> results.json, and `evalkit publish` ->
results.csv, results.json, README (the recall tables, effective length, the served section) and
index.html. n counts every sample attempted; a failure is a miss in recall (recall over the
answered beside it); the response-time percentiles take a failure at its time to failure, p99
only from 100 response times (absent below, never NaN); a request never sent has no response
time; `sustained` counts the time failures held their slot.

As the review did it: `OneSlot` (test_served_runner.py), a small OpenAI-compatible server on
127.0.0.1 that answers right (it copies the needle) or fails the requests the test scripts,
with the real served adapter, client, runner and publish."""
from __future__ import annotations

import csv
import json
import re
from pathlib import Path

import numpy as np
import yaml

from evalkit.cli import main as evalkit_main
from test_served_runner import OneSlot, run, suite_file

LABEL = "fake @ unloaded, 1 in flight"


def _suite(tmp: Path, url: str, *, forced_choice: bool = True, **kw) -> Path:
    path = suite_file(tmp, url, concurrency=1, **kw)
    cfg = yaml.safe_load(path.read_text())
    cfg["models"][0]["forced_choice"] = forced_choice
    path.write_text(yaml.safe_dump(cfg))
    return path


def _publish(run_dir: Path, board: Path) -> dict:
    assert evalkit_main(["publish", str(run_dir), "--to", str(board)]) == 0
    readme = (board / "README.md").read_text()
    html = (board / "index.html").read_text()
    page = json.loads(re.search(r'<script type="application/json" id="board-data">(.*?)'
                                r"</script>", html, re.S).group(1).replace("<\\/", "</"))
    with open(board / "results.csv", newline="") as f:
        rows = list(csv.DictReader(f))
    return {"csv": rows, "json": json.loads((board / "results.json").read_text()),
            "readme": readme, "page": page}


def _served(readme: str) -> dict[str, dict[str, str]]:
    """The served section's response-time table: length -> {column: cell}, for LABEL."""
    section = readme[readme.index("## Served models"):]
    section = section[:section.index("\n### ")]
    lines = [[c.strip() for c in l.strip("|").split("|")] for l in section.splitlines()
             if l.startswith("| ")]
    head = lines[0]
    return {r[2]: dict(zip(head, r)) for r in lines[2:] if r[0] == LABEL}


def _results_row(run_dir: Path, length: int) -> dict:
    res = json.loads((run_dir / "results.json").read_text())
    [row] = [r for r in res["rows"] if r["target_length"] == length]
    return row


def test_a_failed_request_is_a_miss_and_a_time_in_every_output(tmp_path):
    """1 of 4 requests fails (a 503 after 0.6 s, the slowest request): recall is 0.75 in
    results.json, results.csv, the board's results.json, the recall table, the served
    section and the page, with 1.00 over the answered beside it; effective length is no
    longer ">= 64"; p50 / p95 include the failure's time; p99 is absent (n < 100). The
    review saw 1.00 (n=3, 1 failed), ">= 256", and a p99 from 3 samples."""
    with OneSlot(0.05, fault=lambda n: (503, 0.6) if n == 2 else None) as srv:
        rc, samples = run(_suite(tmp_path, srv.url, samples=4, lengths=(64,), depths=(0.5,)),
                          tmp_path / "run")
    assert rc == 1 and len(samples) == 4
    [bad] = [s for s in samples if s["error"]]
    assert bad["error_cause"] == "http_5xx" and bad["attempts"] == 1
    assert all(s["scores"]["exact_match"] == 1.0 for s in samples if not s["error"])
    times = [s["latency_s"] for s in samples]
    answered = [s["latency_s"] for s in samples if not s["error"]]
    p50, p95 = np.percentile(times, 50), np.percentile(times, 95)
    assert bad["latency_s"] >= 0.6 > max(answered)  # so p95 moves with the failure
    assert p95 > max(answered)

    row = _results_row(tmp_path / "run", 64)  # the runner's results.json
    assert (row["n"], row["n_failed"], row["n_flagged"]) == (4, 1, 0)
    for m in ("exact_match", "contains"):
        assert row["metrics"][m]["n"] == 4 and row["metrics"][m]["mean"] == 0.75
        assert row["metrics"][m]["answered"] == 1.0
    assert row["metrics"]["exact_match"]["hi"] < 1.0  # the interval is over the 4, a miss in it

    out = _publish(tmp_path / "run", tmp_path / "board")
    [c] = out["csv"]
    assert (c["n"], c["n_failed"], c["n_flagged"]) == ("4", "1", "0")
    assert float(c["recall"]) == 0.75 and float(c["exact_match"]) == 0.75
    assert float(c["recall_answered"]) == 1.0
    assert np.isclose(float(c["latency_p50_s"]), p50) and np.isclose(float(c["latency_p95_s"]),
                                                                     p95)
    assert c["latency_p99_s"] == ""  # n = 4 < 100: no p99, not NaN
    [j] = out["json"]["rows"]
    assert j["recall"] == 0.75 and j["n"] == 4 and j["latency_p99_s"] is None
    assert np.isclose(j["latency_p95_s"], p95)
    [bl] = out["json"]["by_length"]
    assert bl["recall"] == 0.75 and bl["n"] == 4
    [eff] = out["json"]["effective_length"]
    assert eff["effective_length"] is None and eff["censored"] == "below"  # 0.75 < 0.85

    readme = out["readme"]
    assert f"| {LABEL} | unknown | 0.75 [" in readme and "(n=4, 1 failed)" in readme
    assert f"| {LABEL} | needle | < 64 |" in readme  # effective length: not "≥ 64"
    s = _served(readme)["64"]
    assert s["n"] == "4" and s["failures"] == "1 (http_5xx 1)"
    assert s["recall"].startswith("0.75 [") and s["recall answered"].startswith("1.00 [")
    assert s["response p50"] == f"{p50:.2f}" and s["response p99"] == f"max {max(times):.2f}"

    [pr] = out["page"]["rows"]
    assert pr["recall"] == 0.75 and pr["n"] == 4 and pr["n_failed"] == 1
    [ps] = out["page"]["state"]
    assert ps["recall"] == 0.75 and ps["n"] == 4


def test_a_served_run_where_every_sample_failed_publishes_a_board_of_its_failures(tmp_path,
                                                                                   capsys):
    """Every request fails (finding 14: publish exited 2 with a pandas KeyError): the board
    lists the failures by cause, recall 0 over n = every sample, nothing over the answered."""
    with OneSlot(0.01, fault=lambda n: (503, 0.05)) as srv:
        rc, samples = run(_suite(tmp_path, srv.url, samples=2, depths=(0.5,)), tmp_path / "run")
    assert rc == 1 and len(samples) == 4 and all(s["error_cause"] == "http_5xx" for s in samples)
    capsys.readouterr()
    out = _publish(tmp_path / "run", tmp_path / "board")
    assert "Error" not in capsys.readouterr().err
    wm = _results_row(tmp_path / "run", 64)["metrics"]["exact_match"]
    assert (wm["mean"], wm["lo"], wm["n"], wm["answered"]) == (0.0, 0.0, 2, None)
    assert [(r["target_length"], r["n"], r["n_failed"], float(r["recall"]), r["recall_answered"])
            for r in out["csv"]] == [("64", "2", "2", 0.0, ""), ("128", "2", "2", 0.0, "")]
    served = _served(out["readme"])
    for length in ("64", "128"):
        s = served[length]
        assert (s["n"], s["failures"], s["recall answered"]) == ("2", "2 (http_5xx 2)", "—")
        assert s["recall"].startswith("0.00 [")
    assert out["readme"].count("(n=2, 2 failed)") >= 2
    assert "NaN" not in json.dumps(out["json"]) and "NaN" not in json.dumps(out["page"])


def test_a_request_never_sent_counts_in_n_but_has_no_response_time(tmp_path):
    """The server's max_model_len is 64: a 64-token prompt leaves no room to answer, so its
    request is refused before it is sent (a failure, cause "other", no attempt). It is a miss
    in n and recall, but its few milliseconds are no response time: the 64-token cell has no
    percentile anywhere, while the 48-token cell, answered, has its own."""
    with OneSlot(0.02) as srv:
        srv.models = [{"id": "fake", "max_model_len": 64}]
        rc, samples = run(_suite(tmp_path, srv.url, samples=2, lengths=(48, 64), depths=(0.5,)),
                          tmp_path / "run")
    assert rc == 1 and len(samples) == 4
    never = [s for s in samples if s["target_length"] == 64]
    assert all("leaves no room to answer" in s["error"] and s["attempts"] is None
               and s["error_cause"] == "other" and s["latency_s"] > 0 for s in never), never
    assert all(s["error"] is None for s in samples if s["target_length"] == 48)
    assert len(srv.greedy) == 2  # only the 48-token requests reached the server

    row = _results_row(tmp_path / "run", 64)
    assert (row["n"], row["n_failed"]) == (2, 2) and row["metrics"]["exact_match"]["mean"] == 0.0
    out = _publish(tmp_path / "run", tmp_path / "board")
    by_len = {r["target_length"]: r for r in out["csv"]}
    assert (by_len["64"]["n"], by_len["64"]["n_failed"], float(by_len["64"]["recall"])) == (
        "2", "2", 0.0)
    assert [by_len["64"][f"latency_p{q}_s"] for q in (50, 95, 99)] == ["", "", ""]
    answered = [s["latency_s"] for s in samples if s["target_length"] == 48]
    assert np.isclose(float(by_len["48"]["latency_p50_s"]), np.percentile(answered, 50))
    served = _served(out["readme"])
    assert (served["64"]["n"], served["64"]["failures"]) == ("2", "2 (other 2)")
    assert served["64"]["response p50"] == served["64"]["response p99"] == "—"
    assert served["48"]["response p50"] == f"{np.percentile(answered, 50):.2f}"


def test_p99_from_100_response_times_includes_the_failure(tmp_path):
    """100 requests, the 50th failing after 0.5 s (the slowest): results.csv's p99 is the
    99th percentile of all 100 response times, the failure's among them, and the served
    section shows it as a p99, not a maximum."""
    with OneSlot(0.0, fault=lambda n: (503, 0.5) if n == 50 else None) as srv:
        rc, samples = run(_suite(tmp_path, srv.url, forced_choice=False, samples=100,
                                 lengths=(64,), depths=(0.5,)), tmp_path / "run")
    assert rc == 1 and len(samples) == 100 and sum(bool(s["error"]) for s in samples) == 1
    times = [s["latency_s"] for s in samples]
    p99 = float(np.percentile(times, 99))
    assert p99 > max(s["latency_s"] for s in samples if not s["error"])
    out = _publish(tmp_path / "run", tmp_path / "board")
    [c] = out["csv"]
    assert c["n"] == "100" and float(c["recall"]) == 0.99
    assert np.isclose(float(c["latency_p99_s"]), p99)
    assert _served(out["readme"])["64"]["response p99"] == f"{p99:.2f}"


def test_sustained_counts_the_time_failures_held_their_slot(tmp_path):
    """A closed loop of 1 where every fourth request fails after 0.3 s: the loop answered
    n_answered requests in the sum of every response time (the failures held the one slot
    too), so it sustains n_answered / sum(response times) answers per second, not
    1 / mean(answered response time)."""
    from evalkit.leaderboard.sustained import sustained

    with OneSlot(0.02, fault=lambda n: (503, 0.3) if n % 4 == 0 else None) as srv:
        rc, samples = run(_suite(tmp_path, srv.url, forced_choice=False, samples=8,
                                 lengths=(64,)), tmp_path / "run")
    assert rc == 1 and len(samples) == 16 and sum(bool(s["error"]) for s in samples) == 4
    rate, said = sustained(tmp_path / "run", "fake")
    n_ok = sum(not s["error"] for s in samples)
    expected = n_ok / sum(s["latency_s"] for s in samples)
    assert np.isclose(rate, expected, rtol=1e-9), (rate, expected)
    assert "12 answered, 4 failed" in said, said


def test_a_failure_misses_exactly_the_metrics_an_answer_would_have_had():
    """cell_stats.miss_scores against the scorer itself (scoring.score_sample, as the runner
    calls it: forced choice when the model has it on and the question two candidates or
    more), for every question kind a registered metric names and the kinds none does."""
    from evalkit import scoring
    from evalkit.cell_stats import miss_scores

    kinds = {"recall", "latest", None} | {k for m in scoring.METRICS.values()
                                           for k in m.question_kinds}
    for kind in kinds:
        for n_candidates in (0, 1, 2, 3):
            for fc in (True, False):
                logprobs = [-1.0] * n_candidates if fc and n_candidates >= 2 else None
                answered = scoring.score_sample("4821", ["4821"], logprobs, kind)
                assert miss_scores(kind, n_candidates, fc) == dict.fromkeys(answered, 0.0), (
                    kind, n_candidates, fc)


def test_a_response_time_or_attempt_count_that_is_no_number_is_refused_by_line(tmp_path,
                                                                                 capsys):
    """samples.jsonl's latency_s and attempts are what a cell's response times are read from:
    a string, a negative or non-finite time, or a fractional attempt count is refused, naming
    the file, line and field (not a pandas error, nor a NaN percentile)."""
    from helpers import restamp

    with OneSlot(0.01) as srv:
        rc, _ = run(_suite(tmp_path, srv.url, samples=1, lengths=(64,), depths=(0.5,)),
                    tmp_path / "run")
    assert rc == 0
    spath = tmp_path / "run" / "samples.jsonl"
    good = spath.read_text()
    for field, value, says in [("latency_s", "0.5", "latency_s = '0.5' is not a finite number"),
                               ("latency_s", -1.0, "latency_s = -1.0 is not a finite number"),
                               ("latency_s", float("inf"), "latency_s = inf is not a finite"),
                               ("attempts", 1.5, "attempts = 1.5 is not a whole number")]:
        row = json.loads(good.splitlines()[0])
        row[field] = value
        spath.write_text(json.dumps(row) + "\n")
        restamp(tmp_path / "run")
        capsys.readouterr()
        assert evalkit_main(["publish", str(tmp_path / "run"), "--to",
                             str(tmp_path / "board")]) == 2
        err = capsys.readouterr().err
        assert f"{spath}:1: {says}" in err and "Traceback" not in err, err
