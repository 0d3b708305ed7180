"""Which device a GLA model runs on, and whether it can compute in the dtype asked for."""
from __future__ import annotations

import torch

from evalkit.model_adapters.gla import xla

DEVICES = "cpu, cuda, cuda:N, xla or neuron"
BF16_CUDA_CAPABILITY = (8, 0)  # Ampere: the first CUDA GPUs with bf16 tensor cores


def resolve_device(device: str, dtype: torch.dtype) -> torch.device:
    """The torch device for the `device` option; a ValueError (one line) for a device that is
    unknown, absent, or cannot compute in `dtype`."""
    if device in xla.KINDS:
        return xla.xla_device(device)  # every PJRT device (CPU, TPU, NEURON) computes in bf16
    if device != "cpu" and not (device == "cuda" or (device.startswith("cuda:") and device[5:].isdigit())):
        raise ValueError(f"device must be {DEVICES}, got {device!r}")
    if device.startswith("cuda"):
        if not torch.cuda.is_available():
            raise ValueError(f"device {device!r} requested but CUDA is not available")
        cap = torch.cuda.get_device_capability(device)
        if dtype == torch.bfloat16 and not bf16_capable("cuda", cap):
            need = ".".join(map(str, BF16_CUDA_CAPABILITY))
            raise ValueError(f"dtype 'bf16' needs a device that computes in bf16, and {device} "
                             f"(compute capability {cap[0]}.{cap[1]}) does not: expected compute "
                             f"capability >= {need}, or dtype fp32")
    return torch.device(device)


def bf16_capable(kind: str, capability: tuple[int, int] | None = None) -> bool:
    """CPUs compute bf16 (natively or widened to fp32); CUDA GPUs before Ampere do not."""
    return kind != "cuda" or tuple(capability or (0, 0)) >= BF16_CUDA_CAPABILITY

