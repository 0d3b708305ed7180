"""Scoring metrics. Each takes the model's prediction and the gold answers, returns [0, 1].

Generation metrics (prediction = the greedy continuation after the answer prefix). `gold`
lists every value the answer must hold; several values (multi-value and multi-key questions)
are expected comma-separated in gold order:

>>> exact_match(" 4821", ["4821"])
1.0
>>> exact_match(" 17, 4821", ["17", "4821"])
1.0
>>> contains("4821 is the number", ["4821"])
1.0
>>> normalized_match("  Blue-Sky!", ["blue sky"])    # case, whitespace, punctuation ignored
1.0

RULER's two multi-reference metrics (case-insensitive substring tests):

>>> string_match_all("7, 12 and 40", ["7", "12", "99"])   # share of references found
0.6666666666666666
>>> string_match_part("7, 12 and 40", ["7", "12", "99"])  # 1 if any reference is found
1.0

Partial credit for multi-token values: the share of each gold value's characters matched as
a prefix by some word of the prediction, averaged over gold values (a digit is one token in
the tiny tokenizer, so this is per token there):

>>> partial_credit("4829", ["4821"])
0.75
>>> partial_credit("4821, 77", ["4821", "7712"])
0.75

Forced choice (from log-probabilities of the candidates, gold first): 1 if gold is the
strict argmax. Ties count as wrong, so a model that scores everything equal gets 0.

>>> forced_choice([-1.2, -3.0, -2.5])
1.0
>>> forced_choice([-2.0, -2.0])
0.0
"""
from __future__ import annotations

import re
import string
from typing import Callable, Sequence

_PUNCT = re.compile(f"[{re.escape(string.punctuation)}]")


def normalize(text: str) -> str:
    """Lower-case, punctuation to spaces, collapse whitespace."""
    return " ".join(_PUNCT.sub(" ", text.lower()).split())


def _items(prediction: str, n: int) -> list[str]:
    return [prediction] if n == 1 else prediction.split(",")


def exact_match(prediction: str, gold: Sequence[str]) -> float:
    return float([p.strip() for p in _items(prediction, len(gold))] == [g.strip() for g in gold])


def contains(prediction: str, gold: Sequence[str]) -> float:
    """1 if every gold value occurs in the prediction (case-sensitive)."""
    return float(all(g in prediction for g in gold))


def normalized_match(prediction: str, gold: Sequence[str]) -> float:
    items = [normalize(p) for p in _items(prediction, len(gold))]
    return float(items == [normalize(g) for g in gold])


def string_match_all(prediction: str, gold: Sequence[str]) -> float:
    p = prediction.lower()
    return sum(g.lower() in p for g in gold) / len(gold)


def string_match_part(prediction: str, gold: Sequence[str]) -> float:
    p = prediction.lower()
    return float(any(g.lower() in p for g in gold))


def _prefix_share(word: str, value: str) -> float:
    n = 0
    for a, b in zip(word, value):
        if a != b:
            break
        n += 1
    return n / len(value) if value else 0.0


def partial_credit(prediction: str, gold: Sequence[str]) -> float:
    words = [w for w in re.split(r"[\s,;]+", prediction.strip()) if w] or [""]
    return sum(max(_prefix_share(w, g) for w in words) for g in gold) / len(gold)


def forced_choice(logprobs: Sequence[float]) -> float:
    """Candidates' log-probabilities with gold at index 0."""
    if len(logprobs) < 2:
        raise ValueError("forced choice needs gold and at least one distractor")
    best = max(logprobs[1:])
    return float(logprobs[0] > best)


GENERATION_METRICS: dict[str, Callable[[str, Sequence[str]], float]] = {
    "exact_match": exact_match,
    "contains": contains,
    "normalized_match": normalized_match,
    "string_match_all": string_match_all,
    "string_match_part": string_match_part,
    "partial_credit": partial_credit,
}


def score_sample(prediction: str | None, gold: Sequence[str],
                 logprobs: Sequence[float] | None = None) -> dict[str, float]:
    """All metrics that apply to one answered question."""
    out: dict[str, float] = {}
    if prediction is not None:
        out = {name: fn(prediction, gold) for name, fn in GENERATION_METRICS.items()}
    if logprobs is not None and len(logprobs) >= 2:
        out["forced_choice"] = forced_choice(logprobs)
    return out
