"""Training sequences made by the task plugins, with seeds disjoint from every evaluation seed.

Evaluation probes use seeds below 2^31 (evalkit.taskspec.EVAL_SEED_MASK); training seeds are
2^31 + i. A training sequence is an evaluation prompt (context up to the question, the question, the
answer prefix) followed by the gold answer and a newline; multi-query probes append every
question with its answer:

    [bos] context ... "\\nWhat is the magic number for Lisbon?\\nThe magic number for Lisbon is"
    " 4821" "\\n"

Targets: every next token, answer tokens weighted far above the rest: the haystack prose
repeats across sequences, so a small model can memorise it instead of reading its context,
and only the answers reward in-context recall.
"""
from __future__ import annotations

import random
from dataclasses import dataclass
from typing import Any, Sequence

import torch

from evalkit.render import continuation_ids, render
from evalkit.taskspec import EVAL_SEED_MASK, TaskSpec
from evalkit.tokenization import encode

TRAIN_SEED_BASE = EVAL_SEED_MASK + 1  # 2^31


@dataclass(frozen=True)
class TrainingSequence:
    ids: tuple[int, ...]
    answer_mask: tuple[bool, ...]  # True where the target token is part of an answer
    length: int                    # the probe's target length (batches group by it)


def training_sequence(spec: TaskSpec, tokenizer: Any, *, length: int, depth: float, load: int,
                      seed: int) -> TrainingSequence:
    """A probe in evaluation format followed by gold answers.

    When every question follows the whole context (multi-query probes), all of them are
    appended in turn, each with its answer, so one sequence supervises several recalls;
    otherwise one question, chosen by the seed, is asked where the probe asks it."""
    if seed < TRAIN_SEED_BASE:
        raise ValueError(f"training seed {seed} is below 2^31: it could be an evaluation seed")
    probe = spec.generator(spec.params, task=spec.name, version=spec.version,
                           tokenizer=tokenizer, length=length, depth=depth, load=load, seed=seed)
    r = render(probe, tokenizer)
    n = len(probe.context)
    if all(q.after_segment == n for q in probe.questions):
        asked = list(range(len(probe.questions)))
    else:
        asked = [seed % len(probe.questions)]
    after = probe.questions[asked[0]].after_segment
    ids = [t for piece in r.context[:after] for t in piece]
    mask = [False] * len(ids)
    newline = encode(tokenizer, "\n")
    for qi in asked:
        answer = continuation_ids(tokenizer, ", ".join(probe.questions[qi].gold)) + newline
        ids += list(r.questions[qi]) + answer
        mask += [False] * len(r.questions[qi]) + [True] * len(answer)
    return TrainingSequence(tuple(ids), tuple(mask), length)


def make_pool(specs: Sequence[TaskSpec], tokenizer: Any, *, lengths: Sequence[int],
              loads: dict[str, Sequence[int]], n: int, seed_offset: int = 0) -> list[TrainingSequence]:
    """n sequences cycling over tasks; length, depth and load drawn from a seeded RNG."""
    rng = random.Random(seed_offset)
    pool = []
    for i in range(n):
        spec = specs[i % len(specs)]
        length = rng.choice(list(lengths))
        load = rng.choice(list(loads.get(spec.name, (1,))))
        depth = rng.random()
        seed = TRAIN_SEED_BASE + seed_offset + i
        try:
            pool.append(training_sequence(spec, tokenizer, length=length, depth=depth, load=load,
                                          seed=seed))
        except ValueError as e:  # e.g. a load that cannot fit this length: name the draw
            raise ValueError(f"training data: task {spec.name} length={length} load={load}: {e}")
    return pool


def batch(seqs: Sequence[TrainingSequence], seq_len: int, pad_id: int, answer_weight: float,
          context_weight: float = 1.0) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Right-pad to seq_len. Returns inputs [B, T], targets [B, T], weights [B, T]."""
    B = len(seqs)
    x = torch.full((B, seq_len), pad_id, dtype=torch.long)
    y = torch.full((B, seq_len), pad_id, dtype=torch.long)
    w = torch.zeros((B, seq_len))
    for b, s in enumerate(seqs):
        if len(s.ids) > seq_len + 1:
            raise ValueError(f"training sequence of {len(s.ids)} tokens exceeds seq_len+1="
                             f"{seq_len + 1}; lower the probe lengths")
        n = len(s.ids) - 1
        x[b, :n] = torch.tensor(s.ids[:-1])
        y[b, :n] = torch.tensor(s.ids[1:])
        w[b, :n] = torch.tensor([answer_weight if m else context_weight
                                 for m in s.answer_mask[1:]])
    return x, y, w
