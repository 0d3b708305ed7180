"""evalkit's default recall finds a value only as a whole word or number (issue 58): RULER's
substring match, kept for parity, credits ": 1522" for the gold 15 and a one-letter value
inside almost any sentence."""
import json
import shutil

import pytest

from evalkit import scoring
from evalkit.scoring import string_match_all, word_match
from helpers import REPO


def default_generation_metric() -> scoring.Metric:
    """The leaderboard's default recall for a task of plain generated answers (no MQAR)."""
    return next(scoring.get(m) for m in scoring.recall_preference()
                if scoring.get(m).kind == scoring.GENERATION and not scoring.get(m).question_kinds)


@pytest.mark.parametrize("answer, gold", [(": 1522", ["15"]), (" 1522", ["152"]),
                                          (" 15.5", ["15"]), (" 2154", ["15"]),
                                          ("The ship sailed past another dock at noon.", ["A"]),
                                          ("a dock at the bay", ["A"]),
                                          ("4821, 1799", ["17", "4821"])])
def test_a_value_inside_another_word_or_number_is_not_found(answer, gold):
    assert default_generation_metric().fn(answer, gold) < 1.0
    assert word_match(answer, gold) == (0.5 if len(gold) == 2 else 0.0)


def test_ruler_substring_match_still_credits_them():
    assert string_match_all(": 1522", ["15"]) == 1.0          # parity with RULER's scorer
    assert string_match_all("another dock", ["A"]) == 1.0


@pytest.mark.parametrize("answer, gold", [(": 15.", ["15"]), ("15,", ["15"]), (" 15", ["15"]),
                                          ("the answer is A", ["A"]), ("Dock A.", ["A"]),
                                          ("(15)", ["15"]), ("17, 4821", ["17", "4821"]),
                                          ("17,4821", ["17", "4821"]),
                                          (" tin-apple", ["apple"]),
                                          (" 3f1c-9e aa", ["3f1c-9e"]),
                                          (" blue sky over", ["blue sky"])])
def test_a_whole_value_is_found(answer, gold):
    assert word_match(answer, gold) == default_generation_metric().fn(answer, gold) == 1.0


def test_empty_gold_is_refused():
    with pytest.raises(ValueError, match="empty gold"):
        word_match("15", [" "])


def test_runs_scored_before_the_metric_existed_get_it_from_their_answers(tmp_path):
    """A committed run (no word_match in its samples) is published with word_match computed
    from each sample's stored prediction and gold; its stored scores stay as they were."""
    from evalkit.leaderboard.load import SCORE_PREFIX, load_run

    src = REPO / "leaderboard" / "runs" / "standard-twins" / "smollm2-135m"
    run = tmp_path / "run"
    shutil.copytree(src, run)
    stored = [json.loads(l) for l in (run / "samples.jsonl").read_text().splitlines()]
    assert not any("word_match" in (s.get("scores") or {}) for s in stored)
    df = load_run(run).samples.set_index(["probe_hash", "question"])
    n = 0
    for s in stored:
        row = df.loc[(s["probe_hash"], s["question"])]
        if s["error"] is None and s["flag"] is None:
            assert row[SCORE_PREFIX + "word_match"] == word_match(s["prediction"], s["gold"])
            for m, v in s["scores"].items():
                assert row[SCORE_PREFIX + m] == v
            n += 1
        else:
            assert row[SCORE_PREFIX + "word_match"] != row[SCORE_PREFIX + "word_match"]  # NaN
    assert n > 100


def test_a_task_that_declares_its_metric_keeps_it_on_the_board():
    """lm-eval's RULER tasks declare RULER's metric (results.json lm_eval.board.tasks[...]
    ["metric"], read by load as task_metric): the board's recall there stays RULER's substring
    match, for parity; evalkit's own tasks get word_match."""
    import pandas as pd

    from evalkit.leaderboard.tables import choose_primary
    from evalkit.lm_eval.rows import task_entry

    assert task_entry("niah_single_1", "1", {}, "0.4.13", "string_match_all")["metric"] == \
        "string_match_all"
    assert "metric" not in task_entry("gsm8k", "1", {}, "0.4.13")
    rows = []
    for task, own in (("niah_single_1", "string_match_all"), ("needle", "")):
        pred, gold = " 1522", ["15"]
        scores = scoring.score_sample(pred, gold)
        rows.append({"task_label": task, "task_metric": own, "scored": True,
                     **{f"score.{m}": v for m, v in scores.items()}})
    df = pd.DataFrame(rows)
    assert choose_primary(df) == {"niah_single_1": "string_match_all", "needle": "word_match"}
    assert choose_primary(df, "exact_match") == {"niah_single_1": "exact_match",
                                                 "needle": "exact_match"}
