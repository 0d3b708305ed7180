"""Layout: facts (items) at planned token positions, haystack gaps fitted between them."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Sequence

from evalkit.probe import Segment
from evalkit.probes.fit import Meter, fit_words
from evalkit.probes.haystack import WordStream
from evalkit.probes.words import STORY_REQUESTS


@dataclass(frozen=True)
class Item:
    """A fact placed in the context. Plain probes: one segment, `text`. Chat probes: a user
    turn `text` that states the fact and the assistant's `reply` to it."""

    text: str
    reply: str | None = None

    def contents(self, chat: bool) -> tuple[tuple[str, str | None], ...]:
        """(text, role) of each segment of the item."""
        if chat != (self.reply is not None):
            raise ValueError(f"item {self.text!r}: chat probes need a reply to every fact and "
                             f"plain probes take none")
        return ((self.text, "user"), (self.reply, "assistant")) if chat else ((self.text, None),)


@dataclass
class Layout:
    """The laid-out context: its segments, where each item landed, and the haystack read."""

    context: list[Segment]
    item_seg: list[int]  # index of each item's first (fact) segment in context
    item_nseg: list[int]  # segments per item (chat: the statement and its acknowledgement)
    stream: WordStream
    meter: Meter

    def segment_ends(self) -> list[int]:
        """Token end of each context segment."""
        ends, acc = [], 0
        for j, seg in enumerate(self.context):
            acc += self.meter.seg_tokens(self.context[:j], seg)
            ends.append(acc)
        return ends


def depth_order(depth: float, asked: Any, others: Sequence[Any]) -> list[Any]:
    """`asked` among `others` at the share `depth` of them, so that the asked fact can sit at
    the requested depth: others[:k] + [asked] + others[k:], k = round(depth * len(others))."""
    k = round(depth * len(others))
    return [*others[:k], asked, *others[k:]]


def _join(meter: Meter, ctx: Sequence[Segment], content: str, role: str | None) -> Segment:
    # Plain segments carry their joining space in the segment text itself.
    if meter.chat:
        return Segment(content, role)
    return Segment(content if not ctx else " " + content)


