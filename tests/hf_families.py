"""Tiny random checkpoints of transformers' recurrent and hybrid families, saved with the repo's
tiny tokenizer (vocabulary sized to fit it): for tests/test_recurrent_hf.py and the conformance
suite. Each config is a few thousand parameters: seconds to build, prefill and score."""
from __future__ import annotations

import shutil
from pathlib import Path

import torch

from helpers import TINY_TOKENIZER

VOCAB = 2048  # len() of model_adapters/tiny/tokenizer
ATTN = dict(num_attention_heads=4, num_key_value_heads=2)


def family_config(family: str, vocab: int = VOCAB, eos: int = 0):
    """A tiny config of `family` (a transformers model_type)."""
    import transformers as T

    common = dict(vocab_size=vocab, hidden_size=32, num_hidden_layers=2, bos_token_id=eos,
                  eos_token_id=eos, pad_token_id=0, tie_word_embeddings=False)
    if family == "mamba":
        return T.MambaConfig(**common, state_size=8, expand=2, conv_kernel=4)
    if family == "falcon_mamba":
        return T.FalconMambaConfig(**common, state_size=8, expand=2, conv_kernel=4)
    if family == "mamba2":
        return T.Mamba2Config(**common, state_size=8, expand=2, num_heads=4, head_dim=16,
                              n_groups=1, conv_kernel=4, chunk_size=8)
    if family == "rwkv":
        return T.RwkvConfig(**common, attention_hidden_size=32, intermediate_size=64,
                            context_length=512)
    mlp = dict(intermediate_size=64, max_position_embeddings=512, **ATTN)
    if family == "jamba":
        return T.JambaConfig(**common, **mlp, attn_layer_period=2, attn_layer_offset=1,
                             expert_layer_period=2, expert_layer_offset=1, num_experts=2,
                             mamba_d_state=8, mamba_d_conv=4, mamba_expand=2, mamba_dt_rank=4)
    if family == "bamba":
        return T.BambaConfig(**common, **mlp, attn_layer_indices=[1], mamba_n_heads=4,
                             mamba_d_head=16, mamba_d_state=8, mamba_n_groups=1,
                             mamba_chunk_size=8)
    if family == "falcon_h1":
        return T.FalconH1Config(**common, **mlp, head_dim=8, mamba_n_heads=4, mamba_d_head=16,
                                mamba_d_state=8, mamba_n_groups=1, mamba_chunk_size=8,
                                mamba_d_ssm=64)
    if family == "lfm2":
        return T.Lfm2Config(**common, **mlp, layer_types=["conv", "full_attention"],
                            conv_L_cache=3)
    if family == "qwen3_next":
        return T.Qwen3NextConfig(**common, **mlp, head_dim=8,
                                 layer_types=["linear_attention", "full_attention"],
                                 linear_num_key_heads=2, linear_num_value_heads=4,
                                 linear_key_head_dim=8, linear_value_head_dim=8, num_experts=2,
                                 num_experts_per_tok=1, moe_intermediate_size=16,
                                 shared_expert_intermediate_size=16, decoder_sparse_step=1)
    if family == "zamba2":
        return T.Zamba2Config(**common, intermediate_size=64, max_position_embeddings=512,
                              num_attention_heads=4, num_key_value_heads=4, mamba_d_state=8,
                              mamba_headdim=8, n_mamba_heads=8, mamba_ngroups=1,
                              layers_block_type=["mamba", "hybrid"], hybrid_layer_ids=[1],
                              chunk_size=8, use_mem_rope=False)
    raise KeyError(f"no tiny config for family {family!r}")


FAMILIES = ("mamba", "falcon_mamba", "mamba2", "rwkv", "jamba", "bamba", "falcon_h1", "lfm2",
            "qwen3_next", "zamba2")


def build_family(family: str, folder: Path, *, seed: int = 0, peak: float = 4.0,
                 tokenizer: Path = TINY_TOKENIZER, vocab: int = VOCAB, specials: int = 1) -> Path:
    """Save a random tiny `family` model (safetensors) and `tokenizer`'s files into `folder`.
    `peak` scales the output head: peaked distributions, so greedy choices are stable; the
    first `specials` ids (eos among them) get logit 0, below the best of the others: never greedy."""
    from transformers import AutoModelForCausalLM

    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    torch.manual_seed(seed)
    model = AutoModelForCausalLM.from_config(family_config(family, vocab, eos=specials - 1))
    with torch.no_grad():
        model.get_output_embeddings().weight.mul_(peak)
        model.get_output_embeddings().weight[:specials] = 0
    model.save_pretrained(str(folder))
    if Path(tokenizer).resolve() != folder.resolve():
        for f in Path(tokenizer).iterdir():  # a tokenizer folder: tokenizer files only
            shutil.copy(f, folder / f.name)
    return folder
