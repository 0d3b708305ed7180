"""Multi-key recall: N key -> value facts spread through a haystack, one or several asked.

`load` is the number of facts (keys), 1 .. 1024 and beyond. Length and load are separate axes:
at a fixed length, the haystack shrinks as the load grows. That gives the capacity knee of a
fixed-size state.

Worked example, style "natural" (length 512, depth 0.5, load 4, lookalike 2):

    ... Alice was not a bit hurt ...
    | The code for locker 12 is 5512.          <- asked, depth 0.5
    | ... she jumped up on to her feet ...
    | The code for locker 21 is 9034.          <- look-alike key
    | ... | The code for locker 4071 is 1180. | ...   (other keys, same template)
    | The code for locker 112 is 3377.         <- look-alike key
    What is the code for locker 12?
    The code for locker 12 is                  -> " 5512"

Style "mqar" (synthetic, like Zoology's multi-query associative recall; filler haystack):

    | zuvo: 8812.  | kela: 1290.  | zuva: 4431.  (look-alike)  ...
    What is the value of zuvo?
    Answer: zuvo:                              -> " 8812"

Variants, all set in params:
- values_per_key > 1 (multi-value): "The codes for locker 12 are 5512, 7730, 1190." The
  answer holds every value, comma-separated in order (gold = all values).
- queries > 1 (multi-query): that many keys are asked. query_mode "separate" asks each key in
  its own question after the whole context (prefill once, fork per question). query_mode
  "joint" asks all of them in one question, with the answers comma-separated in the order
  asked. The final (or only) question asks the fact placed at the requested depth.
- lookalike: each asked key gets that many look-alike keys among the facts (locker 12 ->
  locker 21, locker 112; zuvo -> zuva).
- placement: "spread" scatters the facts through the haystack at seeded random positions.
  "block" puts them all in one run around the asked fact.
candidates = gold[0], then the look-alike keys' values, the other keys' values, and fresh
values. Lengths, depth and stop conventions: see evalkit.probes.
"""
from __future__ import annotations

import random
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

from evalkit import probes as kit
from evalkit.probe import Probe
from evalkit.probes.words import DOMAINS


class Params(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)
    style: Literal["natural", "mqar"] = "natural"
    haystack: Literal["prose", "filler"] = "prose"
    keys: Literal["pseudo", "common"] = "pseudo"  # mqar keys: "zuvo", or common words ("said")
    value_kind: Literal["number", "word", "uuid", "common"] = "number"
    digits: int = Field(default=4, ge=2, le=12)
    values_per_key: int = Field(default=1, ge=1, le=8)
    queries: int = Field(default=1, ge=1)
    query_mode: Literal["separate", "joint"] = "separate"
    lookalike: int = Field(default=0, ge=0, le=8)
    placement: Literal["spread", "block"] = "spread"
    n_candidates: int = Field(default=5, ge=1)

    @model_validator(mode="after")
    def _keys_need_mqar(self) -> "Params":
        if self.keys == "common" and self.style != "mqar":
            raise ValueError("keys='common' needs style='mqar' (natural keys are locker numbers)")
        return self


def _keys(rng: random.Random, params: Params, load: int,
          n_asked: int) -> tuple[list[str], list[int]]:
    """load distinct keys. Keys 0..n_asked-1 are asked. Each asked key gets `lookalike`
    look-alike keys right after it. Returns (keys, family), where family[i] is the index of
    the asked key that key i looks like, or -1."""
    used: set[str] = set()
    keys: list[str] = []
    family: list[int] = []

    def fresh_key() -> str:
        while True:
            if params.style == "natural":
                k = str(rng.randrange(1, 10000))
            elif params.keys == "common":
                k = rng.choice(kit.common_words())
            else:
                k = kit.pseudo_word(rng, 2)
            if k not in used:
                used.add(k)
                return k

    asked = [fresh_key() for _ in range(n_asked)]
    keys.extend(asked)
    family.extend(range(n_asked))
    for i, k in enumerate(asked):
        for _ in range(params.lookalike):
            keys.append(kit.lookalike_numbers(rng, k, 1, used)[0] if params.style == "natural"
                        else kit.lookalike_word(rng, k, used))
            family.append(i)
    while len(keys) < load:
        keys.append(fresh_key())
        family.append(-1)
    return keys, family


