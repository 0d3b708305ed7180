"""Scoring metrics and their registry. Every metric returns a score in [0, 1].

A metric is declared once, with `@metric(name, kind=..., higher_is_better=..., recall_rank=...)`
on its function, whose docstring carries at least one worked example (a doctest, run by the
tests). Everything else reads `METRICS`: the runner scores each answered question with every
registered metric of the matching kind (`score_sample`), results.json and the leaderboard
aggregate them, the leaderboard picks each task's default recall metric by `recall_rank`, and
`evalkit lm-eval-export` lists them in the exported lm-eval tasks. A metric name that is not
registered is an error wherever it turns up (`get`, `check_names`).

Kinds (what the metric reads):
- generation: fn(prediction, gold) -> float. `prediction` is the greedy continuation after the
  answer prefix; `gold` lists every value the answer must hold, several values (multi-value
  and multi-key questions) expected comma-separated in gold order.
- forced_choice: fn(logprobs) -> float, the candidates' log-probabilities with gold first
  (a question needs gold and at least one distractor).

Two optional declarations narrow a metric: `question_kinds` (it scores only questions of those
kinds, e.g. MQAR's "mqar" queries; default every question) and `per_probe` (a cell's value is
the mean over probes of each probe's mean over its questions, Zoology's accuracy, and its
interval a bootstrap over probes; default the mean over questions).
"""
from __future__ import annotations

import functools
import re
import string
from dataclasses import dataclass
from typing import Callable, Iterable, Sequence

import numpy as np

from evalkit.registry import Registry, RegistryError

GENERATION = "generation"
FORCED_CHOICE = "forced_choice"
KINDS = (GENERATION, FORCED_CHOICE)


@dataclass(frozen=True)
class Metric:
    name: str
    kind: str
    higher_is_better: bool
    fn: Callable[..., float]
    # Position in the leaderboard's default choice of a task's recall metric (lowest first);
    # None: recall only when asked for (`publish --primary-metric`).
    recall_rank: int | None = None
    question_kinds: tuple[str, ...] = ()  # () : every question
    per_probe: bool = False               # cell value: mean over probes of per-probe means

    def applies_to(self, question_kind: str | None) -> bool:
        return not self.question_kinds or question_kind in self.question_kinds

    @property
    def summary(self) -> str:
        """The first line of the function's docstring."""
        return (self.fn.__doc__ or "").strip().splitlines()[0]


METRICS: Registry[Metric] = Registry("metric")


def metric(name: str, *, kind: str, higher_is_better: bool = True,
           recall_rank: int | None = None, question_kinds: Sequence[str] = (),
           per_probe: bool = False) -> Callable:
    """Register the decorated function as metric `name` (see the module doc)."""
    def register(fn: Callable[..., float]) -> Callable[..., float]:
        if kind not in KINDS:
            raise ValueError(f"metric {name!r}: kind {kind!r}, expected one of {KINDS}")
        if ">>>" not in (fn.__doc__ or ""):
            raise ValueError(f"metric {name!r}: {fn.__qualname__}'s docstring needs a worked "
                             f"example (a doctest: `>>> call` then the expected score)")
        if recall_rank is not None and not higher_is_better:
            raise ValueError(f"metric {name!r}: a recall metric must be higher-is-better")
        scored = _refusing_empty_gold(name, fn) if kind == GENERATION else fn
        METRICS.add(name, Metric(name, kind, higher_is_better, scored, recall_rank,
                                 tuple(question_kinds), per_probe),
                    f"{fn.__module__}.{fn.__qualname__}")  # a second one is refused here
        return scored
    return register


def _refusing_empty_gold(name: str, fn: Callable[..., float]) -> Callable[..., float]:
    """`fn` that refuses an empty gold value: "" matches an empty answer (exact_match) or is
    found in every answer (contains), so scoring it would report recall that never happened."""
    @functools.wraps(fn)
    def scored(prediction: str, gold: Sequence[str]) -> float:
        if not gold or any(not str(g).strip() for g in gold):
            raise ValueError(f"metric {name!r}: gold {list(gold)!r} holds no answer or an empty "
                             f"one; an empty gold cannot be scored (the probe is bad)")
        return fn(prediction, gold)
    return scored


