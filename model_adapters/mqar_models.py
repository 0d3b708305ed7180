"""The MQAR mixer twins trained here by `evalkit train-mqar` (configs/train_mqar.yaml): names
that need no path, weights as package data under model_adapters/mqar/<name>/.

Each is Zoology's two-layer model (a gated short convolution, then the mixer under test, no
MLP) over the 8,192-symbol MQAR tokenizer. A name whose checkpoint is not trained yet fails
to load with the command that trains it. The trained length comes from the checkpoint's
config.json (`trained_length`), so results beyond it can be marked: a built twin without one
is an error (the board would silently mark nothing).
"""
from __future__ import annotations

from pathlib import Path

from evalkit.model_adapters.facts import config_facts
from evalkit.model_adapters.gla.adapter import GLAAdapter, shipped_gla
from evalkit.model_adapters.models import register_model

MQAR_DIR = Path(__file__).resolve().parent / "mqar"
# name: (state kind, description)
MQAR_MODELS = {
    "mqar-attn-d64": ("kv", "MQAR twin: softmax attention, width 64"),
    "mqar-attn-d128": ("kv", "MQAR twin: softmax attention, width 128"),
    "mqar-gla-d32": ("recurrent", "MQAR twin: GLA, width 32 (1.4 kB state)"),
    "mqar-gla-d64": ("recurrent", "MQAR twin: GLA, width 64 (4.9 kB state, Based's point)"),
    "mqar-gla-d128": ("recurrent", "MQAR twin: GLA, width 128 (17.9 kB state, Based's point)"),
    "mqar-gla-d256": ("recurrent", "MQAR twin: GLA, width 256 (68.6 kB state, Based's point)"),
    "mqar-swa-w16-d64": ("kv-window", "MQAR twin: sliding-window attention of 16 tokens, width 64"),
    "mqar-swa-w64-d64": ("kv-window", "MQAR twin: sliding-window attention of 64 tokens, width 64"),
    "mqar-swa-w256-d64": ("kv-window", "MQAR twin: sliding-window attention of 256 tokens, width 64"),
}
TRAIN = "evalkit train-mqar --config configs/train_mqar.yaml --only {name} (make train-capacity)"


def _shipped(name: str):
    return shipped_gla(name, MQAR_DIR / name, "model.safetensors", TRAIN.format(name=name),
                       __name__)


def _factory(name: str):
    return _shipped(name)[0]


def _describe(name: str):
    shipped = _shipped(name)[1]

    def describe(n_tokens: int) -> dict:
        row = shipped(n_tokens)
        if "note" not in row:  # built
            config_facts(MQAR_DIR / name / "config.json").required_trained_length()
        return row
    return describe


def _mqar(name: str) -> dict:
    """register_model's arguments for a twin, from its MQAR_MODELS row."""
    kind, description = MQAR_MODELS[name]
    return {"kind": "gla", "state_kind": kind, "description": description, "options": GLAAdapter,
            "config": MQAR_DIR / name / "config.json", "describe": _describe(name)}


register_model("mqar-attn-d64", **_mqar("mqar-attn-d64"))(_factory("mqar-attn-d64"))
register_model("mqar-attn-d128", **_mqar("mqar-attn-d128"))(_factory("mqar-attn-d128"))
register_model("mqar-gla-d32", **_mqar("mqar-gla-d32"))(_factory("mqar-gla-d32"))
register_model("mqar-gla-d64", **_mqar("mqar-gla-d64"))(_factory("mqar-gla-d64"))
register_model("mqar-gla-d128", **_mqar("mqar-gla-d128"))(_factory("mqar-gla-d128"))
register_model("mqar-gla-d256", **_mqar("mqar-gla-d256"))(_factory("mqar-gla-d256"))
register_model("mqar-swa-w16-d64", **_mqar("mqar-swa-w16-d64"))(_factory("mqar-swa-w16-d64"))
register_model("mqar-swa-w64-d64", **_mqar("mqar-swa-w64-d64"))(_factory("mqar-swa-w64-d64"))
register_model("mqar-swa-w256-d64", **_mqar("mqar-swa-w256-d64"))(_factory("mqar-swa-w256-d64"))
