"""Memory-policy prefill vs the parent's: the ratio of prefill times at --tokens (issue 57 item 6).

A policy (model_adapters/softmax/policy.py) runs through its own attention function: its whole
heads take the parent's sdpa call, its bounded heads one sdpa call over sinks + window, so its
prefill should cost no more than the parent's (target: ratio <= 1.0 plus noise). Each row is
the best of --repeats prefills, after one warm-up, rows interleaved with the parent's so that
a load change on a shared machine hits both. On one thread the clock is that thread's CPU time
(time.thread_time: other processes do not count); with --threads > 1, wall time. The load
average printed says how busy the machine was.

    .venv/bin/python benchmarks/policy_prefill.py                    # smollm2-135m, 4,096 tokens
    .venv/bin/python benchmarks/policy_prefill.py --heads heads/smollm2-135m.json --keep 9,27,45
    .venv/bin/python benchmarks/policy_prefill.py --model recall-softmax-tiny --tokens 1024

Measured (2 shared cores, load average 13, one thread, CPU time, best of 1, heads from 5
selection probes): smollm2-135m at 4,096 tokens: parent 44.8 s; window=64,sinks=4 24.2 s (x0.54,
1.6% of the parent's KV bytes); keep_heads=27,window=64,sinks=4 30.7 s (x0.69, 31.1%).

Rows: the parent; window=W,sinks=S (every head bounded); keep_heads=K for each --keep (K best
KV heads whole; heads from --heads, else measured once at load with `evalkit heads`'
defaults, which takes a minute and is not timed).
"""
from __future__ import annotations

import argparse
import json
import os
import random
import sys
import time

os.environ.setdefault("HF_HUB_OFFLINE", "1")

import torch

from evalkit.cli import csv_list
from evalkit.model_adapters.models import load_model


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", default="smollm2-135m")
    ap.add_argument("--tokens", type=int, default=4096)
    ap.add_argument("--window", type=int, default=64)
    ap.add_argument("--sinks", type=int, default=4)
    ap.add_argument("--keep", type=csv_list(int), default=[27],
                    help="keep_heads values to time (default 27: 30%% of SmolLM2's 90 KV heads)")
    ap.add_argument("--heads", help="an `evalkit heads` JSON for keep_heads (else measured at load)")
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--json", action="store_true", help="also print one JSON object")
    args = ap.parse_args(argv)
    if args.tokens < 1 or args.repeats < 1 or args.threads < 1:
        ap.error("--tokens, --repeats and --threads must be positive")
    torch.set_num_threads(args.threads)
    clock = time.thread_time if args.threads == 1 else time.perf_counter

    parent = load_model(args.model)
    rows = {"parent": parent,
            f"window={args.window},sinks={args.sinks}": load_model(
                args.model, window=args.window, sinks=args.sinks)}
    heads = {"heads": args.heads} if args.heads else {}
    for k in args.keep:
        rows[f"keep_heads={k},window={args.window},sinks={args.sinks}"] = load_model(
            args.model, window=args.window, sinks=args.sinks, keep_heads=k, **heads)
    vocab = parent.model.get_input_embeddings().num_embeddings
    rng = random.Random(0)
    ids = [rng.randrange(vocab) for _ in range(args.tokens)]

    best = {name: float("inf") for name in rows}
    for m in rows.values():
        m.prefill(ids[:256])  # warm-up
    for _ in range(args.repeats):
        for name, m in rows.items():
            t0 = clock()
            state = m.prefill(ids)
            best[name] = min(best[name], clock() - t0)
            best[name + " bytes"] = m.state_bytes(state)
    load = os.getloadavg()[0]
    base = best["parent"]
    print(f"{args.model}, prefill of {args.tokens:,} tokens (chunks of "
          f"{parent.prefill_chunk:,}), best of {args.repeats}, {args.threads} thread(s), "
          f"{'CPU' if args.threads == 1 else 'wall'} time; load average {load:.1f}")
    out = {}
    for name in rows:
        t, b = best[name], best[name + " bytes"]
        ratio = t / base
        out[name] = {"seconds": round(t, 3), "ratio_to_parent": round(ratio, 3), "state_bytes": b,
                     "bytes_ratio": round(b / best["parent bytes"], 4)}
        print(f"  {name:<36} {t:7.2f} s  x{ratio:5.2f} of the parent's time   state "
              f"{b / 1e6:7.2f} MB ({b / best['parent bytes']:.1%} of the parent's)")
    if args.json:
        print(json.dumps({"model": args.model, "tokens": args.tokens, "threads": args.threads,
                          "load_average": load, "rows": out}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
