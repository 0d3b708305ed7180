"""`evalkit heads MODEL --output OUT.json`: each attention head's retrieval score.

    evalkit heads smollm2-135m --output heads/smollm2-135m.json       # + heads/smollm2-135m.png
    evalkit heads recall-softmax-tiny --samples 1 --output /tmp/tiny-heads.json

Wu et al.'s retrieval score (arXiv 2404.15574) on evalkit's own needle probes, made with seeds
of their own (never an evaluation probe's): the share of copy steps (gold answer tokens found
in the needle's value, teacher-forced) whose top attention lands on the copied token inside
the needle. Writes OUT.json (per query head, per KV head = max over its group, and the KV
heads ranked) and OUT.png (a layer x head heat map). The JSON is what
`--model-args keep_heads=K,window=W,sinks=S,heads=OUT.json` keeps whole.
An existing OUT.json or OUT.png is refused (remove it first).
"""
from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

from evalkit.cli import csv_list
from evalkit.cli.run import _model_args


def add_parser(sub) -> None:
    from evalkit.retrieval_heads import DEFAULTS

    p = sub.add_parser("heads", help="retrieval score per attention head (JSON + heat map)",
                       description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("model", help="a softmax model: registered name, hf:PATH or a checkpoint path")
    p.add_argument("--output", required=True, help="the JSON to write (the heat map: same name, .png)")
    p.add_argument("--model-args", type=_model_args, default={},
                   help="k=v,... load options (dtype, device, ...)")
    p.add_argument("--task", default=DEFAULTS["task"], help="a needle task (default %(default)s)")
    p.add_argument("--lengths", type=csv_list(int), default=list(DEFAULTS["lengths"]),
                   help="selection probe lengths (default %(default)s)")
    p.add_argument("--depths", type=csv_list(float), default=list(DEFAULTS["depths"]),
                   help="needle depths (default %(default)s)")
    p.add_argument("--samples", type=int, default=DEFAULTS["samples"],
                   help="probes per (length, depth) (default %(default)s)")
    p.add_argument("--seed", type=int, default=DEFAULTS["seed"],
                   help="selection seed (default %(default)s; mapped above every evaluation seed)")
    p.add_argument("--include", action="append", default=[], help="folder of task YAMLs")
    p.set_defaults(func=run)


def run(args) -> int:
    from evalkit.atomic import write_json
    from evalkit.model_adapters.models import load_model
    from evalkit.model_adapters.softmax import SoftmaxAdapter
    from evalkit.retrieval_heads import heat_map, measure

    out = Path(args.output).expanduser()
    if out.suffix != ".json":
        raise ValueError(f"--output {out}: expected a .json file name (the heat map goes beside "
                         f"it as .png)")
    png = out.with_suffix(".png")
    for f in (out, png):
        if f.exists():
            raise ValueError(f"{f} exists; evalkit heads does not overwrite (remove it first)")
    if args.samples < 1:  # before loading a model: a typo costs no minute
        raise ValueError(f"--samples must be >= 1 probe per (length, depth), got {args.samples}")
    if not args.lengths or min(args.lengths) < 1 or not args.depths:
        raise ValueError("--lengths needs positive token counts and --depths at least one depth")
    t0 = time.time()
    adapter = load_model(args.model, **args.model_args)
    if not isinstance(adapter, SoftmaxAdapter):
        raise ValueError(f"{args.model}: retrieval heads need a softmax (transformers) model; "
                         f"this one is {type(adapter).__name__}")
    if adapter.policy is not None or adapter.window is not None:
        raise ValueError(f"{args.model}: measure the whole model (no window, sinks or "
                         f"keep_heads options)")

    def progress(i: int, n: int) -> None:
        print(f"\rprobe {i}/{n}", end="" if i < n else "\n", file=sys.stderr, flush=True)

    doc = measure(adapter, task=args.task, lengths=args.lengths, depths=args.depths,
                  samples=args.samples, seed=args.seed, include=args.include, progress=progress)
    write_json(out, doc)
    heat_map(doc, png)
    top = ", ".join(f"L{l}.kv{h} {s:.2f}" for l, h, s in doc["kv_ranking"][:8])
    above = sum(s > 0.1 for row in doc["query_scores"] for s in row)
    sel = doc["selection"]
    print(f"{doc['model']}: {sel['probes']} probes, {doc['copy_steps']} copy steps, parent "
          f"correct {sel['parent_correct']}/{sel['probes']}; {above} of "
          f"{doc['n_layers'] * doc['n_heads']} query heads score > 0.1; best KV heads: {top} "
          f"({time.time() - t0:.0f} s)")
    print(f"wrote {out} and {png}")
    return 0