def generate(params: Params, *, task: str, version: str, tokenizer: Any, length: int,
             depth: float, load: int, seed: int) -> Probe:
    kit.check_grid_point(length, depth, load)
    need = params.queries * (1 + params.lookalike)
    if load < need:
        raise ValueError(f"load={load} is too small: params.queries={params.queries} asked keys "
                         f"with params.lookalike={params.lookalike} look-alikes each need at "
                         f"least {need} facts")
    words = (load if params.keys == "common" else 0) + (
        load * params.values_per_key if params.value_kind == "common" else 0)
    if words > len(kit.common_words()):
        raise ValueError(f"load={load}: keys and values drawn from the {len(kit.common_words())} "
                         f"common words need {words} distinct words; lower the load")
    rng = random.Random(seed)
    attr, plural, noun = rng.choice(DOMAINS)
    keys, family = _keys(rng, params, load, params.queries)
    vpk = params.values_per_key
    flat = kit.make_values(rng, params.value_kind, load * vpk, params.digits,
                           avoid=keys if params.keys == "common" else ())
    values = [flat[i * vpk:(i + 1) * vpk] for i in range(load)]
    stream = kit.start_stream(rng, params.haystack)
    offsets = [rng.random() for _ in range(load - 1)]
    others = [i for i in range(load) if i != 0]
    rng.shuffle(others)
    fresh_rng = random.Random(rng.getrandbits(64))

    def name(i: int) -> str:
        return f"{noun} {keys[i]}" if params.style == "natural" else keys[i]

    def fact(i: int) -> str:
        vals = ", ".join(values[i])
        if params.style == "mqar":
            return f"{keys[i]}: {vals}."
        if vpk == 1:
            return f"The {attr} for {name(i)} is {vals}."
        return f"The {plural} for {name(i)} are {vals}."

    def question(i: int) -> tuple[str, str]:
        if params.style == "mqar":
            # " zuvo:" keeps its leading space, so the prefix ends with the fact's own tokens.
            return f"What is the value of {keys[i]}?", f"Answer: {keys[i]}:"
        if vpk == 1:
            return f"What is the {attr} for {name(i)}?", f"The {attr} for {name(i)} is"
        return f"What are the {plural} for {name(i)}?", f"The {plural} for {name(i)} are"

    order = kit.depth_order(depth, 0, others)  # key 0 is asked last, at `depth`
    items = [kit.Item(fact(i)) for i in order]

    def fresh(n: int) -> list[str]:
        return kit.make_values(random.Random(fresh_rng.random()), params.value_kind, n,
                               params.digits, avoid=flat)

    def distractors(i: int) -> list[str]:
        alike = [values[j][0] for j in range(load) if j != i and family[j] == i]
        rest = [values[j][0] for j in [0] + others if j != i and family[j] != i]
        return alike + rest

    def kind_of(i: int) -> str:
        if vpk > 1:
            return "multi"
        return "lookalike" if params.lookalike else "recall"

    asked = list(range(1, params.queries)) + [0]
    if params.query_mode == "joint" and params.queries > 1:
        gold = tuple(v for i in asked for v in values[i])
        names = [name(i) for i in asked]
        listed = ", ".join(names[:-1]) + " and " + names[-1]
        if params.style == "mqar":
            text, prefix = f"What are the values of {listed}?", f"The values of {listed} are"
        else:
            text, prefix = f"What are the {plural} for {listed}?", f"The {plural} for {listed} are"
        asks = [kit.Ask(item=order.index(0), text=text, prefix=prefix, gold=gold,
                        candidates=kit.candidates(gold[0], distractors(asked[0]),
                                                  params.n_candidates, fresh),
                        kind="multi")]
    else:
        asks = []
        for i in asked:
            text, prefix = question(i)
            asks.append(kit.Ask(item=order.index(i), text=text, prefix=prefix,
                                gold=tuple(values[i]),
                                candidates=kit.candidates(values[i][0], distractors(i),
                                                          params.n_candidates, fresh),
                                kind=kind_of(i)))
    return kit.assemble(task=task, version=version, tokenizer=tokenizer, length=length,
                        depth=depth, load=load, seed=seed, items=items, questions=asks,
                        stream=stream, offsets=offsets, block=params.placement == "block",
                        extra=dict(style=params.style, value_kind=params.value_kind,
                                   values_per_key=vpk, lookalike=params.lookalike,
                                   queries=params.queries, query_mode=params.query_mode))
