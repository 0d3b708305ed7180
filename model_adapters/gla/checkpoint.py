"""fla-format GLA checkpoints: config.json + safetensors, under fla's tensor names.

Loading accepts the layouts fla has written over time and normalises them to ours:
- MLP: `mlp.gate_proj` [I, h] + `mlp.up_proj` [I, h], or the older fused `mlp.gate_proj`
  [2I, h] with no up_proj (first half gate, second half up);
- output norm: `attn.g_norm_swish_gate.weight` or `attn.g_norm.weight`;
- tied embeddings: `lm_head.weight` absent (or present and ignored);
- weights in one `model.safetensors` or shards listed in `model.safetensors.index.json`.
Every missing, unexpected or mis-shaped tensor is reported in one error.
"""
from __future__ import annotations

import os
from pathlib import Path
from typing import Iterable

import torch

from evalkit.model_adapters.dtypes import parse_dtype
from evalkit.model_adapters.gla.config import GLAConfig
from evalkit.model_adapters.gla.model import GLAForCausalLM
from evalkit.model_adapters.weights import check_floating, index_shards

WEIGHTS = "model.safetensors"
INDEX = "model.safetensors.index.json"


class CheckpointError(ValueError):
    pass


def expected_shapes(cfg: GLAConfig) -> dict[str, tuple[int, ...]]:
    """Our model's tensor names and shapes (fla's names, split MLP layout)."""
    with torch.device("meta"):
        model = GLAForCausalLM(cfg)
    shapes = {k: tuple(v.shape) for k, v in model.state_dict().items()}
    if cfg.tie_word_embeddings:
        shapes.pop("lm_head.weight")
    return shapes


def weight_files(folder: str | os.PathLike) -> list[Path]:
    folder = Path(folder)
    if (folder / INDEX).is_file():
        names = index_shards(folder / INDEX)
        missing = [n for n in names if not (folder / n).is_file()]
        if missing:
            raise CheckpointError(f"{folder / INDEX}: shard file(s) not found: {', '.join(missing)}")
        return [folder / n for n in names]
    if (folder / WEIGHTS).is_file():
        return [folder / WEIGHTS]
    other = sorted(p.name for p in folder.glob("*.bin")) + sorted(p.name for p in folder.glob("*.pt"))
    hint = (f"; found {', '.join(other)}: convert it to safetensors (evalkit reads safetensors only)"
            if other else "")
    raise CheckpointError(f"{folder}: no {WEIGHTS} or {INDEX}{hint}")


def read_tensors(files: Iterable[Path]) -> dict[str, torch.Tensor]:
    """Every tensor of the files; a truncated or corrupt file, or a non-floating tensor (every
    GLA weight is floating point), raises naming the file and tensor."""
    from safetensors.torch import load_file

    out: dict[str, torch.Tensor] = {}
    for p in files:
        check_floating(p)
        for k, v in load_file(str(p)).items():
            if k in out:
                raise CheckpointError(f"tensor {k!r} appears in more than one shard ({p.name})")
            out[k] = v
    return out


def normalize(tensors: dict[str, torch.Tensor], cfg: GLAConfig, source: str = "checkpoint"
              ) -> dict[str, torch.Tensor]:
    """Map fla's historical layouts onto ours and check names and shapes against `cfg`.
    Raises CheckpointError listing every missing, unexpected and mis-shaped tensor."""
    t = dict(tensors)
    I = cfg.mlp_intermediate_size
    for i in range(cfg.num_hidden_layers):
        p = f"model.layers.{i}."
        gate = t.get(p + "mlp.gate_proj.weight")
        if gate is not None and p + "mlp.up_proj.weight" not in t and gate.shape[0] == 2 * I:
            t[p + "mlp.gate_proj.weight"], t[p + "mlp.up_proj.weight"] = gate[:I], gate[I:]
        ours, theirs = ("g_norm_swish_gate", "g_norm") if cfg.fused_gate_norm else ("g_norm", "g_norm_swish_gate")
        if p + f"attn.{theirs}.weight" in t and p + f"attn.{ours}.weight" not in t:
            t[p + f"attn.{ours}.weight"] = t.pop(p + f"attn.{theirs}.weight")
    if cfg.tie_word_embeddings:
        t.pop("lm_head.weight", None)  # fla ties it to the embeddings on load
    want = expected_shapes(cfg)
    missing = sorted(set(want) - set(t), key=_natural)
    unexpected = sorted(set(t) - set(want), key=_natural)
    misshaped = [f"{k}: {tuple(t[k].shape)}, expected {want[k]}"
                 for k in sorted(set(want) & set(t), key=_natural) if tuple(t[k].shape) != want[k]]
    if missing or unexpected or misshaped:
        lines = [f"{source}: the weights do not match the config "
                 f"({cfg.num_hidden_layers} layers, hidden {cfg.hidden_size}, vocab {cfg.vocab_size})"]
        if missing:
            lines.append(f"missing ({len(missing)}): " + ", ".join(missing))
        if unexpected:
            lines.append(f"unexpected ({len(unexpected)}): " + ", ".join(unexpected))
        if misshaped:
            lines.append(f"wrong shape ({len(misshaped)}): " + "; ".join(misshaped))
        raise CheckpointError("\n  ".join(lines))
    return t


