"""An example user generator: a secret ingredient hidden among numbered recipe steps.

Referenced from recipes.yaml as `recipe_probe:generate`; evalkit finds this module through the
spec's include path (the spec's own folder by default). The generator only states facts and
questions; `assemble()` from evalkit.probes lays them out, fits the prompt to the exact length and
measures it.

Worked example: generate(Params(), task="recipes", version="1", tokenizer=tok, length=256,
depth=0.5, load=1, seed=7) -> a 256-token probe whose context is numbered cooking steps with
"The secret ingredient of the Lisbon stew is saffron." near the middle, and the question
"What is the secret ingredient of the Lisbon stew?".
"""
from __future__ import annotations

import random

from pydantic import BaseModel, ConfigDict, Field

from evalkit import probes as kit

STEPS = ("Chop the onions finely.", "Warm the pan over a low flame.", "Stir for two minutes.",
         "Add a pinch of salt.", "Let it rest before serving.", "Rinse the beans twice.")
KITCHEN = kit.Haystack.from_text(
    "recipe steps", " ".join(f"Step {i + 1}: {STEPS[i * 5 % len(STEPS)]}" for i in range(60)))


class Params(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)
    ingredients: tuple[str, ...] = ("saffron", "cardamom", "sumac", "fennel", "anise", "mace")
    dishes: tuple[str, ...] = ("Lisbon stew", "Oslo soup", "Quito rice", "Hanoi broth")
    n_candidates: int = Field(default=4, ge=1)


def generate(params: Params, *, task, version, tokenizer, length, depth, load, seed):
    if load > len(params.dishes):
        raise ValueError(f"load={load}: only {len(params.dishes)} dishes are defined")
    rng = random.Random(seed)
    dishes = rng.sample(params.dishes, load)
    values = rng.sample(params.ingredients, load)
    order = kit.depth_order(depth, 0, range(1, load))  # dish 0 is asked, at `depth`
    facts = [kit.Item(f"The secret ingredient of the {dishes[i]} is {values[i]}.") for i in order]
    dish = dishes[0]
    question = kit.Ask(item=order.index(0), text=f"What is the secret ingredient of the {dish}?",
                       prefix=f"The secret ingredient of the {dish} is", gold=(values[0],),
                       candidates=kit.candidates(values[0], [*values[1:], *params.ingredients],
                                                 params.n_candidates, lambda n: []))
    return kit.assemble(task=task, version=version, tokenizer=tokenizer, length=length,
                        depth=depth, load=load, seed=seed, items=facts, questions=[question],
                        stream=kit.start_stream(rng, KITCHEN),
                        offsets=[rng.random() for _ in facts[1:]])
