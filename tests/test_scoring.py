"""Scoring metrics: the documented worked examples run as doctests, plus edge cases."""
import doctest

import pytest

import evalkit.scoring as scoring
from evalkit.scoring import (contains, exact_match, forced_choice, normalized_match,
                             partial_credit, score_sample, string_match_all, string_match_part)


def test_docstring_examples_hold():
    result = doctest.testmod(scoring)
    assert result.attempted >= 10 and result.failed == 0


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
    assert s["exact_match"] == s["forced_choice"] == 1.0 and len(s) == 7
    assert set(score_sample(None, ["4821"], [-0.1, -5.0])) == {"forced_choice"}
