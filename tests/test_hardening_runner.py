"""Issue 12 regressions for `evalkit run`: nothing lost, nothing silently wrong, nothing
unbounded, no traceback for an ordinary fault, and no collisions between concurrent runs."""
from __future__ import annotations

import errno
import json
import math
import os
import signal
import re
import shutil
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest
import torch

from evalkit.cli import main as cli_main
from evalkit.runner import rundir
from runner_support import TOY_TASKS, build_tokenizer, run, suite_dict

from helpers import REPO


@pytest.fixture(scope="module")
def tok_dir(tmp_path_factory):
    return build_tokenizer(tmp_path_factory.mktemp("tok"))


def _cli_run(tok, out, *extra, models="oracle", tasks="toy_recall"):
    return cli_main(["run", "--models", models, "--model-args", f"tokenizer={tok}",
                     "--tasks", tasks, "--include", str(TOY_TASKS), "--lengths", "64",
                     "--depths", "0.5", "--loads", "2", "--samples", "1",
                     "--output", str(out), "--no-progress", *extra])


def _snapshot(folder: Path) -> dict[str, bytes]:
    return {str(p.relative_to(folder)): p.read_bytes()
            for p in sorted(folder.rglob("*")) if p.is_file() and p.name != rundir.LOCK}


# -- 1. never destroy what the user has -------------------------------------------------------

def test_a_failed_resume_leaves_the_finished_run_exactly_as_it_was(tok_dir, tmp_path, capsys):
    tok = tmp_path / "tok"
    shutil.copytree(tok_dir, tok)
    out = tmp_path / "r"
    assert _cli_run(tok, out) == 0
    before = _snapshot(out)
    assert "DONE" in before and "provenance.json" in before
    shutil.move(tok, tmp_path / "tok-moved")  # the model's files moved after the run finished
    rc = cli_main(["run", "--resume", str(out), "--no-progress"])
    assert rc in (1, 2)
    assert "tok" in capsys.readouterr().err
    assert _snapshot(out) == before  # DONE, provenance.json, execution.json untouched
    # and a resume that works still rewrites it completely
    shutil.move(tmp_path / "tok-moved", tok)
    assert cli_main(["run", "--resume", str(out), "--no-progress"]) == 0
    assert (out / "DONE").exists()
    assert json.loads((out / "provenance.json").read_text())["models"]


# -- 2. nothing silently wrong ----------------------------------------------------------------

def test_non_finite_logprobs_fail_the_sample_and_no_file_holds_nan(tmp_path, capsys):
    ckpt = tmp_path / "gla-nan"
    shutil.copytree(REPO / "model_adapters" / "tiny" / "recall-gla-tiny", ckpt)
    cfg = json.loads((ckpt / "config.json").read_text())
    cfg["norm_eps"] = float("nan")
    (ckpt / "config.json").write_text(json.dumps(cfg))  # json writes a bare NaN, as a user would
    out = tmp_path / "r"
    rc = cli_main(["run", "--models", f"gla:{ckpt}", "--tasks", "needle_multi", "--lengths", "256", "--loads", "2",
                   "--depths", "0.5", "--samples", "1", "--output", str(out), "--no-progress",
                   "--threads", "1"])
    assert rc == 1  # a failed sample, not a silent zero
    samples = [json.loads(line) for line in (out / "samples.jsonl").read_text().splitlines()]
    # generation meets the NaN first; scoring would too ("non-finite log-probabilities")
    assert samples and all(re.search(r"non-finite (logits|log-probabilities)", s["error"])
                           for s in samples)
    for f in out.rglob("*"):
        if f.is_file() and f.suffix in (".json", ".jsonl") or f.name == "DONE":
            text = f.read_text()
            for line in text.splitlines() if f.suffix == ".jsonl" else [text]:
                json.loads(line, parse_constant=lambda c: pytest.fail(f"{f}: bare {c}"))


