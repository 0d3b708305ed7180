"""What a task generator must return: the checks every generated probe passes.

`evalkit.taskspec.generate_probes` runs them on each probe as it is made, so `evalkit run`,
`validate`, `generate` and `lm-eval-export` refuse the same probes with the same message.
A probe is refused, never repaired, when it is not a Probe; when it belongs to another task;
when its recorded fields (target length, depth, load, seed, tokenizer hash, hash) are not the
grid point and tokenizer it was made for; when its measured length (evalkit.render.probe_length:
the last question's prompt, or the whole context if longer) is not its recorded `actual_length`,
or lies outside `tolerance(length)` of the target; when its context is empty;
when a question's token budget, offsets or gold values are out of range; or when any field
holds a non-finite number (no results file may hold one).
"""
from __future__ import annotations

import json
import math
import numbers
from typing import Any

from evalkit.probe import Probe, Question, Segment, content_hash
from evalkit.probes.build import tolerance
from evalkit.render import probe_length
from evalkit.tokenization import tokenizer_hash

MAX_NEW_TOKENS = 4096      # a question's answer budget; answers are a few values long
CHARS_PER_TOKEN = 64       # no tokenizer packs more into one token: a longer text is refused
                           # before it is tokenized, so a runaway generator costs no memory


def _int(x: Any) -> bool:
    return isinstance(x, numbers.Integral) and not isinstance(x, bool)


def _returned(obj: Any) -> str:
    if obj is None:
        return "returned None (a missing `return`?)"
    text = repr(obj)
    return f"returned a {type(obj).__name__} ({text[:60]}{'...' if len(text) > 60 else ''})"


def check_probe(probe: Any, *, task: str, version: str, length: int, depth: float, load: int,
                seed: int, tokenizer: Any, where: str, error: type[Exception] = ValueError) -> None:
    """Raise `error` (message starting with `where`) unless `probe` is a faithful probe of
    (task, version) at this grid point for this tokenizer."""
    def fail(msg: str) -> None:
        raise error(f"{where}: {msg}")

    if not isinstance(probe, Probe):
        fail(f"{_returned(probe)}; expected an evalkit.probe.Probe (build it with "
             f"evalkit.probes.assemble)")
    if (probe.task, probe.task_version) != (task, version):
        fail(f"returned a probe of task {probe.task!r} version {probe.task_version!r}; expected "
             f"task {task!r} version {version!r} (pass the `task` and `version` it is given)")
    _check_fields(probe, fail)
    m = probe.meta
    expected = {"target_length": length, "depth": float(depth), "load": load, "seed": seed,
                "tokenizer_hash": tokenizer_hash(tokenizer)}
    for key, want in expected.items():
        got = getattr(m, key)
        if got != want or type(got) is bool:
            fail(f"meta.{key} is {got!r}; expected {want!r} (the value it was asked for)")
    try:
        json.dumps(probe.to_dict(), allow_nan=False)
    except (TypeError, ValueError) as e:
        fail(f"a field is not plain JSON ({e}); expected strings and finite numbers")
    limit = tolerance(length)
    if not _int(m.tolerance) or not 0 <= m.tolerance <= limit:
        fail(f"meta.tolerance is {m.tolerance!r}; expected an integer in [0, {limit}] "
             f"(evalkit.probes.tolerance({length}))")
    if not _int(m.actual_length):
        fail(f"meta.actual_length is {m.actual_length!r}; expected an integer")
    chars = sum(len(s.text) for s in probe.context) + sum(
        len(q.text) + len(q.answer_prefix) for q in probe.questions)
    if chars > CHARS_PER_TOKEN * (length + limit) + 4096:
        fail(f"the prompt holds {chars:,} characters, far beyond a {length}-token prompt")
    try:
        measured = probe_length(probe, tokenizer)
    except Exception as e:  # e.g. a chat template that rejects the turns
        fail(f"cannot render the prompt with this tokenizer: {type(e).__name__}: {e}")
    if measured != m.actual_length:
        fail(f"meta.actual_length is {m.actual_length} but the prompt measures {measured} "
             f"tokens (measure it with evalkit.render.probe_length)")
    if abs(measured - length) > m.tolerance:
        fail(f"the prompt is {measured} tokens; expected {length} +- {m.tolerance} "
             f"(meta.tolerance)")
    for i, q in enumerate(probe.questions):
        for key in ("fact_token", "distance"):
            v = getattr(q, key)
            if not _int(v) or not 0 <= v <= measured:
                fail(f"questions[{i}].{key} is {v!r}; expected an integer in [0, {measured}] "
                     f"(a token offset within the prompt)")
    if probe.hash != content_hash(probe):
        fail(f"hash {probe.hash[:12]!r} does not match the probe's content (leave `hash` unset)")


def _check_fields(probe: Probe, fail) -> None:
    """Types and ranges of the fields that are not measured."""
    if not isinstance(probe.id, str) or not probe.id:
        fail(f"id is {probe.id!r}; expected a non-empty string")
    segs = probe.context
    if not isinstance(segs, (tuple, list)) or not all(isinstance(s, Segment) for s in segs):
        fail("context must be a tuple of evalkit.probe.Segment")
    if not all(isinstance(s.text, str) for s in segs):
        fail("every context segment's text must be a string")
    if not any(s.text.strip() for s in segs):
        fail("the context is empty; expected the text that holds the facts")
    for i, q in enumerate(probe.questions):
        if not isinstance(q, Question):
            fail(f"questions[{i}] is a {type(q).__name__}; expected an evalkit.probe.Question")
        for key in ("text", "answer_prefix"):
            if not isinstance(getattr(q, key), str):
                fail(f"questions[{i}].{key} is {getattr(q, key)!r}; expected a string")
        for key in ("gold", "candidates"):
            values = getattr(q, key)
            if not all(isinstance(v, str) and v.strip() for v in values):
                fail(f"questions[{i}].{key} is {values!r}; expected non-empty strings (an "
                     f"empty answer would match anything)")
        budget = q.max_new_tokens
        if not _int(budget) or not 1 <= budget <= MAX_NEW_TOKENS:
            fail(f"questions[{i}].max_new_tokens is {budget!r}; expected an integer in "
                 f"[1, {MAX_NEW_TOKENS}]")
        if not isinstance(q.depth, numbers.Real) or not math.isfinite(q.depth):
            fail(f"questions[{i}].depth is {q.depth!r}; expected a number in [0, 1]")
