"""Probe -> token ids for one tokenizer: the single definition of a prompt and its length.

Each context segment and each question is tokenized on its own and the ids are concatenated,
so the ids of a shared prefix are identical whichever question follows it. That is what lets
a runner prefill a context once and fork per question, and it is how lengths are measured.

Plain probes:  [bos] + seg_1 + ... + seg_n + "\\n" + question.text + "\\n" + answer_prefix
Chat probes:   the tokenizer's chat template, split into one text piece per turn (each turn's
               piece is what the template adds for it), then the question as a user turn, the
               generation prompt and the answer prefix. Tokenizers without a chat template use a
               plain "role: text" rendering.
Answers are continued after the answer prefix with a leading space: " " + value, and end at
the first ANSWER_STOP string (values never contain a newline or a period; facts end with one).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Sequence

from evalkit.probe import Probe, Question, Segment
from evalkit.tokenization import bos_ids, encode


ANSWER_STOP = ("\n", ".")


@dataclass(frozen=True)
class Rendered:
    """Token ids of one probe: context pieces and one piece per question."""

    context: tuple[tuple[int, ...], ...]  # one id tuple per context segment (bos in the first)
    questions: tuple[tuple[int, ...], ...]  # ids appended after context[:q.after_segment]

    def prompt(self, qi: int, after_segment: int) -> list[int]:
        ids: list[int] = []
        for piece in self.context[:after_segment]:
            ids.extend(piece)
        ids.extend(self.questions[qi])
        return ids

    def prefix_length(self, after_segment: int) -> int:
        return sum(len(p) for p in self.context[:after_segment])


def _chat_messages(segments: Sequence[Segment]) -> list[dict]:
    return [{"role": s.role, "content": s.text} for s in segments]


def _template(tokenizer: Any, messages: list[dict], generation_prompt: bool) -> str:
    if getattr(tokenizer, "chat_template", None):
        if not messages:
            return ""
        return tokenizer.apply_chat_template(messages, tokenize=False,
                                             add_generation_prompt=generation_prompt)
    text = "".join(f"{m['role']}: {m['content']}\n" for m in messages)
    return text + ("assistant:" if generation_prompt else "")


def _pieces_quadratic(tokenizer: Any, probe: Probe, turns: list[Segment]) -> list[str]:
    full = [_template(tokenizer, _chat_messages(turns[:i]), False) for i in range(len(turns) + 1)]
    ctx: list[str] = []
    for i in range(len(turns)):
        if not full[i + 1].startswith(full[i]):
            raise ValueError(f"probe {probe.id}: the chat template of this tokenizer re-renders "
                             f"earlier turns when turn {i} is added, so turns cannot be streamed")
        ctx.append(full[i + 1][len(full[i]):])
    return ctx


def _pieces_windowed(tokenizer: Any, turns: list[Segment]) -> list[str] | None:
    """Each turn's piece from a two-turn window: linear in the number of turns. None when the
    template is not local (the pieces do not add up to the whole rendering)."""
    from jinja2 import TemplateError

    ctx: list[str] = []
    try:
        for i in range(len(turns)):
            a = _template(tokenizer, _chat_messages(turns[max(0, i - 1):i]), False)
            b = _template(tokenizer, _chat_messages(turns[max(0, i - 1):i + 1]), False)
            if not b.startswith(a):
                return None
            ctx.append(b[len(a):])
    except TemplateError:  # e.g. a template that insists on user/assistant alternation
        return None
    whole = _template(tokenizer, _chat_messages(turns), False)
    return ctx if "".join(ctx) == whole else None


def _chat_pieces(tokenizer: Any, probe: Probe) -> tuple[list[str], list[str]]:
    turns = list(probe.context)
    ctx = _pieces_windowed(tokenizer, turns) or _pieces_quadratic(tokenizer, probe, turns)
    qs: list[str] = []
    for q in probe.questions:
        msgs = _chat_messages(turns[: q.after_segment] + [Segment(q.text, "user")])
        text = _template(tokenizer, msgs, True)
        base = "".join(ctx[: q.after_segment])
        if not text.startswith(base):
            raise ValueError(f"probe {probe.id}: chat template re-renders earlier turns for a question")
        qs.append(text[len(base):] + q.answer_prefix)
    return ctx, qs


def question_text(q: Question) -> str:
    return "\n" + q.text + "\n" + q.answer_prefix


def render(probe: Probe, tokenizer: Any) -> Rendered:
    if probe.chat:
        ctx_text, q_text = _chat_pieces(tokenizer, probe)
        bos: list[int] = []  # the chat template writes its own start tokens
    else:
        ctx_text = [s.text for s in probe.context]
        q_text = [question_text(q) for q in probe.questions]
        bos = bos_ids(tokenizer)
    ctx = [encode(tokenizer, t) for t in ctx_text]
    qs = [tuple(encode(tokenizer, t)) for t in q_text]
    if bos:  # BOS opens the prompt: on the first context piece, or on a question asked first
        if ctx:
            ctx[0] = bos + ctx[0]
        qs = [tuple(bos) + ids if (not ctx or q.after_segment == 0) else ids
              for q, ids in zip(probe.questions, qs)]
    return Rendered(tuple(tuple(c) for c in ctx), tuple(qs))


def prompt_ids(probe: Probe, tokenizer: Any, qi: int = -1) -> list[int]:
    """Full prompt of question `qi` (default: the last)."""
    r = render(probe, tokenizer)
    qi = qi % len(probe.questions)
    return r.prompt(qi, probe.questions[qi].after_segment)


def prompt_length(probe: Probe, tokenizer: Any, qi: int = -1) -> int:
    return len(prompt_ids(probe, tokenizer, qi))


def continuation_ids(tokenizer: Any, value: str) -> list[int]:
    """Ids of an answer value as continued after the answer prefix."""
    return encode(tokenizer, " " + value)
