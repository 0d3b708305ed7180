"""Which models drop their state on a multi-token forward after a prefill: found by a probe on
the loaded model, not from a list of family names.

Some of transformers' PyTorch paths start a multi-token scan from a zero state whatever the cache
holds (Mamba's and Jamba's selective scan: "Initial hidden state is not supported") or rebuild a
convolution tail from the chunk alone (RecurrentGemma treats any multi-token forward as a
prefill). For those, once a state exists, tokens must go one at a time.

The probe: prefill PREFILL random tokens in one forward, then feed CHUNK more (a) as one forward
and (b) one token at a time, and compare both with (c) one forward of all PREFILL + CHUNK tokens
from scratch. A model whose chunked path is right is as close to (c) as its stepwise path is,
up to rounding; one that drops its state is not. Stepwise feeding is always exact (only
slower), so the probe leans that way: chunks are allowed only when (a) is within
max(2 x (b)'s distance, a rounding floor for the dtype) of (c).

Below fp32 the rounding floor can hide a dropped state (a random bf16 Mamba passes it), so a
bf16 / fp16 model is also probed through an fp32 twin: a tiny random model of the same class
(tiny_configs.py), whose code paths are the model's. Either probe failing means stepwise, and
so does a twin that cannot be built (stepwise is exact; a guess is not).
"""
from __future__ import annotations

from typing import Any

import torch

PREFILL, CHUNK = 6, 4
# the largest log-probability gap rounding alone can explain, by dtype (fp32: summation order)
FLOOR = {torch.float32: 1e-5, torch.float64: 1e-10}
FLOOR_DEFAULT = 5e-2  # bf16 / fp16
TWIN_VOCAB = 256


def probe_distances(stepper: Any, vocab: int, seed: int = 0) -> tuple[float, float]:
    """(chunked, stepwise): max |log-prob| distance of each feeding from one full forward."""
    from evalkit.model_adapters.cache_state import fork_cache

    g = torch.Generator().manual_seed(seed)
    device = next(stepper.model.parameters()).device
    ids = torch.randint(0, vocab, (1, PREFILL + CHUNK), generator=g).to(device)
    with torch.inference_mode():
        _, full = stepper.forward(None, ids, 0, all_logits=True)
        ref = torch.log_softmax(full[PREFILL:], -1)
        state, _ = stepper.forward(None, ids[:, :PREFILL], 0, all_logits=False)
        _, chunk = stepper.forward(fork_cache(state), ids[:, PREFILL:], PREFILL, all_logits=True)
        steps, s = [], fork_cache(state)
        for i in range(CHUNK):
            s, lg = stepper.forward(s, ids[:, PREFILL + i: PREFILL + i + 1], PREFILL + i, False)
            steps.append(lg)
    d_chunk = (torch.log_softmax(chunk, -1) - ref).abs().max().item()
    d_steps = (torch.log_softmax(torch.cat(steps), -1) - ref).abs().max().item()
    return d_chunk, d_steps


def _drops(stepper: Any, vocab: int) -> bool:
    d_chunk, d_steps = probe_distances(stepper, vocab)
    dtype = next(stepper.model.parameters()).dtype
    return not d_chunk <= max(2 * d_steps, FLOOR.get(dtype, FLOOR_DEFAULT))


def _fp32_twin(config: Any) -> Any:
    """A tiny random fp32 model of `config`'s class (None where one cannot be built)."""
    from transformers import AutoModelForCausalLM

    from evalkit.model_adapters.recurrent.tiny_configs import tiny_config

    try:
        torch.manual_seed(0)
        return AutoModelForCausalLM.from_config(tiny_config(type(config), TWIN_VOCAB),
                                                dtype=torch.float32).eval()
    except Exception:  # noqa: BLE001 -- any failure means: no twin, feed stepwise
        return None


def drops_state_on_chunks(stepper: Any, vocab: int) -> bool:
    """True when a multi-token forward after a prefill loses (part of) the state."""
    from evalkit.model_adapters.recurrent.forward import Stepper

    if _drops(stepper, vocab):
        return True
    if next(stepper.model.parameters()).dtype in FLOOR:
        return False
    twin = _fp32_twin(stepper.model.config)
    return twin is None or _drops(Stepper(twin), TWIN_VOCAB)
