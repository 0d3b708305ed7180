"""Random weights for a model built on the meta device: what `evalkit cost` measures when no
checkpoint is given, and what `laplace` runs on without one (the real weights are not public).

Parameters get storage one at a time in the target dtype, never a full fp32 copy first (a 3B
model in bf16 needs 6 GB, not 6 + 12). A random model's scores mean nothing: its identity says
`random_weights` and `evalkit publish` refuses it.
"""
from __future__ import annotations

from typing import Any

import torch
import torch.nn as nn


def init_std(config: Any) -> float:
    """The config's initializer_range (fla and transformers both name it so), else 0.02."""
    std = getattr(config, "initializer_range", None)
    return float(std) if isinstance(std, (int, float)) and std > 0 else 0.02


def weights_id(std: float, seed: int) -> str:
    """What stands for the weights hash in a random model's identity."""
    return f"random:normal(0,{std:g}):seed={seed}"


@torch.no_grad()
def materialise_random(model: nn.Module, dtype: torch.dtype, std: float, seed: int) -> None:
    """Give every meta parameter real storage in `dtype`, one at a time: normal(0, std) for
    weights, ones for norm scales, zeros for biases. Shared (tied) parameters stay shared.
    The same (model, dtype, std, seed) gives the same weights."""
    gen = torch.Generator().manual_seed(seed)
    done: dict[int, nn.Parameter] = {}
    for mod in model.modules():
        is_norm = "norm" in type(mod).__name__.lower()
        for name, p in list(mod._parameters.items()):
            if p is None:
                continue
            if id(p) not in done:
                t = torch.empty(p.shape, dtype=dtype if p.is_floating_point() else p.dtype)
                if name == "bias":
                    t.zero_()
                elif is_norm and p.dim() == 1:
                    t.fill_(1.0)
                else:
                    t.normal_(0.0, std, generator=gen)
                done[id(p)] = nn.Parameter(t, requires_grad=False)
            mod._parameters[name] = done[id(p)]
    left = [n for n, p in model.named_parameters() if p.is_meta]
    if left:
        raise RuntimeError(f"parameters left on the meta device: {left[:5]}")
