"""Recurrent and hybrid transformers models (Mamba, Mamba-2, RWKV, Jamba, Bamba, Zamba2, FalconH1,
LFM2, Qwen3-Next) behind the "hf" loader, their state counted from the cache's tensors.

Modules: `family` (which adapter a config needs), `adapter` (RecurrentAdapter), `formula`
(state bytes from a config), `measure` (state bytes from a prefill of a random model).

Nothing is imported here: the adapter builds on the softmax package's loader, which in turn
reads `family` and `measure` for memory matching, so eager imports would make a cycle.
"""
