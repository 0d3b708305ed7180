"""What a model's config says about it, read in one place: its trained length, its positional
range, its parameters, the bytes one sequence's state holds after T tokens, the KV cache of a
softmax model of the same width and depth, and its mixers' FLOPs a token.

One reader per family, each returning ModelFacts:

    gla_facts(cfg, source)   evalkit's GLA configs (model_type "gla", or none): Laplace, the tiny
                             GLA, the MQAR twins, the linearized twins
    hf_facts(config)         any transformers config: softmax, recurrent or hybrid
    config_facts(path)       a config.json (or a folder holding one), routed to one of the two

The registry's describe functions, the in-process adapters, `evalkit state`, `evalkit cost`
and the served adapter all read a model through these, so a model reports one trained length
and one state wherever it is looked at.

The trained length: the first of TRAINED_LENGTH_KEYS a config sets, in this order:

    trained_length            written by evalkit's own training (train-tiny, train-mqar): the
                              longest sequence the model was trained on, exact. First because
                              nothing else is as direct, and a recurrent model has no other
                              (a state has no positional range).
    max_position_embeddings   \\
    n_positions                | a transformers model's positional range, under the names its
    max_sequence_length        | families give it (most decoders; GPT-2; some remote-code
    seq_length                /  models; ChatGLM and Qwen's remote code): the longest sequence
                                 it was trained to place, so the best a config says of its
                                 training. These four are POSITION_KEYS, also `max_length`,
                                 past which a softmax model cannot run at all.

A GLA config reads `trained_length` alone: fla writes max_position_embeddings (2048 by
default) into every GLA config whether or not the model ever saw such a length, and a GLA has
no positions to range over. Its `max_length` is evalkit's own `evalkit_max_length` (none: a
recurrent model runs at any length). evalkit's own keys must hold a positive integer (else an
error naming the file); a transformers key holding anything else (0 or -1 in some configs for
"no positions") counts as unset, as transformers' own reading does not check it either.
"""
from __future__ import annotations

import copy
import json
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Sequence

import torch

from evalkit.model_adapters.dtypes import parse_dtype
from evalkit.model_adapters.state_kind import StateBytes

POSITION_KEYS = ("max_position_embeddings", "n_positions", "max_sequence_length", "seq_length")
TRAINED_LENGTH_KEYS = ("trained_length",) + POSITION_KEYS
GLA_TRAINED_LENGTH_KEYS = ("trained_length",)
GLA_MAX_LENGTH_KEYS = ("evalkit_max_length",)


@dataclass(frozen=True)
class ModelFacts:
    """A model as its config describes it. Parameters, state and FLOPs are functions: counting
    a transformers model's parameters builds it on the meta device, which only some readers
    need."""
    source: str                 # the config file read (or the config object's name)
    family: str                 # its model_type ("gla" for evalkit's GLA configs)
    trained_length: int | None  # see the module doc: None where the config records none
    max_length: int | None      # positional range: a prompt past it is flagged over-length
    layers: int
    hidden: int
    length_keys: Sequence[str]  # the keys tried for the trained length, in order
    count_parameters: Callable[[], int] = field(repr=False, compare=False)
    state: Callable[[int, torch.dtype], StateBytes] = field(repr=False, compare=False)
    # mixer FLOPs of the token at position t (0-based), summed over layers (evalkit cost)
    mixer_flops: Callable[[int], float] = field(repr=False, compare=False)

    def parameters(self) -> int:
        return self.count_parameters()

    def state_at(self, n_tokens: int, dtype: str | torch.dtype) -> StateBytes:
        """The bytes one sequence's state holds after `n_tokens` tokens, by part."""
        return self.state(n_tokens, parse_dtype(dtype))

    def softmax_kv_bytes(self, n_tokens: int, dtype: str | torch.dtype) -> int:
        """The KV cache of a softmax model of the same width and depth after `n_tokens`: a key
        and a value of `hidden` each per token per layer (what `evalkit state` compares with)."""
        return 2 * self.layers * self.hidden * n_tokens * parse_dtype(dtype).itemsize

    def required_trained_length(self) -> int:
        """The trained length, where a caller cannot do without one."""
        if self.trained_length is None:
            raise ValueError(f"{self.source}: no trained length: none of "
                             f"{', '.join(self.length_keys)} is set (evalkit's training writes "
                             f"trained_length; add it to the config)")
        return self.trained_length


def first_length(get: Callable[[str], Any], keys: Sequence[str], source: str,
                 *, checked: Sequence[str] = ("trained_length", "evalkit_max_length")
                 ) -> int | None:
    """The first of `keys` set to a number of tokens (None: none is). `get(key)` is the value
    or None. Keys in `checked` are evalkit's: anything but a positive integer there is an
    error naming `source`; transformers' keys holding anything else count as unset."""
    for key in keys:
        value = get(key)
        if value is None:
            continue
        ok = isinstance(value, int) and not isinstance(value, bool) and value > 0
        if ok:
            return value
        if key in checked:
            raise ValueError(f"{source}: {key} must be a positive integer number of tokens, "
                             f"got {value!r}")
    return None


