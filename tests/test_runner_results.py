"""The run directory, results.json aggregates, failure isolation and over-length flags."""
from __future__ import annotations

import json
import os
import statistics
from collections import defaultdict
from pathlib import Path

import pytest
import torch
import yaml

from evalkit.cli import main as cli_main
from evalkit.runner import SuiteError, load_suite, resolve
from evalkit.runner.suite import validate
from leaderboard_run import mean_wilson
from runner_support import TOY_TASKS, build_tokenizer, read_samples, run, suite_dict

REPO = Path(__file__).resolve().parent.parent
RUN_FILES = {"config.json", "provenance.json", "samples.jsonl", "results.json", "execution.json",
             "DONE"}


@pytest.fixture(scope="module")
def tok_dir(tmp_path_factory):
    return build_tokenizer(tmp_path_factory.mktemp("tok"))


@pytest.fixture(scope="module")
def small_run(tok_dir, tmp_path_factory):
    out = tmp_path_factory.mktemp("runs") / "small"
    suite = suite_dict(tok_dir, models=("oracle", {"name": "forgetful", "options": {"capacity": 1000}}),
                       tasks=("toy_recall", {"name": "toy_conv", "lengths": [256, 384]}),
                       lengths=[96, 128], depths=[0.3],
                       loads=[2, 4], samples=2, threads=1)
    import torch

    before = torch.get_num_threads()
    outcome = run(suite, out)
    assert torch.get_num_threads() == before  # `threads` is restored after the run
    return outcome, out


def test_run_directory_is_complete_and_done_is_written_last(small_run):
    outcome, out = small_run
    files = {p.name for p in out.iterdir() if p.is_file()}
    assert RUN_FILES <= files
    assert not [p for p in out.rglob("*.tmp")]  # atomic writes leave no temporaries
    done_at = (out / "DONE").stat().st_mtime_ns
    assert all(p.stat().st_mtime_ns <= done_at for p in out.rglob("*") if p.is_file())
    done = json.loads((out / "DONE").read_text())
    assert done["samples"] == outcome.samples == len(read_samples(out)) > 0
    res = json.loads((out / "results.json").read_text())
    for key in ("run_id", "evalkit_version", "created", "config_hash", "provenance", "models",
                "tasks", "rows", "prefill", "failures"):
        assert key in res
    prov = res["provenance"]
    assert prov == json.loads((out / "provenance.json").read_text())
    assert prov["git"]["commit"] and prov["git"]["dirty"] in (True, False)
    assert prov["packages"]["torch"] and prov["seeds"]["seed"] == 0 and prov["finished"]
    # the machine that computed, beyond the kernel string: CPU model, torch's kernel dispatch level
    assert prov["cpu"]["torch_capability"] == torch.backends.cpu.get_cpu_capability()
    assert prov["cpu"]["cores"] == os.cpu_count() and prov["cpu"]["model"]
    for name, m in res["models"].items():
        assert len(m["hash"]) == 64 and m["tokenizer_hash"] == prov["tokenizers"][name]
    assert res["models"]["oracle"]["hash"] != res["models"]["forgetful"]["hash"]
    assert set(res["tasks"]) == {"toy_recall", "toy_conv"}
    assert all({"version", "config_hash", "source"} <= set(t) for t in res["tasks"].values())
    assert json.loads((out / "config.json").read_text())["config_hash"] == res["config_hash"]


def test_aggregates_match_a_hand_computation(small_run):
    _, out = small_run
    samples = read_samples(out)
    res = json.loads((out / "results.json").read_text())
    cells = defaultdict(list)
    for s in samples:
        cells[(s["model"], s["task"], s["target_length"], s["depth"], s["load"])].append(s)
    assert len(res["rows"]) == len(cells)
    for row in res["rows"]:
        cell = cells[(row["model"], row["task"], row["target_length"], row["depth"], row["load"])]
        assert row["n"] == len(cell) and row["n_failed"] == row["n_flagged"] == 0
        assert row["model_hash"] == cell[0]["model_hash"]
        assert row["task_config_hash"] == res["tasks"][row["task"]]["config_hash"]
        for metric in ("exact_match", "forced_choice", "partial_credit"):
            mean, lo, hi = mean_wilson([s["scores"][metric] for s in cell])
            got = row["metrics"][metric]
            assert (got["mean"], got["lo"], got["hi"]) == pytest.approx((mean, lo, hi), abs=1e-12)
            assert got["n"] == len(cell) and "stderr" not in got
        assert row["prompt_tokens"] == pytest.approx(statistics.mean(s["prompt_tokens"] for s in cell))
        assert row["prompt_chars"] == pytest.approx(statistics.mean(s["prompt_chars"] for s in cell))
        assert row["state_bytes"] == round(statistics.mean(s["state_bytes"] for s in cell))
        assert row["state_kind"] == "memory"
    # Not a degenerate run: the two models differ, and some cell's interval is not at an end.
    em = {m: statistics.mean(s["scores"]["exact_match"] for s in samples if s["model"] == m)
          for m in ("oracle", "forgetful")}
    assert em["oracle"] == 1.0 > em["forgetful"]
    assert any(0 < r["metrics"]["exact_match"]["lo"] < r["metrics"]["exact_match"]["hi"] < 1
               for r in res["rows"])
    p = res["prefill"]
    assert p["prompt_tokens"] == sum(s["prompt_tokens"] for s in samples)
    assert p["tokens_prefilled"] == sum(x["tokens_prefilled"] for x in p["by_model_task"])
    assert p["savings_ratio"] == pytest.approx(p["prompt_tokens"] / p["tokens_prefilled"])
    assert p["savings_ratio"] > 1.5
    assert res["failures"] == 0 and res["summary"]["samples"] == len(samples)


