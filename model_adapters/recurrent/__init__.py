"""Recurrent and hybrid transformers models (Mamba, Mamba-2, RWKV, Jamba, Bamba, Zamba2, FalconH1,
LFM2, Qwen3-Next) behind the "hf" loader, their state counted from the cache's tensors.

Modules: `family` (which adapter a config needs), `adapter` (RecurrentAdapter), `formula`
(state bytes from a config), `measure` (state bytes from a prefill of a random model).
"""
from evalkit.model_adapters.recurrent.adapter import RecurrentAdapter
from evalkit.model_adapters.recurrent.family import state_family
from evalkit.model_adapters.recurrent.formula import FAMILIES, state_at

__all__ = ["FAMILIES", "RecurrentAdapter", "state_at", "state_family"]
