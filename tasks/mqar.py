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
"""
from __future__ import annotations

import numpy as np

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
    """Zoology's MQAR accuracy: per example the share of scored positions predicted right,
    then the mean over examples. predictions and targets are [n, length]."""
    scored = targets != IGNORE
    per_example = ((predictions == targets) & scored).sum(1) / np.maximum(scored.sum(1), 1)
    return float(per_example[scored.any(1)].mean())