def test_the_json_writer_refuses_non_finite_numbers_naming_file_and_key(tmp_path):
    from evalkit import atomic

    with pytest.raises(ValueError, match=r"x\.json.*'a\.1\.b'"):
        atomic.write_json(tmp_path / "x.json", {"a": [1, {"b": math.inf}]})
    with pytest.raises(ValueError, match=r"y\.jsonl.*'score'"):
        atomic.write_jsonl(tmp_path / "y.jsonl", [{"score": 1.0}, {"score": math.nan}])
    assert not list(tmp_path.iterdir())  # nothing half-written


def test_a_hand_edited_cache_entry_is_recomputed_not_reused(tok_dir, tmp_path, capsys):
    out = tmp_path / "r"
    assert _cli_run(tok_dir, out, "--cache-dir", str(tmp_path / "cache")) == 0
    good = (out / "samples.jsonl").read_text()
    entries = sorted((tmp_path / "cache" / "entries").rglob("*.json"))
    assert entries
    doc = json.loads(entries[0].read_text())
    doc["result"]["prediction"] = "9999"  # a hand edit, key material intact
    doc["result"]["scores"] = {k: 1.0 - v for k, v in doc["result"]["scores"].items()}
    entries[0].write_text(json.dumps(doc))
    capsys.readouterr()
    assert _cli_run(tok_dir, tmp_path / "r2", "--cache-dir", str(tmp_path / "cache")) == 0
    err = capsys.readouterr().err
    assert f"cache entry {entries[0]} not reused" in err and "sha256" in err
    again = (tmp_path / "r2" / "samples.jsonl").read_text()
    assert [json.loads(x)["prediction"] for x in again.splitlines()] == \
        [json.loads(x)["prediction"] for x in good.splitlines()]  # recomputed, not "9999"


_GEN = '''
import random
from pydantic import BaseModel
from evalkit import probes as kit

class Params(BaseModel):
    pass

def generate(params, *, task, version, tokenizer, length, depth, load, seed):
    {body}
    ask = kit.Ask(item=0, text="What is the code?", prefix="The code is", gold=("{code}",),
                  candidates=())
    return kit.assemble(task=TASK, version=version, tokenizer=tokenizer, length=length,
                        depth=depth, load=load, seed=seed, items=[kit.Item("The code is {code}.")],
                        questions=[ask], stream=kit.start_stream(random.Random(seed), "filler"),
                        offsets=[])
'''


def _user_task(folder: Path, task: str, code: str, body: str = "TASK = task",
               generator: str = "gen:generate") -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "gen.py").write_text(textwrap.dedent(_GEN.format(code=code, body=body)))
    (folder / f"{task}.yaml").write_text(
        f"task: {task}\ngenerator: {generator}\n"
        f"defaults: {{lengths: [64], depths: [0.5], samples: 1}}\n")
    return folder


def test_two_include_folders_with_a_gen_py_each_run_their_own_code(tmp_path, tiny_tokenizer):
    from evalkit.taskspec import discover, generate_probes, grid

    a = _user_task(tmp_path / "a", "task_a", "1111")
    b = _user_task(tmp_path / "b", "task_b", "2222")
    reg = discover([a, b])
    for name, code in (("task_a", "1111"), ("task_b", "2222")):
        spec = reg.get(name)
        probe = next(generate_probes(spec, tiny_tokenizer, grid(spec)[:1]))
        assert probe.task == name and probe.questions[0].gold == (code,)
    # validate agrees, in one process, over both folders
    proc = subprocess.run([sys.executable, "-m", "evalkit", "validate", str(a), str(b)],
                          capture_output=True, text=True, cwd=tmp_path)
    assert proc.returncode == 0, proc.stdout + proc.stderr


