"""Where `evalkit train-tiny`, `train-mqar` and `linearize` write: one folder per model under --out, and
nothing else (evalkit.owned_folder's rules).

A model folder holds only files the trainer writes (OWNED). Before any training starts, --out
must be a folder (or not exist) and every model folder it would replace must hold owned files
alone: a foreign file (a user's notes, a subfolder) is refused by name, never deleted. Each
model is finished in its stage (`.<name>.tmp`) and swapped in.
"""
from __future__ import annotations

from pathlib import Path
from typing import Iterable

from evalkit.owned_folder import refuse_foreign, stage_for, swap_in

# Everything a checkpoint save (fla GLA or transformers Llama), the tokenizer save and the card
# writer put in a model folder.
OWNED = frozenset({"README.md", "loss.png", "train_log.json", "config.json",
                   "generation_config.json", "model.safetensors", "tokenizer.json",
                   "tokenizer_config.json", "special_tokens_map.json", "chat_template.jinja",
                   # `evalkit linearize`: a twin folder, and a run's resume files in its stage
                   "twin.json", "twin.safetensors", "progress.json", "resume.safetensors"})


def _refuse_foreign_in(folder: Path, command: str) -> None:
    refuse_foreign(sorted(folder.iterdir()),
                   lambda p: None if p.name in OWNED and p.is_file() and not p.is_symlink()
                   else f"not written by {command}", command=command, flag="--out")


def check_out(out: Path, names: Iterable[str], command: str) -> None:
    """Raise ValueError naming the first path that training would have to overwrite or delete
    but does not own. Runs before training."""
    if out.exists() and not out.is_dir():
        raise ValueError(f"--out {out}: is a file, expected a folder for the model checkpoints")
    for name in names:
        for folder in (out / name, out / f".{name}.tmp"):
            refuse_foreign([folder], lambda p: None if p.is_dir() and not p.is_symlink() else
                           f"a file where {command} writes the model folder {name}/",
                           command=command, flag="--out")
            if folder.is_dir():
                _refuse_foreign_in(folder, command)


def fresh_tmp(out: Path, name: str) -> Path:
    """The model's empty stage (a leftover of ours from a killed run is removed)."""
    return stage_for(out / name)


def install(tmp: Path, final: Path, command: str) -> None:
    """Replace final with the finished stage `tmp`; a foreign file that appeared in final
    while training ran is refused, and the new model stays in `tmp`."""
    if final.is_dir():
        _refuse_foreign_in(final, command)
    swap_in(tmp, final)
