"""Published curves beside ours (evalkit.leaderboard.published): drawn only where the board
holds the models they speak to, on the token axis only, and refused when malformed."""
from __future__ import annotations

import pandas as pd
import pytest

from evalkit.leaderboard import plots as P
from evalkit.leaderboard.published import CURVES, PublishedCurve, curves_for

TWIN = {"name": "smollm2-135m-gla-w64-s4", "parent": "smollm2-135m", "window": 64, "sinks": 4}
PARENT = {"name": "smollm2-135m", "state_kind": "kv"}


def test_curves_speak_to_linearized_twins_only():
    assert curves_for("needle", {"parent": PARENT}) == []
    got = curves_for("needle", {"parent": PARENT, "twin": TWIN})
    assert [c.model for c in got] == ["Gated DeltaNet (linearized)", "GLA (linearized)"]
    assert all(c.label.startswith("theirs: ") and "2504.14366" in c.label for c in got)
    # a twin elsewhere on the board, not on this task: nothing drawn
    assert curves_for("needle", {"parent": PARENT, "twin": TWIN}, models={"parent"}) == []
    assert curves_for("multikey", {"twin": TWIN}) == []


def test_a_curve_is_one_fraction_per_length():
    with pytest.raises(ValueError, match="one recall per length"):
        PublishedCurve("x", "m", "needle", (512, 1024), (0.5,), "", bool)
    with pytest.raises(ValueError, match="fraction"):
        PublishedCurve("x", "m", "needle", (512,), (99.4,), "", bool)  # a percentage
    for c in CURVES:
        assert list(c.lengths) == sorted(c.lengths)


def test_recall_vs_length_draws_them_on_tokens_not_characters(tmp_path):
    by_len = pd.DataFrame({"task_label": "needle", "model_label": ["twin"] * 3,
                           "target_length": [256, 1024, 4096], "prompt_chars": [900, 3600, 14400],
                           "recall": [1.0, 0.5, 0.25], "recall_lo": [0.7, 0.3, 0.1],
                           "recall_hi": [1.0, 0.7, 0.5],
                           "n": [8, 8, 8]})
    theirs = curves_for("needle", {"twin": TWIN})
    plain = P.recall_vs_length(by_len, "needle", tmp_path / "a.png", 0.85, False)
    drawn = P.recall_vs_length(by_len, "needle", tmp_path / "b.png", 0.85, False, theirs)
    assert plain.read_bytes() != drawn.read_bytes()
    chars = P.recall_vs_length(by_len, "needle", tmp_path / "c.png", 0.85, True)
    chars_theirs = P.recall_vs_length(by_len, "needle", tmp_path / "d.png", 0.85, True, theirs)
    assert chars.read_bytes() == chars_theirs.read_bytes()  # their characters are unknown