def get(name: str) -> Metric:
    """The registered metric `name`; else a RegistryError (a ValueError) with close matches."""
    return METRICS.get(name)


def check_names(names: Iterable[str], where: str) -> None:
    """The registry's error, prefixed with `where`, for the first of `names` not registered."""
    for name in sorted(set(names)):
        try:
            METRICS.get(name)
        except RegistryError as e:
            raise RegistryError(f"{where}: {e}") from None


def of_kind(kind: str) -> list[Metric]:
    return [m for m in METRICS.values() if m.kind == kind]


def recall_preference() -> list[str]:
    """Metric names in the leaderboard's default order for a task's recall metric."""
    ranked = [m for m in METRICS.values() if m.recall_rank is not None]
    return [m.name for m in sorted(ranked, key=lambda m: m.recall_rank)]


# Whether the generated answer is the gold value: what a drift report counts as an answer that flips.
ANSWER_METRIC = "exact_match"


def score_sample(prediction: str | None, gold: Sequence[str],
                 logprobs: Sequence[float] | None = None,
                 question_kind: str | None = None) -> dict[str, float]:
    """Every registered metric that applies to one answered question (of `question_kind`)."""
    out: dict[str, float] = {}
    if prediction is not None:
        out.update((m.name, m.fn(prediction, gold)) for m in of_kind(GENERATION)
                   if m.applies_to(question_kind))
    if logprobs is not None and len(logprobs) >= 2:
        out.update((m.name, m.fn(logprobs)) for m in of_kind(FORCED_CHOICE)
                   if m.applies_to(question_kind))
    return out


def fill_missing(scores: dict[str, float], prediction: str | None, gold: Sequence[str],
                 question_kind: str | None = None) -> dict[str, float]:
    """A stored sample's `scores` plus every generation metric registered since it was scored,
    computed from its stored answer and gold (the stored scores are kept as they are), so a
    board publishes a new metric for old runs without rerunning them.

    >>> fill_missing({"exact_match": 0.0}, " 1522", ["15"])["word_match"]
    0.0
    """
    if prediction is None:
        return dict(scores)
    return {**score_sample(prediction, gold, None, question_kind), **scores}


def example_accuracy(hits: np.ndarray, scored: np.ndarray) -> np.ndarray:
    """Zoology's accuracy per example: the share of its scored positions that are right.

    hits, scored: [examples, positions] (hits counts only where scored). Examples with no
    scored position are dropped. The one definition behind `mqar_accuracy`'s per-probe
    aggregation (evalkit.runner.aggregate) and tasks.mqar.accuracy (training on id arrays).

    >>> example_accuracy(np.array([[1, 0, 1, 0], [1, 1, 0, 0]]),
    ...                  np.array([[1, 1, 1, 1], [1, 1, 0, 0]])).tolist()
    [0.5, 1.0]
    """
    hits, scored = np.asarray(hits, bool), np.asarray(scored, bool)
    if hits.shape != scored.shape or hits.ndim != 2:
        raise ValueError(f"hits and scored must be two [examples, positions] arrays of one "
                         f"shape, got {hits.shape} and {scored.shape}")
    n = scored.sum(1)
    return ((hits & scored).sum(1) / np.maximum(n, 1))[n > 0]


def zoology_accuracy(hits: np.ndarray, scored: np.ndarray) -> float:
    """Mean over examples of `example_accuracy`: Zoology's MQAR accuracy.

    >>> zoology_accuracy(np.array([[1, 0, 1, 0], [1, 1, 0, 0]]),
    ...                  np.array([[1, 1, 1, 1], [1, 1, 0, 0]]))
    0.75
    """
    per = example_accuracy(hits, scored)
    if not len(per):
        raise ValueError("no example has a scored position: accuracy is undefined")
    return float(per.mean())


