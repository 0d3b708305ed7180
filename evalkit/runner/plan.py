"""Execution plans: every shared token prefix is prefilled once, then forked per question.

The questions of one (model, task) go into a trie keyed by context pieces. `render()` tokenizes
each segment on its own, so a prefix's ids are the same whichever question follows it, and two
questions share a trie path exactly when their prompts share those segments. Every trie node's
piece is fed to the model exactly once:

    prefill  context[:a1]               one call (a unit; batched with others of similar length)
      fork -> extend(question ids) -> answer      for every question asked after a1
    extend   context[a1:a2]             the same state streams on (a conversation's next turns)
      fork -> extend(question ids) -> answer
    ...

So a probe with several questions about one haystack costs one prefill, and a conversation
questioned after several turns streams through a single state. Units (the trie's roots, each
prefilled once) are what the runner batches by length and shards over ranks.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Iterable, Iterator

from evalkit.probe import Probe, Question
from evalkit.render import Rendered


@dataclass(frozen=True, eq=False)
class Request:
    """One question of one probe, with the probe's token ids for this model's tokenizer."""

    probe: Probe
    qi: int
    rendered: Rendered
    order: tuple = ()  # sort key of the sample in samples.jsonl

    @property
    def question(self) -> Question:
        return self.probe.questions[self.qi]

    @property
    def after(self) -> int:
        return self.question.after_segment

    @property
    def question_ids(self) -> tuple[int, ...]:
        return self.rendered.questions[self.qi]

    @property
    def prompt_tokens(self) -> int:
        return self.rendered.prefix_length(self.after) + len(self.question_ids)


@dataclass(eq=False)
class Node:
    piece: tuple[int, ...]                     # ids of one context segment
    children: dict = field(default_factory=dict)  # piece ids -> Node, in insertion order
    items: list[Request] = field(default_factory=list)  # questions asked right after this piece

    def subtree_items(self) -> list[Request]:
        out, stack = [], [self]
        while stack:
            n = stack.pop()
            out.extend(n.items)
            stack.extend(reversed(list(n.children.values())))
        return out


def chain(node: Node) -> tuple[tuple[int, ...], Node]:
    """Follow question-less single-child links: the ids to feed in one call and where they end."""
    ids = list(node.piece)
    while not node.items and len(node.children) == 1:
        node = next(iter(node.children.values()))
        ids.extend(node.piece)
    return tuple(ids), node


@dataclass(eq=False)
class Unit:
    """One prefill. Either a question asked before any context (`item`: the prefix is its whole
    prompt) or a context prefix whose subtree (`node`) continues from the prefilled state."""

    prefix: tuple[int, ...]
    node: Node | None = None
    item: Request | None = None

    def items(self) -> list[Request]:
        return [self.item] if self.item is not None else self.node.subtree_items()


@dataclass
class Plan:
    units: list[Unit]
    tokens_prefilled: int   # tokens fed to prefill/extend when the plan runs
    prompt_tokens: int      # the sum of every question's prompt length (no sharing)
    n_items: int

    def items(self) -> Iterator[Request]:
        for u in self.units:
            yield from u.items()

    @property
    def savings_ratio(self) -> float:
        return savings_ratio(self.prompt_tokens, self.tokens_prefilled)


def savings_ratio(prompt_tokens: int, tokens_prefilled: int) -> float:
    """How many times fewer tokens the shared-prefix plan feeds than running every prompt on
    its own (1.0 when nothing was prefilled)."""
    return prompt_tokens / tokens_prefilled if tokens_prefilled else 1.0


def build_plan(items: Iterable[Request]) -> Plan:
    """Plan `items` (in sample order); questions at one node keep that order."""
    root = Node(())
    n_items = prompt_tokens = tokens = 0
    for item in items:
        node = root
        for piece in item.rendered.context[: item.after]:
            child = node.children.get(piece)
            if child is None:
                child = node.children[piece] = Node(piece)
                tokens += len(piece)
            node = child
        node.items.append(item)
        n_items += 1
        prompt_tokens += item.prompt_tokens
        tokens += len(item.question_ids)
    units = [Unit(it.question_ids, item=it) for it in root.items]
    for child in root.children.values():
        ids, end = chain(child)
        units.append(Unit(ids, node=end))
    # Longest first: a batch of similar lengths pads little, and memory errors come early.
    # The sort is stable, so the order (and the sharding over ranks) is deterministic.
    units.sort(key=lambda u: -len(u.prefix))
    return Plan(units, tokens, prompt_tokens, n_items)


def length_buckets(units: list[Unit], batch_size: int) -> list[list[Unit]]:
    """Consecutive units of the (length-sorted) plan, `batch_size` at a time."""
    return [units[i:i + batch_size] for i in range(0, len(units), batch_size)]
