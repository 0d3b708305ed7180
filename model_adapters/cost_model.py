"""The model a cost is measured on (evalkit.model_adapters.cost): a checkpoint's weights, or random weights
built from its config on the meta device and materialised in the target dtype parameter by
parameter (never a full fp32 copy); its shape for the FLOP count and the memory estimate, and
its state formula. One small interface over our GLA and transformers models.
"""
from __future__ import annotations

import os
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

import torch
import torch.nn as nn

from evalkit.model_adapters.dtypes import dtype_name, parse_dtype
from evalkit.model_adapters.random_weights import init_std, materialise_random
from evalkit.model_adapters.state_kind import StateBytes

SEGMENT = 2048          # tokens per prefill step (the GLA's prefill_segment: 16 chunks of 128)
DTYPES = ("fp32", "bf16")


class CostError(ValueError):
    """A request `measure_cost` refuses before allocating (bad size, dtype, or memory)."""

def check_dtype(dtype: str, flag: str = "--dtype") -> torch.dtype:
    try:
        dt = parse_dtype(dtype)
    except ValueError:
        raise CostError(f"{flag} must be one of {', '.join(DTYPES)}, got {dtype!r}") from None
    if dtype_name(dt) not in DTYPES:
        raise CostError(f"{flag} must be one of {', '.join(DTYPES)} (fp16 matmuls are not a "
                        f"CPU format), got {dtype!r}")
    return dt


# ---------------------------------------------------------------------------------------
# Models: one small interface over the GLA and transformers
# ---------------------------------------------------------------------------------------
@dataclass
class Shape:
    """What the FLOP count and the memory estimate need from a config."""
    hidden: int
    intermediate: int
    layers: int
    vocab: int
    mixer_flops_per_token: Callable[[int], float]  # summed over layers, at position t (0-based)
    state_formula: Callable[[int], StateBytes]     # one sequence after T tokens, as held
    mixer_width: int                               # widest per-token mixer tensor (q+k+v+g)
    kv_transient: Callable[[int], int]             # extra bytes a prefill step copies at T


