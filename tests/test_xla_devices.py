"""Bad device options: one-line ValueErrors (the CLI's exit 2) naming the option and what was expected."""
from __future__ import annotations

import importlib.util
import subprocess
import sys

import pytest

from evalkit.model_adapters.device import bf16_capable
from evalkit.model_adapters.models import load_model


def test_unknown_device():
    for bad in ("tpu", "cuda:x", "neuron:0", ""):
        with pytest.raises(ValueError, match=r"device must be cpu, cuda, cuda:N, xla or neuron, got"):
            load_model("recall-gla-tiny", device=bad)


@pytest.mark.skipif(importlib.util.find_spec("torch_xla") is not None, reason="torch_xla is installed")
def test_xla_without_torch_xla(tmp_path):
    with pytest.raises(ValueError, match=r"device 'xla' needs torch_xla, which is not installed here"):
        load_model("recall-gla-tiny", device="xla")
    # through the CLI: exit 2 and the one line, no traceback
    r = subprocess.run([sys.executable, "-m", "evalkit", "run", "--models", "recall-gla-tiny",
                        "--model-args", "device=xla", "--tasks", "needle", "--lengths", "100",
                        "--samples", "1", "--output", str(tmp_path / "run"), "--no-progress"],
                       capture_output=True, text=True, timeout=300)
    assert r.returncode == 2, r.stderr
    err = [line for line in r.stderr.splitlines() if "error:" in line]
    assert len(err) == 1 and "needs torch_xla" in err[0] and "Traceback" not in r.stderr


def test_bf16_capability():
    # CUDA GPUs before Ampere (compute capability 8.0) have no bf16 arithmetic; CPUs and PJRT
    # devices (XLA:CPU, TPU, Neuron) compute it. The CUDA branch needs such a GPU to run end
    # to end; this checks the rule it applies.
    assert not bf16_capable("cuda", (7, 5)) and bf16_capable("cuda", (8, 0)) and bf16_capable("cuda", (9, 0))
    assert bf16_capable("cpu") and bf16_capable("xla")
