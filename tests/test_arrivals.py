"""--arrivals: schedules are pure functions of (arrivals, seed, the request's key), bad input is
refused by name, and the request loop sends each request when it is due, whatever is in flight,
timing its response from then. (Against a fake server end to end: test_served_runner*.py;
against a real vLLM server: tests/test_arrivals_vllm.py.)"""
from __future__ import annotations

import time

import numpy as np
import pytest

from evalkit.runner import arrivals
from evalkit.runner.concurrent import execute_concurrent
from evalkit.runner.execute import ModelRun
from evalkit.runner.plan import build_plan
from evalkit.runner.suite import SuiteError, resolve, validate
from test_runner_plan import items_of, tok, tok_dir, toy_probes  # noqa: F401 (fixtures)
from runner_support import suite_dict


def test_poisson_is_seeded_and_has_its_rate():
    a = arrivals.parse("poisson:4")
    t = a.offsets(4000, seed=0)
    assert t == a.offsets(4000, seed=0) != a.offsets(4000, seed=1)
    assert t[0] == 0.0 and all(np.diff(t) >= 0)
    assert abs(np.mean(np.diff(t)) - 0.25) < 0.02  # 4 requests per second
    assert a.label == "poisson:4/s" and a.config() == {"kind": "poisson", "rate": 4.0}
    assert a.expected_s(4001) == 1000.0


def test_schedule_is_a_function_of_each_key_not_of_plan_order():
    """Plan order is longest prompt first; a schedule in that order put every long prompt at
    the start. Here the keys take the offsets in the order of sha256(seed, key)."""
    a = arrivals.parse("poisson:2")
    keys = [f"needle\0p{L}-{d}\00" for L in (4096, 2048, 1024, 512) for d in range(25)]
    due = a.schedule(keys, seed=0)
    assert due == a.schedule(list(reversed(keys)), seed=0)  # not the order given
    assert due != a.schedule(keys, seed=1)
    assert sorted(due.values()) == a.offsets(len(keys), seed=0)  # one schedule of the rate
    # lengths interleave: each quarter of the schedule holds each length, not one length
    by_time = sorted(keys, key=due.get)
    for quarter in range(4):
        part = by_time[quarter * 25:(quarter + 1) * 25]
        assert len({k.split("-")[0] for k in part}) == 4, part
    # and the mean due time of every length is near the middle (plan order: 4096 first)
    for L in (4096, 512):
        mean = np.mean([due[k] for k in keys if k.startswith(f"needle\0p{L}-")])
        assert 0.3 < mean / max(due.values()) < 0.7


def test_a_schedule_longer_than_the_cap_is_refused():
    with pytest.raises(ValueError, match=r"poisson:1e-06/s: 3 requests take about 2,000,000 s"
                                         r".*longer than the cap of 604,800 s"):
        arrivals.parse("poisson:1e-6").schedule(["a", "b", "c"], seed=0)
    assert arrivals.parse("poisson:1e-6").schedule(["a"], seed=0) == {"a": 0.0}  # nothing waits


@pytest.mark.parametrize("text, why", [
    ("poisson:0", "RATE should be requests per second"), ("poisson:-1", "RATE should be"),
    ("poisson:abc", "RATE should be"), ("poisson:1e9", "RATE should be"),
    ("poisson:nan", "RATE should be"), ("poisson", "expected poisson:RATE"),
    ("burst:3", "expected poisson:RATE"), ("trace:", "expected poisson:RATE")])
def test_bad_arrivals_are_refused(text, why):
    with pytest.raises(ValueError, match=why):
        arrivals.parse(text)


@pytest.mark.parametrize("body, why", [
    ("0\n1\nx\n", r":3: 'x' is not an offset"), ("0\n2\n1\n", r":3: offset 1 is before"),
    ("0\n-1\n", r":2: offset -1 should be seconds"), ("0\ninf\n", r":2: offset inf should be"),
    ("# only a comment\n\n", "no offsets"), ("1e9\n", "should be seconds")])
def test_bad_traces_are_refused_by_line(tmp_path, body, why):
    f = tmp_path / "trace.txt"
    f.write_text(body)
    with pytest.raises(ValueError, match=why):
        arrivals.parse(f"trace:{f}")


