"""Tiny configs of any transformers causal-LM family whose cache holds recurrent states, conv
tails or both beside attention: hidden 64, 2-4 layers, at least one attention and one
recurrent/conv layer in each hybrid. One generic shrink of the family's default config (every
width, head count and expert count it names, set small), then the few keys a family needs on
top (its layer pattern, its mixer's widths). Which families exist is not listed here: the
discovery test (tests/test_families_discovery.py) walks transformers' own registry and asks
this module for a config; a family it has never seen gets the generic shrink alone. Also what
the family table (family_table.py) is measured on."""
from __future__ import annotations

from typing import Any

HIDDEN = 64
# Set wherever the default config has the key (never added where it has not).
GENERIC: dict[str, Any] = {
    "hidden_size": HIDDEN, "embedding_dim": HIDDEN, "num_attention_heads": 4,
    "num_key_value_heads": 2, "head_dim": 16, "attention_head_dim": 16,
    "intermediate_size": 128, "moe_intermediate_size": 32, "shared_expert_intermediate_size": 32,
    "moe_shared_expert_intermediate_size": 32, "shared_intermediate_size": 32,
    "num_experts": 4, "num_local_experts": 4, "n_routed_experts": 4, "num_experts_per_tok": 2,
    "num_experts_per_token": 2, "n_shared_experts": 1, "num_shared_experts": 1,
    "max_position_embeddings": 4096, "tie_word_embeddings": False,
    "linear_num_key_heads": 2, "linear_num_value_heads": 4, "linear_key_head_dim": 16,
    "linear_value_head_dim": 16, "linear_num_heads": 4, "linear_head_dim": 16,
    "linear_conv_kernel_dim": 4, "mamba_d_state": 8, "mamba_n_heads": 8, "mamba_d_head": 16,
    "mamba_num_heads": 8, "mamba_head_dim": 16, "mamba_headdim": 16, "n_mamba_heads": 8,
    "ssm_state_size": 8, "state_size": 8, "mamba_chunk_size": 16, "chunk_size": 16,
    "mamba_dt_rank": 8, "time_step_rank": 8, "n_groups": 1, "mamba_n_groups": 1,
    "mamba_ngroups": 1, "kv_lora_rank": 16, "q_lora_rank": None, "qk_rope_head_dim": 8,
    "qk_nope_head_dim": 8, "v_head_dim": 16, "first_k_dense_replace": 1, "num_expert_group": 1,
    "n_group": 1, "topk_group": 1, "router_hidden_size": 32, "lru_width": HIDDEN,
    "attention_window_size": 32, "swa_num_attention_heads": 4, "swa_num_key_value_heads": 2,
    "swa_head_dim": 16, "d_rel": 4, "rel_extent": 64, "num_nextn_predict_layers": 0,
    "num_mtp_layers": None, "attention_hidden_size": 2 * HIDDEN, "hc_lowrank": 8,
    "ple_embed_dim": 16, "ngram_vocab_size_base": 1000, "split_ngram_parts": 8,
    "heads_per_ngram": 2, "ngram_size": 2, "make_ngram_vocab_size_divisible_by": 8,
    "indexer_n_heads": 2, "indexer_head_dim": 16, "indexer_budget": 8, "index_n_heads": 2,
    "index_head_dim": 16, "index_topk": 8, "mamba_d_ssm": None, "loop_gate_rank": 4,
    "max_inference_chunksize": 16384,
}
WINDOW = 24  # sliding windows: shorter than the test's longest prompt, so the cap shows

