"""An example user generator: a secret ingredient hidden in a list of recipe steps.

Referenced from recipes.yaml as `recipe_probe:generate`; evalkit finds this module through the
spec's include path (the spec's own folder by default).

Worked example: generate(Params(), task="recipes", version="1", tokenizer=tok, length=256,
depth=0.5, load=1, seed=7) -> a probe whose context is ~250 tokens of numbered cooking steps
with "The secret ingredient of the Lisbon stew is saffron." near the middle, and the question
"What is the secret ingredient of the Lisbon stew?".
"""
from __future__ import annotations

import random

from pydantic import BaseModel, ConfigDict, Field

from evalkit.probe import Probe, ProbeMeta, Question, Segment
from evalkit.render import continuation_ids, prompt_length
from evalkit.tokenization import tokenizer_hash


class Params(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)
    ingredients: tuple[str, ...] = ("saffron", "cardamom", "sumac", "fennel", "anise", "mace")
    dishes: tuple[str, ...] = ("Lisbon stew", "Oslo soup", "Quito rice", "Hanoi broth")
    tolerance: int = Field(default=4, ge=0)


STEPS = ("Chop the onions finely.", "Warm the pan over a low flame.", "Stir for two minutes.",
         "Add a pinch of salt.", "Let it rest before serving.", "Rinse the beans twice.")


def _probe(p: Params, task, version, tok, length, depth, load, seed, n_steps, n_pad=0) -> Probe:
    rng = random.Random(seed)
    dishes = rng.sample(p.dishes, load)
    values = rng.sample(p.ingredients, load)
    steps = [f"Step {i + 1}: {rng.choice(STEPS)}" for i in range(n_steps)] + ["Taste."] * n_pad
    at = round(depth * n_steps)
    facts = [f"The secret ingredient of the {d} is {v}." for d, v in zip(dishes, values)]
    lines = steps[:at] + facts + steps[at:]
    context = (Segment(" ".join(lines)),)
    asked = 0
    q = Question(text=f"What is the secret ingredient of the {dishes[asked]}?",
                 answer_prefix=f"The secret ingredient of the {dishes[asked]} is",
                 gold=(values[asked],), candidates=(values[asked], *values[:asked],
                                                     *values[asked + 1:]),
                 after_segment=1, depth=depth,
                 max_new_tokens=len(continuation_ids(tok, values[asked])) + 2)
    meta = ProbeMeta(target_length=length, actual_length=0, tolerance=p.tolerance, depth=depth,
                     load=load, seed=seed, tokenizer_hash=tokenizer_hash(tok))
    probe = Probe(id=f"{task}-L{length}-d{depth:g}-n{load}-s{seed}", task=task,
                  task_version=version, context=context, questions=(q,), meta=meta)
    n = prompt_length(probe, tok)
    return Probe(id=probe.id, task=task, task_version=version, context=context, questions=(q,),
                 meta=ProbeMeta(**{**meta.__dict__, "actual_length": n}))


def generate(params: Params, *, task, version, tokenizer, length, depth, load, seed) -> Probe:
    if load > len(params.dishes):
        raise ValueError(f"load={load}: only {len(params.dishes)} dishes are defined")
    # Grow the number of steps until the prompt reaches the target length.
    n_steps, probe = 0, _probe(params, task, version, tokenizer, length, depth, load, seed, 0)
    if probe.meta.actual_length > length:
        raise ValueError(f"length={length} is too short: the facts and question alone take "
                         f"{probe.meta.actual_length} tokens")
    while probe.meta.actual_length < length - params.tolerance:
        n_steps += 1
        probe = _probe(params, task, version, tokenizer, length, depth, load, seed, n_steps)
    # Steps are ~10 tokens: if the last one overshot, swap it for short "Taste." lines.
    n_pad = 0
    while probe.meta.actual_length > length + params.tolerance and n_steps > 0:
        n_steps -= 1
        probe = _probe(params, task, version, tokenizer, length, depth, load, seed, n_steps)
        while probe.meta.actual_length < length - params.tolerance:
            n_pad += 1
            probe = _probe(params, task, version, tokenizer, length, depth, load, seed, n_steps,
                           n_pad)
    if probe.meta.actual_length > length + params.tolerance:
        raise ValueError(f"length={length}: cannot land within {params.tolerance} tokens "
                         f"(got {probe.meta.actual_length})")
    return probe
