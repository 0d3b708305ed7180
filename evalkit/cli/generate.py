"""`evalkit generate TASK --tokenizer T --out probes.jsonl`: write a task's probes (and a dataset)."""
from __future__ import annotations

import json

from evalkit import atomic
from evalkit.cli import csv_list
from evalkit.taskspec import discover, generate_probes, grid


def add_parser(sub) -> None:
    p = sub.add_parser("generate", help="write a task's probes as JSON lines (and a dataset)")
    p.add_argument("task")
    p.add_argument("--include", action="append", default=[], help="folder of task YAMLs")
    p.add_argument("--lengths", type=csv_list(int))
    p.add_argument("--depths", type=csv_list(float))
    p.add_argument("--loads", type=csv_list(int))
    p.add_argument("--samples", type=int)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--tokenizer", required=True,
                   help="a registered model's name (its tokenizer: recall-gla-tiny, "
                        "smollm2-135m), a tokenizer folder or a tokenizer.json")
    p.add_argument("--out", required=True, help="probes.jsonl to write")
    p.add_argument("--dataset", help="also save a datasets.Dataset here (save_to_disk)")
    p.add_argument("--parquet", help="also write the probes as a parquet file")
    p.set_defaults(func=run)


def probe_row(probe) -> dict:
    """A probe as a flat-enough row for Arrow: meta.extra as a JSON string."""
    d = probe.to_dict()
    d["meta"]["extra"] = json.dumps(d["meta"]["extra"])
    return d


def run(args) -> int:
    from evalkit.cli.tokenizer_arg import tokenizer_from_arg

    tok = tokenizer_from_arg(args.tokenizer)
    spec = discover(args.include).get(args.task)
    points = grid(spec, lengths=args.lengths, depths=args.depths, loads=args.loads,
                  samples=args.samples, seed=args.seed)
    probes = list(generate_probes(spec, tok, points))
    n = atomic.write_jsonl(args.out, (p.to_dict() for p in probes))
    print(f"wrote {n} probes of {spec.name} v{spec.version} to {args.out}")
    if args.dataset or args.parquet:
        import datasets

        ds = datasets.Dataset.from_list([probe_row(p) for p in probes])
        if args.dataset:
            ds.save_to_disk(args.dataset)
            print(f"saved dataset to {args.dataset}")
        if args.parquet:
            ds.to_parquet(args.parquet)
            print(f"wrote {args.parquet}")
    return 0
