"""Deterministic reference adapters: an ideal copier and one with a fixed-size memory.

Both are n-gram *induction* models over token ids: the state maps every k-gram seen so far
(k = 1..order) to the token that followed its latest occurrence. To predict, they take the
longest suffix of the sequence that has a recorded follower and emit that follower, so a
prompt ending with an answer prefix that restates a fact ("... for Lisbon is") is continued
with the fact's value, and an updated fact's latest value wins.

- `oracle` keeps every entry: it answers any single-value recall question exactly.
- `forgetful` keeps at most `capacity` entries, evicting the least recently seen: like a
  fixed recurrent state, it loses old facts once enough new material has arrived, so its
  recall falls as the load (number of facts) grows.

Log-probabilities: the predicted token gets log(1 - eps), every other token
log(eps / (V - 1)); with no match all tokens are equally likely. Score and generate agree.
"""
from __future__ import annotations

import hashlib
import math
import os
from collections import OrderedDict
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Sequence

from evalkit.model_adapters.protocol import AdapterBase, greedy_generate
from evalkit.model_adapters.models import register_model
from evalkit.tokenization import load_tokenizer, tokenizer_hash

DEFAULT_TOKENIZER = Path(__file__).resolve().parent / "tiny" / "tokenizer"
_EPS = 1e-3
_BYTES_PER_ID = 4  # int32 token ids


@dataclass
class MemoryState:
    table: "OrderedDict[tuple[int, ...], int]" = field(default_factory=OrderedDict)
    tail: tuple[int, ...] = ()  # the last `order` tokens
    length: int = 0


class InductionAdapter(AdapterBase):
    state_kind = "memory"

    def __init__(self, name: str, tokenizer: Any, order: int = 8, capacity: int | None = None,
                 max_length: int | None = None) -> None:
        if order < 1:
            raise ValueError(f"{name}: order must be >= 1, got {order}")
        if capacity is not None and capacity < 1:
            raise ValueError(f"{name}: capacity must be >= 1 entry, got {capacity}")
        self.name, self.tokenizer = name, tokenizer
        self.order, self.capacity, self.max_length = order, capacity, max_length
        self.trained_length = None  # nothing is trained: it copies
        self.vocab_size = len(tokenizer)

    # -- protocol -------------------------------------------------------------------------
    def prefill(self, token_ids: Sequence[int]) -> MemoryState:
        if len(token_ids) == 0:
            raise ValueError(f"{self.name}: prefill needs at least one token")
        return self.extend(MemoryState(), token_ids)

    def extend(self, state: MemoryState, token_ids: Sequence[int]) -> MemoryState:
        table, tail = state.table, list(state.tail)
        for tok in token_ids:
            tok = int(tok)
            for k in range(1, min(self.order, len(tail)) + 1):
                key = tuple(tail[-k:])
                if key in table:
                    table.move_to_end(key)
                table[key] = tok
            if self.capacity is not None:
                while len(table) > self.capacity:
                    table.popitem(last=False)
            tail.append(tok)
            del tail[: -self.order]
        state.tail, state.length = tuple(tail), state.length + len(token_ids)
        return state

    def fork(self, state: MemoryState) -> MemoryState:
        return MemoryState(OrderedDict(state.table), state.tail, state.length)

    def _predict(self, table: OrderedDict, tail: Sequence[int]) -> int | None:
        for k in range(min(self.order, len(tail)), 0, -1):
            nxt = table.get(tuple(tail[-k:]))
            if nxt is not None:
                return nxt
        return None

    def generate(self, state: MemoryState, max_new_tokens: int,
                 stop: Sequence[str] | None = None) -> str:
        tail = list(state.tail)

        def step(tok: int) -> int | None:
            tail.append(tok)
            del tail[: -self.order]
            return self._predict(state.table, tail)

        eos = self.tokenizer.eos_token_id
        return greedy_generate(self._predict(state.table, tail), step, decode=self.tokenizer.decode,
                               eos=() if eos is None else (eos,), max_new_tokens=max_new_tokens,
                               stop=stop)

    def score(self, state: MemoryState, continuations: Sequence[Sequence[int]]) -> list[float]:
        hit, miss = math.log(1 - _EPS), math.log(_EPS / (self.vocab_size - 1))
        uniform = -math.log(self.vocab_size)
        scores = []
        for cont in continuations:
            tail, total = list(state.tail), 0.0
            for tok in cont:
                nxt = self._predict(state.table, tail)
                total += uniform if nxt is None else (hit if nxt == tok else miss)
                tail = (tail + [int(tok)])[-self.order:]
            scores.append(total)
        return scores

    def state_bytes(self, state: MemoryState) -> int:
        """Token ids held: each entry's k-gram plus its follower, and the tail."""
        ids = sum(len(k) + 1 for k in state.table) + len(state.tail)
        return ids * _BYTES_PER_ID

    def identity(self) -> dict:
        return {"name": self.name, "kind": "reference", "order": self.order,
                "capacity": self.capacity, "tokenizer_hash": tokenizer_hash(self.tokenizer),
                "weights_hash": hashlib.sha256(f"{self.name}/{self.order}/{self.capacity}"
                                               .encode()).hexdigest()}

    def num_parameters(self) -> int:
        return 0


def _make(name: str, path: str | None, tokenizer: str | os.PathLike | None, order: int,
          capacity: int | None, max_length: int | None) -> InductionAdapter:
    if path:
        raise ValueError(f"{name}: takes no checkpoint path (got {path!r})")
    tok = load_tokenizer(tokenizer or DEFAULT_TOKENIZER)
    return InductionAdapter(name, tok, order=order, capacity=capacity, max_length=max_length)


def _describe(n_tokens: int) -> dict:
    return {"parameters": 0, "state_bytes": None, "max_length": None,
            "note": "state size depends on content"}


@register_model("oracle", kind="reference", state_kind="memory", describe=_describe,
                description="ideal induction copier, unbounded memory")
def oracle(path: str | None, *, tokenizer: str | os.PathLike | None = None, order: int = 8,
           capacity: int | None = None, max_length: int | None = None) -> InductionAdapter:
    return _make("oracle", path, tokenizer, order, capacity, max_length)


@register_model("forgetful", kind="reference", state_kind="memory", describe=_describe,
                description="induction copier with a 4096-entry memory")
def forgetful(path: str | None, *, tokenizer: str | os.PathLike | None = None, order: int = 8,
              capacity: int | None = 4096, max_length: int | None = None) -> InductionAdapter:
    return _make("forgetful", path, tokenizer, order, capacity, max_length)
