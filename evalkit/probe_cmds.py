"""`evalkit tasks`, `evalkit validate`, `evalkit generate`: list, check and write probes."""
from __future__ import annotations

import json
from pathlib import Path

from evalkit import atomic
from evalkit.cli import csv_list
from evalkit.taskspec import SpecError, discover, generate_probes, grid, load_spec




def default_tokenizer_path() -> Path:
    from evalkit.model_adapters import reference

    return reference.DEFAULT_TOKENIZER


def add_parser(sub) -> None:
    p = sub.add_parser("tasks", help="list built-in and discovered tasks")
    p.add_argument("--include", action="append", default=[], help="folder of task YAMLs")
    p.add_argument("--json", action="store_true")
    p.set_defaults(func=cmd_tasks)

    p = sub.add_parser("validate", help="check task YAML files (and generate one probe each)")
    p.add_argument("paths", nargs="+", help="task YAML files or folders of them")
    p.add_argument("--tokenizer", help="tokenizer folder for the trial generation "
                                       "(default: the shipped tiny tokenizer)")
    p.set_defaults(func=cmd_validate)

    p = sub.add_parser("generate", help="write a task's probes as JSON lines (and a dataset)")
    p.add_argument("task")
    p.add_argument("--include", action="append", default=[], help="folder of task YAMLs")
    p.add_argument("--lengths", type=csv_list(int))
    p.add_argument("--depths", type=csv_list(float))
    p.add_argument("--loads", type=csv_list(int))
    p.add_argument("--samples", type=int)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--tokenizer", required=True, help="tokenizer folder or tokenizer.json")
    p.add_argument("--out", required=True, help="probes.jsonl to write")
    p.add_argument("--dataset", help="also save a datasets.Dataset here (save_to_disk)")
    p.add_argument("--parquet", help="also write the probes as a parquet file")
    p.set_defaults(func=cmd_generate)


def cmd_tasks(args) -> int:
    reg = discover(args.include)
    rows = []
    for name in reg:
        spec = reg.get(name)
        rows.append({"task": name, "version": spec.version, "source": str(spec.source),
                     "generator": spec.generator_ref, "description": spec.description})
    if args.json:
        print(json.dumps(rows, indent=2))
    else:
        w = max(len(r["task"]) for r in rows)
        for r in rows:
            print(f"{r['task']:<{w}}  v{r['version']:<3} {r['description']}  [{r['source']}]")
    return 0


def cmd_validate(args) -> int:
    from evalkit.tokenization import load_tokenizer

    tok = load_tokenizer(args.tokenizer or default_tokenizer_path())
    files: list[Path] = []
    for p in map(Path, args.paths):
        if p.is_dir():
            files.extend(sorted(p.glob("*.yaml")))
        elif p.exists():
            files.append(p)
        else:
            raise FileNotFoundError(f"{p}: no such file or folder")
    failed = 0
    for f in files:
        try:
            spec = load_spec(f)
            point = grid(spec)[0]
            probe = next(generate_probes(spec, tok, [point]))
        except (SpecError, ValueError, TypeError) as e:
            failed += 1
            print(f"INVALID {f}\n  " + str(e).replace("\n", "\n  "))
            continue
        print(f"ok      {f}: task {spec.name!r} v{spec.version}; trial probe "
              f"{probe.meta.actual_length} tokens (target {point.length})")
    return 1 if failed else 0


def probe_row(probe) -> dict:
    """A probe as a flat-enough row for Arrow: meta.extra as a JSON string."""
    d = probe.to_dict()
    d["meta"]["extra"] = json.dumps(d["meta"]["extra"])
    return d


def cmd_generate(args) -> int:
    from evalkit.tokenization import load_tokenizer

    tok = load_tokenizer(args.tokenizer)
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
