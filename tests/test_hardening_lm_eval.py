"""Hardening (issue 12, item 8): the lm-eval wrapper supplies the evalkit model's tokenizer to
lm-eval's synthetic tasks, so `--model_args name=...` alone runs RULER's niah_single_1 (lm-eval
builds task metadata from --model_args before the model loads, and `name=` is no tokenizer)."""
import json
import os
import subprocess
import sys

import pytest

pytest.importorskip("lm_eval")
pytest.importorskip("wonderwords")  # lm-eval's RULER code imports it


def test_preloaded_model_is_handed_to_lm_evals_own_creation():
    from evalkit.lm_eval.bridge import EvalkitLM

    extra = {"batch_size": 1, "max_batch_size": None, "device": "cuda:0"}
    lm = EvalkitLM.preload({"name": "oracle"}, extra)
    assert EvalkitLM.create_from_arg_obj({"name": "oracle"}, extra) is lm
    # one-shot: a second creation (or other arguments) builds a new model
    assert EvalkitLM.create_from_arg_obj({"name": "oracle"}, extra) is not lm


ARGS = ["run", "--model", "evalkit", "--model_args", "name=smollm2-135m", "--tasks", "niah_single_1",
        "--metadata", '{"max_seq_lengths":[1024]}']  # the command line


def _command(route, tmp_path, args):
    if route == "wrapper":  # evalkit-lm-eval
        return [sys.executable, "-m", "evalkit.lm_eval.cli", *args]
    # the plain `lm-eval` console script with the .pth hook (a site dir, processed as
    # site-packages .pth files are)
    from evalkit.lm_eval.cli import install_hook

    site_dir = tmp_path / "site"
    site_dir.mkdir()
    install_hook(site_dir)
    script = (f"import site, sys; site.addsitedir({str(site_dir)!r}); "
              f"from lm_eval.__main__ import cli_evaluate; "
              f"sys.argv = ['lm-eval', *{args!r}]; cli_evaluate()")
    return [sys.executable, "-c", script]


@pytest.mark.parametrize("route", ["wrapper", "hook"])
def test_niah_with_only_the_model_name(tmp_path, route):
    from evalkit.model_adapters.embedded import smollm2_gguf_path

    try:
        smollm2_gguf_path()
    except (ModuleNotFoundError, FileNotFoundError) as e:
        pytest.skip(str(e))
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "OMP_NUM_THREADS": "1"}
    cmd = _command(route, tmp_path, ARGS + ["--limit", "1", "--output_path", str(tmp_path / "out")])
    proc = subprocess.run(cmd, capture_output=True, text=True, env=env, cwd=tmp_path, timeout=600)
    log = proc.stdout + proc.stderr
    assert proc.returncode == 0, log[-3000:]
    assert "No tokenizer or pretrained provided" not in log
    assert "Using tokenizer" in log and "smollm2-135m-instruct" in log  # the model's own folder
    [results] = list((tmp_path / "out").rglob("results_*.json"))
    res = json.loads(results.read_text())
    assert res["results"]["niah_single_1"]["1024,none"] in (0, 1)
    assert res["n-samples"]["niah_single_1"]["effective"] == 1



@pytest.mark.parametrize("model_args,tasks,expected", [
    ("name=no-such-model", "niah_single_1", "unknown model 'no-such-model'"),
    ("name=oracle", "no_such_task_xyz", "Tasks not found: no_such_task_xyz"),
    ("name=forgetful,capacity=abc", "niah_single_1",
     "model 'forgetful': option capacity='abc': expected an integer or none")])
def test_bad_input_to_the_wrapper_is_one_line_exit_2(tmp_path, model_args, tasks, expected):
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "OMP_NUM_THREADS": "1"}
    cmd = _command("wrapper", tmp_path, ["run", "--model", "evalkit", "--model_args", model_args,
                                         "--tasks", tasks, "--limit", "1"])
    proc = subprocess.run(cmd, capture_output=True, text=True, env=env, cwd=tmp_path, timeout=300)
    assert proc.returncode == 2 and "Traceback" not in proc.stderr, proc.stderr[-2000:]
    assert proc.stderr.strip().splitlines()[-1].startswith(f"evalkit-lm-eval: error: {expected}")
