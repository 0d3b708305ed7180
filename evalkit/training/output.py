"""Where `evalkit train-tiny` writes: one folder per model under --out, and nothing else.

A model folder holds only files the trainer writes (OWNED). Before any training starts, --out
must be a folder (or not exist) and every model folder it would replace must hold owned files
alone: a foreign file (a user's notes, a subfolder) is refused by name, never deleted.
"""
from __future__ import annotations

import shutil
from pathlib import Path
from typing import Iterable

# Everything a checkpoint save (fla GLA or transformers Llama), the tokenizer save and the card
# writer put in a model folder.
OWNED = frozenset({"README.md", "loss.png", "train_log.json", "config.json",
                   "generation_config.json", "model.safetensors", "tokenizer.json",
                   "tokenizer_config.json", "special_tokens_map.json", "chat_template.jinja"})


def _foreign(folder: Path) -> list[Path]:
    return sorted(p for p in folder.iterdir() if p.name not in OWNED or not p.is_file())


def check_out(out: Path, names: Iterable[str]) -> None:
    """Raise ValueError naming the first path that training would have to overwrite or delete
    but does not own. Runs before training."""
    if out.exists() and not out.is_dir():
        raise ValueError(f"--out {out}: is a file, expected a folder for the model checkpoints")
    for name in names:
        for folder in (out / name, out / f".{name}.tmp"):
            if folder.exists() and not folder.is_dir():
                raise ValueError(f"{folder}: is a file where train-tiny writes the model folder "
                                 f"{name}/; move it away")
            if folder.is_dir():
                foreign = _foreign(folder)
                if foreign:
                    raise ValueError(f"{foreign[0]}: not written by train-tiny, and train-tiny "
                                     f"would replace {folder}; move it away first")


def install(tmp: Path, final: Path) -> None:
    """Replace final with the finished tmp folder (both checked by check_out)."""
    if final.exists():
        foreign = _foreign(final)
        if foreign:  # appeared while training ran
            raise ValueError(f"{foreign[0]}: not written by train-tiny; the new model stays in "
                             f"{tmp}")
        shutil.rmtree(final)
    tmp.rename(final)


def fresh_tmp(out: Path, name: str) -> Path:
    """An empty work folder for a model (a leftover of ours from a killed run is removed)."""
    tmp = out / f".{name}.tmp"
    if tmp.exists():
        shutil.rmtree(tmp)
    tmp.mkdir(parents=True)
    return tmp
