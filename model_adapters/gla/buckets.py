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
    """Runs streamed prefill/extend and decode steps at bucket shapes, optionally compiled."""

    def __init__(self, model: GLAForCausalLM, spec: BucketSpec | None = None, *,
                 compile: bool = False, backend: Any = "inductor", pad_id: int = 0,
                 device: str = "cpu") -> None:
        self.model, self.spec, self.pad_id = model, spec or BucketSpec(), pad_id
        self.spec.check(model.model.layers[0].attn.chunk_size, device)
        self.per_layer = len(model.model.layers[0].attn.cfg.state_shapes())
        self.shapes_seen: set[tuple[str, int, int]] = set()  # what callers asked for
        self.buckets_touched: set[tuple[str, int, int]] = set()  # what ran
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

    def _batch_state(self, states: Sequence[GLAState | None], width: int, device) -> GLAState:
        fresh = self.model.empty_state(1, device)
        rows = [s if s is not None else fresh for s in states]
        rows += [fresh] * (width - len(rows))  # padded rows start from zeros
        return GLAState.cat(rows)

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
        V = self.model.config.vocab_size
        n = len(group)
        width = self.spec.batch_bucket(n)
        lengths = [len(ids) for _, _, ids in group]
        total = max(lengths)
        self.shapes_seen.add(("prefill", n, total))
        ids = torch.full((width, max(total, 1)), self.pad_id, dtype=torch.long)
        for i, (_, _, row) in enumerate(group):
            ids[i, :len(row)] = torch.as_tensor(list(row), dtype=torch.long)
        ids = ids.to(dev)
        lens = torch.tensor(lengths + [0] * (width - n), device=dev)
        state = self._batch_state([s for s, _, _ in group], width, dev)
        last = torch.zeros(width, V, device=dev)
        for i, (_, lg, _) in enumerate(group):
            if lg is not None:
                last[i] = lg.to(dev)
        start = 0
        for seg in self.spec.segments(total):
            seg_ids = ids[:, start:start + seg]
            if seg_ids.shape[1] < seg:  # right-pad the last segment to its bucket
                pad = torch.full((width, seg - seg_ids.shape[1]), self.pad_id, dtype=torch.long, device=dev)
                seg_ids = torch.cat([seg_ids, pad], 1)
            valid = (lens - start).clamp(0, seg)
            self.buckets_touched.add(("prefill", width, seg))
            res = self._segment(seg_ids, valid, last, *state.tensors())
            last, state = res[0], GLAState.from_tensors(res[1:], self.per_layer)
            start += seg
        return [(last[i].clone(), state.rows([i]).clone()) for i in range(n)]

    @torch.no_grad()
    def decode(self, tokens: Sequence[int], states: Sequence[GLAState]
               ) -> list[tuple[torch.Tensor, GLAState]]:
        """One token per sequence at a bucketed batch width."""
        n = len(tokens)
        width = self.spec.batch_bucket(n)
        dev = self.model.lm_head.weight.device
        self.shapes_seen.add(("decode", n, 1))
        self.buckets_touched.add(("decode", width, 1))
        tok = torch.tensor(list(tokens) + [self.pad_id] * (width - n), dtype=torch.long, device=dev)
        res = self._decode(tok, *self._batch_state(states, width, dev).tensors())
        new = GLAState.from_tensors(res[1:], self.per_layer)
        return [(res[0][i].clone(), new.rows([i]).clone()) for i in range(n)]