def test_one_failing_sample_is_recorded_and_the_run_goes_on(tok_dir, tmp_path, capsys):
    cfg = suite_dict(tok_dir, models=({"name": "broken", "spec": "broken-oracle",
                                       "options": {"fail_generate": [3]}},),
                     tasks=("toy_recall",), lengths=[96], depths=[0.5], loads=[4], samples=2)
    (tmp_path / "suite.yaml").write_text(yaml.safe_dump(cfg))
    rc = cli_main(["run", "--config", str(tmp_path / "suite.yaml"), "--output", str(tmp_path / "r"),
                   "--no-progress"])
    assert rc == 1  # documented: any failed sample -> exit status 1
    err = capsys.readouterr()
    assert "1 failed" in err.out and "1 samples failed" in err.err
    samples = read_samples(tmp_path / "r")
    bad = [s for s in samples if s["error"]]
    assert len(samples) == 6 and len(bad) == 1
    assert "deliberate failure in generate call 3" in bad[0]["error"] and bad[0]["prediction"] is None
    assert all(s["scores"]["exact_match"] == 1.0 for s in samples if not s["error"])
    res = json.loads((tmp_path / "r" / "results.json").read_text())
    assert res["failures"] == 1 and (tmp_path / "r" / "DONE").exists()
    [row] = res["rows"]
    # the failure counts in n, a miss in every metric (evalkit.cell_stats; issue 59)
    em = row["metrics"]["exact_match"]
    assert (row["n"], row["n_failed"]) == (6, 1) and em["n"] == 6
    assert em["mean"] == 5 / 6 and em["answered"] == 1.0


def test_a_failing_extend_fails_only_the_questions_after_it(tok_dir, tmp_path):
    # toy_conv streams one state through the turns; the 2nd extend is the first turn step.
    cfg = suite_dict(tok_dir, models=({"name": "broken", "spec": "broken-oracle",
                                       "options": {"fail_extend": [2]}},),
                     tasks=("toy_conv",), samples=1)
    outcome = run(cfg, tmp_path / "r")
    samples = read_samples(tmp_path / "r")
    assert 0 < outcome.failed < len(samples)
    assert all("deliberate failure in extend call 2" in s["error"] for s in samples if s["error"])


def test_over_length_prompts_are_flagged_not_cut(tok_dir, tmp_path):
    # Length 200 is beyond the oracle's 150 but within the (unlimited) forgetful model's reach,
    # so it is run and the oracle's over-length prompts are flagged (a length beyond every
    # model's maximum is refused instead: tests/test_hardening_runner.py).
    cfg = suite_dict(tok_dir, models=({"name": "oracle", "options": {"max_length": 150}},
                                      {"name": "forgetful", "options": {"capacity": 1000}}),
                     tasks=("toy_recall",), lengths=[64, 200], depths=[0.5], loads=[2], samples=2)
    outcome = run(cfg, tmp_path / "r")
    samples = read_samples(tmp_path / "r")
    flagged = [s for s in samples if s["flag"]]
    assert flagged and len(flagged) < len(samples) and outcome.flagged == len(flagged)
    for s in samples:
        over = s["model"] == "oracle" and s["prompt_tokens"] > 150
        assert (s["flag"] == "over_length") == over
        assert (s["prediction"] is None) == over and (s["scores"] == {}) == over
    res = json.loads((tmp_path / "r" / "results.json").read_text())
    long_row = next(r for r in res["rows"] if r["target_length"] == 200
                    and r["model"] == "oracle")
    assert long_row["n_flagged"] == sum(s["target_length"] == 200 for s in flagged) > 0
    assert res["failures"] == 0 and res["summary"]["flagged"] == len(flagged)