def probe_means(scores: Sequence[tuple[str, float]]) -> list[float]:
    """Per-probe accuracy from (probe id, question score) pairs, probes in first-seen order:
    `example_accuracy` over one row per probe (what a per_probe metric averages).

    >>> probe_means([("a", 1.0), ("b", 1.0), ("a", 0.0), ("a", 1.0)])
    [0.6666666666666666, 1.0]
    """
    rows: dict[str, list[float]] = {}
    for pid, v in scores:
        rows.setdefault(pid, []).append(v)
    width = max((len(r) for r in rows.values()), default=0)
    hits = np.zeros((len(rows), width), bool)
    scored = np.zeros((len(rows), width), bool)
    for i, r in enumerate(rows.values()):
        hits[i, :len(r)] = np.asarray(r) >= 0.5  # per-query scores of a per_probe metric are 0/1
        scored[i, :len(r)] = True
    return example_accuracy(hits, scored).tolist() if rows else []


# -- the metrics ----------------------------------------------------------------------------

_PUNCT = re.compile(f"[{re.escape(string.punctuation)}]")


def normalize(text: str) -> str:
    """Lower-case, punctuation to spaces, collapse whitespace."""
    return " ".join(_PUNCT.sub(" ", text.lower()).split())


def _items(prediction: str, n: int) -> list[str]:
    return [prediction] if n == 1 else prediction.split(",")


@metric("exact_match", kind=GENERATION, recall_rank=1)
def exact_match(prediction: str, gold: Sequence[str]) -> float:
    """1 if the answer is the gold values, in order, up to surrounding whitespace.

    >>> exact_match(" 4821", ["4821"])
    1.0
    >>> exact_match(" 17, 4821", ["17", "4821"])
    1.0
    """
    return float([p.strip() for p in _items(prediction, len(gold))] == [g.strip() for g in gold])


@metric("contains", kind=GENERATION, recall_rank=2)
def contains(prediction: str, gold: Sequence[str]) -> float:
    """1 if every gold value occurs in the prediction (case-sensitive).

    >>> contains("4821 is the number", ["4821"])
    1.0
    """
    return float(all(g in prediction for g in gold))


@metric("normalized_match", kind=GENERATION)
def normalized_match(prediction: str, gold: Sequence[str]) -> float:
    """Exact match ignoring case, whitespace and punctuation.

    >>> normalized_match("  Blue-Sky!", ["blue sky"])
    1.0
    """
    items = [normalize(p) for p in _items(prediction, len(gold))]
    return float(items == [normalize(g) for g in gold])


def _word_pattern(value: str) -> re.Pattern:
    """`value` as a whole word or number: no letter, digit or underscore touching it, and no
    decimal part after it ("15.5" does not hold the number 15; "15." and "15," do)."""
    head = r"(?<!\w)(?<!\d\.)" if re.match(r"\w", value) else ""
    tail = r"(?!\w)(?!\.\d)" if re.search(r"\w$", value) else ""
    return re.compile(head + re.escape(value) + tail)


@metric("word_match", kind=GENERATION, recall_rank=0)
def word_match(prediction: str, gold: Sequence[str]) -> float:
    """Share of gold values found in the answer as written, each as a whole word or number.

    evalkit's default recall: a value inside a longer word or number does not count (RULER's
    substring match credits ": 1522" for the gold 15, and a one-letter value "A" inside almost
    any sentence). Case-sensitive: evalkit's values are lower-case words and numbers, and an
    article "a" is no dock "A".

    >>> word_match(" 4821.", ["4821"]), word_match(": 1522", ["15"])
    (1.0, 0.0)
    >>> word_match("7, 12 and 40", ["7", "12", "99"])
    0.6666666666666666
    """
    return sum(bool(_word_pattern(g.strip()).search(prediction)) for g in gold) / len(gold)