@dataclass
class CostModel:
    name: str
    kind: str                  # "gla" | "hf"
    config: Any
    dtype: torch.dtype
    shape: Shape
    model: nn.Module           # on the meta device until materialise()
    weights: Path | None       # safetensors folder, or None for random weights
    build_seconds: float = 0.0
    _random: bool = field(default=True)

    # -- figures before allocating ---------------------------------------------------------
    def parameters(self) -> int:
        seen, n = set(), 0
        for p in self.model.parameters():
            if id(p) not in seen:
                seen.add(id(p))
                n += p.numel()
        return n

    def weight_bytes(self) -> int:
        return self.parameters() * torch.empty(0, dtype=self.dtype).element_size()

    def linear_weights(self) -> tuple[int, int]:
        """(weights of the linear layers applied to every token, those of the output head)."""
        head = self.output_head()
        body = sum(m.weight.numel() for m in self.model.modules()
                   if isinstance(m, nn.Linear) and m is not head)
        return body, head.weight.numel()

    def output_head(self) -> nn.Module:
        return self.model.lm_head

    def prefill_flops(self, T: int) -> float:
        body, head = self.linear_weights()
        mixer = sum(self.shape.mixer_flops_per_token(t) for t in _sample_positions(T))
        mixer *= T / len(_sample_positions(T))
        return 2.0 * body * T + 2.0 * head + mixer

    def need_bytes(self, T: int, segment: int) -> dict[str, int]:
        """Upper estimate of what measuring context T allocates beyond the weights."""
        s, sh = min(T, segment), self.shape
        fp32 = 4
        # per prefill step, one layer's live tensors (fp32 bound): residual + norms, the
        # mixer's projections and their fp32 copies, the MLP's three intermediate tensors
        act = s * fp32 * (6 * sh.hidden + 3 * sh.intermediate + 3 * sh.mixer_width)
        act += 2 * sh.vocab * fp32 + sh.kv_transient(T)
        state = self.shape.state_formula(T + 1).total  # + decode steps are counted below
        return {"state": state, "activations": act}

    # -- building ---------------------------------------------------------------------------
    def materialise(self, seed: int = 0) -> None:
        t0 = time.perf_counter()
        if self.weights is not None:
            self.model = _load_weights(self)
            self._random = False
        else:
            materialise_random(self.model, self.dtype, init_std(self.config), seed)
            if self.kind == "hf":
                self.model.tie_weights()
        self.model.eval()
        self.build_seconds = time.perf_counter() - t0

    # -- running ----------------------------------------------------------------------------
    def prefill(self, ids: torch.Tensor, segment: int, progress: Callable[[int], None]):
        """Stream ids [1, T]; returns (state, last logits [V])."""
        T = ids.shape[1]
        if self.kind == "gla":
            state, last = None, None
            for start in range(0, T, segment):
                piece = ids[:, start:start + segment]
                last, state = self.model.prefill(piece, state, segment=segment, consume=True)
                progress(piece.shape[1])
            return state, last[0]
        from evalkit.model_adapters.softmax import kv_cache

        cache = kv_cache.new_cache(self.model)
        kw = kv_cache.cache_kwarg(self.model)
        last = None
        for start in range(0, T, segment):
            piece = ids[:, start:start + segment]
            pos = torch.arange(start, start + piece.shape[1])[None]
            out = self.model(input_ids=piece, position_ids=pos, use_cache=True,
                             logits_to_keep=1, **{kw: cache})
            last = out.logits[0, -1].float()
            del out
            progress(piece.shape[1])
        return (cache, T), last

    def decode_step(self, token: int, state):
        if self.kind == "gla":
            logits, state = self.model.decode_step(torch.tensor([token]), state)
            return state, logits[0]
        from evalkit.model_adapters.softmax import kv_cache

        cache, pos = state
        out = self.model(input_ids=torch.tensor([[token]]), position_ids=torch.tensor([[pos]]),
                         use_cache=True, logits_to_keep=1,
                         **{kv_cache.cache_kwarg(self.model): cache})
        return (cache, pos + 1), out.logits[0, -1].float()

    def state_parts(self, state) -> tuple[StateBytes, int]:
        """(bytes held by part, number of elements) of the state after the prefill."""
        if self.kind == "gla":
            return state.parts(), sum(t.numel() for t in state.tensors()) // state.batch_size
        from evalkit.model_adapters.cache_state import cache_state, cache_tensors

        cache = state[0]
        return cache_state(cache), sum(t.numel() for t in cache_tensors(cache))


def _sample_positions(T: int) -> list[int]:
    """Positions at which the mixer's per-token FLOPs are summed (all, or 64 evenly spread:
    the terms are linear in t, so the mean of evenly spread samples is exact enough)."""
    if T <= 64:
        return list(range(T))
    return [round(i * (T - 1) / 63) for i in range(64)]


def _load_weights(cm: CostModel) -> nn.Module:
    if cm.kind == "gla":
        from evalkit.model_adapters.gla.checkpoint import load_checkpoint

        model, _ = load_checkpoint(cm.weights, device=torch.device("cpu"), dtype=cm.dtype)
        return model
    from transformers import AutoModelForCausalLM

    # use_safetensors=True: never unpickle .bin weights
    return AutoModelForCausalLM.from_pretrained(str(cm.weights), dtype=cm.dtype,
                                                use_safetensors=True, local_files_only=True)


# ---------------------------------------------------------------------------------------
# Resolving MODEL: registered name, name:PATH, folder or config.json; or a config object
# ---------------------------------------------------------------------------------------
def resolve_config(spec: str) -> tuple[Path, Path | None]:
    """(config.json, weights folder or None) for a model spec."""
    from evalkit.model_adapters.models import config_file

    try:
        cfg = config_file(spec)
    except FileNotFoundError:
        raise
    except ValueError as e:
        raise CostError(str(e)) from None
    # weights only from a folder (given, or as NAME:PATH), never beside a named config file
    given = Path(spec).expanduser()
    folder_given = given.is_dir() or (not given.exists() and ":" in spec
                                      and Path(spec.partition(":")[2]).expanduser().is_dir())
    folder = cfg.parent
    has_weights = folder_given and (any(folder.glob("*.safetensors"))
                                     or (folder / "model.safetensors.index.json").is_file())
    return cfg, (folder if has_weights else None)