def test_a_dotted_user_module_shadowed_by_another_folder_is_an_error(tmp_path):
    from evalkit.taskspec import SpecError, discover

    for name, code in (("a", "1111"), ("b", "2222")):
        pkg = tmp_path / name / "mygen"
        _user_task(pkg, f"task_{name}", code)
        (pkg / "__init__.py").write_text("")
        (pkg / f"task_{name}.yaml").rename(tmp_path / name / f"task_{name}.yaml")
        text = (tmp_path / name / f"task_{name}.yaml").read_text()
        (tmp_path / name / f"task_{name}.yaml").write_text(
            text.replace("gen:generate", "mygen.gen:generate"))
    sys.modules.pop("mygen", None), sys.modules.pop("mygen.gen", None)
    try:
        with pytest.raises(SpecError, match=r"task_b\.yaml.*'mygen\.gen'.*already loaded"):
            discover([tmp_path / "a", tmp_path / "b"])
    finally:
        sys.modules.pop("mygen", None), sys.modules.pop("mygen.gen", None)


@pytest.mark.parametrize("body, match", [
    ("TASK = 'needle'", r"task_x.*returned a probe of task 'needle'"),
    ("TASK = task; seed = 7", r"task_x.*meta\.seed is 7; expected"),  # one probe for all seeds
])
def test_wrong_probes_are_caught_at_generation_not_at_publish(tmp_path, tok_dir, capsys, body,
                                                              match):
    folder = _user_task(tmp_path / "t", "task_x", "1234", body=body)
    out = tmp_path / "r"
    rc = cli_main(["run", "--models", "oracle", "--model-args", f"tokenizer={tok_dir}",
                   "--tasks", "task_x", "--include", str(folder), "--samples", "2",
                   "--output", str(out), "--no-progress"])
    assert rc == 2
    assert len(capsys.readouterr().err.strip().splitlines()) == 1
    assert not out.exists()  # bad input leaves nothing behind
    rc = cli_main(["run", "--models", "oracle", "--model-args", f"tokenizer={tok_dir}",
                   "--tasks", "task_x", "--include", str(folder), "--samples", "2",
                   "--output", str(out), "--no-progress"])
    assert rc == 2 and re.search(match, capsys.readouterr().err)


def test_the_same_model_under_two_names_is_refused_before_running(tok_dir, tmp_path, capsys):
    cfg = suite_dict(tok_dir, models=("oracle", {"name": "oracle2", "spec": "oracle"}),
                     lengths=[64], depths=[0.5], loads=[1], samples=1)
    from evalkit.runner.suite import SuiteError
    with pytest.raises(SuiteError, match="'oracle' and 'oracle2' are the same model"):
        run(cfg, tmp_path / "r")
    assert not (tmp_path / "r").exists()


# -- 4. bound everything ------------------------------------------------------------------------

def test_a_length_beyond_every_models_maximum_is_refused_before_probes(tok_dir, tmp_path, capsys):
    rc = cli_main(["run", "--models", "oracle", "--model-args", f"tokenizer={tok_dir},max_length=150",
                   "--tasks", "toy_recall", "--include", str(TOY_TASKS), "--lengths", "64,1000000",
                   "--depths", "0.5", "--samples", "1", "--output", str(tmp_path / "r"),
                   "--no-progress"])
    err = capsys.readouterr().err
    assert rc == 2 and "length 1000000" in err and "oracle max_length 150" in err
    assert not (tmp_path / "r").exists()


def test_yaml_aliases_are_refused_naming_file_and_line(tmp_path):
    from evalkit.runner.suite import SuiteError, load_suite

    cfg = tmp_path / "suite.yaml"
    cfg.write_text("a: &x [1, 2]\nb: &y [*x, *x]\nmodels: [oracle]\n")
    with pytest.raises(SuiteError, match=r"suite\.yaml: line 2: YAML alias \*x"):
        load_suite(cfg)


def test_a_generator_that_never_returns_is_stopped_with_a_clear_error(tmp_path, tok_dir,
                                                                      monkeypatch, capsys):
    folder = _user_task(tmp_path / "t", "task_hang", "1", body="TASK = task\n    while True: pass")
    monkeypatch.setenv("EVALKIT_GENERATOR_TIMEOUT_S", "1")
    assert cli_main(["validate", str(folder)]) == 1
    assert "did not return within 1 s" in capsys.readouterr().out
    rc = cli_main(["run", "--models", "oracle", "--model-args", f"tokenizer={tok_dir}",
                   "--tasks", "task_hang", "--include", str(folder),
                   "--output", str(tmp_path / "r"), "--no-progress"])
    err = capsys.readouterr().err
    assert rc == 2 and "task 'task_hang'" in err and "gen:generate" in err
    assert "task_hang.yaml" in err and "did not return within 1 s" in err