@metric("string_match_all", kind=GENERATION)
def string_match_all(prediction: str, gold: Sequence[str]) -> float:
    """Share of gold values found in the answer, case-insensitive (RULER's metric).

    A substring match, kept for parity with RULER's scores (`--primary-metric
    string_match_all`); it credits "1522" for the gold 15, so it is not evalkit's default.

    >>> string_match_all("7, 12 and 40", ["7", "12", "99"])
    0.6666666666666666
    """
    p = prediction.lower()
    return sum(g.lower() in p for g in gold) / len(gold)


# RULER's per-document scorers (lm_eval/tasks/ruler/common_utils.py) -> the metric here of the
# same definition (lm-eval's RULER rows keep RULER's metric on the board, for parity)
RULER_SCORERS = {"process_results": "string_match_all", "process_results_part": "string_match_part"}


@metric("string_match_part", kind=GENERATION)
def string_match_part(prediction: str, gold: Sequence[str]) -> float:
    """1 if any gold value is found in the answer, case-insensitive (RULER's metric).

    >>> string_match_part("7, 12 and 40", ["7", "12", "99"])
    1.0
    """
    p = prediction.lower()
    return float(any(g.lower() in p for g in gold))


def _prefix_share(word: str, value: str) -> float:
    n = 0
    for a, b in zip(word, value):
        if a != b:
            break
        n += 1
    return n / len(value) if value else 0.0


@metric("partial_credit", kind=GENERATION)
def partial_credit(prediction: str, gold: Sequence[str]) -> float:
    """Share of each gold value's characters matched as a prefix by some word of the answer.

    Averaged over gold values; a digit is one token in the tiny tokenizer, so this is per
    token there.

    >>> partial_credit("4829", ["4821"])
    0.75
    >>> partial_credit("4821, 77", ["4821", "7712"])
    0.75
    """
    words = [w for w in re.split(r"[\s,;]+", prediction.strip()) if w] or [""]
    return sum(max(_prefix_share(w, g) for w in words) for g in gold) / len(gold)


@metric("forced_choice", kind=FORCED_CHOICE, recall_rank=3)
def forced_choice(logprobs: Sequence[float]) -> float:
    """1 if gold's log-probability is strictly higher than every in-context distractor's.

    Ties count as wrong, so a model that scores everything equal gets 0.

    >>> forced_choice([-1.2, -3.0, -2.5])
    1.0
    >>> forced_choice([-2.0, -2.0])
    0.0
    """
    if len(logprobs) < 2:
        raise ValueError("forced choice needs gold and at least one distractor")
    return float(logprobs[0] > max(logprobs[1:]))


def scores_forced_choice(model_entry: dict | None) -> bool:
    """Whether a model entry of results.json (its `models` map) has forced choice scored: on
    unless the entry says `forced_choice: false` (a served model may switch it off)."""
    return (model_entry or {}).get("forced_choice", True) is not False


MQAR_QUESTION = "mqar"  # the question kind of tasks/mqar.py's queries
MQAR_METRIC = "mqar_accuracy"  # Zoology's accuracy (the leaderboard's MQAR plot reads it)


@metric(MQAR_METRIC, kind=GENERATION, recall_rank=-1, question_kinds=(MQAR_QUESTION,),
        per_probe=True)
def mqar_accuracy(prediction: str, gold: Sequence[str]) -> float:
    """Zoology's MQAR accuracy: each probe's share of queries right, averaged over probes.

    Per query (MQAR questions only): 1 if the one generated symbol is the value, whitespace
    around it ignored. A cell's value is the mean over probes of each probe's share
    (`zoology_accuracy`), its interval a bootstrap over probes (evalkit.cell_stats).

    >>> mqar_accuracy("v4565", ["v4565"]), mqar_accuracy(" v4565", ["v456"])
    (1.0, 0.0)
    """
    return float(prediction.strip() == gold[0].strip())
