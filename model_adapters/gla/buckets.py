"""Static shapes for compiled backends: batch width and prefill length padded to buckets.

A compiler that specialises on shapes (torch.compile with dynamic=False, and Neuron, where
each new shape is a fresh multi-second compilation) sees only the bucket shapes: a batch of
n prompts runs at the smallest width bucket >= n, and a prompt of T tokens streams through
segments whose lengths are length buckets (full segments of the largest bucket, then the
smallest bucket that holds the rest). So compilations = buckets touched, not shapes seen.

Why padding cannot change real rows:
- padded batch rows: every op is row-independent (no reduction over the batch dimension);
- right-padded tokens: the model is causal, so outputs at real positions never see them; and
  at a padded position the layer writes k = 0 and log-gate g = 0, so S_t = 1 * S_{t-1} + 0
  leaves the state exactly unchanged, while the conv tail is gathered at each row's last
  real token. Tests check both: real rows equal unpadded runs, and are bit-identical
  whatever the pad contents are.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable, Sequence

import torch

from evalkit.model_adapters.gla.model import GLAForCausalLM, GLAState

NEURON_ALIGN = 128  # Neuron on-chip buffers have 128 partitions: chunks of 128 tokens


@dataclass(frozen=True)
class BucketSpec:
    batch_sizes: tuple[int, ...] = (1, 2, 4, 8)
    lengths: tuple[int, ...] = (128, 512, 2048)

    def __post_init__(self) -> None:
        for name in ("batch_sizes", "lengths"):
            vals = tuple(getattr(self, name))
            if not vals or any(int(v) < 1 for v in vals):
                raise ValueError(f"buckets: {name} must be a non-empty list of positive ints, got {vals}")
            object.__setattr__(self, name, tuple(sorted(set(int(v) for v in vals))))

    def check(self, chunk_size: int, device: str) -> None:
        """Neuron needs chunks aligned to 128 and segments made of whole chunks."""
        if device == "neuron":
            if chunk_size % NEURON_ALIGN:
                raise ValueError(f"neuron: chunk_size must be a multiple of {NEURON_ALIGN}, got {chunk_size}")
            bad = [n for n in self.lengths if n % chunk_size]
            if bad:
                raise ValueError(f"neuron: length buckets {bad} are not multiples of chunk_size {chunk_size}")

    def batch_bucket(self, n: int) -> int:
        for b in self.batch_sizes:
            if b >= n:
                return b
        raise ValueError(f"batch of {n} exceeds the largest batch bucket {self.batch_sizes[-1]}")

    def segments(self, total: int) -> list[int]:
        """Segment lengths (each a bucket) that stream `total` tokens."""
        out, big = [], self.lengths[-1]
        while total > big:
            out.append(big)
            total -= big
        if total > 0:
            out.append(next(n for n in self.lengths if n >= total))
        return out


def counting_backend(inner: Any = None) -> Callable:
    """A torch.compile backend that counts the graphs it compiles (`fn.count`)."""
    def backend(gm: torch.fx.GraphModule, example_inputs):
        backend.count += 1
        if inner is None:
            return gm.forward
        from torch._dynamo.backends.registry import lookup_backend
        return lookup_backend(inner)(gm, example_inputs)
    backend.count = 0
    return backend


class BucketedRunner:
    """Runs streamed prefill/extend and decode steps at bucket shapes, optionally compiled.

    Around each unit (one segment, one decode step) the batch is assembled from, and split
    back into, one row per batch slot, padded slots included, so that the work done per unit
    has the same structure for every call at the same bucket. A lazy-tensor backend (XLA,
    see xla.py) captures that work as one graph, and `sync` (called after each unit) cuts
    it there: one graph per bucket, whatever the rows' contents or where they came from."""

    def __init__(self, model: GLAForCausalLM, spec: BucketSpec | None = None, *,
                 compile: bool = False, backend: Any = "inductor", pad_id: int = 0,
                 device: str = "cpu", sync: Callable[[], None] | None = None) -> None:
        self.model, self.spec, self.pad_id = model, spec or BucketSpec(), pad_id
        self.spec.check(model.model.layers[0].attn.chunk_size, device)
        self.per_layer = len(model.model.layers[0].attn.cfg.state_shapes())
        self.sync = sync or (lambda: None)
        self.shapes_seen: set[tuple[str, int, int]] = set()  # what callers asked for
        self.buckets_touched: set[tuple[str, int, int]] = set()  # what ran
        self._fresh: list[tuple[torch.Tensor, GLAState]] = []  # per batch slot, see _slots
        if compile:
            import torch._dynamo.config as dcfg
            # One graph per bucket must fit under dynamo's recompile limit.
            need = 2 * len(self.spec.batch_sizes) * (len(self.spec.lengths) + 1) + 16
            dcfg.recompile_limit = max(dcfg.recompile_limit, need)
            dcfg.accumulated_recompile_limit = max(dcfg.accumulated_recompile_limit, 4 * need)
            kw = dict(backend=backend, dynamic=False, fullgraph=True)
            self._segment = torch.compile(self._segment_eager, **kw)
            self._decode = torch.compile(self._decode_eager, **kw)
        else:
            self._segment, self._decode = self._segment_eager, self._decode_eager

    # The compiled units take and return flat tensors: no None, no Python objects, so one
    # trace per shape.
    def _segment_eager(self, ids, valid, last, *state):
        last, new = self.model.segment_step(ids, valid, GLAState.from_tensors(state, self.per_layer), last)
        return (last, *new.tensors())

    def _decode_eager(self, tokens, *state):
        logits, new = self.model.decode_step(tokens, GLAState.from_tensors(state, self.per_layer))
        return (logits, *new.tensors())

    def _slots(self, rows: Sequence[tuple[GLAState | None, torch.Tensor | None]], width: int
               ) -> tuple[torch.Tensor, GLAState]:
        """Batch `rows` (state, last logits; None = fresh) into `width` slots. A fresh or padded
        slot j reads slot j's own zeros: materialised once on the device (a transfer, never a
        traced op) and distinct per slot, because a lazy backend hashes a graph together with
        which of its inputs are the same buffer."""
        dev = self.model.lm_head.weight.device
        while len(self._fresh) < width:
            zeros = torch.zeros(self.model.config.vocab_size).to(dev)
            self._fresh.append((zeros, self.model.empty_state(1, "cpu").map(lambda t: t.to(dev))))
        rows = list(rows) + [(None, None)] * (width - len(rows))
        lasts = [lg.to(dev) if lg is not None else self._fresh[j][0] for j, (_, lg) in enumerate(rows)]
        states = [s if s is not None else self._fresh[j][1] for j, (s, _) in enumerate(rows)]
        return torch.stack(lasts), GLAState.cat(states)

    def _unslot(self, res: Sequence[torch.Tensor], n: int) -> list[tuple[torch.Tensor, GLAState]]:
        """Split a unit's (logits [W, V], *state) into every slot's row, then `sync`; the
        first n rows are the callers'."""
        width = res[0].shape[0]
        state = GLAState.from_tensors(res[1:], self.per_layer)
        rows = [(res[0][j].clone(), state.rows(slice(j, j + 1)).clone()) for j in range(width)]
        self.sync()
        return rows[:n]

    @torch.no_grad()
    def run(self, items: Sequence[tuple[GLAState | None, torch.Tensor | None, Sequence[int]]]
            ) -> list[tuple[torch.Tensor, GLAState]]:
        """items: (state or None, last logits [V] or None, new token ids) per sequence.
        Returns (logits [V] after the last token, state [B=1]) per sequence, in order."""
        out: list[tuple[torch.Tensor, GLAState]] = []
        big = self.spec.batch_sizes[-1]
        for g0 in range(0, len(items), big):
            out.extend(self._run_group(items[g0:g0 + big]))
        return out

    def _run_group(self, group):
        dev = self.model.lm_head.weight.device
        n = len(group)
        width = self.spec.batch_bucket(n)
        lengths = [len(ids) for _, _, ids in group]
        total = max(lengths)
        self.shapes_seen.add(("prefill", n, total))
        # Token ids and valid counts are cut and padded on the host: each segment's inputs
        # reach the device as data of the bucket's shape, never as ops that depend on `start`.
        segs = self.spec.segments(total)
        ids = torch.full((width, sum(segs)), self.pad_id, dtype=torch.long)
        for i, (_, _, row) in enumerate(group):
            ids[i, :len(row)] = torch.as_tensor(list(row), dtype=torch.long)
        lens = torch.tensor(lengths + [0] * (width - n))
        carry = [(s, lg) for s, lg, _ in group]
        start = 0
        for seg in segs:
            self.buckets_touched.add(("prefill", width, seg))
            last, state = self._slots(carry, width)
            res = self._segment(ids[:, start:start + seg].to(dev), (lens - start).clamp(0, seg).to(dev),
                                last, *state.tensors())
            out = self._unslot(res, width)
            carry = [(s, lg) for lg, s in out]
            start += seg
        return out[:n]

    @torch.no_grad()
    def decode(self, tokens: Sequence[int], states: Sequence[GLAState]
               ) -> list[tuple[torch.Tensor, GLAState]]:
        """One token per sequence at a bucketed batch width."""
        n = len(tokens)
        width = self.spec.batch_bucket(n)
        dev = self.model.lm_head.weight.device
        self.shapes_seen.add(("decode", n, 1))
        self.buckets_touched.add(("decode", width, 1))
        tok = torch.tensor(list(tokens) + [self.pad_id] * (width - n), dtype=torch.long).to(dev)
        _, state = self._slots([(s, None) for s in states], width)
        return self._unslot(self._decode(tok, *state.tensors()), n)
