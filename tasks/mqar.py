"""Multi-query associative recall as Zoology generates it (arXiv 2312.04927, Based 2402.18668).

One example is `length` token ids: all `load` key-value pairs first, then each key queried
once at an even offset after the pairs, the filler token everywhere else. The target at a
query's position is its key's value; no other position is scored. Keys come from the first
half of the vocabulary (1 .. V/2 - 1), values from the second (V/2 .. V - 1), both drawn
without replacement; token 0 is the filler. A query's slot g (offset 2g after the pairs) is
drawn without replacement from 0 .. S-1, S = (length - 2 * load) // 2, with probability
proportional to (g + 1) ** (a - 1), a = power_a: most queries come soon after the pairs.

Worked example (length 16, load 2, vocabulary 16: keys 1..7, values 8..15):

    ids     = [3, 12, 6, 9,  0, 0, 6, 0, 0, 0, 0, 0, 3, 0, 0, 0]
    targets = [-, -,  -, -,  -, -, 9, -, -, -, -, -, 12, -, -, -]     (- : not scored)

Pairs (3 -> 12), (6 -> 9) fill positions 0..3; S = 6 slots; key 6 is asked in slot 1
(position 4 + 2 = 6), key 3 in slot 4 (position 12). The model reads key 6 at position 6 and
must predict 9 there; position 7 holds the filler, not the value: a query never reveals its
answer to later queries.

Every array is a pure function of (length, load, vocab_size, power_a, seed): numpy's PCG64
seeded with `seed`. A batch's row i is the example of seed `seed` row i, so training batches
and evaluation probes come from one generator.

As an evalkit task (`generate`, tasks/mqar.yaml) a probe is row 0 of `mqar_batch(1, ...)` at the
grid point's seed, written in the symbols of model_adapters/mqar/tokenizer (`symbol`: id 0 "_",
keys "k<id>", values "v<id>"; one token each, id i <-> symbol i). The example above, in the
symbols of its vocabulary of 16 (the task's is 8,192), streams as context segments that each
end at a query key, one question per segment with empty text and prefix:

    segment 0: "k3 v12 k6 v9 _ _ k6"   question 0 (after_segment 1): gold "v9"
    segment 1: "_ _ _ _ _ k3"          question 1 (after_segment 2): gold "v12"
    segment 2: "_ _ _"                 (the tail: never fed, nothing is scored there)

The runner prefills segment 0 once, reads the answer to question 0 from a fork of that state
(one greedy token), then extends the same state with segment 1: the stream continues with the
filler, never with the value, exactly as in the array. Every probe is exactly `length` tokens
(tolerance 0) and the model sees exactly the array's ids. `depth` is ignored (the query
positions are the power law's); `load` is the number of pairs.
"""
from __future__ import annotations

from functools import lru_cache
from typing import Any

import numpy as np
from pydantic import BaseModel, ConfigDict, Field

from evalkit import probes as kit
from evalkit.probe import Probe, ProbeMeta, Question, Segment
from evalkit.scoring import MQAR_QUESTION, zoology_accuracy
from evalkit.tokenization import bos_ids, encode, tokenizer_hash

FILLER = 0
IGNORE = -100  # target of a position that is not scored (PyTorch's cross-entropy default)
POWER_A = 0.01
VOCAB_SIZE = 8192
MAX_BATCH = 1 << 16


def check_shape(length: int, load: int, vocab_size: int) -> None:
    """A clear error for a (length, load, vocab) that cannot hold the example."""
    if vocab_size < 4 or vocab_size % 2:
        raise ValueError(f"vocab_size must be even and >= 4, got {vocab_size}")
    if load < 1:
        raise ValueError(f"load (key-value pairs) must be >= 1, got {load}")
    if load > vocab_size // 2 - 1:
        raise ValueError(f"load={load}: at most {vocab_size // 2 - 1} distinct keys in a "
                         f"vocabulary of {vocab_size}")
    if (length - 2 * load) // 2 < load:
        raise ValueError(f"length={length} cannot hold load={load}: {2 * load} tokens of pairs "
                         f"and {load} query slots of 2 tokens need length >= {4 * load}")


