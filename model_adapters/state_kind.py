"""What a model's state is, from what it holds: the one definition every adapter reports by.

A state's tensors fall in three parts:
- fixed: recurrent matrices and convolution tails; their size never depends on the context;
- window: sliding-window KV buffers, bounded by the window once it is full;
- growing: full KV caches, one key and one value row per token per attention layer.

    kind_of(fixed=4864, window=0, growing=0)       == "recurrent"
    kind_of(fixed=768, window=0, growing=524288)   == "kv"         (a conv tail beside a KV cache)
    kind_of(fixed=4096, window=0, growing=524288)  == "hybrid"     (a recurrent layer and a KV one)

A convolution tail alone does not make a KV model hybrid: every KV model keeps a few tokens of
its own. `recurrent` says whether any layer holds a recurrent state (not just a conv tail).
"""
from __future__ import annotations

from dataclasses import dataclass

@dataclass(frozen=True)
class StateBytes:
    """Bytes of one sequence's state, split by how they grow with the context."""
    fixed: int = 0        # recurrent states and convolution tails
    window: int = 0       # sliding-window KV buffers (bounded by the window)
    growing: int = 0      # full KV caches (grow with every token)
    recurrent: bool = False  # some layer holds a recurrent state (not only conv tails)

    @property
    def total(self) -> int:
        return self.fixed + self.window + self.growing

    @property
    def kind(self) -> str:
        return kind_of(fixed=self.fixed, window=self.window, growing=self.growing,
                       recurrent=self.recurrent)

    def __add__(self, other: "StateBytes") -> "StateBytes":
        return StateBytes(self.fixed + other.fixed, self.window + other.window,
                          self.growing + other.growing, self.recurrent or other.recurrent)


def kind_of(*, fixed: int, window: int, growing: int, recurrent: bool | None = None) -> str:
    """recurrent | hybrid | kv | kv-window, from the parts a state holds (see the module doc).

    recurrent=None reads any fixed bytes as a recurrent state."""
    rec = fixed > 0 if recurrent is None else recurrent
    if growing or window:
        if rec:
            return "hybrid"
        return "kv" if growing else "kv-window"
    if fixed > 0:
        return "recurrent"
    raise ValueError("a state with no bytes has no kind (nothing was counted)")
