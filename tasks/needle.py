"""Needle in a haystack: one or several "special magic" facts hidden in prose or filler.

Worked example (length 256, depth 0.5, load 3 = the asked needle plus 2 same-template
distractor needles, haystack "prose"; the lines mark segment boundaries):

    Alice was beginning to get very tired of sitting by her sister ... she had peeped
    | The special magic number for Oslo is 3318202.                      <- distractor
    | into the book her sister was reading ...
    | The special magic number for Lisbon is 4821907.                    <- asked, depth 0.5
    | ... 'and what is the use of a book,' thought Alice ...
    | The special magic number for Kyoto is 7720016.                     <- distractor
    | ... without pictures or conversations?
    What is the special magic number for Lisbon?
    The special magic number for Lisbon is            -> " 4821907"  (stop at "." or "\\n")

gold = ("4821907",); candidates = ("4821907", "3318202", "7720016", <fresh numbers>...).
The answer prefix restates the fact's own wording up to the value, so a pure copy
(induction) model can answer by finding "for Lisbon is" and copying what followed.

- load: the number of needles, the asked one included. Every needle has its own key (a city)
  and the same template. The others are distractors.
- queries: how many of the needles are asked, each in its own question after the whole
  context. The final question asks the needle placed at the requested depth. The others ask
  random other needles.
- haystack: "prose" (Alice in Wonderland; see data/LICENSE.md) or "filler" (the repeated
  "The grass is green. ..." sentences).
- value_kind: "number" (`digits` digits), "word" (a noun absent from the prose), "uuid", or
  "phrase" (`words` distinct common prose words in random order: a long verbatim copy, the recall
  that a fixed state loses first, cf. Jelassi et al. 2024, "Repeat After Me").
Lengths, depth and stop conventions: see evalkit.probes.
"""
from __future__ import annotations

import random
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from evalkit import probes as kit
from evalkit.probe import Probe
from evalkit.probes.words import CITIES

KIND_NOUN = {"number": "number", "word": "word", "uuid": "UUID", "phrase": "phrase"}


class Params(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)
    haystack: Literal["prose", "filler"] = "prose"
    value_kind: Literal["number", "word", "uuid", "phrase"] = "number"
    digits: int = Field(default=7, ge=2, le=12)
    words: int = Field(default=8, ge=2, le=32)  # phrase values only
    queries: int = Field(default=1, ge=1)
    n_candidates: int = Field(default=5, ge=1)


def generate(params: Params, *, task: str, version: str, tokenizer: Any, length: int,
             depth: float, load: int, seed: int) -> Probe:
    kit.check_grid_point(length, depth, load)
    if load > len(CITIES):
        raise ValueError(f"load={load}: at most {len(CITIES)} needles (one key each)")
    if params.queries > load:
        raise ValueError(f"load={load} is too small: params.queries={params.queries} asked "
                         f"needles need at least {params.queries} needles")
    rng = random.Random(seed)
    keys = rng.sample(CITIES, load)
    values = kit.make_values(rng, params.value_kind, load, params.digits, words=params.words)
    stream = kit.start_stream(rng, params.haystack)
    offsets = [rng.random() for _ in range(load - 1)]
    asked_others = rng.sample(range(1, load), params.queries - 1)
    fresh_rng = random.Random(rng.getrandbits(64))

    noun = KIND_NOUN[params.value_kind]
    order = kit.depth_order(depth, 0, range(1, load))  # needle 0 is asked last, at `depth`
    items = [kit.Item(f"The special magic {noun} for {keys[i]} is {values[i]}.") for i in order]

    def fresh(n: int) -> list[str]:
        return kit.make_values(random.Random(fresh_rng.random()), params.value_kind, n,
                               params.digits, avoid=values, words=params.words)

    def ask(i: int) -> kit.Ask:
        others = [values[j] for j in rng.sample(range(load), load) if j != i]
        return kit.Ask(item=order.index(i), text=f"What is the special magic {noun} for {keys[i]}?",
                       prefix=f"The special magic {noun} for {keys[i]} is", gold=(values[i],),
                       candidates=kit.candidates(values[i], others, params.n_candidates, fresh))

    return kit.assemble(task=task, version=version, tokenizer=tokenizer, length=length,
                        depth=depth, load=load, seed=seed, items=items,
                        questions=[ask(i) for i in asked_others] + [ask(0)], stream=stream,
                        offsets=offsets, extra={"value_kind": params.value_kind})
