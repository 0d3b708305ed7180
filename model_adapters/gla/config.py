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
from evalkit.model_adapters.gla import window_linear_config as wlc
from evalkit.model_adapters.state_kind import StateBytes


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
    # Ours, for mixer twins (Zoology's MQAR models): layers whose mixer is a gated short
    # convolution ({"layers": [0], "kernel_size": 3}) and whether blocks carry an MLP.
    gated_conv: dict | None = None
    # Ours, for linearized twins (LoLCATs): layers whose mixer is softmax attention over the
    # last `window` tokens plus a gated linear state over older ones (window_linear.py); their
    # heads, projections and rotary come from `attn`.
    window_linear: dict | None = None
    use_mlp: bool = True
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
        d.update(self._typed())
        return d

    def save(self, folder: str | os.PathLike) -> Path:
        p = Path(folder) / "config.json"
        p.write_text(json.dumps(self.to_dict(), indent=2, sort_keys=True) + "\n")
        return p

    def config_hash(self) -> str:
        """SHA-256 of the fields that change the computation (not names or bookkeeping)."""
        return hashlib.sha256(json.dumps(self._typed(), sort_keys=True).encode()).hexdigest()

    def _typed(self) -> dict[str, Any]:
        # window_linear came later: left out when unset, so older configs keep their hash (MQAR
        # recipe hashes and runner cache keys depend on it) and their config.json
        return {f.name: getattr(self, f.name) for f in dataclasses.fields(self)
                if f.name != "extra" and not (f.name == "window_linear" and self.window_linear is None)}

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
        errs += self._mixer_errors()
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

    # -- per-layer mixers (fla's hybrid `attn` key, our `gated_conv`) ----------------------
    def _mixer_errors(self) -> list[str]:
        errs = []
        for key, known, required in (("attn", ATTN_KEYS, ("layers", "num_heads")),
                                     ("gated_conv", CONV_KEYS, ("layers",)),
                                     ("window_linear", wlc.WINDOW_LINEAR_KEYS, ("layers", "window"))):
            spec = getattr(self, key)
            if spec is None:
                continue
            if not isinstance(spec, dict):
                errs.append(f"{key} must be a mapping, got {spec!r}")
                continue
            errs += [f"{key}.{k} is not a known key (expected one of {', '.join(known)})"
                     for k in spec if k not in known]
            errs += [f"{key}.{k} is required" for k in required if k not in spec]
            layers = spec.get("layers", [])
            if not isinstance(layers, list) or not all(
                    isinstance(i, int) and not isinstance(i, bool) and 0 <= i < self.num_hidden_layers
                    for i in layers):
                errs.append(f"{key}.layers must be a list of layer indices in "
                            f"[0, {self.num_hidden_layers}), got {layers!r}")
        if errs:
            return errs
        for a, b in (("attn", "gated_conv"), ("attn", "window_linear"), ("gated_conv", "window_linear")):
            both = set(self._layers(a)) & set(self._layers(b))
            if both:
                errs.append(f"layer(s) {sorted(both)} are in both {a}.layers and {b}.layers")
        if self.attn is not None:
            a = self.attn_spec
            if a["num_heads"] < 1 or self.hidden_size % a["num_heads"]:
                errs.append(f"attn.num_heads={a['num_heads']} must divide hidden_size={self.hidden_size}")
            elif a["num_kv_heads"] < 1 or a["num_heads"] % a["num_kv_heads"]:
                errs.append(f"attn.num_kv_heads={a['num_kv_heads']} must divide "
                            f"attn.num_heads={a['num_heads']}")
            w = a["window_size"]
            if w is not None and (isinstance(w, bool) or not isinstance(w, int) or w < 1):
                errs.append(f"attn.window_size must be null or a positive integer, got {w!r}")
            err = wlc.sinks_error("attn", a["sinks"], w)
            if err:
                errs.append(err)
            theta = a["rope_theta"]
            if theta is not None and (isinstance(theta, bool) or not isinstance(theta, (int, float))
                                      or not theta > 0):
                errs.append(f"attn.rope_theta must be a positive number, or null for no rotary "
                            f"embedding, got {theta!r}")
        if self.gated_conv is not None:
            k = self.gated_conv.get("kernel_size", 3)
            if isinstance(k, bool) or not isinstance(k, int) or not 1 <= k <= 64:
                errs.append(f"gated_conv.kernel_size must be an integer in [1, 64], got {k!r}")
        if self.window_linear is not None:
            errs += wlc.errors(self.window_linear, self.attn is not None)
        return errs

    def _layers(self, key: str) -> list[int]:
        spec = getattr(self, key)
        return list(spec.get("layers", [])) if isinstance(spec, dict) else []

    @property
    def attn_spec(self) -> dict[str, Any]:
        """fla's hybrid attention settings with fla's defaults filled in. rope_theta null (ours)
        means no positional encoding, as Zoology's attention: the convolution before it gives
        each token its neighbours, and recall then generalises past the trained length."""
        a = dict(self.attn or {})
        a.setdefault("num_kv_heads", a.get("num_heads"))
        a.setdefault("qkv_bias", False)
        a.setdefault("window_size", None)
        a.setdefault("sinks", 0)
        a.setdefault("rope_theta", 10000.0)
        return a

    @property
    def window_linear_spec(self) -> dict[str, Any]:
        """The twin layers' settings with defaults filled in (window_linear_config.spec)."""
        return wlc.spec(self.window_linear)

    @property
    def window_linear_features(self) -> int:
        """Features per head of the twin layers' state (window_linear_config.features)."""
        return wlc.features(self.window_linear, self.hidden_size // self.attn_spec["num_heads"])

    @property
    def sinks(self) -> int:
        """Tokens at the start kept exact beside a window (attention sinks); 0 without."""
        if self.window_linear is not None:
            return int(self.window_linear_spec["sinks"])
        return int(self.attn_spec["sinks"]) if self.attn is not None else 0

    @property
    def window(self) -> int | None:
        """Tokens seen exactly before older ones are compressed (window_linear) or dropped
        (attn.window_size); None when no layer has a window."""
        if self.window_linear is not None:
            return int(self.window_linear["window"])
        return self.attn_spec["window_size"] if self.attn is not None else None

    def mixer(self, layer: int) -> str:
        """"attn", "gated_conv", "window_linear" or "gla": the sequence mixer of layer `layer`."""
        if layer in self._layers("attn"):
            return "attn"
        if layer in self._layers("gated_conv"):
            return "gated_conv"
        if layer in self._layers("window_linear"):
            return "window_linear"
        return "gla"

    @property
    def mixers(self) -> list[str]:
        return [self.mixer(i) for i in range(self.num_hidden_layers)]

    @property
    def gated_conv_kernel(self) -> int:
        return int((self.gated_conv or {}).get("kernel_size", 3))

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
        h, V = self.hidden_size, self.vocab_size
        total = V * h + h + (0 if self.tie_word_embeddings else V * h)   # embeddings, final norm
        for mixer in self.mixers:
            total += h + (3 * h * self.mlp_intermediate_size + h if self.use_mlp else 0)
            total += {"gla": self._gla_params, "attn": self._attn_params,
                      "gated_conv": self._conv_params,
                      "window_linear": self._window_linear_params}[mixer]()
        return total

    def _gla_params(self) -> int:
        h = self.hidden_size
        dk, dkg, dvg, dv = self.key_dim, self.key_dim_per_group, self.value_dim_per_group, self.value_dim
        r = self.gate_low_rank_dim
        n = h * dk + h * dkg + h * dvg + dv * h              # q, k, v, o
        n += h * dv if self.use_output_gate else 0            # g
        n += h * r + r * dkg + dkg                            # low-rank gate with bias
        n += self.conv_size * self.conv_channels              # depthwise conv kernels
        return n + (self.head_v_dim if self.elementwise_affine else 0)  # per-head output norm

    def _attn_params(self) -> int:
        a, h = self.attn_spec, self.hidden_size
        kv = a["num_kv_heads"] * (h // a["num_heads"])
        return 2 * h * h + 2 * h * kv + ((h + 2 * kv) if a["qkv_bias"] else 0)

    def _window_linear_params(self) -> int:
        return self._attn_params() + wlc.extra_params(self.window_linear, self.hidden_size,
                                                      self.attn_spec["num_heads"])

    def _conv_params(self) -> int:
        h = self.hidden_size
        return h * h + h + h * self.gated_conv_kernel          # projection (with bias), kernel

    def state_shapes(self) -> dict[str, tuple[int, ...]]:
        """Per-sequence state tensors of a GLA layer (batch dimension left out)."""
        shapes = {"recurrent": (self.num_heads, self.head_k_dim, self.head_v_dim)}
        if self.use_short_conv:
            shapes.update(q_conv=(self.key_dim, self.conv_size),
                          k_conv=(self.key_dim_per_group, self.conv_size),
                          v_conv=(self.value_dim_per_group, self.conv_size))
        return shapes

    def attn_kv_width(self) -> int:
        """Key (= value) width of an attention layer's cache: kv heads x head dim."""
        a = self.attn_spec
        return a["num_kv_heads"] * (self.hidden_size // a["num_heads"])

    def state_parts(self, context: int, dtype: str | torch.dtype = torch.float32) -> StateBytes:
        """One sequence's state after `context` tokens, split into fixed / window / growing:
        a GLA layer H*d_k*d_v plus its conv tails (conv_size positions per q/k/v channel,
        fla's cache convention), a gated convolution d*kernel, an attention layer 2*d_kv per
        cached token (min(context, window) with a window), a window_linear layer its window's
        K, V plus H*F*(d_v+1)."""
        size, parts = parse_dtype(dtype).itemsize, StateBytes()
        for mixer in self.mixers:
            if mixer == "gla":
                n = self.num_heads * self.head_k_dim * self.head_v_dim
                parts += StateBytes(fixed=(n + self.conv_size * self.conv_channels) * size,
                                    recurrent=True)
            elif mixer == "gated_conv":
                parts += StateBytes(fixed=self.hidden_size * self.gated_conv_kernel * size)
            elif mixer == "window_linear":
                # the fixed state (window_linear_config), the window's and the sinks' K, V
                fixed = wlc.fixed_state_values(self.window_linear, self.hidden_size,
                                               self.attn_spec["num_heads"]) * size
                kept = min(context, self.window_linear_spec["window"]) + min(context, self.sinks)
                parts += StateBytes(fixed=fixed, recurrent=True,
                                    window=2 * self.attn_kv_width() * kept * size)
            else:
                w = self.attn_spec["window_size"]
                if w is None:
                    parts += StateBytes(growing=2 * self.attn_kv_width() * context * size)
                else:  # sinks.py: the window and the first `sinks` tokens
                    kept = min(context, w) + min(context, self.attn_spec["sinks"])
                    parts += StateBytes(window=2 * self.attn_kv_width() * kept * size)
        return parts

    @property
    def state_kind(self) -> str:
        return self.state_parts(1).kind

    def state_bytes(self, dtype: str | torch.dtype = torch.float32, context: int | None = None) -> int:
        """Bytes of one sequence's state (see state_parts); `context` is needed only when a
        layer holds a KV cache."""
        if context is None:
            if {"attn", "window_linear"} & set(self.mixers):
                raise ValueError("state_bytes of a model with attention layers depends on the "
                                 "context length: pass context=")
            context = 1
        return self.state_parts(context, dtype).total


ATTN_KEYS = ("layers", "num_heads", "num_kv_heads", "qkv_bias", "window_size", "sinks",
             "rope_theta")
CONV_KEYS = ("layers", "kernel_size")


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
