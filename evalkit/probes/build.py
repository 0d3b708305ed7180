"""assemble(): facts + questions + a haystack -> one finished, exact-length, measured Probe."""
from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any, Callable, Mapping, Sequence

from evalkit.grid import point_error
from evalkit.probe import Probe, ProbeMeta, Question, Segment
from evalkit.probes.fit import Meter
from evalkit.probes.haystack import WordStream
from evalkit.probes.layout import Item, Layout, lay_out
from evalkit.render import continuation_ids, render
from evalkit.tokenization import tokenizer_hash

ANSWER_MARGIN = 4  # extra generation tokens beyond the gold answer's own tokens


@dataclass(frozen=True)
class Ask:
    """A question before measurement: which item states its answer, and its texts."""

    item: int  # index into the items passed to assemble()
    text: str
    prefix: str  # the answer prefix: restates the fact's own wording up to the value
    gold: tuple[str, ...]
    candidates: tuple[str, ...]
    kind: str = "recall"
    after_segment: int | None = None  # None: after the whole context


def tolerance(length: int) -> int:
    """Largest allowed |actual - target| prompt length: max(2 tokens, 0.5 %)."""
    return max(2, length // 200)


def probe_id(task: str, length: int, depth: float, load: int, seed: int) -> str:
    return f"{task}-L{length}-d{depth:g}-n{load}-s{seed}"


def check_grid_point(length: Any, depth: Any, load: Any) -> None:
    """Reject bad grid inputs with errors that name the field (evalkit.grid's bounds, the
    ones every grid is held to). Nothing is ever clamped."""
    why = point_error(length, depth, load)
    if why:
        raise ValueError(why)


def assemble(*, task: str, version: str, tokenizer: Any, length: int, depth: float, load: int,
             seed: int, items: Sequence[Item], questions: Sequence[Ask], stream: WordStream,
             offsets: Sequence[float], chat: bool = False, block: bool = False,
             chunk: int = 192, extra: Mapping[str, Any] | None = None,
             checkpoints: Callable[[Layout], list[Ask]] | None = None) -> Probe:
    """Lay the items out in the haystack, fit the prompt to `length` tokens and measure it.

    The last question's item is placed at `depth`; its prompt is the one fitted to `length`.
    `offsets` (one fraction in [0, 1) per other item, from the probe's seeded RNG) spread the
    other items over the haystack; with `block` they sit right around it instead. Chat probes
    fill the gaps with story exchanges of about `chunk` tokens. `checkpoints`, given the
    finished layout, returns questions asked part-way through it (before `questions`)."""
    check_grid_point(length, depth, load)
    if not items or not questions:
        raise ValueError(f"task {task!r}: a probe needs at least one item and one question")
    meter = Meter(tokenizer, chat)
    last = questions[-1]
    dummy = [Segment("x", "user"), Segment("x", "assistant")] if chat else [Segment("x")]
    q_tokens = meter.question_tokens(dummy, last.text, last.prefix)
    layout = lay_out(meter, items, last.item, depth, length, load, q_tokens, offsets, block,
                     stream, chunk)
    asks = (checkpoints(layout) if checkpoints else []) + list(questions)
    meta_extra = {
        "haystack": stream.hay.name, "haystack_start_word": stream.start,
        "haystack_words": stream.pos - stream.start, "haystack_wrapped": stream.wrapped(),
        "placement": "block" if block else "spread",
        "depth_rule": "fact_token / (context_tokens - fact_tokens)", **(extra or {})}
    if chat:
        meta_extra["turns"] = len(layout.context)
    probe = _finish(task=task, version=version, tokenizer=tokenizer, layout=layout, asks=asks,
                    length=length, depth=depth, load=load, seed=seed, extra=meta_extra)
    err = probe.meta.actual_length - length
    if err > probe.meta.tolerance:
        raise ValueError(f"length={length} is too short: the facts and question of this probe "
                         f"take {probe.meta.actual_length} tokens")
    if abs(err) > probe.meta.tolerance:
        raise RuntimeError(f"probe {probe.id}: fitted prompt is {probe.meta.actual_length} "
                           f"tokens, outside {length} +- {probe.meta.tolerance}; please report "
                           f"this with the tokenizer used")
    return probe


def _finish(*, task: str, version: str, tokenizer: Any, layout: Layout, asks: Sequence[Ask],
            length: int, depth: float, load: int, seed: int, extra: dict[str, Any]) -> Probe:
    """Render the probe for real, then fill every measured field from the real token ids."""
    ctx = tuple(layout.context)
    n = len(ctx)

    def make(qs: Sequence[Question], actual: int = 0) -> Probe:
        return Probe(id=probe_id(task, length, depth, load, seed), task=task,
                     task_version=version, context=ctx, questions=tuple(qs),
                     meta=ProbeMeta(target_length=length, actual_length=actual,
                                    tolerance=tolerance(length), depth=float(depth), load=load,
                                    seed=seed, tokenizer_hash=tokenizer_hash(tokenizer),
                                    extra=tuple(sorted(extra.items()))),
                     chat=layout.meter.chat)

    draft = [Question(text=q.text, answer_prefix=q.prefix, gold=q.gold, candidates=q.candidates,
                      after_segment=n if q.after_segment is None else q.after_segment,
                      kind=q.kind) for q in asks]
    r = render(make(draft), tokenizer)
    questions = []
    for q, d in zip(asks, draft):
        seg = layout.item_seg[q.item]
        fact_tok = r.prefix_length(seg)
        fact_len = r.prefix_length(seg + layout.item_nseg[q.item]) - fact_tok
        ctx_tok = r.prefix_length(d.after_segment)
        span = ctx_tok - fact_len
        dep = 0.0 if span <= 0 else min(1.0, max(0.0, fact_tok / span))
        gold_ids = continuation_ids(tokenizer, ", ".join(q.gold))
        questions.append(replace(d, depth=dep, fact_token=fact_tok, distance=ctx_tok - fact_tok,
                                 max_new_tokens=len(gold_ids) + ANSWER_MARGIN))
    actual = len(r.prompt(len(questions) - 1, questions[-1].after_segment))
    return make(questions, actual)
