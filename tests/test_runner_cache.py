"""Cache and resume: a killed run resumes to the same results; models never share entries;
a sample scored by other code is scored again; a cache or run directory of another schema or
config is detected, never silently reused."""
from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml

from evalkit.cli import main as cli_main
from evalkit.runner.aggregate import strip_timestamps
from evalkit.runner.cache import MANIFEST, CacheMismatch, SampleCache
from evalkit.runner.rundir import RunDirError
from runner_support import build_tokenizer, read_samples, run, suite_dict, without_latency

REPO = Path(__file__).resolve().parent.parent


@pytest.fixture(scope="module")
def tok_dir(tmp_path_factory):
    return build_tokenizer(tmp_path_factory.mktemp("tok"))


def slow_suite(tok_dir):
    # 24 questions at 80 ms each: killed after the 4th, with ~1.5 s of margin before the end.
    return suite_dict(tok_dir, models=({"name": "slow", "spec": "slow-oracle",
                                        "options": {"delay": 0.08}},),
                      tasks=("toy_recall", {"name": "toy_conv", "lengths": [256, 288]}),
                      lengths=[96, 128], depths=[0.5],
                      loads=[4], samples=2)


def _default_sigint() -> None:
    # A shell's background job (nohup ... &, some CI runners) starts with SIGINT ignored, and
    # the child would inherit that; Ctrl-C must reach it as it would in a terminal.
    signal.signal(signal.SIGINT, signal.SIG_DFL)


def entries(cache_root: Path) -> list[Path]:
    return list((cache_root / "entries").glob("*/*.json")) if cache_root.exists() else []


def results(run_dir: Path) -> dict:
    return json.loads((run_dir / "results.json").read_text())


def test_killed_run_resumes_to_identical_results(tok_dir, tmp_path):
    suite = slow_suite(tok_dir)
    # The uninterrupted reference (same run-directory name, so run_id is equal too).
    total = run(suite, tmp_path / "a" / "run").samples
    assert total == 24

    cfg = tmp_path / "suite.yaml"
    cfg.write_text(yaml.safe_dump(suite))
    out = tmp_path / "b" / "run"
    env = {**os.environ, "PYTHONPATH": str(REPO / "tests")}
    proc = subprocess.Popen([sys.executable, "-m", "evalkit", "run", "--config", str(cfg),
                             "--output", str(out), "--no-progress"],
                            cwd=tmp_path, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True, preexec_fn=_default_sigint)
    deadline = time.time() + 120
    while len(entries(out / "cache")) < 4 and proc.poll() is None and time.time() < deadline:
        time.sleep(0.01)
    proc.send_signal(signal.SIGINT)  # Ctrl-C, part-way through
    stdout, stderr = proc.communicate(timeout=60)
    assert proc.returncode == 130, stderr
    assert "Resume with: evalkit run --resume" in stderr
    assert not (out / "DONE").exists() and not (out / "results.json").exists()
    done_before = len(entries(out / "cache"))
    assert 4 <= done_before < total

    # `--resume DIR` alone reuses the stored config.
    assert cli_main(["run", "--resume", str(out), "--no-progress"]) == 0
    assert (out / "DONE").exists()
    a, b = results(tmp_path / "a" / "run"), results(out)
    assert strip_timestamps(b) == strip_timestamps(a)
    assert a["created"] != b["created"]  # (the stripped fields really are timestamps)
    assert without_latency(read_samples(out)) == without_latency(read_samples(tmp_path / "a" / "run"))
    inv = json.loads((out / "execution.json").read_text())["invocations"]
    assert [i["interrupted"] for i in inv] == [True, False]
    assert inv[1]["cached"] == done_before and inv[1]["computed"] == total - done_before


def test_different_models_never_share_entries(tok_dir, tmp_path):
    shared = str(tmp_path / "shared-cache")
    base = dict(tasks=("toy_recall",), lengths=[256], depths=[0.3], loads=[4], samples=2,
                cache_dir=shared)
    first = run(suite_dict(tok_dir, models=("oracle",), **base), tmp_path / "r1")
    assert (first.cached, first.computed) == (0, 6)
    # Another model, the same model with other options, a same-named different model: all miss.
    for i, model in enumerate([{"name": "forgetful", "options": {"capacity": 600}},
                               {"name": "forgetful", "options": {"capacity": 601}},
                               {"name": "oracle", "spec": "forgetful",
                                "options": {"capacity": 600, "order": 7}}]):
        out = run(suite_dict(tok_dir, models=(model,), **base), tmp_path / f"m{i}")
        assert (out.cached, out.computed) == (0, 6), model
    # ... while the same model again is served entirely from the cache.
    again = run(suite_dict(tok_dir, models=("oracle",), **base), tmp_path / "r2")
    assert (again.cached, again.computed) == (6, 0)
    same = lambda d: without_latency(read_samples(tmp_path / d))
    assert same("r2") == same("r1")
    # Every entry is filed under the model that produced it; forgetful really answers differently.
    hashes = set()
    for p in entries(Path(shared)):
        e = json.loads(p.read_text())
        assert e["key"]["model_hash"] == e["result"]["model_hash"]
        hashes.add(e["key"]["model_hash"])
    assert len(hashes) == 4 and len(entries(Path(shared))) == 24
    preds = lambda d: [s["prediction"] for s in read_samples(d)]
    assert preds(tmp_path / "m0") != preds(tmp_path / "r1")


