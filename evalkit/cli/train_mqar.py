"""`evalkit train-mqar`: train the MQAR mixer twins (Zoology's protocol) on CPU, resumably.

    evalkit train-mqar --config configs/train_mqar.yaml --out model_adapters/mqar
    evalkit train-mqar --config configs/train_mqar.yaml --only mqar-gla-d64 --only mqar-attn-d64

A member already trained by the same recipe is skipped (see evalkit.training.mqar_family).
"""
from __future__ import annotations

from pathlib import Path

from evalkit.yamlfile import read_typed


def add_parser(sub) -> None:
    p = sub.add_parser("train-mqar", help="train the MQAR mixer twins (resumable, CPU)")
    p.add_argument("--config", default="configs/train_mqar.yaml")
    p.add_argument("--out", default="model_adapters/mqar",
                   help="folder for the member folders (other files there are kept)")
    p.add_argument("--only", action="append", default=[], metavar="NAME",
                   help="train only this member (repeatable)")
    p.add_argument("--jobs", type=int, default=None,
                   help="runs at once (default: the config's jobs; 1..16)")
    p.set_defaults(func=run)


def load_family(path: str):
    from evalkit.training.mqar import MQARFamily

    return read_typed(path, MQARFamily, "training config")


def run(args) -> int:
    from evalkit.training.mqar_family import train_mqar_family

    fam = load_family(args.config)
    if args.jobs is not None:
        if not 1 <= args.jobs <= 16:
            raise ValueError(f"--jobs must be between 1 and 16, got {args.jobs}")
        fam = fam.model_copy(update={"jobs": args.jobs})
    train_mqar_family(fam, Path(args.out), args.only, config_path=args.config)
    return 0
