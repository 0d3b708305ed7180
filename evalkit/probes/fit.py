"""Token measuring and exact-length fitting of haystack gaps.

Fitting only ever trusts real token ids. Estimates from token offsets choose where to look, and
real counts of the rendered piece confirm every choice.
"""
from __future__ import annotations

import bisect
from typing import Any, Callable, Sequence

from evalkit.probe import Segment
from evalkit.probes.haystack import Haystack, WordStream
from evalkit.render import Renderer
from evalkit.tokenization import encode


class Meter:
    """Token counts of prompt pieces for one tokenizer, as evalkit.render renders them."""

    def __init__(self, tokenizer: Any, chat: bool) -> None:
        self.tok = tokenizer
        self.chat = chat
        self.renderer = Renderer(tokenizer, chat)
        self.bos = len(self.renderer.bos)
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

    def tokens_per_word(self, hay: Haystack) -> float:
        if hay.name not in self._tpw:
            words = hay.words[:2000]
            self._tpw[hay.name] = max(0.2, self.count(" ".join(words)) / len(words))
        return self._tpw[hay.name]

    def seg_tokens(self, ctx: Sequence[Segment], seg: Segment) -> int:
        """Tokens of `seg` after `ctx`, BOS included when it opens the prompt."""
        return self.count(self.renderer.piece(ctx, seg)) + (self.bos if not ctx else 0)

    def affixes(self, ctx: Sequence[Segment], role: str | None) -> tuple[str, str]:
        """(pre, post) such that the tokenized piece of a segment is pre + content + post."""
        if not self.chat:
            return ("" if not ctx else " ", "")
        sentinel = "\x00EVALKIT\x00"
        pre, mid, post = self.renderer.piece(ctx, Segment(sentinel, role)).partition(sentinel)
        if not mid:
            raise ValueError("the chat template of this tokenizer does not copy message content "
                             "verbatim, so prompt lengths cannot be fitted")
        return pre, post

    def question_tokens(self, ctx: Sequence[Segment], text: str, prefix: str) -> int:
        return (self.count(self.renderer.question(ctx, text, prefix))
                + (self.bos if not ctx else 0))


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


def fit_words(meter: Meter, stream: WordStream, start: int, n: int, pre: str, post: str,
              extra: int = 0, max_shift: int = 16) -> tuple[int, int, int]:
    """Choose haystack words so that pre + words + post is exactly n tokens (plus `extra`
    tokens, e.g. BOS), or as close below n as possible.

    Returns (first word, word count, tokens). Words are always whole. If no word count hits n
    exactly, the start moves forward a word at a time (at most max_shift words), because where
    word boundaries fall in token space depends on where the text starts. Token offsets of one
    tokenization estimate every (start, count) pair. Real counts confirm the estimates, so a
    gap costs about three tokenizations whatever its size.
    """
    base = extra + meter.count(pre + post)
    if n <= extra:  # (plain pre " " merges into the first word, so base may overstate)
        return start, 0, 0
    tpw = meter.tokens_per_word(stream.hay)
    window = max(32, int((n - base) / tpw * 1.1) + max_shift + 16)
    while True:
        words = stream.words(start, window)
        offs = meter.offsets(pre + " ".join(words))
        if offs is None or len(offs) >= n + 8 or window > 50 * n + 1000:
            break
        window *= 2
    max_shift = min(max_shift, len(words) - 1)

    def count(k: int, a: int) -> int:
        if k == 0:
            return 0
        return extra + meter.count(pre + " ".join(stream.words(a, k)) + post)

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
