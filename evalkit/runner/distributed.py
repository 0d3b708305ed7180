"""Data parallelism with torch.distributed: `torchrun --nproc-per-node N -m evalkit run ...`.

Every rank builds the same plans (probe generation and planning are deterministic), takes every
N-th unit (units are sorted longest first, so the shards are balanced and a shared prefix
never straddles two ranks), and sends its samples to rank 0, which alone writes the run
directory. The gloo backend works on CPU; nothing else is needed for evaluation traffic, which
is a handful of Python objects per rank.
"""
from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Any, Sequence, TypeVar

T = TypeVar("T")


@dataclass(frozen=True)
class Dist:
    rank: int = 0
    world: int = 1

    @property
    def active(self) -> bool:
        return self.world > 1

    @property
    def is_main(self) -> bool:
        return self.rank == 0

    def shard(self, seq: Sequence[T]) -> list[T]:
        return list(seq[self.rank::self.world])

    def broadcast(self, obj: Any) -> Any:
        """Rank 0's `obj` on every rank."""
        if not self.active:
            return obj
        import torch.distributed as dist

        box = [obj]
        dist.broadcast_object_list(box, src=0)
        return box[0]

    def gather(self, obj: Any) -> list[Any] | None:
        """Every rank's `obj`, in rank order, on rank 0 (None elsewhere)."""
        if not self.active:
            return [obj]
        import torch.distributed as dist

        out = [None] * self.world if self.is_main else None
        dist.gather_object(obj, out, dst=0)
        return out


def setup() -> Dist:
    """Join the process group torchrun describes (WORLD_SIZE > 1), else a single process."""
    world = int(os.environ.get("WORLD_SIZE", "1"))
    if world <= 1:
        return Dist()
    import torch.distributed as dist

    if not dist.is_initialized():
        dist.init_process_group("gloo")
    return Dist(dist.get_rank(), dist.get_world_size())


def teardown(d: Dist) -> None:
    if d.active:
        import torch.distributed as dist

        if dist.is_initialized():
            dist.destroy_process_group()