# The layer pattern and mixer keys a family needs beyond the generic shrink (by model_type:
# builders may be per family; the list of families comes from transformers, not from here).
FAMILY: dict[str, dict[str, Any]] = {
    "mamba": {"num_hidden_layers": 2, "expand": 2, "conv_kernel": 4},
    "falcon_mamba": {"num_hidden_layers": 2, "expand": 2, "conv_kernel": 4},
    "mamba2": {"num_hidden_layers": 2, "expand": 2, "num_heads": 8, "head_dim": 16,
               "conv_kernel": 4},
    "rwkv": {"num_hidden_layers": 2, "attention_hidden_size": HIDDEN, "intermediate_size": 128,
             "context_length": 4096},
    "xlstm": {"num_hidden_layers": 2, "num_blocks": 2, "num_heads": 4, "chunk_size": 16,
              "qk_dim_factor": 1.0},
    "jamba": {"num_hidden_layers": 2, "attn_layer_period": 2, "attn_layer_offset": 1,
              "expert_layer_period": 2, "expert_layer_offset": 1},
    "bamba": {"num_hidden_layers": 2, "attn_layer_indices": [1]},
    "granitemoehybrid": {"layer_types": ["linear_attention", "full_attention"]},
    "nemotron_h": {"layers_block_type": ["linear_attention", "full_attention", "mlp"]},
    "falcon_h1": {"num_hidden_layers": 2, "mamba_d_ssm": 128},
    "zamba": {"layers_block_type": ["linear_attention", "hybrid", "linear_attention"],
              "attn_layer_period": 2, "attn_layer_offset": 1},
    "zamba2": {"layers_block_type": ["linear_attention", "hybrid"], "hybrid_layer_ids": [1],
               "use_mem_rope": False, "num_key_value_heads": 4},
    "lfm2": {"layer_types": ["conv", "full_attention"]},
    "lfm2_moe": {"layer_types": ["conv", "full_attention", "conv"], "num_dense_layers": 1},
    "lfm3": {"layer_types": ["conv", "full_attention", "sliding_attention"],
             "sliding_window": WINDOW},
    "qwen3_next": {"layer_types": ["linear_attention", "full_attention"]},
    "qwen3_5_text": {"layer_types": ["linear_attention", "full_attention"]},
    "qwen3_5_moe_text": {"layer_types": ["linear_attention", "full_attention"]},
    "qwen4_exp_text": {"layer_types": ["linear_attention", "indexed_attention"],
                       "indexer_kv_heads": 1, "indexer_compress_ratio": 1},
    "lara_mini": {"layer_types": ["linear_attention", "sliding_attention", "full_attention"],
                  "sliding_window": WINDOW},
    "olmo_hybrid": {"layer_types": ["linear_attention", "full_attention"]},
    # MLA: transformers' MLA attention expands the latent to every head (kv heads = heads)
    "kimi_linear": {"layer_types": ["linear_attention", "full_attention"], "num_key_value_heads": 4,
                    "mlp_layer_types": ["dense", "sparse"]},
    "bailing_hybrid": {"layer_types": ["linear_attention", "full_attention"], "num_key_value_heads": 4,
                       "mlp_layer_types": ["dense", "sparse"], "layer_group_size": 2,
                       "head_dim": 16, "short_conv_kernel_size": 4},
    "minimax": {"layer_types": ["linear_attention", "full_attention"], "block_size": 16},
    "recurrent_gemma": {"num_hidden_layers": 3, "block_types": ["recurrent", "attention"],
                        "attention_window_size": WINDOW, "num_key_value_heads": 4,
                        "head_dim": 16},
    "zaya": {"layer_types": ["hybrid", "hybrid_sliding"], "sliding_window": WINDOW,
             "num_experts_per_tok": 1},
    "inkling_text": {"layer_types": ["hybrid_sliding", "hybrid"], "sliding_window_size": WINDOW,
                     "mlp_layer_types": ["dense", "sparse"]},
    "inkling2_text": {"layer_types": ["hybrid_sliding", "hybrid"], "sliding_window_size": WINDOW,
                      "n_layers_per_attn_res_block": 1},
    "inkling2_loop_text": {"layer_types": ["hybrid_sliding", "hybrid", "hybrid_sliding"],
                           "sliding_window_size": WINDOW, "n_layers_per_attn_res_block": 1,
                           "loop_layer_index_start": 1, "loop_layer_index_end": 2,
                           "loop_num_passes": 2},
}


def tiny_config(config_class: type, vocab: int, eos: int = 0) -> Any:
    """A tiny config of `config_class`: GENERIC where its defaults name the key, then FAMILY."""
    default = config_class()
    keys = set(default.to_dict()) | set(vars(default))
    kw = {k: v for k, v in GENERIC.items() if k in keys}
    extra = dict(FAMILY.get(default.model_type, {}))
    kw.update(extra)
    types = kw.get("layer_types") or kw.get("layers_block_type")
    if "num_hidden_layers" not in extra:
        kw["num_hidden_layers"] = len(types) if types else 2
    if "num_blocks" in keys:
        kw["num_blocks"] = kw["num_hidden_layers"]
    for k in list(kw):
        if k.endswith("layer_types") and k != "layer_types" and isinstance(default_get(default, k), list) and k not in extra:
            kw[k] = (default_get(default, k) * 8)[: kw["num_hidden_layers"]]
    kw.update(vocab_size=vocab, bos_token_id=eos, eos_token_id=eos, pad_token_id=eos)
    if "unpadded_vocab_size" in keys:
        kw["unpadded_vocab_size"] = vocab
    return config_class(**kw)


def default_get(cfg: Any, key: str) -> Any:
    return getattr(cfg, key, None)