def gap_probabilities(slots: int, power_a: float = POWER_A) -> np.ndarray:
    """P(slot g) for a single query, g = 0 .. slots-1: proportional to (g + 1) ** (a - 1)."""
    p = power_a * np.arange(1, slots + 1, dtype=np.float64) ** (power_a - 1)
    return p / p.sum()


def mqar_batch(n: int, length: int, load: int, *, seed: int, vocab_size: int = VOCAB_SIZE,
               power_a: float = POWER_A) -> tuple[np.ndarray, np.ndarray]:
    """n examples: ids [n, length] int64 and targets [n, length] int64 (IGNORE where unscored).

    Drawing without replacement uses the Gumbel top-k form, which has the same distribution
    as drawing one by one (numpy's choice(replace=False, p=...)) and runs as one array op."""
    check_shape(length, load, vocab_size)
    if not 1 <= n <= MAX_BATCH:
        raise ValueError(f"n must be between 1 and {MAX_BATCH}, got {n}")
    rng = np.random.Generator(np.random.PCG64(seed))
    half = vocab_size // 2
    keys = 1 + _without_replacement(rng, n, half - 1, load)               # [n, load] in 1..half-1
    values = half + _without_replacement(rng, n, half, load)              # [n, load] in half..V-1
    slots = (length - 2 * load) // 2
    logp = np.log(gap_probabilities(slots, power_a))
    gaps = _without_replacement(rng, n, slots, load, logp)                # [n, load]
    ids = np.full((n, length), FILLER, dtype=np.int64)
    targets = np.full((n, length), IGNORE, dtype=np.int64)
    ids[:, 0:2 * load:2], ids[:, 1:2 * load:2] = keys, values
    pos = 2 * load + 2 * gaps                                             # query positions
    rows = np.arange(n)[:, None]
    ids[rows, pos] = keys
    targets[rows, pos] = values
    return ids, targets


def _without_replacement(rng: np.random.Generator, n: int, size: int, k: int,
                         logp: np.ndarray | None = None) -> np.ndarray:
    """Per row, k distinct draws from 0..size-1 (uniform, or with log-probabilities logp)."""
    scores = rng.gumbel(size=(n, size))
    if logp is not None:
        scores = scores + logp
    top = np.argpartition(-scores, k - 1, axis=1)[:, :k] if k < size else \
        np.tile(np.arange(size), (n, 1))
    # argpartition leaves the k winners unordered: order them by score (the draw order)
    order = np.argsort(-np.take_along_axis(scores, top, 1), axis=1)
    return np.take_along_axis(top, order, 1)


def accuracy(predictions: np.ndarray, targets: np.ndarray) -> float:
    """Zoology's MQAR accuracy on id arrays [n, length]: per example the share of scored
    positions predicted right, then the mean over examples. The definition is
    evalkit.scoring.zoology_accuracy, the one the registered metric `mqar_accuracy` uses."""
    scored = targets != IGNORE
    return zoology_accuracy(predictions == targets, scored)


# -- symbols: the text form of the ids (model_adapters/mqar/tokenizer) ------------------------

FILLER_SYMBOL = "_"


