"""Load schedules that mean what their label says (issue 41), against the fake one-slot server
of test_served_runner.py: a resumed run offers its whole schedule again at its due times; shards
send their parts of one schedule; a schedule longer than the cap is refused before anything
is sent, and the expected duration is printed at the start."""
from __future__ import annotations

import subprocess
import sys

import numpy as np

from evalkit.cli import main as evalkit_main
from evalkit.runner.arrivals import parse
from test_served_runner import OneSlot, run, suite_file


def test_resume_offers_the_whole_schedule_again_at_its_due_times(tmp_path, capsys):
    """Three requests are refused (a 400, not retried) in the first invocation; the resume
    offers the whole schedule again (issue 59: the three sent alone met a fraction of the
    load the label names), each request at the due time it had, measured from the resume's
    start."""
    refuse = {2, 5, 7}
    with OneSlot(0.02, fault=lambda n: (400, 0.0) if n in refuse else None) as srv:
        suite = suite_file(tmp_path, srv.url, samples=2, concurrency=1)
        rc, first = run(suite, tmp_path / "run", "--arrivals", "poisson:2")
        assert rc == 1 and sum(bool(r["error"]) for r in first) == 3
        due = {(r["probe_hash"], r["question"]): r["due_s"] for r in first}
        capsys.readouterr()
        srv.fault = lambda n: None
        t0 = srv.greedy[-1]
        rc, again = run(suite, tmp_path / "run", "--arrivals", "poisson:2", "--resume")
        sent = srv.greedy[len(first):]
    assert rc == 0 and len(again) == len(first) and all(r["error"] is None for r in again)
    assert {(r["probe_hash"], r["question"]): r["due_s"] for r in again} == due
    # ... and they went out at them: their spacing is the spacing of their due times
    every = sorted(due.values())
    assert len(sent) == 8 and t0 < sent[0]
    assert np.allclose(np.diff(sent), np.diff(every), atol=0.15), (sent, every)
    err = capsys.readouterr().err
    assert "under poisson:2/s: 8 requests, expected to take" in err and "8 to send here" in err


def test_shards_send_their_parts_of_one_schedule(tmp_path, capsys):
    """--shard 1/2 and 2/2 with poisson:R: together one schedule of rate R (their due times
    are its offsets, each once), not two copies of it; the merged board says so."""
    with OneSlot(0.02) as srv:
        suite = suite_file(tmp_path, srv.url, samples=2, concurrency=1)
        parts = [run(suite, tmp_path / f"s{i}", "--arrivals", "poisson:2", "--shard", f"{i}/2")
                 for i in (1, 2)]
    assert [rc for rc, _ in parts] == [0, 0]
    times = [sorted(r["due_s"] for r in rows) for _, rows in parts]
    assert all(len(t) == 4 for t in times)
    assert sorted(times[0] + times[1]) == parse("poisson:2").offsets(8, seed=0)
    assert "(shard 2/2: its part)" in capsys.readouterr().err
    assert evalkit_main(["publish", str(tmp_path / "s1"), str(tmp_path / "s2"),
                         "--to", str(tmp_path / "board")]) == 0
    readme = (tmp_path / "board" / "README.md").read_text()
    assert "| fake @ poisson:2/s | needle | 64 | 4 |" in readme
    assert ("fake @ poisson:2/s: the run was split into shards (--shard I/N); each shard sent "
            "its part of one schedule, so together they offered the load named.") in readme


def test_a_schedule_longer_than_the_cap_is_refused_before_anything_is_sent(tmp_path):
    """poisson:1e-6 slept for days; now it is refused, naming the expected duration, and the
    new run folder is removed. (In a subprocess with a deadline: on old code it would hang.)"""
    with OneSlot(0.02) as srv:
        suite = suite_file(tmp_path, srv.url, samples=1, lengths=(64,), depths=(0.2, 0.8))
        proc = subprocess.run(
            [sys.executable, "-m", "evalkit", "run", "--config", str(suite), "--output",
             str(tmp_path / "run"), "--no-progress", "--arrivals", "poisson:1e-6"],
            capture_output=True, text=True, timeout=120)
        assert srv.greedy == []
    assert proc.returncode == 2, proc.stderr
    assert ("model 'fake': --arrivals poisson:1e-06/s: 2 requests take about 1,000,000 s at "
            "that rate, longer than the cap of 604,800 s (a week)") in proc.stderr
    assert "Traceback" not in proc.stderr and not (tmp_path / "run").exists()
