"""The XLA backend: the bucketed runner's units as XLA graphs on a PJRT device.

`device="xla"` runs on whatever PJRT device the environment selects (PJRT_DEVICE=CPU here,
TPU, ...); `device="neuron"` is the same path on the Neuron PJRT plugin that torch-neuronx
registers (Trainium, Inferentia 2). torch_xla is imported only when one of them is asked for.

torch_xla records tensor ops lazily and compiles what was recorded when `sync` cuts the
trace, keyed by the graph's structure and shapes. The runner (buckets.py) cuts after every
unit, so the graphs are:
- prefill / extend: one graph per (batch bucket, length bucket): gather the rows' states
  into the batch, run one segment of `length` tokens, split the rows out again. A prompt
  longer than the largest bucket streams through several segments, each a cached graph;
- decode: one graph per batch bucket: one token per row, same gather and split;
- reading a token: the greedy loop's argmax over the vocabulary, one small graph, compiled
  once, then one scalar copied to the host per generated token;
- score: the continuation token by token through the decode graph (no graph per length),
  each step's logits downloaded to pick the continuation's token.
So a workload compiles (prefill buckets touched + decode widths + 1) graphs, then only hits
the cache. The recurrent state and the last logits stay on the device between graphs: token
ids and valid counts are the only uploads, the chosen token the only download. Within a
traced graph the chunked GLA operator takes its branch-free log-space path (no
data-dependent branch, see ops/gla/chunk.py).
"""
from __future__ import annotations

import torch

KINDS = ("xla", "neuron")


def xla_device(kind: str) -> torch.device:
    """The PJRT device for `kind` ("xla" or "neuron"); a ValueError names what is missing."""
    if kind == "neuron":
        try:
            import torch_neuronx  # noqa: F401  (registers the Neuron PJRT plugin)
        except ImportError as e:
            raise ValueError("device 'neuron' needs torch-neuronx (the AWS Neuron SDK), which is "
                             "not installed here") from e
    try:
        import torch_xla
    except ImportError as e:
        raise ValueError(f"device {kind!r} needs torch_xla, which is not installed here (install the "
                         f"torch-xla release matching torch {torch.__version__}, or use the "
                         f"environment `make test-xla` builds: torch 2.9.0 + torch-xla 2.9.0)") from e
    return torch_xla.device()


def sync() -> None:
    """Cut the lazy trace here: compile (or fetch from the cache) and run what was recorded."""
    import torch_xla
    torch_xla.sync()


def hardware() -> str:
    """The PJRT device type behind the xla device: CPU, TPU, NEURON, ..."""
    import torch_xla.runtime as xr
    return xr.device_type()


def compilations() -> tuple[int, float]:
    """(graphs compiled so far, seconds spent compiling them), from XLA's own metrics."""
    import torch_xla.core.xla_model as xm
    import torch_xla.debug.metrics as met
    xm.wait_device_ops()  # sync dispatches asynchronously: let the compile be recorded
    data = met.metric_data("CompileTime")
    return (0, 0.0) if data is None else (int(data[0]), data[1] / 1e9)
