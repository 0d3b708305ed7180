"""Toy task generators for the runner tests: code-word facts in filler text.

`toy_recall`: one haystack, several questions about it (prefill once, fork per question).
`toy_conv`: a chat conversation questioned after several turns (streamed through one state).
Facts and filler are one per line, so a perfect copier answers exactly and stops at the newline.
"""
from __future__ import annotations

import random

from pydantic import BaseModel, ConfigDict, Field

from evalkit.probe import Probe, ProbeMeta, Question, Segment
from evalkit.probes import tolerance
from evalkit.render import prompt_length
from evalkit.tokenization import tokenizer_hash

KEYS = ("Lisbon Paris Oslo Rome Vienna Prague Dublin Madrid Berlin Athens Warsaw Sofia Riga "
        "Tallinn Vilnius Bern Kyiv Minsk Zagreb Skopje Tirana Valletta Nicosia Ankara Cairo "
        "Tunis Rabat Lagos Accra Dakar Nairobi Kampala Lusaka Harare Maputo Luanda Lima Quito "
        "Bogota Caracas Santiago Havana Ottawa Denver Austin Boston Chicago Seattle Tokyo "
        "Seoul Hanoi Manila Jakarta Delhi Dhaka Kabul Tehran Baghdad Doha Muscat").split()
FILLER = ("the river ran past the old stone mill", "clouds gathered over the quiet hills",
          "a small boat drifted near the shore", "the market opened before the sun rose",
          "children played beside the garden wall", "the train left the station on time",
          "rain fell softly on the wooden roof", "an owl called from the dark forest")


class Params(BaseModel):
    model_config = ConfigDict(extra="forbid")
    questions: int = Field(default=2, ge=1)   # questions per probe (at most `load`)
    turns: int = Field(default=0, ge=0)       # > 0: a chat conversation of this many turns


def _facts(rng: random.Random, load: int) -> list[tuple[str, str]]:
    keys = rng.sample(KEYS, min(load, len(KEYS)))
    return [(k, str(rng.randint(1000, 9999))) for k in keys]


def _question(rng: random.Random, k: str, v: str, others: list[str], after: int,
              depth: float) -> Question:
    # Distractors: the other facts' values first (in-context), then fresh numbers.
    pool = [o for o in others if o != v] + [str(rng.randint(1000, 9999)) for _ in range(3)]
    cands = (v, *[o for o in dict.fromkeys(pool) if o != v][:3])
    return Question(text=f"What is the code for {k}?", answer_prefix=f"The code for {k} is",
                    gold=(v,), candidates=cands, after_segment=after, depth=depth,
                    max_new_tokens=8)


def _build(params: Params, task, version, tokenizer, length, depth, load, seed, facts,
           filler_words, asked_rng_state, n_words: int, pad: int = 0) -> Probe:
    rng = random.Random()
    rng.setstate(asked_rng_state)  # the same distractors whatever the filler length
    values = [v for _, v in facts]
    fact_lines = [f"The code for {k} is {v}" for k, v in facts]
    words = filler_words[:n_words] + (["7" * pad] if pad else [])  # digits: one token each
    filler = [" ".join(words[i:i + 7]) for i in range(0, len(words), 7)]
    at = round(depth * len(filler))
    lines = filler[:at] + fact_lines + filler[at:]
    asked = facts[: params.questions]
    if params.turns == 0:
        context = (Segment("\n".join(lines) + "\n"),)
        questions = tuple(_question(rng, k, v, values, 1, depth) for k, v in asked)
        chat = False
    else:
        # Turn boundaries depend on the longest filler, not this one, so one more filler
        # word lengthens the prompt by a word and never reflows the turns.
        per = max(1, (len(facts) + (len(filler_words) + 6) // 7) // params.turns)
        chunks = [lines[i * per:(i + 1) * per] for i in range(params.turns - 1)]
        chunks.append(lines[(params.turns - 1) * per:])
        context = []
        for i, chunk in enumerate(chunks):
            context.append(Segment("\n".join(chunk) + "\n", "user"))
            context.append(Segment(f"Noted, part {i}.", "assistant"))
        context = tuple(context)
        # Question j is asked after a later and later turn (the conversation streams on),
        # and never before the turn that states its fact.
        n = len(context)
        said = {line: 2 * i + 2 for i, chunk in enumerate(chunks) for line in chunk}
        questions = tuple(
            _question(rng, k, v, values,
                      max(n * (j + 1) // len(asked), said[f"The code for {k} is {v}"]), depth)
            for j, (k, v) in enumerate(asked))
        chat = True
    meta = dict(target_length=length, tolerance=tolerance(length), depth=depth, load=load,
                seed=seed, tokenizer_hash=tokenizer_hash(tokenizer))
    probe = Probe(id=f"{task}-{seed:010d}", task=task, task_version=version, context=context,
                  questions=questions, meta=ProbeMeta(actual_length=0, **meta), chat=chat)
    return Probe(id=probe.id, task=task, task_version=version, context=context,
                 questions=questions, chat=chat,
                 meta=ProbeMeta(actual_length=prompt_length(probe, tokenizer), **meta))


def generate(params: Params, *, task, version, tokenizer, length, depth, load, seed) -> Probe:
    """Facts among filler lines; the number of filler words is searched so that the prompt
    is `length` tokens (within evalkit.probes.tolerance), like any probe."""
    rng = random.Random(seed)
    facts = _facts(rng, load)
    words = " ".join(rng.choice(FILLER) for _ in range(length // 4 + 2)).split()
    state = rng.getstate()
    build = lambda n: _build(params, task, version, tokenizer, length, depth, load, seed, facts,
                             words, state, n)
    lo, hi = 0, len(words)  # the largest word count whose prompt is not too long
    if build(0).meta.actual_length > length + tolerance(length):
        raise ValueError(f"length={length} is too short for {load} facts")
    while lo < hi:
        mid = (lo + hi + 1) // 2
        if build(mid).meta.actual_length <= length:
            lo = mid
        else:
            hi = mid - 1
    # One more word may add several tokens: single digits close the remaining gap.
    best = min((_build(params, task, version, tokenizer, length, depth, load, seed, facts, words,
                       state, lo, pad) for pad in range(8)),
               key=lambda p: abs(p.meta.actual_length - length))
    if abs(best.meta.actual_length - length) > tolerance(length):
        raise ValueError(f"length={length}: the toy filler cannot fit it")
    return best
