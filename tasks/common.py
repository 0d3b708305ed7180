"""Shared machinery of the built-in tasks: haystacks, value makers, exact-length fitting.

Every generator here is a pure function of (params, seed, tokenizer, length, depth, load).
All random choices are drawn up front from `random.Random(seed)`, never from the global RNG
and never from the tokenizer. So one seed states the same facts under every tokenizer,
length and depth, and only the haystack around them changes.

Stop convention (runners and scorers rely on it)
------------------------------------------------
An answer continues the question's answer prefix as " " + value. A multi-value answer joins
its values in order with ", ". No value ever holds ".", ",", or a newline.

Every fact ends with "." right after its value(s). A model that copies the fact therefore
ends its answer by itself. Generation stops at the first string in STOP_STRINGS = ("\\n", ".")
or at the tokenizer's end-of-sequence or end-of-turn token (`<|end|>` in the tiny tokenizer).
The prediction is the text before the stop, stripped.

Length, tolerance, depth
------------------------
`length` is the token count of the final question's whole prompt, as defined by
`evalkit.render`: each segment is tokenized on its own, then the ids are joined. Fitting only
ever measures real token ids. First, the word count of each haystack gap is set by galloping
from an estimate taken from token offsets. Then the gap's start is moved a word at a time until
the count is exact.
- `meta.actual_length` is the real rendered length. Nearly always it equals the target.
  It always lies within `meta.tolerance` = tolerance(length) = max(2, length // 200) tokens.
- Every fact is its own context segment. So `fact_token`, the fact's start offset in the
  prompt ids, is exact. `Question.depth` = fact_token / (context_tokens - fact_tokens): the
  share of the other context tokens that come before the fact. It is 0.0 when the fact opens
  the context and 1.0 when the fact is the last thing before the question. It equals
  fact_token / context_tokens up to the fact's own length.
- Chat probes: the fact is the exchange that states it: the user turn (fact_token points at
  its template header) plus the assistant's acknowledgement. fact_tokens counts both, so
  depth 1.0 means that exchange is the last one before the question. Turns come in whole
  exchanges, so chat depths are exact only to within one exchange of about a dozen tokens:
  within 1 % from about 2K tokens on, a few % at 256.
- When facts fill most of the context (high loads), the asked fact can only sit where there
  is room for it. Question.depth always records where it actually is.
"""
from __future__ import annotations

import bisect
import collections
import functools
import numbers
import random
import re
import uuid
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any, Callable, Sequence

from evalkit.probe import Probe, ProbeMeta, Question, Segment
from evalkit.render import ANSWER_STOP, _template, continuation_ids, question_text, render
from evalkit.tokenization import bos_ids, encode, tokenizer_hash

STOP_STRINGS = ANSWER_STOP  # the answer contract lives in evalkit.render
DATA = Path(__file__).resolve().parent / "data"
FILLER = "The grass is green. The sky is blue. The sun is yellow. Here we go. There and back again."
ANSWER_MARGIN = 4  # extra generation tokens beyond the gold answer's own tokens