# -- 6. bad input leaves nothing behind --------------------------------------------------------

@pytest.mark.parametrize("bad, good", [
    (["--loads", "2", "--model-args", "capacity=100,colour=red"],      # a bad model option
     ["--loads", "2", "--model-args", "capacity=100"]),
    (["--loads", "8"], ["--loads", "2"]),                 # a grid the task cannot make
])
def test_a_fixed_rerun_with_the_same_output_works(tmp_path, capsys, bad, good):
    out = tmp_path / "r"
    argv = ["run", "--models", "forgetful", "--tasks", "needle_multi", "--lengths", "128",
            "--depths", "0.5", "--samples", "1", "--output", str(out), "--no-progress"]
    assert cli_main(argv + bad) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and ("colour" in err or "load=8" in err), err
    assert not out.exists()
    assert cli_main(argv + good) == 0


def test_a_missing_checkpoint_leaves_no_run_folder(tmp_path, capsys):
    out = tmp_path / "r"
    missing = tmp_path / "nowhere"
    rc = cli_main(["run", "--models", f"gla:{missing}", "--tasks", "needle", "--lengths", "64",
                   "--samples", "1", "--output", str(out), "--no-progress"])
    assert rc == 2 and str(missing) in capsys.readouterr().err
    assert not out.exists()


def test_an_unknown_lm_eval_task_is_refused_before_anything_runs(tok_dir, tmp_path, capsys):
    out = tmp_path / "r"
    rc = _cli_run(tok_dir, out, "--lm-eval-tasks", "no_such_task_xyz")
    assert rc == 2 and "no_such_task_xyz" in capsys.readouterr().err
    assert not out.exists()


# -- 5. output paths and a full disk: one line, exit 2 (bad input) or 1 (run failure) ----------

@pytest.mark.parametrize("case", ["output-file", "output-under-a-file", "output-unwritable",
                                  "cache-file", "resume-file"])
def test_bad_output_paths_get_one_line_naming_the_path(tok_dir, tmp_path, capsys, case):
    if case == "output-unwritable" and os.geteuid() == 0:
        pytest.skip("root writes anywhere")
    a_file = tmp_path / "a-file"
    a_file.write_text("mine\n")
    ro = tmp_path / "ro"
    ro.mkdir()
    ro.chmod(0o500)
    argv = {"output-file": ([], a_file), "output-under-a-file": ([], a_file / "r"),
            "output-unwritable": ([], ro / "r"),
            "cache-file": (["--cache-dir", str(a_file)], tmp_path / "r"),
            "resume-file": (["--resume", str(a_file)], None)}[case]
    extra, out = argv
    if case == "resume-file":
        rc = cli_main(["run", "--resume", str(a_file), "--no-progress"])
    else:
        rc = _cli_run(tok_dir, out, *extra)
    err = capsys.readouterr().err.strip()
    assert rc == 2 and len(err.splitlines()) == 1, err
    named = {"output-unwritable": ro / "r", "output-under-a-file": a_file / "r"}.get(case, a_file)
    assert str(named) in err and ("folder" in err)
    assert a_file.read_text() == "mine\n"
    assert not (tmp_path / "r").exists()


def test_disk_full_mid_run_is_one_line_exit_1_and_resumable(tok_dir, tmp_path, capsys,
                                                            monkeypatch):
    from evalkit import atomic

    real = atomic.os.fsync
    calls = {"n": 0}

    def full(fd):
        calls["n"] += 1
        # config, manifest, provenance, provenance with the loaded model, entry 1, then entry 2
        if calls["n"] == 6:
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
        return real(fd)

    monkeypatch.setattr(atomic.os, "fsync", full)
    out = tmp_path / "r"
    rc = _cli_run(tok_dir, out)
    err = capsys.readouterr().err.strip()
    assert rc == 1 and len(err.splitlines()) == 1 and "No space left on device" in err
    assert not (out / "DONE").exists()
    monkeypatch.setattr(atomic.os, "fsync", real)
    assert cli_main(["run", "--resume", str(out), "--no-progress"]) == 0
    assert "1 from cache, 1 evaluated" in capsys.readouterr().out  # the first sample was kept


