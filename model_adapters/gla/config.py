"""GLAConfig: flash-linear-attention's GLA config.json, read as a validated dataclass.

Typed fields follow fla's `GLAConfig` (fla/models/gla/configuration_gla.py) with the same
defaults; every other key (model_type, architectures, torch_dtype, use_gk, fuse_* flags, ...)
is kept in `extra` and written back unchanged. The analytic helpers (`param_count`,
`state_bytes`, `kv_bytes`) need no weights, so the figures of a 3B config come for free.
"""
from __future__ import annotations

import dataclasses
import hashlib
import json
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from evalkit.model_adapters.dtypes import parse_dtype


# The typed subset; field types are checked on load (int fields reject floats and bools).
@dataclass
class GLAConfig:
    vocab_size: int = 32000
    hidden_size: int = 2048
    expand_k: float = 0.5
    expand_v: float = 1.0
    hidden_ratio: int | None = 4
    intermediate_size: int | None = None
    num_hidden_layers: int = 24
    num_heads: int = 4
    num_kv_heads: int | None = None
    feature_map: str | None = None
    attn_mode: str = "chunk"
    use_short_conv: bool = False
    conv_size: int = 4
    use_output_gate: bool = True
    clamp_min: float | None = None
    hidden_act: str = "swish"
    max_position_embeddings: int = 2048
    elementwise_affine: bool | None = True
    norm_eps: float = 1e-6
    attn: dict | None = None
    pad_token_id: int | None = None
    bos_token_id: int | None = 1
    eos_token_id: int | None = 2
    tie_word_embeddings: bool = False
    initializer_range: float = 0.02
    fuse_norm: bool = True
    # GatedLinearAttention's own defaults; fla's GLAConfig does not expose them, we honour them
    # if a config.json sets them.
    gate_logit_normalizer: float = 16
    gate_low_rank_dim: int = 16
    extra: dict[str, Any] = field(default_factory=dict)

    # -- reading / writing ---------------------------------------------------------------
    @classmethod
    def from_dict(cls, d: dict[str, Any], source: str = "config") -> "GLAConfig":
        d = dict(d)
        if "norm_eps" not in d and "rms_norm_eps" in d:  # older fla configs
            d["norm_eps"] = d.pop("rms_norm_eps")
        model_type = d.pop("model_type", "gla")
        if model_type != "gla":
            raise ValueError(f"{source}: model_type is {model_type!r}, expected 'gla'")
        if d.get("architectures") == ["GLAForCausalLM"]:
            d.pop("architectures")  # written back by to_dict
        typed = {f.name: f for f in dataclasses.fields(cls) if f.name != "extra"}
        kwargs: dict[str, Any] = {}
        extra = dict(d.pop("extra", {}) or {})
        errors = []
        for key, value in d.items():
            if key in typed:
                err = _check_type(key, value, typed[key].type)
                if err:
                    errors.append(err)
                kwargs[key] = float(value) if typed[key].type.startswith("float") and \
                    isinstance(value, int) and not isinstance(value, bool) else value
            else:
                extra[key] = value
        if errors:
            raise ValueError(f"{source}: invalid field(s): " + "; ".join(errors))
        cfg = cls(**kwargs, extra=extra)
        cfg.validate(source)
        return cfg

    @classmethod
    def from_json(cls, path: str | os.PathLike) -> "GLAConfig":
        p = Path(path)
        if p.is_dir():
            p = p / "config.json"
        if not p.is_file():
            raise FileNotFoundError(f"GLA config {str(p)!r} not found (expected a config.json)")
        try:
            d = json.loads(p.read_text())
        except ValueError as e:  # JSONDecodeError, UnicodeDecodeError
            raise ValueError(f"{p}: not valid JSON ({e})") from e
        if not isinstance(d, dict):
            raise ValueError(f"{p}: expected a JSON object")
        return cls.from_dict(d, source=str(p))

    def to_dict(self) -> dict[str, Any]:
        d = {"model_type": "gla", "architectures": ["GLAForCausalLM"]}
        d.update(self.extra)
        d.update({f.name: getattr(self, f.name) for f in dataclasses.fields(self) if f.name != "extra"})
        return d

    def save(self, folder: str | os.PathLike) -> Path:
        p = Path(folder) / "config.json"
        p.write_text(json.dumps(self.to_dict(), indent=2, sort_keys=True) + "\n")
        return p

    def config_hash(self) -> str:
        """SHA-256 of the fields that change the computation (not names or bookkeeping)."""
        d = {f.name: getattr(self, f.name) for f in dataclasses.fields(self) if f.name != "extra"}
        return hashlib.sha256(json.dumps(d, sort_keys=True).encode()).hexdigest()

    def validate(self, source: str = "config") -> None:
        errs = []
        for name in ("vocab_size", "hidden_size", "num_hidden_layers", "num_heads", "conv_size",
                     "gate_low_rank_dim"):
            if getattr(self, name) < 1:
                errs.append(f"{name} must be >= 1, got {getattr(self, name)}")
        if errs:
            raise ValueError(f"{source}: " + "; ".join(errs))
        if self.key_dim % self.num_heads or self.value_dim % self.num_heads:
            errs.append(f"key dim {self.key_dim} (hidden_size*expand_k) and value dim "
                        f"{self.value_dim} (hidden_size*expand_v) must be divisible by "
                        f"num_heads={self.num_heads}")
        if self.num_heads % self.kv_heads:
            errs.append(f"num_heads={self.num_heads} must be a multiple of num_kv_heads={self.kv_heads}")
        if self.hidden_act != "swish":
            errs.append(f"hidden_act {self.hidden_act!r} unsupported (fla's GatedMLP takes only 'swish')")
        if self.feature_map is not None:
            errs.append(f"feature_map {self.feature_map!r} unsupported (only None)")
        if self.attn is not None:
            errs.append("attn (hybrid softmax-attention layers) is not supported")
        if self.use_short_conv and self.extra.get("share_conv_kernel") is True:
            # Old fla (early 2024) with one shared convolution on the hidden state.
            errs.append("share_conv_kernel=true with use_short_conv (one convolution on the hidden "
                        "state, early fla) is not supported; only separate q/k/v convolutions")
        if self.attn_mode not in ("chunk", "fused_chunk", "fused_recurrent"):
            errs.append(f"attn_mode {self.attn_mode!r} is not one of chunk, fused_chunk, fused_recurrent")
        if self.pad_token_id is not None and not 0 <= self.pad_token_id < self.vocab_size:
            errs.append(f"pad_token_id {self.pad_token_id} outside the vocabulary [0, {self.vocab_size})")
        if errs:
            raise ValueError(f"{source}: " + "; ".join(errs))

    # -- derived sizes (fla's rules) ------------------------------------------------------
    @property
    def key_dim(self) -> int:
        return int(self.hidden_size * self.expand_k)

    @property
    def value_dim(self) -> int:
        return int(self.hidden_size * self.expand_v)

    @property
    def kv_heads(self) -> int:
        return self.num_kv_heads if self.num_kv_heads is not None else self.num_heads

    @property
    def kv_groups(self) -> int:
        return self.num_heads // self.kv_heads

    @property
    def head_k_dim(self) -> int:
        return self.key_dim // self.num_heads

    @property
    def head_v_dim(self) -> int:
        return self.value_dim // self.num_heads

    @property
    def key_dim_per_group(self) -> int:  # width of k_proj / gk_proj output
        return self.key_dim // self.kv_groups

    @property
    def value_dim_per_group(self) -> int:  # width of v_proj output
        return self.value_dim // self.kv_groups

    @property
    def mlp_intermediate_size(self) -> int:
        # fla's GatedMLP: 2/3 * hidden * ratio, rounded up to a multiple of 256.
        if self.intermediate_size is not None:
            return self.intermediate_size
        ratio = 4 if self.hidden_ratio is None else self.hidden_ratio
        i = int(self.hidden_size * ratio * 2 / 3)
        return 256 * ((i + 255) // 256)

    @property
    def fused_gate_norm(self) -> bool:
        """True when fla names the output norm `g_norm_swish_gate` (else `g_norm`)."""
        return self.hidden_act == "swish" and self.fuse_norm and self.use_output_gate

    @property
    def conv_channels(self) -> int:
        """Channels with a short-convolution tail: q, k, v widths (0 without short conv)."""
        if not self.use_short_conv:
            return 0
        return self.key_dim + self.key_dim_per_group + self.value_dim_per_group

    # -- analytic figures -----------------------------------------------------------------
    def param_count(self) -> int:
        h, L, V = self.hidden_size, self.num_hidden_layers, self.vocab_size
        dk, dkg, dvg, dv = self.key_dim, self.key_dim_per_group, self.value_dim_per_group, self.value_dim
        r = self.gate_low_rank_dim
        attn = h * dk + h * dkg + h * dvg + dv * h          # q, k, v, o
        attn += h * dv if self.use_output_gate else 0        # g
        attn += h * r + r * dkg + dkg                        # low-rank gate with bias
        attn += self.conv_size * self.conv_channels          # depthwise conv kernels
        attn += self.head_v_dim if self.elementwise_affine else 0  # per-head output norm
        mlp = 3 * h * self.mlp_intermediate_size
        per_layer = attn + mlp + 2 * h                       # + attn_norm, mlp_norm
        emb = V * h
        return emb + L * per_layer + h + (0 if self.tie_word_embeddings else V * h)

    def state_shapes(self) -> dict[str, tuple[int, ...]]:
        """Per-sequence, per-layer state tensors (batch dimension left out)."""
        shapes = {"recurrent": (self.num_heads, self.head_k_dim, self.head_v_dim)}
        if self.use_short_conv:
            shapes.update(q_conv=(self.key_dim, self.conv_size),
                          k_conv=(self.key_dim_per_group, self.conv_size),
                          v_conv=(self.value_dim_per_group, self.conv_size))
        return shapes

    def state_bytes(self, dtype: str | torch.dtype = torch.float32) -> int:
        """Bytes of one sequence's state: per layer H*d_k*d_v plus the conv tails (conv_size
        positions per q/k/v channel, fla's cache convention)."""
        size = parse_dtype(dtype).itemsize
        per_layer = self.num_heads * self.head_k_dim * self.head_v_dim + self.conv_size * self.conv_channels
        return self.num_hidden_layers * per_layer * size

    def kv_bytes(self, context: int, dtype: str | torch.dtype = torch.bfloat16) -> int:
        """KV cache of a softmax model of the same width and depth at `context` tokens."""
        return 2 * self.num_hidden_layers * self.hidden_size * context * parse_dtype(dtype).itemsize


def _check_type(key: str, value: Any, type_str: str) -> str | None:
    optional = "None" in type_str
    base = type_str.replace(" | None", "").strip()
    if value is None:
        return None if optional else f"{key} must not be null"
    ok = {
        "int": isinstance(value, int) and not isinstance(value, bool),
        "float": isinstance(value, (int, float)) and not isinstance(value, bool),
        "bool": isinstance(value, bool),
        "str": isinstance(value, str),
        "dict": isinstance(value, dict),
    }.get(base, True)
    return None if ok else f"{key} must be {type_str}, got {value!r}"