def symbol(i: int, vocab_size: int = VOCAB_SIZE) -> str:
    """The word of token id i: "_" (filler), "k<i>" (a key id), "v<i>" (a value id).

    >>> symbol(0), symbol(17), symbol(5000)
    ('_', 'k17', 'v5000')
    """
    if not 0 <= i < vocab_size:
        raise ValueError(f"token id {i} outside the vocabulary 0..{vocab_size - 1}")
    return FILLER_SYMBOL if i == FILLER else (f"k{i}" if i < vocab_size // 2 else f"v{i}")


@lru_cache(maxsize=2)
def symbols(vocab_size: int = VOCAB_SIZE) -> tuple[str, ...]:
    """Every symbol in id order: the tokenizer's vocabulary."""
    return tuple(symbol(i, vocab_size) for i in range(vocab_size))


# -- the evalkit task --------------------------------------------------------------------------

class Params(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)
    power_a: float = Field(default=POWER_A, gt=0, le=1)  # the query gaps' power law


def generate(params: Params, *, task: str, version: str, tokenizer: Any, length: int,
             depth: float, load: int, seed: int) -> Probe:
    """One Zoology example as a probe (see the module doc); depth is recorded, not used."""
    kit.check_grid_point(length, depth, load)
    check_shape(length, load, VOCAB_SIZE)
    ids, targets = mqar_batch(1, length, load, seed=seed, power_a=params.power_a)
    segments, questions = stream(ids[0], targets[0], load)
    _check_tokenizer(tokenizer, segments, ids[0])
    meta = ProbeMeta(target_length=length, actual_length=length, tolerance=0,
                     depth=float(depth), load=load, seed=seed,
                     tokenizer_hash=tokenizer_hash(tokenizer),
                     extra=(("power_a", params.power_a), ("vocab_size", VOCAB_SIZE)))
    return Probe(id=kit.probe_id(task, length, depth, load, seed), task=task,
                 task_version=version, context=tuple(Segment(t) for t in segments),
                 questions=tuple(questions), meta=meta)


def stream(ids: np.ndarray, targets: np.ndarray, load: int,
           vocab_size: int = VOCAB_SIZE) -> tuple[list[str], list[Question]]:
    """One example's context segments (each ends at a query key; then the tail) and its
    questions (one per query, asked after its segment), as in the module doc's example."""
    length = len(ids)
    pos = np.flatnonzero(targets != IGNORE)                   # query positions, ascending
    ends = [*(int(p) + 1 for p in pos), length]
    starts = [0, *ends[:-1]]
    words = symbols(vocab_size)
    segments = [" ".join(words[t] for t in ids[a:b]) for a, b in zip(starts, ends) if b > a]
    fact = {int(k): 2 * j for j, k in enumerate(ids[0:2 * load:2])}  # key -> its pair's offset
    questions = []
    for j, p in enumerate(int(x) for x in pos):
        f = fact[int(ids[p])]
        questions.append(Question(text="", answer_prefix="", gold=(words[targets[p]],),
                                  after_segment=j + 1, depth=f / length, fact_token=f,
                                  distance=p - f, max_new_tokens=1, kind=MQAR_QUESTION))
    return segments, questions


def _check_tokenizer(tokenizer: Any, segments: list[str], ids: np.ndarray) -> None:
    """The rendered stream must encode to exactly the generator's ids (no BOS, one token a
    symbol, id i = symbol i): any other tokenizer would change the task, so it is refused."""
    need = "task mqar needs the MQAR word-level tokenizer (model_adapters/mqar/tokenizer)"
    name = f"tokenizer={tokenizer_hash(tokenizer)[:12]}"
    if bos_ids(tokenizer):
        raise ValueError(f"{name}: adds a BOS token, which would shift every position; {need}")
    got: list[int] = []
    for text in segments:
        try:
            got += encode(tokenizer, text)
        except Exception as e:  # tokenizers raises a bare Exception for an unknown word
            raise ValueError(f"{name}: cannot encode the symbols ({e}); {need}") from None
    want = ids.tolist()
    if got != want:
        i = next((i for i, (a, b) in enumerate(zip(got, want)) if a != b), min(len(got), len(want)))
        sym = symbol(want[i]) if i < len(want) else "(end)"
        raise ValueError(f"{name}: the stream encodes to {len(got)} tokens for {len(want)} "
                         f"symbols, first differing at position {i} (symbol {sym!r}, id "
                         f"{want[i] if i < len(want) else '-'}); {need}")
