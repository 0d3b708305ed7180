"""Conversation memory: facts stated in a multi-turn chat, some updated later, then asked.

The probe is a chat (chat=True). It is rendered with the tokenizer's chat template, or with
plain "role: text" lines when the tokenizer has none. The user states facts. Between them
the user asks for more of a story and the assistant tells it (the haystack). At the end,
and with `checkpoints` also at earlier turns, the user asks about an earlier fact.

Worked example (length 1024, depth 0.5, load 3, kind "latest"):

    user:      Please remember this. The code for locker 12 is 5512.
    assistant: Noted.
    user:      Tell me more of the story.
    assistant: Alice was beginning to get very tired of sitting by her sister ...
    user:      Keep this in mind. The code for locker 21 is 9034.        (look-alike key)
    ...
    user:      Correction, this has changed. The code for locker 12 is 7730.  <- depth 0.5
    assistant: Noted, I have updated it.
    ...
    user:      What is the code for locker 12?
    assistant: The code for locker 12 is             -> " 7730"

gold = ("7730",); candidates = ("7730", "5512", "9034", ...): gold first, then earlier values
of the same key, then the other values seen in the conversation (only values that occur in
the context). An update restates the fact's exact wording, so the latest occurrence holds
the current value.

Question kinds (one per probe, drawn from params.kinds with the seed):
- recall: the asked fact is stated once.
- latest: the asked fact was stated, then updated. Gold is the newest value. `depth` places
  the update. The first statement comes earlier, at a random place.
- lookalike: `lookalike` keys look like the asked one (locker 12, 21, 112). The question
  names which one is meant.
`load` = the number of distinct facts (keys) stated. `updates` more facts are updated too, as
distractors. With `checkpoints` = k, k more questions are asked after earlier assistant turns,
spread evenly. Each asks a fact already stated by then, and gold is its value at that time.
The final question is always last, and its prompt is the one fitted to `length`.
Depth, length and stop conventions: see evalkit.probes. Here fact_token points at the
user turn that states the fact.
"""
from __future__ import annotations

import random
from typing import Any, Callable, Literal

from pydantic import BaseModel, ConfigDict, Field

from evalkit import probes as kit
from evalkit.probe import Probe
from evalkit.probes.words import DOMAINS, FACT_ACKS, FACT_INTROS, UPDATE_ACKS, UPDATE_INTROS

Kind = Literal["recall", "latest", "lookalike"]


MAX_KEYS = 999


class Params(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)
    kinds: tuple[Kind, ...] = Field(default=("recall", "latest", "lookalike"), min_length=1)
    value_kind: Literal["number", "word", "uuid"] = "number"
    digits: int = Field(default=4, ge=2, le=12)
    updates: int = Field(default=1, ge=0)
    lookalike: int = Field(default=2, ge=0, le=8)
    checkpoints: int = Field(default=0, ge=0)
    haystack: Literal["prose", "filler"] = "prose"
    chunk_tokens: int = Field(default=192, ge=16)
    n_candidates: int = Field(default=5, ge=1)


