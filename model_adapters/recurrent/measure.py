"""State bytes of a config measured from an actual prefill of a random model of that config.

The model keeps every width and depth of the config (its state's shapes) but a 256-token
vocabulary: no state tensor depends on the vocabulary, and the embedding and output head are
most of a small model's weights. The prefill is one forward (correct for every family: even a
zero-start selective scan starts from zero there), on CPU, through the same plumbing the adapter
uses (recurrent/forward.py), and its state is counted by role (cache_state.py).
"""
from __future__ import annotations

import copy
from typing import Any

import torch

from evalkit.model_adapters.cache_state import cache_state, roles_of
from evalkit.model_adapters.state_kind import StateBytes

MEASURE_VOCAB = 256


def measured_holder(config: Any, n_tokens: int, dtype: torch.dtype, *, seed: int = 0) -> Any:
    """The state holder a prefill of `n_tokens` random tokens leaves in a random model."""
    from transformers import AutoModelForCausalLM

    from evalkit.model_adapters.recurrent.forward import Stepper

    cfg = copy.deepcopy(config)
    text = cfg.get_text_config(decoder=True)
    for c in {id(cfg): cfg, id(text): text}.values():
        c.vocab_size = MEASURE_VOCAB
        for name in ("pad_token_id", "bos_token_id", "eos_token_id"):
            if isinstance(getattr(c, name, None), int) and getattr(c, name) >= MEASURE_VOCAB:
                setattr(c, name, 0)
    torch.manual_seed(seed)
    model = AutoModelForCausalLM.from_config(cfg, dtype=dtype).eval()
    ids = torch.randint(0, MEASURE_VOCAB, (1, int(n_tokens)))
    with torch.inference_mode():
        holder, _ = Stepper(model).forward(None, ids, 0, all_logits=False)
    return holder


def measured_at(config: Any, n_tokens: int, dtype: torch.dtype, *, seed: int = 0) -> StateBytes:
    """The cache's bytes after prefilling `n_tokens` random tokens into a random model."""
    return cache_state(measured_holder(config, n_tokens, dtype, seed=seed))


def measured_roles(config: Any, n_tokens: int, dtype: torch.dtype) -> dict[str, int]:
    return roles_of(measured_holder(config, n_tokens, dtype))
