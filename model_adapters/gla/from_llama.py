"""A Hugging Face Llama (SmolLM2: tied embeddings, RMSNorm, SwiGLU, GQA attention with rotary
embeddings) as our native model, every layer an `attn` mixer, and its linearized twin, every
chosen layer a `window_linear` mixer on the same weights.

    cfg = config_from_llama(json.load(open(folder / "config.json")))
    model = load_llama(folder)                       # GLAForCausalLM, logits = Llama's
    twin = linearize(model, window=64)               # parent's weights, fresh maps/gates/mixes

Llama features our Attention does not have (o_proj bias, MLP bias, rope scaling, a head_dim
other than hidden/heads, an activation other than SiLU) are refused, naming the field.
"""
from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import torch
from safetensors.torch import load_file

from evalkit.model_adapters.gla.config import GLAConfig
from evalkit.model_adapters.gla.model import GLAForCausalLM


def config_from_llama(d: dict[str, Any], source: str = "config") -> GLAConfig:
    """A Llama config.json (as a dict) -> a GLAConfig whose every layer is softmax attention."""
    if d.get("model_type") != "llama":
        raise ValueError(f"{source}: model_type is {d.get('model_type')!r}, expected 'llama'")
    h, H = d["hidden_size"], d["num_attention_heads"]
    Hkv = d.get("num_key_value_heads") or H
    errs = []
    if d.get("head_dim", h // H) * H != h:
        errs.append(f"head_dim {d.get('head_dim')} x num_attention_heads {H} != hidden_size {h}")
    if d.get("hidden_act", "silu") != "silu":
        errs.append(f"hidden_act {d.get('hidden_act')!r} unsupported (only 'silu')")
    if d.get("attention_bias", False):
        errs.append("attention_bias=true unsupported (it also puts a bias on o_proj)")
    if d.get("mlp_bias", False):
        errs.append("mlp_bias=true unsupported")
    rope = d.get("rope_parameters") or d.get("rope_scaling") or {}
    if rope.get("rope_type", rope.get("type", "default")) != "default":
        errs.append(f"rope_parameters.rope_type {rope.get('rope_type', rope.get('type'))!r} "
                    f"unsupported (only 'default')")
    if errs:
        raise ValueError(f"{source}: " + "; ".join(errs))
    theta = rope.get("rope_theta", d.get("rope_theta", 10000.0))
    n = d["num_hidden_layers"]
    cfg = GLAConfig(
        vocab_size=d["vocab_size"], hidden_size=h, num_hidden_layers=n, num_heads=H,
        expand_k=1.0, expand_v=1.0, intermediate_size=d["intermediate_size"],
        max_position_embeddings=d.get("max_position_embeddings", 2048),
        norm_eps=float(d.get("rms_norm_eps", 1e-6)),
        attn={"layers": list(range(n)), "num_heads": H, "num_kv_heads": Hkv, "qkv_bias": False,
              "window_size": None, "rope_theta": float(theta)},
        pad_token_id=d.get("pad_token_id"), bos_token_id=d.get("bos_token_id"),
        eos_token_id=d.get("eos_token_id"),
        tie_word_embeddings=bool(d.get("tie_word_embeddings", False)),
        initializer_range=d.get("initializer_range", 0.02))
    cfg.validate(source)
    return cfg


# Llama's parameter names -> ours (fla's), per layer and global.
_LAYER_NAMES = {"self_attn.q_proj": "attn.q_proj", "self_attn.k_proj": "attn.k_proj",
                "self_attn.v_proj": "attn.v_proj", "self_attn.o_proj": "attn.o_proj",
                "input_layernorm": "attn_norm", "post_attention_layernorm": "mlp_norm",
                "mlp.gate_proj": "mlp.gate_proj", "mlp.up_proj": "mlp.up_proj",
                "mlp.down_proj": "mlp.down_proj"}


def state_dict_from_llama(sd: dict[str, torch.Tensor], cfg: GLAConfig) -> dict[str, torch.Tensor]:
    """Llama checkpoint tensors -> our names (lm_head left out when tied)."""
    out = {"model.embeddings.weight": sd["model.embed_tokens.weight"],
           "model.norm.weight": sd["model.norm.weight"]}
    if not cfg.tie_word_embeddings:
        out["lm_head.weight"] = sd["lm_head.weight"]
    for i in range(cfg.num_hidden_layers):
        for theirs, ours in _LAYER_NAMES.items():
            out[f"model.layers.{i}.{ours}.weight"] = sd[f"model.layers.{i}.{theirs}.weight"]
    return out


def load_llama(folder: str | os.PathLike, layers: int | None = None) -> GLAForCausalLM:
    """Our model from a Llama folder (config.json + model.safetensors), in fp32. `layers`
    keeps only the first n blocks (for quick tests)."""
    folder = Path(folder)
    d = json.loads((folder / "config.json").read_text())
    if layers is not None:
        d["num_hidden_layers"] = layers
    cfg = config_from_llama(d, source=str(folder / "config.json"))
    sd = state_dict_from_llama(load_file(str(folder / "model.safetensors")), cfg)
    model = GLAForCausalLM(cfg)
    missing, unexpected = model.load_state_dict({k: v.float() for k, v in sd.items()}, strict=False)
    # a tied lm_head is the embedding Parameter itself, loaded through its other name
    if unexpected or set(missing) - ({"lm_head.weight"} if cfg.tie_word_embeddings else set()):
        raise ValueError(f"{folder}: Llama weights do not fit: missing {missing}, "
                         f"unexpected {unexpected}")
    return model.eval()


def twin_config(cfg: GLAConfig, window: int = 64, layers: list[int] | None = None,
                **spec: Any) -> GLAConfig:
    """`cfg` with `layers` (default: every attention layer) turned into window_linear layers;
    `spec` holds the other window_linear keys (feature_map, feature_dim, gate, mix)."""
    attn = dict(cfg.attn or {})
    chosen = list(attn.get("layers", [])) if layers is None else list(layers)
    attn["layers"] = [i for i in attn.get("layers", []) if i not in chosen]
    d = cfg.to_dict()
    d.update(attn=attn, window_linear={"layers": chosen, "window": window, **spec})
    return GLAConfig.from_dict(d, source="twin config")


def linearize(parent: GLAForCausalLM, window: int = 64, layers: list[int] | None = None,
              **spec: Any) -> GLAForCausalLM:
    """The twin of `parent`: every parent weight copied, the new feature maps, gates and mixes
    at their initial values."""
    cfg = twin_config(parent.config, window, layers, **spec)
    twin = GLAForCausalLM(cfg).to(parent.lm_head.weight.dtype)
    missing, unexpected = twin.load_state_dict(parent.state_dict(), strict=False)
    new = {n for n, _ in twin.named_parameters()} - set(parent.state_dict())
    if unexpected or set(missing) - new:
        raise ValueError(f"parent weights do not fit the twin: missing {sorted(set(missing) - new)}, "
                         f"unexpected {unexpected}")
    return twin.eval()
