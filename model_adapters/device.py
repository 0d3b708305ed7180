"""Which device a model runs on: the one check every adapter makes, with one policy.

An unknown device, an absent one (CUDA on a machine without it, cuda:N past the count) or one
that cannot compute in the dtype asked for is a ModelOptionError (a one-line ValueError naming
the option) at load, never a failure deep inside it. XLA devices (xla, neuron) run GLA models
only, through their compiled bucketed shapes. The one exception is explicit: the lm-eval
bridge may ask for lm-eval's own policy, CPU when CUDA is absent (`cpu_if_no_cuda`).
"""
from __future__ import annotations

import logging

import torch

from evalkit.model_adapters.gla import xla
from evalkit.model_adapters.models import ModelOptionError

log = logging.getLogger(__name__)

DEVICES = "cpu, cuda, cuda:N, xla or neuron"
BF16_CUDA_CAPABILITY = (8, 0)  # Ampere: the first CUDA GPUs with bf16 tensor cores


def resolve_device(device: str, dtype: torch.dtype = torch.float32, *,
                   xla_ok: bool = False) -> torch.device:
    """The torch device for the `device` option (xla_ok: the model runs on XLA devices)."""
    device = str(device)
    if device in xla.KINDS:
        if not xla_ok:
            raise ModelOptionError(f"device {device!r} runs GLA models only (compiled bucketed "
                                   f"shapes); use device cpu or cuda for this model")
        return xla.xla_device(device)  # every PJRT device (CPU, TPU, NEURON) computes in bf16
    if device != "cpu" and not (device == "cuda" or (device.startswith("cuda:") and device[5:].isdigit())):
        raise ModelOptionError(f"device must be {DEVICES}, got {device!r}")
    if device.startswith("cuda"):
        if not torch.cuda.is_available():
            raise ModelOptionError(f"device {device!r} requested but CUDA is not available here "
                                   f"(use device cpu)")
        dev = torch.device(device)
        if dev.index is not None and dev.index >= torch.cuda.device_count():
            raise ModelOptionError(f"device {device!r}: this machine has "
                                   f"{torch.cuda.device_count()} CUDA device(s)")
        cap = torch.cuda.get_device_capability(dev)
        if dtype == torch.bfloat16 and not bf16_capable("cuda", cap):
            need = ".".join(map(str, BF16_CUDA_CAPABILITY))
            raise ModelOptionError(f"dtype 'bf16' needs a device that computes in bf16, and "
                                   f"{device} (compute capability {cap[0]}.{cap[1]}) does not: "
                                   f"expected compute capability >= {need}, or dtype fp32")
    return torch.device(device)


def bf16_capable(kind: str, capability: tuple[int, int] | None = None) -> bool:
    """CPUs compute bf16 (natively or widened to fp32); CUDA GPUs before Ampere do not."""
    return kind != "cuda" or tuple(capability or (0, 0)) >= BF16_CUDA_CAPABILITY


def cpu_if_no_cuda(device: str) -> str:
    """lm-eval's hf policy, for the lm-eval bridge alone: a CUDA device on a machine without
    CUDA becomes cpu, with a warning; any other device is left to resolve_device."""
    device = str(device)
    if device.startswith("cuda") and not torch.cuda.is_available():
        log.warning("device %r requested but CUDA is not available; using cpu "
                    "(as lm-eval's hf model does)", device)
        return "cpu"
    return device
