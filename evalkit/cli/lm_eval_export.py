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
                   help="tokenizer folder or tokenizer.json of the model to evaluate "
                        "(lengths are in its tokens)")
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
    from evalkit.lm_eval.export import export_tasks

    manifest = export_tasks(args.tasks, args.out, tokenizer=args.tokenizer, lengths=args.lengths,
                            depths=args.depths, loads=args.loads, samples=args.samples,
                            seed=args.seed, include_paths=args.include, choice=not args.no_choice,
                            stop=args.stop)
    for entry in manifest["tasks"].values():
        for name, info in entry["lm_eval_tasks"].items():
            print(f"{name}: {info['docs']} docs ({info['output_type']})")
    print(f"include path: {Path(args.out).expanduser().resolve()}  "
          f"(lm_eval run --include_path ... --tasks evalkit_<task>)")
    return 0
