"""One KV formula from a config (recurrent.formula.config_state_at), read through facts.py by
`evalkit cost` and by a served model's state: checked against the cache arithmetic written out
by hand."""
from __future__ import annotations

import os

os.environ.setdefault("HF_HUB_OFFLINE", "1")

import torch
from transformers import LlamaConfig, MistralConfig

from evalkit.model_adapters.recurrent.formula import config_state_at, kv_per_token
from evalkit.model_adapters.facts import config_facts


def test_full_attention_grows_and_sliding_keeps_window_minus_one():
    llama = LlamaConfig(hidden_size=64, num_attention_heads=4, num_key_value_heads=2,
                        num_hidden_layers=3, intermediate_size=128, vocab_size=100)
    assert kv_per_token(llama) == 2 * 2 * 16
    s = config_state_at(llama, 1000, torch.bfloat16)
    assert (s.growing, s.window, s.fixed) == (3 * 64 * 1000 * 2, 0, 0) and s.kind == "kv"
    mistral = MistralConfig(hidden_size=64, num_attention_heads=4, num_key_value_heads=4,
                            num_hidden_layers=2, intermediate_size=128, vocab_size=100,
                            sliding_window=256)
    for T, kept in ((100, 100), (1000, 255)):
        s = config_state_at(mistral, T, torch.float32)
        assert (s.growing, s.window) == (0, 2 * 128 * kept * 4)


def test_a_config_folder_reads_the_same_formula(tmp_path):
    cfg = LlamaConfig(hidden_size=64, num_attention_heads=4, num_key_value_heads=2,
                      num_hidden_layers=3, intermediate_size=128, vocab_size=100)
    cfg.save_pretrained(tmp_path)
    assert config_facts(tmp_path).state_at(512, torch.float32) == config_state_at(cfg, 512,
                                                                                  torch.float32)
