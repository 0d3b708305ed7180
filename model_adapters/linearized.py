"""SmolLM2-135M's linearized twins, built here by `evalkit linearize` (configs/linearize.yaml):
names that need no path, twin folders (gla/twin.py) as package data under
model_adapters/twins/<name>/, assembled at load time from the parent (the embedded
smollm2-135m) and the few tensors trained for them.

A name whose folder is not built yet fails to load with the command that builds it.
"""
from __future__ import annotations

from pathlib import Path

from evalkit.model_adapters.gla.twin import TWIN_FILE
from evalkit.model_adapters.gla.adapter import GLAAdapter, shipped_gla
from evalkit.model_adapters.models import register_model

TWINS_DIR = Path(__file__).resolve().parent / "twins"
# name: (state kind, description)
TWIN_MODELS = {
    # issue 40's family: 4 attention sinks beside the window, both training stages
    "smollm2-135m-swa-w64-s4": ("kv-window", "SmolLM2-135M with every layer's attention limited "
                                             "to its first 4 and last 64 tokens (untrained)"),
    "smollm2-135m-gla-w64-s4": ("hybrid", "SmolLM2-135M linearized: exact softmax over the first "
                                          "4 and last 64 tokens + a gated linear state beyond"),
    "smollm2-135m-gdn-w64-s4": ("hybrid", "SmolLM2-135M linearized: exact softmax over the first "
                                          "4 and last 64 tokens + a gated delta-rule state beyond"),
    "smollm2-135m-gdn-w64-s4-recall": ("hybrid", "smollm2-135m-gdn-w64-s4 trained further to "
                                                 "recall snippets copied past its window"),
}
BUILD = ("evalkit linearize smollm2-135m --recipe configs/linearize.yaml --only {name} "
         "(make train-twins)")


def _shipped(name: str):
    return shipped_gla(name, TWINS_DIR / name, TWIN_FILE, BUILD.format(name=name), __name__)


def _factory(name: str):
    return _shipped(name)[0]


def _twin(name: str) -> dict:
    """register_model's arguments for a twin, from its TWIN_MODELS row."""
    kind, description = TWIN_MODELS[name]
    return {"kind": "gla", "state_kind": kind, "description": description, "options": GLAAdapter,
            "config": TWINS_DIR / name / "config.json", "describe": _shipped(name)[1]}


# one call a name: the architecture test reads each name as register_model's literal argument
register_model("smollm2-135m-swa-w64-s4", **_twin("smollm2-135m-swa-w64-s4"))(_factory("smollm2-135m-swa-w64-s4"))
register_model("smollm2-135m-gla-w64-s4", **_twin("smollm2-135m-gla-w64-s4"))(_factory("smollm2-135m-gla-w64-s4"))
register_model("smollm2-135m-gdn-w64-s4", **_twin("smollm2-135m-gdn-w64-s4"))(_factory("smollm2-135m-gdn-w64-s4"))
register_model("smollm2-135m-gdn-w64-s4-recall", **_twin("smollm2-135m-gdn-w64-s4-recall"))(_factory("smollm2-135m-gdn-w64-s4-recall"))


def heldout_perplexity(spec: str) -> dict | None:
    """What `make train-twins` measured of twin `spec` on held-out prose (its card's
    train_log.json, written with its weights): {"parent": the parent's spec, "lengths": {L:
    {"parent": ppl, "twin": ppl, "state_off": ppl or None, "tokens": n, "documents": [...]}}}.
    None for a name that is not a built twin. Each document is scored from its start over its
    first L tokens, by the twin and by its parent on the same tokens (evalkit.training.linearize.perplexity)."""
    if spec not in TWIN_MODELS:
        return None
    path = TWINS_DIR / spec / "train_log.json"  # written with the twin, by evalkit.training.output
    if not path.is_file():
        return None
    import json

    log = json.loads(path.read_text(encoding="utf-8"))
    lengths = {}
    for length, m in sorted((log.get("perplexity") or {}).items(), key=lambda kv: int(kv[0])):
        try:
            lengths[int(length)] = {"parent": float(m["parent"]["ppl"]),
                                    "twin": float(m["twin"]["ppl"]),
                                    "state_off": float(m["state_off"]["ppl"]) if "state_off" in m
                                    else None,
                                    "tokens": int(m["twin"]["tokens"]),
                                    "documents": list(m["documents"])}
        except (KeyError, TypeError, ValueError) as e:
            raise ValueError(f"{path}: field 'perplexity.{length}': expected parent, twin "
                             f"(ppl, tokens) and documents, got {sorted(m)} ({e})") from None
    return {"parent": log["parent"], "lengths": lengths}