def _fill_gap(meter: Meter, ctx: list[Segment], used: int, n: int, stream: WordStream,
              chunk: int, max_shift: int, fillers: dict[int, tuple[int, int, int]]) -> int:
    """Append haystack worth n tokens to ctx (as close as possible without going over).
    Plain: one segment of prose. Chat: (request, prose) exchanges of about `chunk` tokens."""
    if n <= 0:
        return used
    if not meter.chat:
        pre, post = meter.affixes(ctx, None)
        extra = meter.bos if not ctx else 0
        a, k, got = fit_words(meter, stream, stream.pos, n, pre, post, extra, max_shift)
        if k:
            ctx.append(_join(meter, ctx, " ".join(stream.words(a, k)), None))
            stream.pos = a + k
            used += got
        return used
    # chat: the user asks for more of the story, the assistant tells the next part of it
    probe_req = Segment(STORY_REQUESTS[0], "user")
    u_min = meter.seg_tokens(ctx, probe_req)
    pre, post = meter.affixes(ctx + [probe_req], "assistant")
    a_min = meter.count(pre + "x" + post)
    if n < u_min + a_min + 2:
        return used
    m = max(1, min(round(n / chunk), n // (u_min + a_min + 8)))
    goal = used + n
    for j in range(m):
        req = Segment(STORY_REQUESTS[(len(ctx) // 2) % len(STORY_REQUESTS)], "user")
        u = meter.seg_tokens(ctx, req)
        target = (goal - used) // (m - j) - u
        pre, post = meter.affixes(ctx + [req], "assistant")
        if target <= meter.count(pre + post):
            continue
        last = j == m - 1
        a, k, got = fit_words(meter, stream, stream.pos, target, pre, post, 0,
                              max_shift if last else 0)
        if not k:
            continue
        ctx.append(req)
        fillers[len(ctx)] = (a, k, got)
        ctx.append(Segment(" ".join(stream.words(a, k)), "assistant"))
        stream.pos = a + k
        used += u + got
    return used


def _extend_last_turn(meter: Meter, ctx: list[Segment], n: int, stream: WordStream,
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
        a, got = stream.pos, meter.count(meter.renderer.piece(ctx[:j], ctx[j]))
    pre, post = meter.affixes(ctx[:j], "assistant")
    a2, k2, got2 = fit_words(meter, stream, a, got + n, pre + lead, post, 0, max_shift)
    if not k2 or got2 <= got:
        return 0
    ctx[j] = Segment(lead + " ".join(stream.words(a2, k2)), "assistant")
    if fillers:
        fillers[j] = (a2, k2, got2)
    stream.pos = max(stream.pos, a2 + k2)
    return got2 - got


def build_context(meter: Meter, items: Sequence[Item], planned: Sequence[int],
                  final_end: int, stream: WordStream, *, chunk: int = 192,
                  allow_tail: bool = True, max_shift: int = 16) -> Layout:
    """Lay items out in order, filling the haystack gaps left to right. Item i should start at
    token planned[i]. The context should end at token final_end. A gap that falls short
    passes its shortfall to the next gap. If `allow_tail` is False, nothing may follow the last
    item (depth 1.0), so a shortfall there stays a shortfall."""
    ctx: list[Segment] = []
    item_seg: list[int] = []
    fillers: dict[int, tuple[int, int, int]] = {}
    used = 0
    for it, p in zip(items, planned):
        used = _fill_gap(meter, ctx, used, p - used, stream, chunk, max_shift, fillers)
        item_seg.append(len(ctx))
        for text, role in it.contents(meter.chat):
            seg = _join(meter, ctx, text, role)
            used += meter.seg_tokens(ctx, seg)
            ctx.append(seg)
    if allow_tail:
        used = _fill_gap(meter, ctx, used, final_end - used, stream, chunk, 4 * max_shift,
                         fillers)
    if meter.chat and used < final_end:
        used += _extend_last_turn(meter, ctx, final_end - used, stream, fillers, 4 * max_shift)
    return Layout(ctx, item_seg, [len(it.contents(meter.chat)) for it in items], stream, meter)


def item_tokens(meter: Meter, item: Item, first: bool) -> int:
    """Tokens of an item when placed after other text (or first in the context)."""
    if meter.chat:
        prev = [] if first else [Segment("x", "user"), Segment("x", "assistant")]
        total = 0
        ctx = list(prev)
        for text, role in item.contents(True):
            seg = Segment(text, role)
            total += meter.seg_tokens(ctx, seg)
            ctx.append(seg)
        return total
    prev = [] if first else [Segment("x")]
    return meter.seg_tokens(prev, _join(meter, prev, item.contents(False)[0][0], None))


def plan_positions(meter: Meter, item_lens: Sequence[int], target: int, depth: float,
                   context_tokens: int, offsets: Sequence[float], block: bool) -> list[int]:
    """Planned start token of every item, in order.

    item `target` starts at round(depth * (context_tokens - its length)). The other items are
    spread over the haystack: each has a fraction in [0, 1) (`offsets`, drawn from the seeded
    RNG), scaled into the haystack before or after the target. With `block`, all items are
    contiguous around the target."""
    start = meter.bos
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


def lay_out(meter: Meter, items: Sequence[Item], target: int, depth: float, length: int,
            load: int, q_tokens: int, offsets: Sequence[float], block: bool,
            stream: WordStream, chunk: int) -> Layout:
    """Plan item positions for the requested depth, then fill the gaps to the exact length.
    Works for plain and chat probes alike."""
    lens = [item_tokens(meter, it, first=False) for it in items]
    first_len = item_tokens(meter, items[0], first=True)
    fixed = meter.bos + sum(lens) - lens[0] + first_len + q_tokens
    if fixed > length:
        if load == 1:
            raise ValueError(f"length={length} is too short: the fact and question alone take "
                             f"{fixed} tokens")
        raise ValueError(f"load={load} facts need at least {fixed} tokens (with the "
                         f"question) but length={length}")
    context_tokens = length - q_tokens
    planned = plan_positions(meter, lens, target, depth, context_tokens, offsets, block)
    tail = context_tokens - (planned[-1] + lens[-1])
    # Only an asked fact planned flush against the question (depth 1.0) forbids a tail gap.
    return build_context(meter, items, planned, context_tokens, stream, chunk=chunk,
                         allow_tail=tail > 0 or target != len(items) - 1)
