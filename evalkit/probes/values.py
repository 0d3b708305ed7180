"""Values and keys: every choice drawn from the probe's seeded RNG, never the global one."""
from __future__ import annotations

import collections
import functools
import random
import uuid
from typing import Callable, Sequence

from evalkit.probes.haystack import prose_words
from evalkit.probes.words import CONSONANTS, FILLER, VALUE_WORDS, VOWELS


@functools.lru_cache(maxsize=None)
def value_words() -> tuple[str, ...]:
    prose = set(prose_words())
    return tuple(w for w in VALUE_WORDS if w not in prose)


@functools.lru_cache(maxsize=None)
def _ranked_words(exclude: frozenset[str] = frozenset()) -> tuple[str, ...]:
    """The prose's lower-case words of 3+ letters, most frequent first (ties alphabetical)."""
    counts = collections.Counter(prose_words())
    return tuple(sorted((w for w in counts if w.isalpha() and len(w) >= 3 and w not in exclude),
                        key=lambda w: (-counts[w], w)))


def phrase_words() -> tuple[str, ...]:
    """The prose's 400 most frequent lower-case words of 3+ letters (ties alphabetical). Phrase
    values are random orders of them: common words, one token each in most tokenizers, so a
    copied phrase is a run of single-token copies whose order only the context can tell."""
    return _ranked_words()[:400]


@functools.lru_cache(maxsize=None)
def common_words() -> tuple[str, ...]:
    """The prose's 512 most frequent lower-case words of 3+ letters that the filler haystack
    never uses (ties alphabetical): keys and values of Zoology-style MQAR ("said: little."),
    one token each for most of them in most tokenizers (408 of 512 in the tiny tokenizer)."""
    return _ranked_words(frozenset(w.strip(".,").lower() for w in FILLER.split()))[:512]


def make_values(rng: random.Random, kind: str, n: int, digits: int,
                avoid: Sequence[str] = (), words: int = 8) -> list[str]:
    """n distinct values of one kind: numbers with `digits` digits, words, UUIDs, or phrases
    of `words` distinct common prose words in random order (a copy only the context supplies),
    or single common words ("common", see common_words)."""
    seen = set(avoid)
    out: list[str] = []
    if kind == "word" and n + len(seen) > len(value_words()):
        raise ValueError(f"load={n}: at most {len(value_words()) - len(seen)} distinct word "
                         f"values are available; use value_kind 'number' or 'uuid'")
    if kind == "common" and n + len(seen) > len(common_words()):
        raise ValueError(f"load={n}: at most {len(common_words())} common words serve as keys "
                         f"and values together ({len(seen)} already taken)")
    if kind == "number" and n + len(seen) > 9 * 10 ** (digits - 1) // 2:
        raise ValueError(f"load={n}: {digits}-digit numbers are too few for {n} distinct "
                         f"values; raise params.digits")
    while len(out) < n:
        if kind == "number":
            v = str(rng.randrange(10 ** (digits - 1), 10 ** digits))
        elif kind == "word":
            v = rng.choice(value_words())
        elif kind == "uuid":
            v = str(uuid.UUID(int=rng.getrandbits(128), version=4))
        elif kind == "common":
            v = rng.choice(common_words())
        elif kind == "phrase":
            v = " ".join(rng.sample(phrase_words(), words))
        else:
            raise ValueError(f"value_kind={kind!r}: expected 'number', 'word', 'uuid', "
                             f"'phrase' or 'common'")
        if v not in seen:
            seen.add(v)
            out.append(v)
    return out


def lookalike_numbers(rng: random.Random, base: str, n: int, used: set[str],
                      limit: int = 9999) -> list[str]:
    """Numbers that look like `base`: digits swapped or reversed, one digit added or changed
    (12 -> 21, 112, 13). Drawn from the RNG, so the set is deterministic."""
    out: list[str] = []
    for _ in range(200 * max(1, n)):
        if len(out) == n:
            break
        op = rng.randrange(4)
        d = list(base)
        if op == 0 and len(d) > 1:  # swap two digits
            i, j = rng.sample(range(len(d)), 2)
            d[i], d[j] = d[j], d[i]
        elif op == 1:  # add a digit
            d.insert(rng.randrange(len(d) + 1), str(rng.randrange(10)))
        elif op == 2:  # change a digit
            d[rng.randrange(len(d))] = str(rng.randrange(10))
        else:
            d = d[::-1]
        s = "".join(d).lstrip("0")
        if s and int(s) <= limit and s not in used and s != base:
            used.add(s)
            out.append(s)
    if len(out) < n:
        raise ValueError(f"params.lookalike={n}: could not find {n} look-alike keys of {base}")
    return out


def pseudo_word(rng: random.Random, syllables: int = 2) -> str:
    return "".join(rng.choice(CONSONANTS) + rng.choice(VOWELS) for _ in range(syllables))


def lookalike_word(rng: random.Random, base: str, used: set[str]) -> str:
    """A pseudo-word one letter away from `base` (consonant for consonant, vowel for vowel)."""
    for _ in range(1000):
        i = rng.randrange(len(base))
        pool = VOWELS if base[i] in VOWELS else CONSONANTS
        s = base[:i] + rng.choice(pool) + base[i + 1:]
        if s not in used:
            used.add(s)
            return s
    raise ValueError(f"params.lookalike: no look-alike left for key {base!r}")


def candidates(gold: str, distractors: Sequence[str], n: int, fresh: Callable[[int], list[str]]
               ) -> tuple[str, ...]:
    """gold first, then in-context distractors, then fresh values of the same kind, n in all."""
    out = [gold]
    for d in distractors:
        if len(out) >= n:
            break
        if d not in out:
            out.append(d)
    if len(out) < n:
        out.extend(v for v in fresh(n - len(out)) if v not in out)
    return tuple(out[:n])