def test_trace_offsets_and_a_short_trace(tmp_path):
    f = tmp_path / "trace.txt"
    f.write_text("0\n0.5  # a burst\n0.5\n2\n")
    a = arrivals.parse(f"trace:{f}")
    assert a.offsets(3, seed=0) == [0.0, 0.5, 0.5]
    assert sorted(a.schedule(["x", "y", "z"], seed=0).values()) == [0.0, 0.5, 0.5]
    assert a.label.startswith("trace:trace.txt@") and a.config()["offsets"] == 4
    with pytest.raises(ValueError, match="5 requests to send but only 4 offsets"):
        a.schedule(list("abcde"), seed=0)
    (tmp_path / "bin").write_bytes(b"\xff\xfe0\n")
    with pytest.raises(ValueError, match="not UTF-8"):
        arrivals.parse(f"trace:{tmp_path / 'bin'}")
    with pytest.raises(ValueError, match="no such file"):
        arrivals.parse(f"trace:{tmp_path / 'missing.txt'}")


def test_arrivals_need_a_served_model_and_change_the_config_hash(tok_dir):
    """In-process models may sit beside the served one: they run unloaded."""
    base = suite_dict(tok_dir, lengths=[64], depths=[0.5], loads=[1], samples=1)
    plain = resolve(validate(base, "t"), "t")
    assert "arrivals" not in plain.config  # a run without arrivals keeps its hash
    with pytest.raises(SuiteError, match=r"no served model \(oracle run in this process\)"):
        resolve(validate({**base, "arrivals": "poisson:2"}, "t"), "t")
    served = {**base, "models": [{"name": "s", "spec": "served:http://127.0.0.1:9/v1",
                                  "options": {"tokenizer": str(tok_dir)}}, *base["models"]]}
    a = resolve(validate({**served, "arrivals": "poisson:2"}, "t"), "t")
    b = resolve(validate({**served, "arrivals": "poisson:3"}, "t"), "t")
    c = resolve(validate(served, "t"), "t")
    assert len({a.config_hash, b.config_hash, c.config_hash}) == 3
    assert a.arrivals.label == "poisson:2/s"


class _Slow:
    """The toy oracle with a fixed service time per request, one request at a time, as a
    server with one slot would answer."""

    def __init__(self, inner, service_s: float):
        self.inner, self.service_s = inner, service_s
        self.slot = __import__("threading").Lock()

    def __getattr__(self, name):
        return getattr(self.inner, name)

    def generate(self, state, max_new_tokens, stop=None):
        with self.slot:
            time.sleep(self.service_s)
        return self.inner.generate(state, max_new_tokens, stop)


def test_requests_go_out_when_due_whatever_is_in_flight(tok, tok_dir):
    """Open loop: a request due while others are open is sent anyway; only the cap on open
    requests holds one back, and that wait is its queue_s (what the run counts)."""
    from evalkit.model_adapters.models import load_model
    probes = toy_probes(tok, "toy_recall", lengths=[64], depths=[0.5], loads=[1], samples=5)
    items = list(build_plan(items_of(probes, tok)).items())
    assert len(items) == 5
    run = ModelRun(_Slow(load_model("oracle", tokenizer=str(tok_dir)), 0.3), "m", "h", "memory",
                   arrivals="trace:t@0")
    due = [0.0, 0.0, 0.0, 1.2, 1.8]
    out, t0 = [], time.monotonic()
    execute_concurrent(run, items, lambda s: out.append((time.monotonic() - t0, s)), 64, due)
    assert len(out) == 5 and all(s.error is None for _, s in out)
    assert [s.queue_s for _, s in out] == [0.0] * 5  # never held back: the cap is far above
    assert sorted(s.due_s for _, s in out) == due
    # the three due at 0 queue at the one-slot server: their response times hold that wait
    first = sorted(s.latency_s for _, s in out if s.due_s == 0.0)
    assert first == pytest.approx([0.3, 0.6, 0.9], abs=0.12)
    assert out[-1][0] >= 1.8 + 0.3 - 0.05  # the last was not sent before it was due
    assert all(s.arrivals == "trace:t@0" for _, s in out)
    # a cap of 2: the third waits for a slot, which is counted as its queue_s
    out.clear()
    execute_concurrent(run, items, lambda s: out.append((0, s)), 2, due)
    assert sorted(s.queue_s for _, s in out)[-1] == pytest.approx(0.3, abs=0.12)
    assert sum(s.queue_s > 0 for _, s in out) == 1
    with pytest.raises(ValueError, match="4 arrival times for 5 requests"):
        execute_concurrent(run, items, lambda s: None, 2, due[:4])
