"""The Probe record: the only thing a task hands to a model (like lm-eval's Instance).

A probe is a context (plain text segments or chat turns) followed by one or more questions.
Every question is asked after some number of context segments (normally all of them), so a
runner can prefill the shared context once and fork the state per question, and a
conversation can be questioned after several turns while it streams through the state.

Worked example (a one-needle probe, lengths in the evaluated model's tokens):

    Probe(id="needle-00001", task="needle", task_version="1",
          context=(Segment("Alice was beginning ... The magic number for Paris is 4821. ..."),),
          questions=(Question(text="What is the magic number for Paris?",
                              answer_prefix="The magic number for Paris is",
                              gold=("4821",), candidates=("4821", "9075", "1123"),
                              after_segment=1, depth=0.5, fact_token=512,
                              distance=490, max_new_tokens=8),),
          meta=ProbeMeta(target_length=1024, actual_length=1021, tolerance=8,
                         depth=0.5, load=1, seed=3, tokenizer_hash="9f0c..."))

`probe.hash` is a SHA-256 over the canonical JSON of every field except `hash` itself: two
probes with the same hash are the same prompt, question and gold for the same tokenizer.
"""
from __future__ import annotations

import hashlib
import json
from dataclasses import asdict, dataclass, field, replace
from typing import Any, Mapping

ROLES = (None, "system", "user", "assistant")
# A recurrent model has no context window, so no model bounds the length; building a probe
# costs time and memory in proportion to it (10M tokens: minutes and gigabytes).
MAX_LENGTH = 1 << 20


def check_tokens(n: int, flag: str) -> int:
    """A token count given on the command line: 1..MAX_LENGTH, never clamped."""
    if not 1 <= n <= MAX_LENGTH:
        raise ValueError(f"{flag} must be between 1 and {MAX_LENGTH:,} tokens (the longest "
                         f"probe evalkit builds), got {n:,}")
    return n


@dataclass(frozen=True)
class Segment:
    """A piece of context. `role` is None for plain text, else a chat role."""

    text: str
    role: str | None = None

    def __post_init__(self) -> None:
        if self.role not in ROLES:
            raise ValueError(f"Segment.role must be one of {ROLES}, got {self.role!r}")


@dataclass(frozen=True)
class Question:
    """One question about the context.

    text: the question (a user turn in chat probes, a plain line otherwise).
    answer_prefix: text the model's answer starts with; the model continues after it.
    gold: acceptable answers; for multi-value questions every value that must be recalled.
    candidates: forced-choice options, gold[0] first, then in-context distractors.
    after_segment: the question is asked after context[:after_segment].
    depth: relative position (0..1) of the fact in the context, in tokens.
    fact_token: token offset where the asked fact starts; distance: tokens from the fact to
    the question. max_new_tokens: generation budget (gold length in tokens plus a margin).
    """

    text: str
    answer_prefix: str
    gold: tuple[str, ...]
    candidates: tuple[str, ...] = ()
    after_segment: int = -1
    depth: float = 0.0
    fact_token: int = 0
    distance: int = 0
    max_new_tokens: int = 16
    kind: str = "recall"  # e.g. "recall", "latest" (after an update), "lookalike", "multi"

    def __post_init__(self) -> None:
        if not self.gold:
            raise ValueError("Question.gold must hold at least one answer")
        if any(not isinstance(g, str) or not g.strip() for g in self.gold):
            raise ValueError(f"Question.gold must hold non-empty strings, got {list(self.gold)!r} "
                             f"(an empty answer would match an empty prediction)")
        if self.candidates and self.candidates[0] != self.gold[0]:
            raise ValueError("Question.candidates must start with gold[0]")
        if not 0.0 <= self.depth <= 1.0:
            raise ValueError(f"Question.depth must lie in [0, 1], got {self.depth}")


@dataclass(frozen=True)
class ProbeMeta:
    """Lengths are in the evaluated model's tokens (prompt = context + final question)."""

    target_length: int
    actual_length: int
    tolerance: int
    depth: float
    load: int
    seed: int
    tokenizer_hash: str
    extra: tuple[tuple[str, Any], ...] = ()  # task-specific, sorted (key, value) pairs


@dataclass(frozen=True)
class Probe:
    id: str
    task: str
    task_version: str
    context: tuple[Segment, ...]
    questions: tuple[Question, ...]
    meta: ProbeMeta
    chat: bool = False
    hash: str = field(default="", compare=False)

    def __post_init__(self) -> None:
        if not self.questions:
            raise ValueError(f"probe {self.id}: needs at least one question")
        n = len(self.context)
        for i, q in enumerate(self.questions):
            if not 0 <= q.after_segment <= n:
                raise ValueError(
                    f"probe {self.id}: question {i} after_segment={q.after_segment} outside [0, {n}]")
        if self.chat and any(s.role is None for s in self.context):
            raise ValueError(f"probe {self.id}: chat probes need a role on every segment")
        if not self.hash:
            object.__setattr__(self, "hash", content_hash(self))

    def to_dict(self) -> dict:
        return asdict(self)

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> "Probe":
        meta = dict(d["meta"])
        meta["extra"] = tuple(tuple(kv) for kv in meta.get("extra", ()))
        probe = cls(
            id=d["id"], task=d["task"], task_version=d["task_version"],
            context=tuple(Segment(**s) for s in d["context"]),
            questions=tuple(Question(**{**q, "gold": tuple(q["gold"]),
                                        "candidates": tuple(q.get("candidates", ()))})
                            for q in d["questions"]),
            meta=ProbeMeta(**meta), chat=d.get("chat", False))
        if d.get("hash") and d["hash"] != probe.hash:
            raise ValueError(f"probe {d['id']}: stored hash {d['hash'][:12]} does not match "
                             f"its content ({probe.hash[:12]}); the record was edited or corrupted")
        return probe


def canonical_json(obj: Any) -> str:
    return json.dumps(obj, sort_keys=True, separators=(",", ":"), ensure_ascii=False)


def content_hash(probe: Probe) -> str:
    d = asdict(replace(probe, hash="x"))
    d.pop("hash")
    return hashlib.sha256(canonical_json(d).encode()).hexdigest()