def build_cost_model(spec: Any, dtype: str | torch.dtype = "bf16", *, name: str | None = None
                     ) -> CostModel:
    """A CostModel on the meta device (nothing allocated) for a spec string, a GLAConfig or a
    transformers config."""
    from evalkit.model_adapters.facts import read_config
    from evalkit.model_adapters.gla.config import GLAConfig

    dt = dtype if isinstance(dtype, torch.dtype) else check_dtype(dtype)
    weights = None
    if isinstance(spec, (str, os.PathLike)):
        cfg_path, weights = resolve_config(str(spec))
        name = name or str(spec)
        config = read_config(cfg_path)
    else:
        config, name = spec, name or type(spec).__name__
    if isinstance(config, GLAConfig):
        return _gla_cost_model(name, config, dt, weights)
    return _hf_cost_model(name, config, dt, weights)


def _empty_weights():
    from accelerate import init_empty_weights

    return init_empty_weights(include_buffers=False)  # buffers (rotary tables) computed for real


def _gla_cost_model(name: str, cfg, dt: torch.dtype, weights: Path | None) -> CostModel:
    from evalkit.model_adapters.facts import gla_facts
    from evalkit.model_adapters.gla.model import GLAForCausalLM
    from evalkit.model_adapters.gla.state import STATE_DTYPE

    with _empty_weights():
        model = GLAForCausalLM(cfg)
    model.to(dtype=dt)  # meta tensors: only their dtype changes
    model.set_ops(mode="chunk")
    facts = gla_facts(cfg, name)
    has_attn = "attn" in cfg.mixers
    shape = Shape(hidden=cfg.hidden_size, intermediate=cfg.mlp_intermediate_size if cfg.use_mlp else 0,
                  layers=cfg.num_hidden_layers, vocab=cfg.vocab_size,
                  mixer_flops_per_token=facts.mixer_flops,
                  # the state as the GLA holds it at run time: fp32 whatever the weights
                  state_formula=lambda T: facts.state_at(T, STATE_DTYPE),
                  mixer_width=2 * cfg.key_dim + 2 * cfg.value_dim,
                  kv_transient=lambda T: (4 * cfg.attn_kv_width() * T * 4 if has_attn else 0))
    return CostModel(name, "gla", cfg, dt, shape, model, weights)


def _hf_cost_model(name: str, config, dt: torch.dtype, weights: Path | None) -> CostModel:
    from transformers import AutoModelForCausalLM

    from evalkit.model_adapters.facts import hf_facts

    text = config.get_text_config(decoder=True)
    with _empty_weights():
        model = AutoModelForCausalLM.from_config(config, dtype=dt,
                                                 attn_implementation="sdpa")
    heads = text.num_attention_heads
    head_dim = getattr(text, "head_dim", None) or text.hidden_size // heads
    kv_heads = getattr(text, "num_key_value_heads", None) or heads
    size = torch.empty(0, dtype=dt).element_size()
    facts = hf_facts(config, source=name)

    shape = Shape(hidden=text.hidden_size, intermediate=getattr(text, "intermediate_size", 0) or 0,
                  layers=text.num_hidden_layers, vocab=text.vocab_size,
                  mixer_flops_per_token=facts.mixer_flops,
                  state_formula=lambda T: facts.state_at(T, dt),
                  mixer_width=(heads + 2 * kv_heads) * head_dim,
                  # a step concatenates one layer's K and V, and SDPA may expand them to every
                  # query head (repeat_kv) and build a [segment, T] mask
                  kv_transient=lambda T: (2 * (kv_heads + heads) * head_dim * T * size
                                          + SEGMENT * T * 4))
    cm = CostModel(name, "hf", config, dt, shape, model, weights)
    return cm

