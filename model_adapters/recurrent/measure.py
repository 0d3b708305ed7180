"""State bytes of a config measured from an actual prefill of a random model of that config.

The model keeps every width and depth of the config (its state's shapes) but a 256-token
vocabulary: no state tensor depends on the vocabulary, and the embedding and output head are
most of a small model's weights. The prefill is one forward (correct for every family: even a
zero-start selective scan starts from zero there), on CPU.
"""
from __future__ import annotations

import copy
from typing import Any

import torch

from evalkit.model_adapters.cache_state import TensorState, cache_state
from evalkit.model_adapters.state_kind import StateBytes

MEASURE_VOCAB = 256


def measured_at(config: Any, n_tokens: int, dtype: torch.dtype, *, seed: int = 0) -> StateBytes:
    """The cache's bytes after prefilling `n_tokens` random tokens into a random model."""
    from transformers import AutoModelForCausalLM, DynamicCache

    cfg = copy.deepcopy(config)
    cfg.vocab_size = MEASURE_VOCAB
    for name in ("pad_token_id", "bos_token_id", "eos_token_id"):
        if isinstance(getattr(cfg, name, None), int) and getattr(cfg, name) >= MEASURE_VOCAB:
            setattr(cfg, name, 0)
    torch.manual_seed(seed)
    model = AutoModelForCausalLM.from_config(cfg, dtype=dtype).eval()
    ids = torch.randint(0, MEASURE_VOCAB, (1, int(n_tokens)))
    with torch.inference_mode():
        if cfg.model_type == "rwkv":  # its state is a list of tensors, returned by the forward
            return cache_state(TensorState(list(model(input_ids=ids, use_cache=True).state)))
        cache = DynamicCache(config=model.config)
        model(input_ids=ids, cache=cache, use_cache=True, logits_to_keep=1)
        return cache_state(cache)
