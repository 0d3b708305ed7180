"""CONTRIBUTING.md "Add a metric", followed literally: one registration of a toy metric, which
then flows through scoring, a real runner run (the oracle on the built-in needle task), the
leaderboard (as each task's recall metric, by its recall_rank) and the lm-eval export, run by
lm-eval itself. Without the registration the same run's scores are an error, never dropped."""
from __future__ import annotations

import json
from typing import Sequence

import pandas as pd
import pytest

from evalkit import scoring
from evalkit.cell_stats import wilson
from evalkit.scoring import GENERATION, metric
from helpers import TINY_TOKENIZER, run_worked_example

NAME = "toy_starts_with"


@pytest.fixture(scope="module")
def toy():
    @metric(NAME, kind=GENERATION, higher_is_better=True, recall_rank=-1)
    def toy_starts_with(prediction: str, gold: Sequence[str]) -> float:
        """1 if the answer starts with the first gold value.

        >>> toy_starts_with(" 4821, said the clerk", ["4821"])
        1.0
        """
        return float(prediction.strip().startswith(gold[0]))

    yield scoring.METRICS[NAME]
    scoring.METRICS.remove(NAME)


@pytest.fixture(scope="module")
def run_dir(toy, tmp_path_factory):
    from evalkit.runner import resolve, run_suite
    from evalkit.runner.suite import validate

    suite = {"name": "recipe", "models": ["oracle"], "tasks": ["needle"], "lengths": [128],
             "depths": [0.5], "loads": [1], "samples": 2}
    out = run_suite(resolve(validate(suite, "test"), "test"),
                    output=tmp_path_factory.mktemp("recipe") / "run", progress=False)
    assert out.failed == 0
    return out.run_dir


def test_the_worked_example_runs_and_scoring_uses_the_metric(toy):
    assert run_worked_example(toy) == (1, 0)
    assert scoring.score_sample(" 4821.", ["4821"])[NAME] == 1.0
    assert scoring.score_sample("no: 4821", ["4821"])[NAME] == 0.0


def test_runner_scores_and_aggregates_it(run_dir):
    samples = [json.loads(x) for x in (run_dir / "samples.jsonl").read_text().splitlines()]
    assert samples and all(s["scores"][NAME] == 1.0 for s in samples)  # the oracle recalls
    rows = json.loads((run_dir / "results.json").read_text())["rows"]
    assert rows and all(r["metrics"][NAME] == {"mean": 1.0, "lo": wilson(1.0, r["n"])[0],
                                               "hi": 1.0, "n": r["n"], "answered": 1.0}
                        for r in rows)


def test_leaderboard_reports_it_and_ranks_it_first(run_dir, tmp_path):
    from evalkit.leaderboard import publish

    publish([run_dir], tmp_path / "board")
    table = pd.read_csv(tmp_path / "board" / "results.csv")
    assert (table[NAME] == 1.0).all() and (table["primary_metric"] == NAME).all()
    readme = (tmp_path / "board" / "README.md").read_text()
    assert f"Primary metric: `{NAME}`" in readme
    assert f"`{NAME}`: 1 if the answer starts with the first gold value." in readme


def test_lm_eval_export_scores_it_through_lm_eval(toy, tmp_path):
    from lm_eval import simple_evaluate
    from lm_eval.tasks import TaskManager

    import evalkit.lm_eval.bridge  # noqa: F401  -- registers --model "evalkit"
    from evalkit.lm_eval.export import export_tasks

    manifest = export_tasks(["needle"], tmp_path, tokenizer=TINY_TOKENIZER, lengths=[256],
                            depths=[0.5], loads=[1], samples=1, choice=False)
    assert NAME in manifest["metrics"][GENERATION]
    assert f"metric: {NAME}" in (tmp_path / "evalkit_needle_256.yaml").read_text()
    tm = TaskManager(include_path=str(tmp_path), include_defaults=False)
    out = simple_evaluate(model="evalkit", model_args="name=oracle", task_manager=tm,
                          tasks=["evalkit_needle_256"], bootstrap_iters=0)
    assert out["results"]["evalkit_needle_256"][f"{NAME},none"] == 1.0


def test_without_the_registration_its_scores_are_an_error(run_dir, tmp_path):
    from evalkit.leaderboard import publish
    from evalkit.result import SampleResult
    from evalkit.runner.aggregate import rows

    registered = scoring.METRICS.remove(NAME)
    try:
        with pytest.raises(ValueError, match=f"samples.jsonl: scores: unknown metric.*'{NAME}'"):
            publish([run_dir], tmp_path / "board")
        lines = (run_dir / "samples.jsonl").read_text().splitlines()
        samples = [SampleResult.from_dict(json.loads(x)) for x in lines]
        with pytest.raises(ValueError, match=f"scores of oracle on needle: unknown metric.*'{NAME}'"):
            rows(samples, {})
    finally:
        scoring.METRICS.add(NAME, registered, "tests/test_recipe_metric.py")
