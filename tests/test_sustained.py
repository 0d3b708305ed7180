"""The rate a served model sustains, read from a closed-loop run's samples (Little's law), and
the check that the board's Poisson rates straddle it."""
from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import pytest

from evalkit.leaderboard.sustained import check_rates, main, sustained
from evalkit.result import SampleResult


def _write(run: Path, latencies, arrivals="closed:4", model="m-vllm", **extra) -> Path:
    run.mkdir(parents=True, exist_ok=True)
    rows = [SampleResult(model=model, model_hash="h", task="needle", task_version="1",
                         probe_id=f"p{i}", probe_hash=f"x{i}", question=0, kind="recall",
                         target_length=512, prompt_tokens=512, prompt_chars=2000, depth=0.5,
                         load=1, distance=100, seed=0, prediction="7", gold=["7"],
                         state_kind="recurrent", latency_s=lat, arrivals=arrivals, **extra)
            for i, lat in enumerate(latencies)]
    (run / "samples.jsonl").write_text("".join(json.dumps(dataclasses.asdict(r)) + "\n"
                                               for r in rows))
    return run


def test_little_law_and_the_rates_either_side(tmp_path, capsys):
    run = _write(tmp_path / "closed-4", [0.5, 1.5] * 10)  # mean 1 s, 4 in flight: 4/s
    rate, said = sustained(run, "m-vllm")
    assert rate == pytest.approx(4.0) and "20 answered" in said and "closed:4" in said
    assert check_rates(4.0, [1, 10]) == ""
    assert "no Poisson rate above" in check_rates(4.0, [0.5, 2])
    assert "no Poisson rate below" in check_rates(4.0, [5])
    assert main([str(run), "m-vllm", "--rates", "1 10"]) == 0
    assert "poisson 1/s is below, poisson 10/s is above" in capsys.readouterr().out
    assert main([str(run), "m-vllm", "--rates", "0.5 2"]) == 1
    assert "no Poisson rate above the sustained 4/s" in capsys.readouterr().err


def test_what_cannot_be_measured_is_refused(tmp_path, capsys):
    with pytest.raises(ValueError, match="no such file"):
        sustained(tmp_path / "missing", "m-vllm")
    run = _write(tmp_path / "open", [1.0] * 20, arrivals="poisson:2/s")
    with pytest.raises(ValueError, match="not run in one closed loop"):
        sustained(run, "m-vllm")
    with pytest.raises(ValueError, match="no samples of model 'other'"):
        sustained(run, "other")
    few = _write(tmp_path / "few", [1.0] * 5)
    with pytest.raises(ValueError, match="5 answered samples.*at least 10"):
        sustained(few, "m-vllm")
    failed = _write(tmp_path / "failed", [1.0] * 20, error="connection failed")
    with pytest.raises(ValueError, match="0 answered samples"):
        sustained(failed, "m-vllm")
    scored = _write(tmp_path / "scored", [1.0] * 20, requests=5)
    with pytest.raises(ValueError, match=r"sent \[5\] requests each \(forced choice on\)"):
        sustained(scored, "m-vllm")
    assert sustained(_write(tmp_path / "one", [1.0] * 20, requests=1), "m-vllm")[0] == 4.0
    assert main([str(run), "m-vllm", "--rates", "1 x"]) == 2
    assert "expected numbers" in capsys.readouterr().err
    assert main([str(run), "m-vllm", "--rates", "0 1"]) == 2
    assert "expected positive rates" in capsys.readouterr().err
    assert main([str(tmp_path / "missing"), "m-vllm"]) == 2
    assert "no such file" in capsys.readouterr().err