def tolerance(length: int) -> int:
    """Largest allowed |actual - target| prompt length: max(2 tokens, 0.5 %)."""
    return max(2, length // 200)


def probe_id(task: str, length: int, depth: float, load: int, seed: int) -> str:
    return f"{task}-L{length}-d{depth:g}-n{load}-s{seed}"


def check_grid_point(length: Any, depth: Any, load: Any) -> None:
    """Reject bad grid inputs with errors that name the field. Nothing is ever clamped."""
    if isinstance(length, bool) or not isinstance(length, numbers.Integral) or length < 1:
        raise ValueError(f"length={length!r} must be a positive integer number of tokens")
    if (isinstance(depth, bool) or not isinstance(depth, numbers.Real)
            or not 0.0 <= depth <= 1.0):  # NaN fails the comparison too
        raise ValueError(f"depth={depth!r} outside [0, 1]")
    if isinstance(load, bool) or not isinstance(load, numbers.Integral) or load < 1:
        raise ValueError(f"load={load!r} must be a positive integer number of facts")


# --------------------------------------------------------------------------------------------
# Word lists (also part of the tiny tokenizer's training text; see build_tokenizer.py)

CITIES = (
    "Lisbon", "Paris", "Oslo", "Cairo", "Lima", "Quito", "Dakar", "Hanoi", "Kyoto", "Seville",
    "Porto", "Dublin", "Vienna", "Prague", "Warsaw", "Riga", "Tallinn", "Helsinki", "Bergen",
    "Geneva", "Zurich", "Munich", "Hamburg", "Antwerp", "Utrecht", "Bruges", "Lyon", "Nantes",
    "Bordeaux", "Marseille", "Naples", "Turin", "Verona", "Palermo", "Valencia", "Bilbao",
    "Granada", "Malaga", "Athens", "Sofia", "Bucharest", "Belgrade", "Zagreb", "Split",
    "Krakow", "Gdansk", "Vilnius", "Minsk", "Kyiv", "Odesa", "Tbilisi", "Yerevan", "Baku",
    "Tehran", "Muscat", "Doha", "Amman", "Beirut", "Tunis", "Algiers", "Rabat", "Accra",
    "Lagos", "Nairobi", "Kampala", "Lusaka", "Harare", "Maputo", "Durban", "Windhoek",
    "Mumbai", "Delhi", "Chennai", "Dhaka", "Kathmandu", "Colombo", "Yangon", "Bangkok",
    "Manila", "Jakarta", "Surabaya", "Perth", "Adelaide", "Hobart", "Auckland", "Wellington",
    "Osaka", "Sapporo", "Busan", "Seoul", "Taipei", "Macau", "Denver", "Austin", "Boston",
    "Chicago", "Seattle", "Portland", "Toronto", "Montreal", "Halifax", "Havana", "Bogota",
    "Caracas", "Santiago", "Montevideo", "Asuncion", "Recife", "Salvador", "Cusco",
)

# Word values: concrete nouns; any that occur in the prose haystack are dropped at load time,
# so a word value is never confused with haystack text.
VALUE_WORDS = (
    "anchor", "apricot", "avalanche", "badger", "bagpipe", "balcony", "bamboo", "banjo",
    "barometer", "basil", "beacon", "biscuit", "blizzard", "bonfire", "boulder", "bracelet",
    "bramble", "bucket", "cactus", "canoe", "canyon", "caravan", "cardigan", "carousel",
    "cashew", "cathedral", "cello", "chestnut", "cinnamon", "clarinet", "cobalt", "compass",
    "copper", "coral", "cricket", "cymbal", "dolphin", "dragonfly", "drizzle", "dynamo",
    "eclipse", "emerald", "falcon", "ferry", "fjord", "flannel", "fossil", "galaxy",
    "gazebo", "geyser", "ginger", "glacier", "gondola", "granite", "harbor", "harpoon",
    "hazelnut", "helmet", "hammock", "iceberg", "igloo", "jasmine", "javelin", "jigsaw",
    "juniper", "kayak", "kettledrum", "kiwi", "lagoon", "lantern", "lava", "lemonade",
    "lighthouse", "limestone", "lobby", "magnet", "mango", "marble", "meadowlark", "meteor",
    "monsoon", "mosaic", "nectar", "nutmeg", "oasis", "octopus", "orchid", "origami",
    "paddle", "pagoda", "panther", "papaya", "parsley", "pebble", "pelican", "penguin",
    "pepperoni", "piano", "pistachio", "planet", "plum", "pretzel", "pumpkin", "quartz",
    "quilt", "raccoon", "radar", "raft", "rocket", "saddle", "saffron", "sapphire",
    "scooter", "seashell", "sequoia", "sherbet", "skateboard", "sleigh", "snorkel",
    "spinach", "sponge", "squirrel", "starfish", "sundial", "sunflower", "tambourine",
    "tangerine", "telescope", "thunder", "tornado", "tractor", "trombone", "trumpet",
    "tulip", "tundra", "turquoise", "umbrella", "vanilla", "velvet", "violin", "volcano",
    "walnut", "walrus", "wigwam", "windmill", "yacht", "yogurt", "zebra", "zeppelin",
    "zucchini",
)

# Natural-language key domains: (attribute, plural attribute, noun): "the code for locker 12".
DOMAINS = (
    ("code", "codes", "locker"),
    ("passcode", "passcodes", "vault"),
    ("combination", "combinations", "safe"),
    ("extension", "extensions", "desk"),
    ("ticket number", "ticket numbers", "seat"),
    ("access code", "access codes", "gate"),
)

# Synthetic (MQAR-like) keys are consonant-vowel pseudo-words such as "zuvo".
CONSONANTS = "bdfgklmnprstvz"
VOWELS = "aeiou"

# Chat phrases.
FACT_INTROS = ("Please remember this.", "Keep this in mind.", "Note this down for later.")
UPDATE_INTROS = ("Correction, this has changed.", "Update, it is different now.")
FACT_ACKS = ("Noted.", "Got it.", "Understood, I will remember.")
UPDATE_ACKS = ("Noted, I have updated it.", "Thanks for the update.")
STORY_REQUESTS = ("Tell me more of the story.", "Please go on with the story.",
                  "What happens next?", "Continue, please.")


# --------------------------------------------------------------------------------------------
# Haystacks

@dataclass(frozen=True)
class Haystack:
    name: str
    words: tuple[str, ...]
    sentence_starts: tuple[int, ...]  # word indices that open a sentence


_SENT_END = re.compile(r"[.!?][\'\")\]]*$")


def _make_haystack(name: str, text: str) -> Haystack:
    words = tuple(text.split())
    starts = tuple(i for i in range(len(words)) if i == 0 or _SENT_END.search(words[i - 1]))
    return Haystack(name, words, starts)


@functools.lru_cache(maxsize=None)
def haystack(name: str) -> Haystack:
    """`prose`: Alice's Adventures in Wonderland (public domain; see data/LICENSE.md), with its
    whitespace collapsed to single spaces and the "* * *" scene breaks removed.
    `filler`: the repeated-filler sentences."""
    if name == "prose":
        raw = (DATA / "alice.txt").read_text(encoding="utf-8")
        lines = [ln for ln in raw.splitlines() if ln.strip().strip("* ")]
        return _make_haystack("alice", " ".join(lines))
    if name == "filler":
        return _make_haystack("filler", FILLER)
    raise ValueError(f"haystack={name!r}: expected 'prose' or 'filler'")


@functools.lru_cache(maxsize=None)
def prose_words() -> tuple[str, ...]:
    """The prose's words, lower-cased, punctuation stripped, in text order."""
    return tuple(w.strip(".,;:!?'\"()-_").lower() for w in haystack("prose").words)


@functools.lru_cache(maxsize=None)
def value_words() -> tuple[str, ...]:
    prose = set(prose_words())
    return tuple(w for w in VALUE_WORDS if w not in prose)


@functools.lru_cache(maxsize=None)
def phrase_words() -> tuple[str, ...]:
    """The prose's 400 most frequent lower-case words of 3+ letters (ties alphabetical). Phrase
    values are random orders of them: common words, one token each in most tokenizers, so a
    copied phrase is a run of single-token copies whose order only the context can tell."""
    counts = collections.Counter(prose_words())
    ranked = sorted((w for w in counts if w.isalpha() and len(w) >= 3),
                    key=lambda w: (-counts[w], w))
    return tuple(ranked[:400])


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


# --------------------------------------------------------------------------------------------
# Values and keys (all from the probe's seeded RNG)

def make_values(rng: random.Random, kind: str, n: int, digits: int,
                avoid: Sequence[str] = (), words: int = 8) -> list[str]:
    """n distinct values of one kind: numbers with `digits` digits, words, UUIDs, or phrases
    of `words` distinct common prose words in random order (a copy only the context supplies)."""
    seen = set(avoid)
    out: list[str] = []
    if kind == "word" and n + len(seen) > len(value_words()):
        raise ValueError(f"load={n}: at most {len(value_words()) - len(seen)} distinct word "
                         f"values are available; use value_kind 'number' or 'uuid'")
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
        elif kind == "phrase":
            v = " ".join(rng.sample(phrase_words(), words))
        else:
            raise ValueError(f"value_kind={kind!r}: expected 'number', 'word', 'uuid' or "
                             f"'phrase'")
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


# --------------------------------------------------------------------------------------------
# Token counting, plain and chat

class Pieces:
    """How a context segment becomes the text that is tokenized (mirrors evalkit.render)."""

    def __init__(self, tokenizer: Any, chat: bool) -> None:
        self.tok = tokenizer
        self.chat = chat
        self.bos = 0 if chat else len(bos_ids(tokenizer))
        self._tpw: dict[str, float] = {}
        # Counting straight through the fast backend skips transformers' per-call overhead.
        # It is used only when it gives exactly the ids of evalkit's encode, which the final
        # render checks anyway.
        self._backend = getattr(tokenizer, "backend_tokenizer", None)
        if self._backend is not None:
            sample = ("Alice was beginning to get very tired. The code for locker 12 is 5512.\n"
                      + "".join(str(t) for t in getattr(tokenizer, "all_special_tokens", ())))
            if self._backend.encode(sample, add_special_tokens=False).ids != encode(tokenizer,
                                                                                     sample):
                self._backend = None

    def count(self, text: str) -> int:
        if not text:
            return 0
        if self._backend is not None:
            return len(self._backend.encode(text, add_special_tokens=False).ids)
        return len(encode(self.tok, text))

    def offsets(self, text: str) -> list[int] | None:
        """Character start of each token (fast tokenizers only; used for estimates)."""
        if self._backend is None:
            return None
        return [s for s, _ in self._backend.encode(text, add_special_tokens=False).offsets]

    def tokens_per_word(self, hay: "Haystack") -> float:
        if hay.name not in self._tpw:
            words = hay.words[:2000]
            self._tpw[hay.name] = max(0.2, self.count(" ".join(words)) / len(words))
        return self._tpw[hay.name]

    # Plain segments carry their joining space in the segment text itself.
    def segment(self, ctx: Sequence[Segment], content: str, role: str | None) -> Segment:
        if self.chat:
            return Segment(content, role)
        return Segment(content if not ctx else " " + content)

    def affixes(self, ctx: Sequence[Segment], role: str | None) -> tuple[str, str]:
        """(pre, post) such that the tokenized piece is pre + content + post."""
        if not self.chat:
            return ("" if not ctx else " ", "")
        sentinel = "\x00EVALKIT\x00"
        piece = self.piece(ctx, Segment(sentinel, role))
        pre, mid, post = piece.partition(sentinel)
        if not mid:
            raise ValueError("the chat template of this tokenizer does not copy message content "
                             "verbatim, so prompt lengths cannot be fitted")
        return pre, post

    def _window(self, ctx: Sequence[Segment]) -> list[dict]:
        # Turns alternate user/assistant from a user turn. The template is rendered over a window
        # that starts at the latest user turn, or the one before that, so templates that check
        # the alternation still render it.
        i = len(ctx)
        j = 0 if i == 0 else (i - 1 if i % 2 == 1 else i - 2)
        return [{"role": s.role, "content": s.text} for s in ctx[j:]]

    def piece(self, ctx: Sequence[Segment], seg: Segment) -> str:
        if not self.chat:
            return seg.text
        win = self._window(ctx)
        base = _template(self.tok, win, False)
        full = _template(self.tok, win + [{"role": seg.role, "content": seg.text}], False)
        if not full.startswith(base):
            raise ValueError("the chat template of this tokenizer re-renders earlier turns, so "
                             "turns cannot be streamed or fitted")
        return full[len(base):]

    def seg_tokens(self, ctx: Sequence[Segment], seg: Segment) -> int:
        return self.count(self.piece(ctx, seg)) + (self.bos if not ctx else 0)

    def question_tokens(self, ctx: Sequence[Segment], text: str, prefix: str) -> int:
        if not self.chat:
            q = Question(text=text, answer_prefix=prefix, gold=("x",))
            return self.count(question_text(q)) + (self.bos if not ctx else 0)
        win = self._window(ctx)
        base = _template(self.tok, win, False)
        full = _template(self.tok, win + [{"role": "user", "content": text}], True)
        return self.count(full[len(base):] + prefix)


def _gallop_fit(count: Callable[[int], int], n: int, guess: int, kmax: int) -> tuple[int, int]:
    """Largest k in [0, kmax] with count(k) <= n (count is non-decreasing in k), searched
    outward from `guess`, so a good guess costs two or three tokenizations."""
    cache: dict[int, int] = {}

    def c(k: int) -> int:
        if k not in cache:
            cache[k] = count(k)
        return cache[k]

    guess = max(0, min(kmax, guess))
    if c(guess) <= n:
        lo, step = guess, 1
        hi = None
        while hi is None:
            k = min(kmax, lo + step)
            if k == lo:
                return lo, c(lo)
            if c(k) <= n:
                lo, step = k, step * 2
            else:
                hi = k
    else:
        hi, step = guess, 1
        lo = None
        while lo is None:
            k = max(0, hi - step)
            if c(k) <= n or k == 0:  # count(0) == 0 <= n: the search always ends here
                lo = k
            else:
                hi, step = k, step * 2
    while hi - lo > 1:
        mid = (lo + hi) // 2
        if c(mid) <= n:
            lo = mid
        else:
            hi = mid
    return lo, c(lo)


def fit_words(pieces: Pieces, stream: WordStream, start: int, n: int, pre: str, post: str,
              extra: int = 0, max_shift: int = 16) -> tuple[int, int, int]:
    """Choose haystack words so that pre + words + post is exactly n tokens (plus `extra`
    tokens, e.g. BOS), or as close below n as possible.

    Returns (first word, word count, tokens). Words are always whole. If no word count hits n
    exactly, the start moves forward a word at a time (at most max_shift words), because where
    word boundaries fall in token space depends on where the text starts. Token offsets of one
    tokenization estimate every (start, count) pair. Real counts confirm the estimates, so a
    gap costs about three tokenizations whatever its size.
    """
    base = extra + pieces.count(pre + post)
    if n <= extra:  # (plain pre " " merges into the first word, so base may overstate)
        return start, 0, 0
    tpw = pieces.tokens_per_word(stream.hay)
    window = max(32, int((n - base) / tpw * 1.1) + max_shift + 16)
    while True:
        words = stream.words(start, window)
        offs = pieces.offsets(pre + " ".join(words))
        if offs is None or len(offs) >= n + 8 or window > 50 * n + 1000:
            break
        window *= 2
    max_shift = min(max_shift, len(words) - 1)

    def count(k: int, a: int) -> int:
        if k == 0:
            return 0
        return extra + pieces.count(pre + " ".join(stream.words(a, k)) + post)

    def search_real(shifts, hint, best):  # fit with real token counts at each start shift
        for shift in shifts:
            a = start + shift
            k, got = _gallop_fit(lambda k, a=a: count(k, a), n, hint(shift), len(words) - shift)
            if got > best[2]:
                best = (a, k, got)
            if got == n:
                break
        return best

    if offs is None:  # slow tokenizer: real counts only
        guess = max(1, round((n - base) / tpw))
        return search_real(range(max_shift + 1), lambda shift: guess, (start, 0, 0))

    starts, ends, pos = [], [], len(pre)  # character span of each word in pre + text
    for w in words:
        starts.append(pos)
        pos += len(w)
        ends.append(pos)
        pos += 1
    tok_to = [bisect.bisect_left(offs, e) for e in ends]       # tokens starting before word end
    tok_from = [bisect.bisect_left(offs, st) for st in starts]  # tokens starting before word

    def raw(s: int, k: int) -> int:  # estimated tokens of words[s:s+k] alone
        return tok_to[s + k - 1] - tok_from[s] if k else 0

    def k_for(s: int, budget: int) -> int:  # largest k with raw(s, k) <= budget
        return bisect.bisect_right(tok_to, tok_from[s] + budget) - s

    k0, c0 = _gallop_fit(lambda k: count(k, start), n, k_for(0, n - base), len(words))
    best = (start, k0, c0) if k0 > 0 else (start, 0, 0)
    if c0 == n and k0 > 0:
        return best
    # what pre, post and the joins add; about the same for any start (learned again below)
    delta = c0 - raw(0, k0) if k0 > 0 else base
    recalibrated = False
    shift = 1
    while shift <= max_shift:
        k = k_for(shift, n - delta)
        if k > 0 and raw(shift, k) + delta == n:
            got = count(k, start + shift)
            if got == n:
                return start + shift, k, got
            if best[2] < got <= n:
                best = (start + shift, k, got)
            if not recalibrated:  # a later start may join pre differently: learn it once
                recalibrated, delta = True, got - raw(shift, k)
                continue
        shift += 1
    # estimates failed (rare): search with real counts
    return search_real(range(1, max_shift + 1), lambda shift: k_for(shift, n - delta), best)


# --------------------------------------------------------------------------------------------
# Layout: facts (items) at planned token positions, haystack gaps between them

@dataclass
class Item:
    """A fixed piece of context: one plain segment, or a (user, assistant) pair of turns.
    The fact is stated by the item's first segment."""

    contents: tuple[tuple[str, str | None], ...]  # (text, role) per segment
    key: Any = None  # task-specific tag


@dataclass
class Built:
    context: list[Segment]
    item_seg: list[int]  # index of each item's first (fact) segment in context
    item_nseg: list[int]  # segments per item (chat: the statement and its acknowledgement)
    stream: WordStream
    planned: list[int]   # planned start token of each item


def _fill_gap(pieces: Pieces, ctx: list[Segment], used: int, n: int, stream: WordStream,
              chunk: int, max_shift: int, fillers: dict[int, tuple[int, int, int]]) -> int:
    """Append haystack worth n tokens to ctx (as close as possible without going over).
    Plain: one segment of prose. Chat: (request, prose) exchanges of about `chunk` tokens."""
    if n <= 0:
        return used
    if not pieces.chat:
        pre, post = pieces.affixes(ctx, None)
        extra = pieces.bos if not ctx else 0
        a, k, got = fit_words(pieces, stream, stream.pos, n, pre, post, extra, max_shift)
        if k:
            ctx.append(pieces.segment(ctx, " ".join(stream.words(a, k)), None))
            stream.pos = a + k
            used += got
        return used
    # chat: the user asks for more of the story, the assistant tells the next part of it
    probe_req = Segment(STORY_REQUESTS[0], "user")
    u_min = pieces.seg_tokens(ctx, probe_req)
    pre, post = pieces.affixes(ctx + [probe_req], "assistant")
    a_min = pieces.count(pre + "x" + post)
    if n < u_min + a_min + 2:
        return used
    m = max(1, min(round(n / chunk), n // (u_min + a_min + 8)))
    goal = used + n
    for j in range(m):
        req = Segment(STORY_REQUESTS[(len(ctx) // 2) % len(STORY_REQUESTS)], "user")
        u = pieces.seg_tokens(ctx, req)
        target = (goal - used) // (m - j) - u
        pre, post = pieces.affixes(ctx + [req], "assistant")
        if target <= pieces.count(pre + post):
            continue
        last = j == m - 1
        a, k, got = fit_words(pieces, stream, stream.pos, target, pre, post, 0,
                              max_shift if last else 0)
        if not k:
            continue
        ctx.append(req)
        fillers[len(ctx)] = (a, k, got)
        ctx.append(Segment(" ".join(stream.words(a, k)), "assistant"))
        stream.pos = a + k
        used += u + got
    return used


def _extend_last_turn(pieces: Pieces, ctx: list[Segment], n: int, stream: WordStream,
                      fillers: dict[int, tuple[int, int, int]], max_shift: int) -> int:
    """Chat turns come in whole exchanges of at least ~a dozen tokens. So a shortfall smaller
    than that is made up by lengthening the last story turn (or, if there is none, by adding
    story words after the last acknowledgement). Items after it move later by that much.
    Returns the tokens added."""
    if fillers:
        j = max(fillers)
        a, k, got = fillers[j]
        lead = ""
    else:
        j = max((i for i, sgm in enumerate(ctx) if sgm.role == "assistant"), default=-1)
        if j < 0:
            return 0
        lead = ctx[j].text + " "
        a, got = stream.pos, pieces.count(pieces.piece(ctx[:j], ctx[j]))
    pre, post = pieces.affixes(ctx[:j], "assistant")
    a2, k2, got2 = fit_words(pieces, stream, a, got + n, pre + lead, post, 0, max_shift)
    if not k2 or got2 <= got:
        return 0
    ctx[j] = Segment(lead + " ".join(stream.words(a2, k2)), "assistant")
    if fillers:
        fillers[j] = (a2, k2, got2)
    stream.pos = max(stream.pos, a2 + k2)
    return got2 - got


def build_context(pieces: Pieces, items: Sequence[Item], planned: Sequence[int],
                  final_end: int, stream: WordStream, *, chunk: int = 192,
                  allow_tail: bool = True, max_shift: int = 16) -> Built:
    """Lay items out in order, filling the haystack gaps left to right. Item i should start at
    token planned[i]. The context should end at token final_end. A gap that falls short
    passes its shortfall to the next gap. If `allow_tail` is False, nothing may follow the last
    item (depth 1.0), so a shortfall there stays a shortfall."""
    ctx: list[Segment] = []
    item_seg: list[int] = []
    fillers: dict[int, tuple[int, int, int]] = {}
    used = 0
    for it, p in zip(items, planned):
        used = _fill_gap(pieces, ctx, used, p - used, stream, chunk, max_shift, fillers)
        item_seg.append(len(ctx))
        for text, role in it.contents:
            seg = pieces.segment(ctx, text, role)
            used += pieces.seg_tokens(ctx, seg)
            ctx.append(seg)
    if allow_tail:
        used = _fill_gap(pieces, ctx, used, final_end - used, stream, chunk, 4 * max_shift,
                         fillers)
    if pieces.chat and used < final_end:
        used += _extend_last_turn(pieces, ctx, final_end - used, stream, fillers, 4 * max_shift)
    return Built(ctx, item_seg, [len(it.contents) for it in items], stream, list(planned))


def item_tokens(pieces: Pieces, item: Item, first: bool) -> int:
    """Tokens of an item when placed after other text (or first in the context)."""
    if pieces.chat:
        prev = [] if first else [Segment("x", "user"), Segment("x", "assistant")]
        total = 0
        ctx = list(prev)
        for text, role in item.contents:
            seg = Segment(text, role)
            total += pieces.seg_tokens(ctx, seg)
            ctx.append(seg)
        return total
    prev = [] if first else [Segment("x")]
    return pieces.seg_tokens(prev, pieces.segment(prev, item.contents[0][0], None))


def plan_positions(pieces: Pieces, item_lens: Sequence[int], target: int, depth: float,
                   context_tokens: int, offsets: Sequence[float], block: bool) -> list[int]:
    """Planned start token of every item, in order.

    item `target` starts at round(depth * (context_tokens - its length)). The other items are
    spread over the haystack: each has a fraction in [0, 1) (`offsets`, drawn from the seeded
    RNG), scaled into the haystack before or after the target. With `block`, all items are
    contiguous around the target."""
    start = pieces.bos
    fixed = sum(item_lens)
    hay = context_tokens - start - fixed
    t_tok = round(depth * (context_tokens - item_lens[target]))
    before = sum(item_lens[:target])
    hb_t = min(max(t_tok - start - before, 0), hay)
    n_before, n_after = target, len(item_lens) - target - 1
    if block:
        hb = [hb_t] * len(item_lens)
    else:
        ob = sorted(offsets[:n_before])
        oa = sorted(offsets[n_before:n_before + n_after])
        hb = ([round(x * hb_t) for x in ob] + [hb_t]
              + [hb_t + round(x * (hay - hb_t)) for x in oa])
    planned, acc = [], start
    for i, n in enumerate(item_lens):
        planned.append(acc + hb[i])
        acc += n
    return planned


@dataclass
class QSpec:
    """A question before measurement: which item holds its answer, and its texts."""

    item: int
    text: str
    prefix: str
    gold: tuple[str, ...]
    candidates: tuple[str, ...]
    kind: str = "recall"
    after_segment: int | None = None  # None: after the whole context


def finish_probe(*, task: str, version: str, tokenizer: Any, pieces: Pieces, built: Built,
                 qspecs: Sequence[QSpec], length: int, depth: float, load: int, seed: int,
                 extra: dict[str, Any]) -> Probe:
    """Render the probe for real, then fill every measured field from the real token ids."""
    ctx = tuple(built.context)
    n = len(ctx)

    def make(qs: Sequence[Question], actual: int = 0) -> Probe:
        return Probe(id=probe_id(task, length, depth, load, seed), task=task,
                     task_version=version, context=ctx, questions=tuple(qs),
                     meta=ProbeMeta(target_length=length, actual_length=actual,
                                    tolerance=tolerance(length), depth=float(depth), load=load,
                                    seed=seed, tokenizer_hash=tokenizer_hash(tokenizer),
                                    extra=tuple(sorted(extra.items()))),
                     chat=pieces.chat)

    draft = [Question(text=q.text, answer_prefix=q.prefix, gold=q.gold, candidates=q.candidates,
                      after_segment=n if q.after_segment is None else q.after_segment,
                      kind=q.kind) for q in qspecs]
    r = render(make(draft), tokenizer)
    questions = []
    for q, d in zip(qspecs, draft):
        seg = built.item_seg[q.item]
        fact_tok = r.prefix_length(seg)
        fact_len = r.prefix_length(seg + built.item_nseg[q.item]) - fact_tok
        ctx_tok = r.prefix_length(d.after_segment)
        span = ctx_tok - fact_len
        dep = 0.0 if span <= 0 else min(1.0, max(0.0, fact_tok / span))
        gold_ids = continuation_ids(tokenizer, ", ".join(q.gold))
        questions.append(replace(d, depth=dep, fact_token=fact_tok, distance=ctx_tok - fact_tok,
                                 max_new_tokens=len(gold_ids) + ANSWER_MARGIN))
    actual = len(r.prompt(len(questions) - 1, questions[-1].after_segment))
    return make(questions, actual)


def check_fixed_fits(length: int, fixed: int, what: str, load: int) -> None:
    """The facts and question alone must fit; the error names the field that does not fit."""
    if fixed > length:
        if load == 1:
            raise ValueError(f"length={length} is too short: the {what} alone take "
                             f"{fixed} tokens")
        raise ValueError(f"load={load} facts need at least {fixed} tokens (with the "
                         f"{what}) but length={length}")


def check_length(probe: Probe, length: int) -> Probe:
    """Internal guarantee: the rendered prompt lies within the recorded tolerance."""
    err = probe.meta.actual_length - length
    if err > probe.meta.tolerance:
        raise ValueError(f"length={length} is too short: the facts and question of this probe "
                         f"take {probe.meta.actual_length} tokens")
    if abs(err) > probe.meta.tolerance:
        raise RuntimeError(f"probe {probe.id}: fitted prompt is {probe.meta.actual_length} "
                           f"tokens, outside {length} +- {probe.meta.tolerance}; please report "
                           f"this with the tokenizer used")
    return probe


def haystack_extra(stream: WordStream, placement: str = "spread") -> dict[str, Any]:
    return {"haystack": stream.hay.name, "haystack_start_word": stream.start,
            "haystack_words": stream.pos - stream.start, "haystack_wrapped": stream.wrapped(),
            "placement": placement, "depth_rule": "fact_token / (context_tokens - fact_tokens)"}


def start_stream(rng: random.Random, hay_name: str) -> WordStream:
    hay = haystack(hay_name)
    return WordStream(hay, rng.choice(hay.sentence_starts))


def fit_layout(*, pieces: Pieces, items: Sequence[Item], target: int, depth: float,
               length: int, q_tokens: int, offsets: Sequence[float], block: bool,
               stream_factory: Callable[[], WordStream], what: str, load: int,
               chunk: int = 192) -> Built:
    """Plan item positions for the requested depth, then fill the gaps to the exact length.
    Works for plain and chat pieces alike."""
    lens = [item_tokens(pieces, it, first=False) for it in items]
    first_len = item_tokens(pieces, items[0], first=True)
    fixed = pieces.bos + sum(lens) - lens[0] + first_len + q_tokens
    check_fixed_fits(length, fixed, what, load)
    context_tokens = length - q_tokens
    planned = plan_positions(pieces, lens, target, depth, context_tokens, offsets, block)
    tail = context_tokens - (planned[-1] + lens[-1])
    # Only an asked fact planned flush against the question (depth 1.0) forbids a tail gap.
    built = build_context(pieces, items, planned, context_tokens, stream_factory(), chunk=chunk,
                          allow_tail=tail > 0 or target != len(items) - 1)
    return built