def generate(params: Params, *, task: str, version: str, tokenizer: Any, length: int,
             depth: float, load: int, seed: int) -> Probe:
    kit.check_grid_point(length, depth, load)
    if "lookalike" in params.kinds and load < 1 + params.lookalike:
        raise ValueError(f"load={load} is too small: kind 'lookalike' with params.lookalike="
                         f"{params.lookalike} needs at least {1 + params.lookalike} facts")
    if load > MAX_KEYS:  # keys are distinct numbers 1-999: more would never finish drawing
        raise ValueError(f"load={load}: at most {MAX_KEYS} facts (one key number 1-999 each)")
    if params.updates > load - 1:
        raise ValueError(f"load={load} is too small: params.updates={params.updates} updated "
                         f"distractor facts need at least {params.updates + 1} facts")
    rng = random.Random(seed)
    kind = params.kinds[rng.randrange(len(params.kinds))]
    attr, _, noun = rng.choice(DOMAINS)
    used: set[str] = set()
    keys = [str(rng.randrange(1, 1000))]
    used.add(keys[0])
    if kind == "lookalike":
        keys += kit.lookalike_numbers(rng, keys[0], params.lookalike, used, limit=9999)
    while len(keys) < load:
        k = str(rng.randrange(1, 1000))
        if k not in used:
            used.add(k)
            keys.append(k)
    updated = set(rng.sample(range(1, load), params.updates))
    if kind == "latest":
        updated.add(0)
    n_values = load + len(updated)
    flat = kit.make_values(rng, params.value_kind, n_values, params.digits)
    first = {i: flat[i] for i in range(load)}
    second = {i: flat[load + j] for j, i in enumerate(sorted(updated))}

    # Events: (key, value, is_update). Other keys' events in random order, updates after
    # their first statement; then the asked key's statement(s) go where depth puts them.
    others = list(range(1, load))
    rng.shuffle(others)
    seq: list[tuple[int, str, bool]] = [(i, first[i], False) for i in others]
    for i in sorted(updated - {0}):
        pos = next(j for j, e in enumerate(seq) if e[0] == i and not e[2])
        seq.insert(rng.randrange(pos + 1, len(seq) + 1), (i, second[i], True))
    n_events = len(seq) + (2 if kind == "latest" else 1)
    g = round(depth * (n_events - 1))
    if kind == "latest":
        g = max(g, 1)  # the first statement must come before the update
        seq.insert(rng.randrange(0, g), (0, first[0], False))
        seq.insert(g, (0, second[0], True))
    else:
        seq.insert(g, (0, first[0], False))
    offsets = [rng.random() for _ in range(n_events - 1)]
    intros = [rng.randrange(len(FACT_INTROS)) for _ in seq]
    acks = [rng.randrange(len(FACT_ACKS)) for _ in seq]
    stream = kit.start_stream(rng, params.haystack)
    ck_rng = random.Random(rng.getrandbits(64))

    def fact(i: int, v: str) -> str:
        return f"The {attr} for {noun} {keys[i]} is {v}."

    items = []
    for (i, v, upd), a, b in zip(seq, intros, acks):
        intro = UPDATE_INTROS[a % len(UPDATE_INTROS)] if upd else FACT_INTROS[a]
        ack = UPDATE_ACKS[b % len(UPDATE_ACKS)] if upd else FACT_ACKS[b]
        items.append(kit.Item(f"{intro} {fact(i, v)}", reply=ack))

    def question(i: int) -> tuple[str, str]:
        return f"What is the {attr} for {noun} {keys[i]}?", f"The {attr} for {noun} {keys[i]} is"

    def cands(i: int, gold: str, upto: int) -> tuple[str, ...]:
        """gold, earlier values of key i, then the look-alike keys' and the other values seen
        in the first `upto` events (in key order, so the same for every depth)."""
        seen = sorted(seq[:upto], key=lambda e: (e[0], e[2]))
        own = [v for k, v, _ in seen if k == i and v != gold][::-1]
        alike = [v for k, v, _ in seen
                 if k != i and kind == "lookalike" and i == 0 and k <= params.lookalike]
        rest = [v for k, v, _ in seen if k != i]
        return kit.candidates(gold, own + alike + rest, params.n_candidates, lambda n: [])

    text, prefix = question(0)
    final = kit.Ask(item=g, text=text, prefix=prefix, gold=(seq[g][1],),
                    candidates=cands(0, seq[g][1], len(seq)), kind=kind)
    return kit.assemble(
        task=task, version=version, tokenizer=tokenizer, length=length, depth=depth, load=load,
        seed=seed, items=items, questions=[final], stream=stream, offsets=offsets, chat=True,
        chunk=params.chunk_tokens,
        checkpoints=lambda layout: _checkpoints(params.checkpoints, layout, seq, ck_rng,
                                                question, cands),
        extra=dict(kind=kind, value_kind=params.value_kind, updates=len(updated),
                   checkpoints=params.checkpoints))


def _checkpoints(k: int, layout: kit.Layout, seq: list, rng: random.Random,
                 question: Callable, cands: Callable) -> list[kit.Ask]:
    """k questions after assistant turns spread evenly through the conversation. Each asks
    a fact already stated, and gold is its value at that time."""
    if k == 0:
        return []
    ctx = layout.context
    ends = layout.segment_ends()
    acc = ends[-1]
    first_fact_end = layout.item_seg[0] + 2  # after the first fact's acknowledgement
    slots = [a for a in range(first_fact_end, len(ctx) + 1, 2)
             if a < len(ctx) and ctx[a - 1].role == "assistant"]
    if len(slots) < k:
        raise ValueError(f"params.checkpoints={k}: this conversation has only {len(slots)} "
                         f"assistant turns after the first fact; use a larger length")
    chosen: list[int] = []
    for j in range(1, k + 1):
        goal = acc * j / (k + 1)
        free = [a for a in slots if a not in chosen]
        chosen.append(min(free, key=lambda a: (abs(ends[a - 1] - goal), a)))
    out = []
    for a in sorted(chosen):
        stated = [e for e, s in enumerate(layout.item_seg) if s + 2 <= a]
        keys = sorted({seq[e][0] for e in stated})
        i = keys[rng.randrange(len(keys))]
        last = max(e for e in stated if seq[e][0] == i)
        n_said = sum(1 for e in stated if seq[e][0] == i)
        text, prefix = question(i)
        gold = seq[last][1]
        out.append(kit.Ask(item=last, text=text, prefix=prefix, gold=(gold,),
                           candidates=cands(i, gold, len(stated)),
                           kind="latest" if n_said > 1 else "recall", after_segment=a))
    return out
