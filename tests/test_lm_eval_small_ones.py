"""Issue 58 item 6: `--tokenizer NAME` takes a registered model's name from any working
directory (CONTRIBUTING's relative tokenizer folder worked only from the repository root, and
`--tokenizer recall-gla-tiny` was refused); an exported evalkit task reports only the metrics
of its own questions (a needle task reported mqar_accuracy) and `--tasks evalkit_<task>`
runs its forced-choice variant too; `evalkit --help` names evalkit-lm-eval."""
import json

import pytest
import yaml

from helpers import TINY_TOKENIZER

GRID = ["--lengths", "256", "--depths", "0.5", "--loads", "2", "--samples", "1"]


def test_tokenizer_by_model_name_from_any_folder(tmp_path, monkeypatch, capsys):
    from evalkit.cli import main

    assert main(["generate", "needle", "--tokenizer", str(TINY_TOKENIZER), *GRID,
                 "--out", str(tmp_path / "by_path.jsonl")]) == 0
    monkeypatch.chdir(tmp_path)  # not the repository root
    assert main(["generate", "needle", "--tokenizer", "recall-gla-tiny", *GRID,
                 "--out", "by_name.jsonl"]) == 0
    # the same tokenizer: the same probes, byte for byte
    assert (tmp_path / "by_name.jsonl").read_bytes() == (tmp_path / "by_path.jsonl").read_bytes()
    capsys.readouterr()
    assert main(["generate", "needle", "--tokenizer", "model_adapters/tiny/tokenizer", *GRID,
                 "--out", "x.jsonl"]) == 2
    err = capsys.readouterr().err
    assert "model_adapters/tiny/tokenizer" in err and "recall-gla-tiny" in err
    assert not (tmp_path / "x.jsonl").exists()


def test_exported_task_reports_its_own_metrics_and_runs_both_ways(tmp_path, capsys):
    pytest.importorskip("lm_eval")
    from evalkit import scoring
    from evalkit.cli import main

    out = tmp_path / "export"
    assert main(["lm-eval-export", "--tasks", "needle", "--tokenizer", "recall-gla-tiny", *GRID,
                 "--out", str(out)]) == 0
    printed = capsys.readouterr().out
    assert f"evalkit-lm-eval run --model evalkit --model_args name=recall-gla-tiny " \
           f"--include_path {out.resolve()} --tasks evalkit_needle" in printed
    gen = yaml.safe_load((out / "evalkit_needle_256.yaml").read_text()
                         .replace("!function", ""))
    names = [m["metric"] for m in gen["metric_list"]]
    assert scoring.MQAR_METRIC not in names
    assert "word_match" in names and "exact_match" in names
    choice = yaml.safe_load((out / "evalkit_needle_choice_256.yaml").read_text()
                            .replace("!function", ""))
    assert "evalkit_needle" in choice["tag"]  # `--tasks evalkit_needle` includes it

    import evalkit.lm_eval.bridge  # noqa: F401  -- registers --model "evalkit"
    from lm_eval import simple_evaluate
    from lm_eval.tasks import TaskManager

    tm = TaskManager(include_path=str(out), include_defaults=False)
    res = simple_evaluate(model="evalkit", model_args="name=oracle", task_manager=tm,
                          tasks=["evalkit_needle"], bootstrap_iters=0)["results"]
    assert set(res) == {"evalkit_needle_256", "evalkit_needle_choice_256"}
    assert res["evalkit_needle_256"]["word_match,none"] == 1.0
    assert not any(k.startswith(scoring.MQAR_METRIC) for k in res["evalkit_needle_256"])
    assert res["evalkit_needle_choice_256"]["forced_choice,none"] == 1.0
    assert json.loads((out / "evalkit_export.json").read_text())["tasks"]["needle"]


def test_help_names_the_lm_eval_command(capsys):
    from evalkit.cli import main

    with pytest.raises(SystemExit):
        main(["--help"])
    text = capsys.readouterr().out
    assert "evalkit-lm-eval run --model evalkit --model_args name=M" in text