def test_cli_flags_run_end_to_end(tok_dir, tmp_path, capsys):
    rc = cli_main(["run", "--models", "oracle", "--model-args", f"tokenizer={tok_dir}",
                   "--tasks", "toy_*", "--include", str(TOY_TASKS), "--lengths", "256",
                   "--depths", "0.5", "--loads", "2", "--samples", "1", "--limit", "1",
                   "--output", str(tmp_path / "r"), "--log-samples", "--no-progress"])
    assert rc == 0
    out = capsys.readouterr().out
    assert "0 failed" in out and "savings ratio" in out
    res = json.loads((tmp_path / "r" / "results.json").read_text())
    assert set(res["tasks"]) == {"toy_recall", "toy_conv"}  # the glob
    probes = (tmp_path / "r" / "probes.jsonl").read_text().splitlines()
    assert len(probes) == 2  # --limit 1 per task; --log-samples writes them
    # An existing run directory is never overwritten without --resume.
    assert cli_main(["run", "--models", "oracle", "--model-args", f"tokenizer={tok_dir}",
                     "--tasks", "toy_recall", "--include", str(TOY_TASKS),
                     "--output", str(tmp_path / "r"), "--no-progress"]) == 2
    assert "already exists" in capsys.readouterr().err


def test_suite_errors_name_the_file_key_and_expected_type(tmp_path, tok_dir):
    bad = tmp_path / "bad.yaml"
    bad.write_text("models: [oracle]\ntasks: [toy_recall]\nseed: many\nbatchsize: 2\n")
    with pytest.raises(SuiteError) as e:
        load_suite(bad)
    msg = str(e.value)
    assert f"{bad}: key 'seed'" in msg and "integer" in msg
    assert f"{bad}: unknown key 'batchsize'" in msg
    with pytest.raises(SuiteError, match=r"unknown model 'no-such-model' \(known: .*oracle"):
        resolve(validate(suite_dict(tok_dir, models=("no-such-model",)), "s.yaml"), "s.yaml")
    with pytest.raises(SuiteError, match=r"unknown task or group 'nope'"):
        resolve(validate(suite_dict(tok_dir, tasks=("nope",)), "s.yaml"), "s.yaml")


@pytest.mark.parametrize("name", ["quick", "standard"])
def test_shipped_suites_parse(name):
    suite = load_suite(REPO / "configs" / f"{name}.yaml")
    assert suite.models and suite.tasks


def test_command_line_grid_flags_beat_per_task_overrides(tmp_path):
    import argparse

    from evalkit.cli.run import add_parser, build_suite

    cfg = tmp_path / "s.yaml"
    cfg.write_text("models: [oracle]\ntasks: [{name: toy_recall, lengths: [1024], loads: [8]}]\n"
                   "lengths: [256]\n")
    parser = argparse.ArgumentParser()
    add_parser(parser.add_subparsers())
    suite, source, resume = build_suite(parser.parse_args(["run", "--config", str(cfg),
                                                           "--lengths", "64,128"]))
    assert (suite.lengths, suite.tasks[0].lengths, suite.tasks[0].loads) == ((64, 128), None, (8,))
    assert (source, resume) == (str(cfg), None)


def test_models_flag_picks_a_declared_row_with_its_options(tmp_path):
    """`--models NAME` on a config that declares NAME runs that row as declared (a twin's
    state-off row keeps state_off=true): the standard board runs one folder per model."""
    import argparse

    from evalkit.cli.run import add_parser, build_suite

    parser = argparse.ArgumentParser()
    add_parser(parser.add_subparsers())
    cfg = REPO / "configs" / "standard-twins.yaml"
    off = "smollm2-135m-gdn-w64-s4-state-off"
    suite, _, _ = build_suite(parser.parse_args(["run", "--config", str(cfg), "--models",
                                                 f"{off},oracle"]))
    (row, extra), full = suite.models, load_suite(cfg)
    assert row == next(m for m in full.models if m.name == off)
    assert (row.spec, row.options) == ("smollm2-135m-gdn-w64-s4", {"state_off": True})
    assert (extra.name, extra.spec, extra.options) == ("oracle", None, {})
    # its run's model identity is the full suite's: the same row, the same samples
    assert [m for m in resolve(suite).models if m.name == off] == \
        [m for m in resolve(full).models if m.name == off]
    # a typo of a row (no model of that name either) names the row
    with pytest.raises(SuiteError, match=rf"no such row in .*did you mean its row '{off}'"):
        build_suite(parser.parse_args(["run", "--config", str(cfg), "--models", off[:-1]]))
    # options come from one place: --model-args beside a declared name is refused
    with pytest.raises(SuiteError, match=rf"--models {off}: .*declares this model"):
        build_suite(parser.parse_args(["run", "--config", str(cfg), "--models", off,
                                       "--model-args", "state_off=false"]))
