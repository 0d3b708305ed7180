"""Write what `evalkit train-tiny` trained: one folder per model (checkpoint, tokenizer, card,
loss plot, train_log.json), each finished in a hidden work folder and then put in place. Only
the folders of the models trained (`--only`) are checked, written and replaced; the others
under --out are never touched."""
from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any, Iterable

from evalkit import __version__
from evalkit.training.output import check_out, fresh_tmp, install


def _finish(tmp: Path, out: Path, name: str, tokenizer: Any, log: dict, card: str) -> None:
    tokenizer.save_pretrained(tmp)
    (tmp / "train_log.json").write_text(json.dumps({**log, "evalkit_version": __version__},
                                                   indent=1) + "\n")
    (tmp / "README.md").write_text(card)
    install(tmp, out / name, "train-tiny")
    print(f"wrote {out / name}")


# recipe keys that change neither the batches nor the pair's models
_NOT_RECIPE = ("mamba2", "include", "threads")


def _same_recipe(logged: dict, cfg) -> bool:
    """Whether a train_log.json's recipe is `cfg`'s, read through today's schema (so a key added
    since, at its default, still matches) and its task folders by name."""
    from pydantic import ValidationError

    strip = lambda c: {k: v for k, v in c.items() if k not in _NOT_RECIPE}
    try:
        theirs = type(cfg).model_validate(strip(logged))
    except ValidationError:
        return False
    names = lambda include: sorted(Path(d).name for d in include)
    return (strip(theirs.model_dump(mode="json")) == strip(cfg.model_dump(mode="json"))
            and names(logged.get("include", ())) == names(cfg.include))


def earlier_logs(out: Path, cfg, skip: Iterable[str]) -> dict[str, dict]:
    """{kind: train_log.json} of the family's folders under out/ not trained now whose recipe
    is this one (so trained on the same batches): their curves go beside the new ones."""
    from evalkit.training.train import NAMES

    logs = {}
    for kind, name in NAMES.items():
        path = out / name / "train_log.json"
        if kind in skip or not path.is_file():
            continue
        try:
            log = json.loads(path.read_text())
            curves = {k: log[k] for k in ("history", "answer_history")}
            same = _same_recipe(log["config"], cfg)
        except (OSError, ValueError, KeyError, TypeError, AttributeError):
            continue  # unreadable: plotted without it
        if same and all(isinstance(v, list) and len(v) == cfg.steps and
                        all(isinstance(x, (int, float)) for x in v) for v in curves.values()):
            logs[kind] = curves
    return logs


def train_and_write(cfg, tokenizer: Any, out: Path, tok_path: str, config_path: str,
                    only: Iterable[str] = ()) -> None:
    """Train the family's models named in `only` (none: all the recipe defines) on the shared
    batches and write each one's folder under out/."""
    from evalkit.model_adapters.gla.checkpoint import save_checkpoint
    from evalkit.training.cards import mamba2_card, pair_card, pair_loss_plot
    from evalkit.training.train import NAMES, select_kinds, train_models

    kinds = select_kinds(cfg, only)
    check_out(out, [NAMES[k] for k in kinds], "train-tiny")  # before training: never lose an hour
    earlier = earlier_logs(out, cfg, kinds)
    t0 = time.time()
    result = train_models(cfg, tokenizer, kinds)
    for kind in kinds:
        name, model = NAMES[kind], result["models"][kind]
        tmp = fresh_tmp(out, name)
        if kind == "gla":
            save_checkpoint(model.float(), result["configs"]["gla"], tmp)
        else:
            model.save_pretrained(tmp, safe_serialization=True)
        pair_loss_plot(result, tmp / "loss.png", earlier)
        log = {"config": cfg.model_dump(mode="json"), "history": result["history"][kind],
               "answer_history": result["answer_history"][kind],
               "seconds": result["seconds"][kind], "params": result["params"][kind]}
        card = (mamba2_card(name, cfg, result, tok_path, config_path, earlier)
                if kind == "mamba2" else
                pair_card(name, kind, cfg, result, result["configs"]["gla"],
                          result["configs"]["softmax"], tok_path, config_path))
        _finish(tmp, out, name, tokenizer, log, card)
    print(f"trained {', '.join(NAMES[k] for k in kinds)} in {(time.time() - t0) / 60:.1f} min")
