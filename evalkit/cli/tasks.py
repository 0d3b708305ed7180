"""`evalkit tasks`: list built-in and discovered tasks."""
from __future__ import annotations

import json

from evalkit.taskspec import discover


def add_parser(sub) -> None:
    p = sub.add_parser("tasks", help="list built-in and discovered tasks")
    p.add_argument("--include", action="append", default=[], help="folder of task YAMLs")
    p.add_argument("--json", action="store_true")
    p.set_defaults(func=run)


def run(args) -> int:
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
