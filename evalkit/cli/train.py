"""`evalkit train-tiny`: train tiny recall models on CPU and write checkpoints + cards.

    evalkit train-tiny --config configs/train_tiny.yaml --out model_adapters/tiny
    evalkit train-tiny --config configs/train_capacity.yaml --out model_adapters/tiny

The first writes the matched pair `recall-gla-tiny/` (fla checkpoint format) and
`recall-softmax-tiny/` (transformers Llama); the MQAR twins train with `evalkit train-mqar`.
Each folder holds the shared tokenizer, a
README.md model card, loss.png and train_log.json; nothing else under --out is touched.
"""
from __future__ import annotations

from pathlib import Path

from pydantic import ValidationError

from evalkit.yamlfile import read_yaml


def add_parser(sub) -> None:
    p = sub.add_parser("train-tiny",
                       help="train the tiny GLA/softmax pair (CPU)")
    p.add_argument("--config", default="configs/train_tiny.yaml")
    p.add_argument("--out", default="model_adapters/tiny",
                   help="folder for the model folders (other files there are kept)")
    p.add_argument("--tokenizer", default=None, help="default: the shipped tiny tokenizer")
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
    from evalkit.training.save import train_and_write_pair

    cfg = load_config(args.config)
    tok_path = args.tokenizer or str(DEFAULT_TOKENIZER.relative_to(Path.cwd())
                                     if DEFAULT_TOKENIZER.is_relative_to(Path.cwd())
                                     else DEFAULT_TOKENIZER)
    tokenizer = load_tokenizer(tok_path)
    train_and_write_pair(cfg, tokenizer, Path(args.out), tok_path, args.config)
    return 0
