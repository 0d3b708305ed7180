"""Scoring metrics and their registry: every metric's worked example runs as a doctest, plus
edge cases, and each metric is declared once."""
import ast
import doctest
from pathlib import Path

import pytest

import evalkit.scoring as scoring
from evalkit.scoring import (contains, exact_match, forced_choice, normalized_match,
                             partial_credit, score_sample, string_match_all, string_match_part)
from helpers import REPO, run_worked_example


def test_docstring_examples_hold():
    result = doctest.testmod(scoring)
    assert result.attempted >= 10 and result.failed == 0


def test_cell_stats_examples_hold():
    from evalkit import cell_stats

    result = doctest.testmod(cell_stats)
    assert result.attempted >= 7 and result.failed == 0  # every worked example, none failing


@pytest.mark.parametrize("name", list(scoring.METRICS))
def test_every_metric_has_a_worked_example_that_holds(name):
    m = scoring.METRICS[name]
    attempted, failed = run_worked_example(m)
    assert attempted >= 1 and failed == 0
    assert m.kind in scoring.KINDS and m.summary and not m.summary.startswith(">>>")


def test_registry_order_kinds_and_recall_preference():
    assert [m.name for m in scoring.METRICS.values()] == ["exact_match", "contains", "normalized_match",
                                     "word_match", "string_match_all", "string_match_part",
                                     "partial_credit", "forced_choice", "mqar_accuracy"]
    assert [m.name for m in scoring.of_kind(scoring.FORCED_CHOICE)] == ["forced_choice"]
    assert scoring.recall_preference() == ["mqar_accuracy", "word_match", "exact_match",
                                           "contains", "forced_choice"]
    assert all(m.higher_is_better for m in scoring.METRICS.values())


def test_bad_registrations_and_unknown_names_are_errors():
    def fn(prediction, gold):
        """No example here."""
        return 1.0

    with pytest.raises(ValueError, match="metric 'exact_match' is already registered \\(by "
                                         "evalkit.scoring.exact_match\\)"):
        scoring.metric("exact_match", kind=scoring.GENERATION)(exact_match)
    with pytest.raises(ValueError, match="kind 'ranking'"):
        scoring.metric("new_one", kind="ranking")(exact_match)
    with pytest.raises(ValueError, match="needs a worked example"):
        scoring.metric("new_one", kind=scoring.GENERATION)(fn)
    with pytest.raises(ValueError, match="recall metric must be higher-is-better"):
        scoring.metric("new_one", kind=scoring.GENERATION, higher_is_better=False,
                       recall_rank=9)(exact_match)
    assert "new_one" not in scoring.METRICS
    with pytest.raises(ValueError, match="unknown metric 'exact'; did you mean 'exact_match'"):
        scoring.get("exact")
    with pytest.raises(ValueError, match="results.json: unknown metric.*'bleu'"):
        scoring.check_names(["exact_match", "bleu"], "results.json")


def test_every_metric_is_declared_once():
    """A metric name is written as a string only in evalkit/scoring.py: every other module
    reads the registry (a dict key describing how forced choice is computed aside)."""
    copies = []
    for root in ("evalkit", "model_adapters", "tasks"):
        for path in sorted((REPO / root).rglob("*.py")):
            if path == REPO / "evalkit" / "scoring.py":
                continue
            tree = ast.parse(path.read_text())
            keys = {id(k) for n in ast.walk(tree) if isinstance(n, ast.Dict) for k in n.keys}
            copies += [f"{path.relative_to(REPO)}:{n.lineno}: {n.value!r}"
                       for n in ast.walk(tree) if isinstance(n, ast.Constant)
                       and n.value in scoring.METRICS and id(n) not in keys]
    assert not copies, copies


def test_multi_value_answers_must_come_in_order():
    gold = ["17", "4821"]
    assert exact_match("17, 4821", gold) == 1.0
    assert exact_match("4821, 17", gold) == 0.0          # order matters for exact match
    assert string_match_all("4821, 17", gold) == 1.0     # but not for RULER's all-match
    assert contains("4821 and 17", gold) == 1.0
    assert normalized_match(" 17 ,4821. ", gold) == 1.0


def test_misses_score_zero():
    assert exact_match("4820", ["4821"]) == 0.0
    assert string_match_part("nothing", ["a1", "b2"]) == 0.0
    assert partial_credit("", ["4821"]) == 0.0
    assert partial_credit("9821", ["4821"]) == 0.0       # prefix credit only


def test_forced_choice_needs_distractors_and_strict_win():
    with pytest.raises(ValueError, match="at least one distractor"):
        forced_choice([-1.0])
    assert forced_choice([-1.0, -0.5, -3.0]) == 0.0


def test_score_sample_combines_generation_and_choice():
    s = score_sample(" 4821", ["4821"], [-0.1, -5.0])
    assert s["exact_match"] == s["forced_choice"] == 1.0 and len(s) == 8
    assert set(score_sample(None, ["4821"], [-0.1, -5.0])) == {"forced_choice"}


def test_formatting_examples_hold():
    from evalkit import formatting

    result = doctest.testmod(formatting)
    assert result.attempted == 5 and result.failed == 0
