"""Haystacks: the text around the facts, read a word at a time from a seeded start."""
from __future__ import annotations

import functools
import random
import re
from dataclasses import dataclass
from pathlib import Path

from evalkit.probes.words import FILLER

DATA = Path(__file__).resolve().parent / "data"

_SENT_END = re.compile(r"[.!?][\'\")\]]*$")


@dataclass(frozen=True)
class Haystack:
    name: str
    words: tuple[str, ...]
    sentence_starts: tuple[int, ...]  # word indices that open a sentence

    @classmethod
    def from_text(cls, name: str, text: str) -> "Haystack":
        """A haystack of any text. Fitting cuts it between words, never inside one."""
        words = tuple(text.split())
        if not words:
            raise ValueError(f"haystack {name!r}: the text has no words")
        starts = tuple(i for i in range(len(words)) if i == 0 or _SENT_END.search(words[i - 1]))
        return cls(name, words, starts)


@functools.lru_cache(maxsize=None)
def builtin_haystack(name: str) -> Haystack:
    """`prose`: Alice's Adventures in Wonderland (public domain; see data/LICENSE.md), with its
    whitespace collapsed to single spaces and the "* * *" scene breaks removed.
    `filler`: the repeated-filler sentences."""
    if name == "prose":
        raw = (DATA / "alice.txt").read_text(encoding="utf-8")
        lines = [ln for ln in raw.splitlines() if ln.strip().strip("* ")]
        return Haystack.from_text("alice", " ".join(lines))
    if name == "filler":
        return Haystack.from_text("filler", FILLER)
    raise ValueError(f"haystack={name!r}: expected 'prose' or 'filler'")


@functools.lru_cache(maxsize=None)
def prose_words() -> tuple[str, ...]:
    """The prose's words, lower-cased, punctuation stripped, in text order."""
    return tuple(w.strip(".,;:!?'\"()-_").lower() for w in builtin_haystack("prose").words)


class WordStream:
    """Haystack words read from a start word onward, wrapping around the end of the text."""

    def __init__(self, hay: Haystack, start: int) -> None:
        self.hay = hay
        self.start = start
        self.pos = start  # absolute position; word i is hay.words[i % n]

    def words(self, a: int, k: int) -> list[str]:
        w, n = self.hay.words, len(self.hay.words)
        out: list[str] = []
        i = a
        while len(out) < k:
            j = i % n
            take = min(k - len(out), n - j)
            out.extend(w[j:j + take])
            i += take
        return out

    def wrapped(self) -> bool:
        return self.pos > len(self.hay.words)


def start_stream(rng: random.Random, hay: str | Haystack) -> WordStream:
    """A stream from a seeded sentence start of `hay` (a built-in name or a Haystack)."""
    if isinstance(hay, str):
        hay = builtin_haystack(hay)
    return WordStream(hay, rng.choice(hay.sentence_starts))
