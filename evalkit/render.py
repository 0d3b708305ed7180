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

from evalkit.probe import Probe, Segment
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


class Renderer:
    """The text of each prompt piece, one piece at a time. Probe generators use it to measure a
    piece while they build the context, and `render` uses it for the finished probe.

    Chat turn pieces come from a window of the conversation: the template renders the window
    with and without the new turn, and the piece is the difference. The window opens at the
    latest user turn before the new one, so its cost does not grow with the conversation, and
    templates that insist on user/assistant alternation still accept it. `piece_texts` checks
    the pieces against the template's rendering of the whole conversation."""

    def __init__(self, tokenizer: Any, chat: bool) -> None:
        self.tokenizer = tokenizer
        self.chat = chat
        self.bos: list[int] = [] if chat else bos_ids(tokenizer)  # a template writes its own

    def template(self, turns: Sequence[Segment], generation_prompt: bool) -> str:
        """The chat template's rendering of `turns` ("role: text" lines without a template)."""
        messages = [{"role": s.role, "content": s.text} for s in turns]
        if not getattr(self.tokenizer, "chat_template", None):
            text = "".join(f"{m['role']}: {m['content']}\n" for m in messages)
            return text + ("assistant:" if generation_prompt else "")
        if not messages:
            return ""
        from jinja2 import TemplateError

        try:
            return self.tokenizer.apply_chat_template(messages, tokenize=False,
                                                      add_generation_prompt=generation_prompt)
        except TemplateError as e:
            raise ValueError(f"the chat template of this tokenizer rejects these turns "
                             f"({[m['role'] for m in messages]}): {e}") from e

    def _window(self, before: Sequence[Segment]) -> Sequence[Segment]:
        start = max((i for i, s in enumerate(before) if s.role == "user"), default=0)
        return before[start:]

    def _added(self, before: Sequence[Segment], new: Segment, generation_prompt: bool) -> str:
        window = self._window(before)
        base = self.template(window, False)
        full = self.template([*window, new], generation_prompt)
        if not full.startswith(base):
            raise ValueError("the chat template of this tokenizer re-renders earlier turns when "
                             "a turn is added, so turns cannot be streamed or measured")
        return full[len(base):]

    def piece(self, before: Sequence[Segment], seg: Segment) -> str:
        """Text of `seg` when it follows the segments `before` (BOS not included)."""
        return self._added(before, seg, False) if self.chat else seg.text

    def question(self, before: Sequence[Segment], text: str, answer_prefix: str) -> str:
        """Text of a question asked after the segments `before`, up to the answer prefix."""
        if not self.chat:
            return "\n" + text + "\n" + answer_prefix
        return self._added(before, Segment(text, "user"), True) + answer_prefix


    def texts(self, probe: Probe) -> tuple[list[str], list[str]]:
        """The text of every context piece and every question piece of `probe` (no BOS)."""
        turns = list(probe.context)
        ctx = [self.piece(turns[:i], s) for i, s in enumerate(turns)]
        qs = [self.question(turns[:q.after_segment], q.text, q.answer_prefix)
              for q in probe.questions]
        if self.chat:
            if "".join(ctx) != self.template(turns, False):
                raise ValueError(f"probe {probe.id}: the chat template of this tokenizer renders "
                                 f"a turn differently after other turns, so turns cannot be "
                                 f"streamed")
            for q, text in zip(probe.questions, qs):
                whole = self.template(turns[:q.after_segment] + [Segment(q.text, "user")], True)
                if "".join(ctx[:q.after_segment]) + text != whole + q.answer_prefix:
                    raise ValueError(f"probe {probe.id}: the chat template of this tokenizer "
                                     f"re-renders earlier turns for a question")
        return ctx, qs


def render(probe: Probe, tokenizer: Any) -> Rendered:
    r = Renderer(tokenizer, probe.chat)
    ctx_text, q_text = r.texts(probe)
    bos = r.bos
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


def probe_length(probe: Probe, tokenizer: Any) -> int:
    """The tokens a probe spans: its last question's prompt, or its whole context when that is
    longer. They differ only when the last question is asked before the context ends (MQAR's
    queries sit inside the stream, whose tail after the last query is part of the example);
    when it is asked after the whole context, as in every natural-language task, this is
    `prompt_length`."""
    r = render(probe, tokenizer)
    qi = len(probe.questions) - 1
    last = len(r.prompt(qi, probe.questions[qi].after_segment))
    return max(last, r.prefix_length(len(probe.context)))


def continuation_ids(tokenizer: Any, value: str) -> list[int]:
    """Ids of an answer value as continued after the answer prefix."""
    return encode(tokenizer, " " + value)