# -- evalkit's GLA configs -----------------------------------------------------------------
def gla_facts(cfg: Any, source: str | os.PathLike) -> ModelFacts:
    """The facts of a GLAConfig read from `source` (its unknown keys are in cfg.extra)."""
    src = str(source)
    a = cfg.attn_spec if "attn" in cfg.mixers else None
    n_gla, n_attn = cfg.mixers.count("gla"), cfg.mixers.count("attn")
    gla_per_token = 4.0 * cfg.num_heads * cfg.head_k_dim * cfg.head_v_dim

    def mixer_flops(t: int) -> float:
        # a GLA layer updates and reads an H x K x V state; an attention layer (heads x head dim
        # = hidden) reads every key in its span; the gated convolutions and window_linear
        # layers are left out (as they always were in evalkit cost)
        f = n_gla * gla_per_token
        if a is not None:
            span = t + 1 if a["window_size"] is None else min(t + 1, a["window_size"])
            f += n_attn * 4.0 * cfg.hidden_size * span
        return f

    return ModelFacts(
        source=src, family="gla",
        trained_length=first_length(cfg.extra.get, GLA_TRAINED_LENGTH_KEYS, src),
        max_length=first_length(cfg.extra.get, GLA_MAX_LENGTH_KEYS, src),
        layers=cfg.num_hidden_layers, hidden=cfg.hidden_size,
        length_keys=GLA_TRAINED_LENGTH_KEYS, count_parameters=cfg.param_count,
        state=lambda n, dt: cfg.state_parts(n, dt), mixer_flops=mixer_flops)


# -- transformers configs ------------------------------------------------------------------
def hf_facts(config: Any, *, source: str | os.PathLike | None = None,
             trust_remote_code: bool = False) -> ModelFacts:
    """The facts of a transformers config: the positional keys from its text decoder's config
    (where a multimodal config keeps them), `trained_length` from the config itself (where
    evalkit writes it; transformers keeps unknown keys as attributes)."""
    from evalkit.model_adapters.recurrent.formula import config_state_at

    text = config.get_text_config(decoder=True) if hasattr(config, "get_text_config") else config
    src = str(source or getattr(config, "_name_or_path", "") or type(config).__name__)

    def get(key: str) -> Any:
        return getattr(config if key == "trained_length" else text, key, None)

    def mixer_flops(t: int) -> float:
        # every attention layer reads every earlier key (sliding layers too: an upper bound);
        # read when asked, as a recurrent config has no attention heads
        heads = text.num_attention_heads
        head_dim = getattr(text, "head_dim", None) or text.hidden_size // heads
        return attention_layers(text) * 4.0 * heads * head_dim * (t + 1)

    return ModelFacts(
        source=src, family=text.model_type,
        trained_length=first_length(get, TRAINED_LENGTH_KEYS, src),
        max_length=first_length(get, POSITION_KEYS, src),
        layers=getattr(text, "num_hidden_layers", None), hidden=getattr(text, "hidden_size", None),
        length_keys=TRAINED_LENGTH_KEYS,
        count_parameters=lambda: _meta_parameters(config, trust_remote_code),
        state=lambda n, dt: config_state_at(config, n, dt), mixer_flops=mixer_flops)


def attention_layers(text: Any) -> int:
    """Attention layers of a transformers text config: its full and sliding layers where it
    lists layer types, else every layer."""
    types = getattr(text, "layer_types", None)
    if types:
        return sum(t in ("full_attention", "sliding_attention") for t in types)
    return text.num_hidden_layers


def _meta_parameters(config: Any, trust_remote_code: bool) -> int:
    """Parameters of the model a config builds, on the meta device (no weight allocated)."""
    from transformers import AutoModelForCausalLM

    if hasattr(config, "quantization_config"):  # GGUF configs carry it; count the dequantised
        config = copy.copy(config)
        del config.quantization_config
    with torch.device("meta"):
        model = AutoModelForCausalLM.from_config(config, trust_remote_code=trust_remote_code)
    return model.num_parameters()


# -- a config file ---------------------------------------------------------------------------
def read_config(path: str | os.PathLike) -> Any:
    """The config object of a config.json (or a folder holding one): a GLAConfig where
    model_type is "gla" or missing (fla's own configs may leave it out), else transformers'."""
    p = Path(path).expanduser()
    if p.is_dir():
        p = p / "config.json"
    try:
        raw = json.loads(p.read_text())
    except OSError as e:
        raise FileNotFoundError(f"{p}: no readable config ({e.strerror or e})") from None
    except ValueError as e:
        raise ValueError(f"{p}: not valid JSON ({e})") from None
    if not isinstance(raw, dict):
        raise ValueError(f"{p}: expected a JSON object")
    if raw.get("model_type", "gla") == "gla":
        from evalkit.model_adapters.gla.config import GLAConfig

        return GLAConfig.from_json(p)
    from transformers import AutoConfig

    return AutoConfig.from_pretrained(str(p), local_files_only=True)


def facts_of(config: Any, source: str | os.PathLike | None = None) -> ModelFacts:
    """The facts of a config object: a GLAConfig or a transformers config."""
    from evalkit.model_adapters.gla.config import GLAConfig

    if isinstance(config, GLAConfig):
        return gla_facts(config, source or "GLAConfig")
    return hf_facts(config, source=source)


def config_facts(path: str | os.PathLike) -> ModelFacts:
    """The facts of a config.json, or of a folder holding one."""
    p = Path(path).expanduser()
    p = p / "config.json" if p.is_dir() else p
    return facts_of(read_config(p), p)
