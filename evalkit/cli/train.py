"""`evalkit train-tiny`: train tiny recall models on CPU and write checkpoints + cards.

    evalkit train-tiny --config configs/train_tiny.yaml --out model_adapters/tiny
    evalkit train-tiny --config configs/train_tiny.yaml --out model_adapters/tiny \
        --only recall-mamba2-tiny

The first trains the whole tiny family on the same batches and writes the matched pair
`recall-gla-tiny/` (fla checkpoint format) and `recall-softmax-tiny/` (transformers Llama) and,
when the recipe has a `mamba2` block (configs/train_tiny.yaml does), `recall-mamba2-tiny/`
(transformers Mamba-2). `--only NAME` (repeatable) trains and writes only the named models: each
sees exactly the batches it would see beside the others, and the other folders are left as they
are. The MQAR twins train with `evalkit train-mqar`. Each folder holds the checkpoint, the shared
tokenizer, a README.md model card, loss.png and train_log.json; nothing else under --out is
touched.
"""
from __future__ import annotations

from pathlib import Path

from pydantic import ValidationError

from evalkit.yamlfile import read_yaml


def add_parser(sub) -> None:
    p = sub.add_parser("train-tiny",
                       help="train the tiny GLA/softmax pair and Mamba-2 (CPU)")
    p.add_argument("--config", default="configs/train_tiny.yaml")
    p.add_argument("--out", default="model_adapters/tiny",
                   help="folder for the model folders (other files there are kept)")
    p.add_argument("--tokenizer", default=None, help="default: the shipped tiny tokenizer")
    p.add_argument("--only", action="append", default=[], metavar="NAME",
                   help="train and write only this model (repeatable): recall-gla-tiny, "
                        "recall-softmax-tiny or recall-mamba2-tiny; default: every model the "
                        "recipe defines, on the same batches")
    p.set_defaults(func=run)


def load_config(path: str):
    from evalkit.training.train import TrainConfig

    p = Path(path)
    raw = read_yaml(p, ValueError, "training config") or {}
    if not isinstance(raw, dict):
        raise ValueError(f"{p}: expected a mapping of keys (tasks, steps, ...), got "
                         f"{type(raw).__name__}")
    if isinstance(raw, dict) and "include" in raw:  # task folders are relative to the config
        raw["include"] = [str((p.parent / d).resolve()) for d in raw["include"]]
    try:
        return TrainConfig.model_validate(raw)
    except ValidationError as e:
        lines = [f"{p}: key {'.'.join(map(str, err['loc']))!r}: {err['msg']}" for err in e.errors()]
        raise ValueError("\n".join(lines)) from None


def run(args) -> int:
    from evalkit.model_adapters.reference import DEFAULT_TOKENIZER
    from evalkit.tokenization import load_tokenizer
    from evalkit.training.save import train_and_write
    from evalkit.training.train import select_kinds

    cfg = load_config(args.config)
    select_kinds(cfg, args.only)  # a typo is an error before the tokenizer loads
    tok_path = args.tokenizer or str(DEFAULT_TOKENIZER.relative_to(Path.cwd())
                                     if DEFAULT_TOKENIZER.is_relative_to(Path.cwd())
                                     else DEFAULT_TOKENIZER)
    tokenizer = load_tokenizer(tok_path)
    train_and_write(cfg, tokenizer, Path(args.out), tok_path, args.config, args.only)
    return 0
