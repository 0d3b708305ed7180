"""Write what `evalkit train-tiny` trained: one folder per model (checkpoint, tokenizer, card,
loss plot, train_log.json), each finished in a hidden work folder and then put in place."""
from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

from evalkit import __version__
from evalkit.training.output import check_out, fresh_tmp, install


def _finish(tmp: Path, out: Path, name: str, tokenizer: Any, log: dict, card: str) -> None:
    tokenizer.save_pretrained(tmp)
    (tmp / "train_log.json").write_text(json.dumps({**log, "evalkit_version": __version__},
                                                   indent=1) + "\n")
    (tmp / "README.md").write_text(card)
    install(tmp, out / name, "train-tiny")
    print(f"wrote {out / name}")


def train_and_write_pair(cfg, tokenizer: Any, out: Path, tok_path: str, config_path: str) -> None:
    from evalkit.model_adapters.gla.checkpoint import save_checkpoint
    from evalkit.training.cards import NAMES, pair_card, pair_loss_plot
    from evalkit.training.train import train_pair

    check_out(out, NAMES.values(), "train-tiny")  # before training: never lose an hour
    t0 = time.time()
    result = train_pair(cfg, tokenizer)
    gla, gla_cfg = result["gla"]
    llama = result["softmax"]
    for kind, name in NAMES.items():
        tmp = fresh_tmp(out, name)
        if kind == "gla":
            save_checkpoint(gla.float(), gla_cfg, tmp)
        else:
            llama.save_pretrained(tmp, safe_serialization=True)
        pair_loss_plot(result, tmp / "loss.png")
        log = {"config": cfg.model_dump(mode="json"), "history": result["history"][kind],
               "answer_history": result["answer_history"][kind],
               "seconds": result["seconds"][kind], "params": result["params"][kind]}
        _finish(tmp, out, name, tokenizer, log, pair_card(name, kind, cfg, result, gla_cfg,
                                                          llama.config, tok_path, config_path))
    print(f"trained the pair in {(time.time() - t0) / 60:.1f} min")