def test_a_sample_scored_by_other_code_is_scored_again(tok_dir, tmp_path, monkeypatch):
    """The cache was keyed on evalkit_version, "0.1.0" since the first commit: samples scored
    by older code came back on --resume. Now the key holds the hash of evalkit's source: a
    changed scorer (here its file edited in a copy of the source the hash reads, and its new
    behaviour patched in) makes --resume score every sample again."""
    import shutil

    from evalkit import code_version
    from evalkit.runner import execute, provenance

    suite = suite_dict(tok_dir, tasks=("toy_recall",), lengths=[64], depths=[0.5], loads=[2],
                       samples=2)
    out = tmp_path / "r"
    run(suite, out)
    assert all(s["scores"]["exact_match"] == 1.0 for s in read_samples(out))
    code = json.loads((out / "provenance.json").read_text())["evalkit_code"]
    assert code == provenance.code_hash()

    old = execute.score_sample
    zero = lambda *a, **k: {m: 0.0 for m in old(*a, **k)}  # the new scorer
    monkeypatch.setattr(execute, "score_sample", zero)
    run(suite, out, resume=True)  # the same source: the cache answers, the scorer never runs
    assert all(s["scores"]["exact_match"] == 1.0 for s in read_samples(out))

    copies = [shutil.copytree(r, tmp_path / "src" / r.name,
                              ignore=shutil.ignore_patterns("__pycache__", "*.so", "*.bin", "*.safetensors", "*.png"))
              for r in code_version.source_roots()]
    scoring = tmp_path / "src" / "evalkit" / "scoring.py"
    scoring.write_text(scoring.read_text() + "\n# every metric scores 0 now\n")
    monkeypatch.setattr(code_version, "source_roots", lambda: copies)
    provenance.code_hash.cache_clear()
    try:
        run(suite, out, resume=True)
        assert all(s["scores"]["exact_match"] == 0.0 for s in read_samples(out))
        assert json.loads((out / "provenance.json").read_text())["evalkit_code"] != code
    finally:
        provenance.code_hash.cache_clear()


def test_cache_of_another_schema_is_refused(tok_dir, tmp_path):
    suite = suite_dict(tok_dir, tasks=("toy_recall",), lengths=[64], depths=[0.5], loads=[2],
                       samples=1)
    out = tmp_path / "r"
    run(suite, out)
    manifest = out / "cache" / MANIFEST
    doc = json.loads(manifest.read_text())
    assert doc == {"cache_schema": 1}
    manifest.write_text(json.dumps({**doc, "evalkit_version": "0.0.1"}))  # an older store
    SampleCache(out / "cache")  # opens: its entries are keyed on the code, not on a version
    manifest.write_text(json.dumps({**doc, "cache_schema": 99}))
    with pytest.raises(CacheMismatch, match="cache_schema 99 there, 1 here"):
        run(suite, out, resume=True)
    with pytest.raises(CacheMismatch, match="cache_schema"):
        SampleCache(out / "cache")


def test_resume_with_another_config_is_refused(tok_dir, tmp_path):
    suite = suite_dict(tok_dir, tasks=("toy_recall",), lengths=[64], depths=[0.5], loads=[2],
                       samples=1)
    run(suite, tmp_path / "r")
    with pytest.raises(RunDirError, match=r"differs in: seed"):
        run({**suite, "seed": 1}, tmp_path / "r", resume=True)
    with pytest.raises(RunDirError, match=r"differs in: models"):
        run(suite_dict(tok_dir, models=({"name": "oracle", "options": {"order": 4}},),
                       tasks=("toy_recall",), lengths=[64], depths=[0.5], loads=[2], samples=1),
            tmp_path / "r", resume=True)
    # Batch size does not change results, so it may differ on resume.
    assert run({**suite, "batch_size": 3}, tmp_path / "r", resume=True).cached == 2


def test_an_entry_with_other_key_material_is_detected_and_recomputed(tok_dir, tmp_path, capsys):
    suite = suite_dict(tok_dir, tasks=("toy_recall",), lengths=[64], depths=[0.5], loads=[2],
                       samples=1)
    out = tmp_path / "r"
    run(suite, out)
    before = results(out)
    [victim, *_] = sorted(entries(out / "cache"))
    e = json.loads(victim.read_text())
    e["key"]["generation"]["stop"] = ["."]          # written under other generation settings
    e["result"]["prediction"] = "something else"
    victim.write_text(json.dumps(e))
    again = run(suite, out, resume=True)
    assert (again.cached, again.computed) == (1, 1)
    assert "not reused: its stored key material differs" in capsys.readouterr().err
    assert strip_timestamps(results(out)) == strip_timestamps(before)


def test_resume_starts_a_run_that_does_not_exist_yet(tok_dir, tmp_path, capsys):
    # `make run` passes --resume --output runs/quick every time: the first time starts the run.
    suite = suite_dict(tok_dir, tasks=("toy_recall",), lengths=[64], depths=[0.5], loads=[2],
                       samples=1)
    first = run(suite, tmp_path / "r", resume=True)
    second = run(suite, tmp_path / "r", resume=True)
    assert (first.computed, second.cached, second.computed) == (2, 2, 0)
    assert json.loads((tmp_path / "r" / "provenance.json").read_text())["resumed"]
    # Without a config there is nothing to start from.
    assert cli_main(["run", "--resume", str(tmp_path / "absent")]) == 2
    assert "nothing to resume" in capsys.readouterr().err
