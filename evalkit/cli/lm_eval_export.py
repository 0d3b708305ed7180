"""`evalkit lm-eval-export`: evalkit tasks as an lm-eval include path (see lm_eval/export.py)."""
from __future__ import annotations

import argparse
from pathlib import Path

from evalkit.cli import csv_list


def _unescape(text: str) -> str:
    out = text.encode("utf-8").decode("unicode_escape")
    if not out:
        raise argparse.ArgumentTypeError("a stop string cannot be empty")
    return out


def add_parser(sub) -> None:
    p = sub.add_parser("lm-eval-export",
                       help="write evalkit tasks as an lm-eval include path (YAML + jsonl data)")
    p.add_argument("--tasks", type=csv_list(str), required=True, help="comma-separated task names")
    p.add_argument("--tokenizer", required=True,
                   help="the tokenizer of the model to evaluate (lengths are in its tokens): "
                        "a registered model's name (recall-gla-tiny, smollm2-135m), a "
                        "tokenizer folder or a tokenizer.json")
    p.add_argument("--lengths", type=csv_list(int))
    p.add_argument("--depths", type=csv_list(float))
    p.add_argument("--loads", type=csv_list(int))
    p.add_argument("--samples", type=int)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--include", action="append", default=[], help="folder of task YAMLs")
    p.add_argument("--stop", action="append", type=_unescape,
                   help="a stop string (repeatable; escapes like \\n allowed); default: the "
                        "tasks' convention, newline and period")
    p.add_argument("--no-choice", action="store_true",
                   help="skip the forced-choice (multiple_choice) variants")
    p.add_argument("--out", required=True,
                   help="folder to write (lm-eval --include_path); files in it that an earlier "
                        "export did not write are never replaced")
    p.set_defaults(func=run)


def run(args) -> int:
    from evalkit.cli.tokenizer_arg import tokenizer_from_arg
    from evalkit.lm_eval.export import export_tasks

    tokenizer = tokenizer_from_arg(args.tokenizer)
    manifest = export_tasks(args.tasks, args.out, tokenizer=tokenizer, lengths=args.lengths,
                            depths=args.depths, loads=args.loads, samples=args.samples,
                            seed=args.seed, include_paths=args.include, choice=not args.no_choice,
                            stop=args.stop)
    for entry in manifest["tasks"].values():
        for name, info in entry["lm_eval_tasks"].items():
            print(f"{name}: {info['docs']} docs ({info['output_type']})")
    out = Path(args.out).expanduser().resolve()
    first = f"evalkit_{args.tasks[0]}".replace("-", "_").replace(".", "_")
    model = args.tokenizer if not Path(args.tokenizer).expanduser().exists() else "MODEL"
    print(f"include path: {out}\n"
          f"run it: evalkit-lm-eval run --model evalkit --model_args name={model} "
          f"--include_path {out} --tasks {first}\n"
          f"(--tasks {first} runs every length by generation and, where the questions have "
          f"candidates, by forced choice; {first}_choice runs forced choice only)")
    return 0