# -- 7. concurrency --------------------------------------------------------------------------

def test_two_runs_in_the_same_second_get_distinct_default_run_ids(tok_dir, tmp_path,
                                                                  monkeypatch):
    from datetime import datetime, timezone

    from evalkit.runner import resolve, run_suite
    from evalkit.runner.suite import validate

    class Frozen(datetime):  # every run starts in the same second
        @classmethod
        def now(cls, tz=None):
            return datetime(2026, 1, 2, 3, 4, 5, tzinfo=timezone.utc)

    monkeypatch.setattr(rundir, "datetime", Frozen)
    cfg = suite_dict(tok_dir, lengths=[64], depths=[0.5], loads=[1], samples=1)
    resolved = resolve(validate(cfg, "test"), "test")
    dirs = {run_suite(resolved, runs_root=tmp_path / "runs", progress=False).run_dir
            for _ in range(3)}
    assert len(dirs) == 3 and all((d / "DONE").exists() for d in dirs)


def test_a_second_resume_on_a_locked_run_folder_is_refused_naming_the_pid(tok_dir, tmp_path):
    out = tmp_path / "r"
    suite = suite_dict(tok_dir, models=({"name": "slow-oracle", "options": {"delay": 0.6}},),
                       lengths=[64, 128], depths=[0.2, 0.8], loads=[2], samples=2)
    (tmp_path / "suite.yaml").write_text(json.dumps(suite))
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    first = subprocess.Popen([sys.executable, "-m", "evalkit", "run", "--config",
                              str(tmp_path / "suite.yaml"), "--output", str(out), "--resume",
                              "--no-progress"], env=env, cwd=tmp_path,
                             stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.time() + 60
        while not (out / "cache" / "entries").exists():  # the first run is under way
            assert time.time() < deadline and first.poll() is None
            time.sleep(0.05)
        # the first is paused while the second tries: it holds the folder however slowly the
        # second starts (on loaded cores the second's imports outlasted 16 x 0.6 s once)
        os.kill(first.pid, signal.SIGSTOP)
        try:
            second = subprocess.run([sys.executable, "-m", "evalkit", "run", "--resume",
                                     str(out), "--no-progress"], env=env, cwd=tmp_path,
                                    capture_output=True, text=True, timeout=120)
        finally:
            os.kill(first.pid, signal.SIGCONT)
        assert second.returncode == 2, second.stdout + second.stderr
        assert f"pid {first.pid}" in second.stderr and str(out / ".lock") in second.stderr
    finally:
        first.wait(timeout=300)
    assert first.returncode == 0, first.stderr
    assert (out / "DONE").exists()


def test_non_finite_logits_fail_generation_too(tmp_path):
    """Generation alone (no candidates to score) must not turn a NaN model into an answer."""
    from evalkit.model_adapters.protocol import greedy_token
    from evalkit.model_adapters.models import load_model

    assert greedy_token(torch.tensor([0.0, 3.0, 1.0])) == 1
    with pytest.raises(ValueError, match="non-finite logits"):
        greedy_token(torch.tensor([0.0, math.nan, 1.0]))
    ckpt = tmp_path / "gla-nan"
    shutil.copytree(REPO / "model_adapters" / "tiny" / "recall-gla-tiny", ckpt)
    cfg = json.loads((ckpt / "config.json").read_text())
    cfg["norm_eps"] = float("nan")
    (ckpt / "config.json").write_text(json.dumps(cfg))
    model = load_model(f"gla:{ckpt}")
    state = model.prefill(model.tokenizer("The code is 1234. The code is").input_ids)
    with pytest.raises(ValueError, match="non-finite logits"):
        model.generate(state, 4)