def _natural(name: str) -> list[tuple[int, int, str]]:
    """Sort key putting layers.2 before layers.10."""
    return [(0, int(s), "") if s.isdigit() else (1, 0, s) for s in name.split(".")]


def build_model(cfg: GLAConfig, state_dict: dict[str, torch.Tensor] | None = None,
                device: str | torch.device = "cpu", dtype: str | torch.dtype = torch.float32
                ) -> GLAForCausalLM:
    """A model with `state_dict`'s weights (already normalised), or fla-style random init."""
    dtype = parse_dtype(dtype)
    if state_dict is None:
        model = GLAForCausalLM(cfg).init_weights()
        return model.to(device=device, dtype=dtype)
    with torch.device("meta"):
        model = GLAForCausalLM(cfg)
    sd = {k: v.to(device=device, dtype=dtype) for k, v in state_dict.items()}
    if cfg.tie_word_embeddings:
        sd["lm_head.weight"] = sd["model.embeddings.weight"]
    model.load_state_dict(sd, strict=True, assign=True)
    if cfg.tie_word_embeddings:  # assign=True replaced the shared Parameter; tie again
        model.lm_head.weight = model.model.embeddings.weight
    return model


def load_checkpoint(folder: str | os.PathLike, device: str | torch.device = "cpu",
                    dtype: str | torch.dtype = torch.float32) -> tuple[GLAForCausalLM, GLAConfig]:
    """Load an fla-format GLA checkpoint folder (config.json + safetensors)."""
    folder = Path(folder).expanduser()
    if not folder.is_dir():
        raise FileNotFoundError(f"GLA checkpoint {str(folder)!r}: not a folder")
    cfg = GLAConfig.from_json(folder / "config.json")
    tensors = normalize(read_tensors(weight_files(folder)), cfg, source=str(folder))
    model = build_model(cfg, tensors, device=device, dtype=dtype)
    model.eval()
    return model, cfg


def random_model(config: str | os.PathLike, seed: int, device: str | torch.device = "cpu",
                 dtype: str | torch.dtype = torch.float32) -> tuple[GLAForCausalLM, GLAConfig]:
    """A GLA model of `config` (a config.json) with random weights from `seed`, built on the
    meta device and materialised parameter by parameter in `dtype` (model_adapters.random_weights)."""
    from evalkit.model_adapters.random_weights import init_std, materialise_random

    cfg = GLAConfig.from_json(Path(config).expanduser())
    with torch.device("meta"):
        model = GLAForCausalLM(cfg)
    materialise_random(model, parse_dtype(dtype), init_std(cfg), seed)
    model.to(device)
    model.eval()
    return model, cfg


def save_checkpoint(model: GLAForCausalLM, config: GLAConfig, folder: str | os.PathLike,
                    mlp_layout: str = "split", norm_name: str | None = None) -> Path:
    """Write config.json + model.safetensors in fla's names.

    mlp_layout="fused" writes the older layout (gate_proj [2I, h] = [gate; up], no up_proj);
    norm_name ("g_norm" or "g_norm_swish_gate") overrides the output-norm name the config implies."""
    from safetensors.torch import save_file

    if mlp_layout not in ("split", "fused"):
        raise ValueError(f"mlp_layout must be 'split' or 'fused', got {mlp_layout!r}")
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    sd = {k: v.detach().cpu().contiguous() for k, v in model.state_dict().items()}
    if config.tie_word_embeddings:
        sd.pop("lm_head.weight", None)  # shared with the embeddings; HF/fla omit it
    for i in range(config.num_hidden_layers):
        p = f"model.layers.{i}."
        if mlp_layout == "fused":
            sd[p + "mlp.gate_proj.weight"] = torch.cat([sd[p + "mlp.gate_proj.weight"],
                                                        sd.pop(p + "mlp.up_proj.weight")]).contiguous()
        if norm_name is not None:
            for old in ("g_norm", "g_norm_swish_gate"):
                if p + f"attn.{old}.weight" in sd and old != norm_name:
                    sd[p + f"attn.{norm_name}.weight"] = sd.pop(p + f"attn.{old}.weight")
    config.save(folder)
    path = folder / WEIGHTS
    save_file(sd, str(path), metadata={"format": "pt"})
    return path
