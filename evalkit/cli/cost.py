"""`evalkit cost MODEL [--contexts 2048,8192,32768] [--dtype bf16] [--decode 32] [--threads N]
[--max-memory SIZE] [--json]`.

Measures, on this machine, what a model costs at each context length: prefill tokens/s and
their share of the machine's matmul limit (measured in the same run), decode ms per output
token after the context and its ratio to the shortest context, the resident memory the
prefill adds, and the state held after it beside the config's formula. MODEL: a registered
model (laplace), NAME:PATH, a checkpoint folder (its safetensors weights are used) or a bare
config.json (random weights, built on the meta device then materialised in --dtype). A context
whose state, KV cache or activations would not fit in the available memory is refused before
anything is allocated. See model_adapters/cost.py for how each figure is measured.
"""
from __future__ import annotations

import argparse
import json
import sys

from evalkit.cli import csv_list


def add_parser(subparsers) -> argparse.ArgumentParser:
    p = subparsers.add_parser(
        "cost", help="measured prefill / decode speed, memory and state at each context",
        description=__doc__.split("\n\n")[1] if __doc__ else None)
    p.add_argument("model", metavar="MODEL", help="registered model, NAME:PATH, checkpoint "
                                                  "folder or config.json")
    p.add_argument("--contexts", type=csv_list(int), default=[2048, 8192, 32768],
                   help="comma-separated context lengths in tokens (default 2048,8192,32768)")
    p.add_argument("--dtype", default="bf16", help="weights and activations: bf16 (default) or fp32")
    p.add_argument("--decode", type=int, default=32,
                   help="decode steps timed after each context (median reported; 0 = none)")
    p.add_argument("--threads", type=int, default=None,
                   help="torch threads (default: torch's, here %(default)s = all cores)")
    p.add_argument("--max-memory", default=None, metavar="SIZE",
                   help="memory the run may use, e.g. 8G (default: 90%% of the available memory)")
    p.add_argument("--seed", type=int, default=0, help="random weights and tokens")
    p.add_argument("--json", action="store_true", help="one JSON object per context, one a line")
    p.set_defaults(func=run)
    return p


def run(args: argparse.Namespace) -> int:
    from evalkit.model_adapters import cost, cost_model

    contexts = cost.check_contexts(args.contexts)
    decode = cost.check_decode(args.decode)
    threads = cost.check_threads(args.threads)
    cost_model.check_dtype(args.dtype)
    max_memory = cost.parse_bytes(args.max_memory) if args.max_memory is not None else None
    cm = cost_model.build_cost_model(args.model, args.dtype)
    res = cost.measure_cost(cm, contexts, decode=decode, threads=threads, max_memory=max_memory,
                            seed=args.seed)
    if args.json:
        for row in res["rows"]:
            print(json.dumps({**row, "parameters": res["run"]["parameters"],
                              "weights": res["run"]["weights"]}))
        return 0
    print_table(res)
    return 0


def print_table(res: dict, out=None) -> None:
    out = out or sys.stdout
    r = res["run"]
    print(f"model        {r['model']} ({r['kind']}, {r['parameters']:,} parameters, {r['weights']} "
          f"weights, {r['dtype']}, {r['threads']} thread(s); built in {r['build_seconds']:.1f} s)",
          file=out)
    print(f"matmul limit {r['matmul_limit_flops_per_s'] / 1e9:.0f} GFLOP/s ({r['dtype']}, "
          f"2048x3072 @ 3072x3072); load average {r['load_average'][0]:.1f}", file=out)
    head = (f"{'context':>8}  {'prefill tok/s':>13}  {'of matmul':>9}  {'decode ms/tok':>13}  "
            f"{'ratio':>6}  {'peak memory':>12}  {'state measured':>15}  {'formula':>15}  kind")
    print(head, file=out)
    for row in res["rows"]:
        dec = row["decode_ms_per_token"]
        ratio = row["decode_ratio"]
        print(f"{row['context']:>8,}  {row['prefill_tokens_per_s']:>13,.1f}  "
              f"{row['prefill_fraction_of_matmul_limit']:>9.1%}  "
              f"{'-' if dec is None else f'{dec:,.1f}':>13}  "
              f"{'-' if ratio is None else f'{ratio:.3f}':>6}  "
              f"{row['peak_memory_bytes'] / 2 ** 20:>8,.0f} MiB  "
              f"{row['state_bytes_measured']:>15,}  {row['state_bytes_formula']:>15,}  "
              f"{row['state_parts_measured']['kind']}", file=out)
    last = res["rows"][-1]
    if last["state_bytes_at_model_dtype"] != last["state_bytes_measured"]:
        print(f"state elements counted at {r['dtype']}: {last['state_bytes_at_model_dtype']:,} B "
              f"(the state is held in fp32)", file=out)
