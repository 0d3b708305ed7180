"""Compile cost under staggered arrivals: a seeded, replayable request stream through the
bucketed runner, for cpu eager, cpu torch.compile and xla, with and without buckets.

    python benchmarks/arrivals.py                    # the modest default (2 cores: minutes)
    python benchmarks/arrivals.py --requests 64 --compile-backend inductor
    python benchmarks/arrivals.py --model laplace --model-args dtype=bf16 --modes xla ...  # 3B
    make bench-arrivals                              # the same in .venv-xla (PJRT_DEVICE=CPU)

The stream: Poisson arrivals (--rate per second), prompt lengths log-uniform in
[--min-length, --max-length] tokens, --decode greedy tokens per request, all from --seed.
Requests arriving within --window seconds of a batch's first one join it (up to the largest
batch bucket), so every mode serves the same batches. Each batch is served for real (prefill
through the runner, then decode steps, reading each chosen token on the host); time is
replayed on a virtual clock: a batch starts when the server is free and its last request
has arrived, and a request's latency is its batch's finish time minus its arrival.

"buckets": batch widths and prefill segments padded to the bucket shapes (buckets.py).
"exact": no buckets, one graph per exact shape: width = the batch's size, full segments of
the largest length bucket and then the exact remainder.

Each mode runs in a fresh process (no compile cache carried over). Compilations and their
seconds are the compilers' own counts: XLA's CompileTime metric, dynamo's compile_inner
timings. The default torch.compile backend is aot_eager (dynamo capture and AOT autograd,
no code generation) because inductor took 100-200 s per graph on 2 cores; pass
--compile-backend inductor for the full cost.
"""
from __future__ import annotations

import argparse
import importlib.util
import json
import math
import subprocess
import sys
import time
from dataclasses import dataclass

MODES = ("eager", "compile", "xla")
MAX_REQUESTS = 4096
MAX_TOKENS = 65536


@dataclass(frozen=True)
class Request:
    arrival: float
    ids: list[int]


def stream(args) -> list[Request]:
    """The seeded request stream: the same arguments give the same requests."""
    import random
    rng = random.Random(args.seed)
    t, out = 0.0, []
    lo, hi = math.log(args.min_length), math.log(args.max_length)
    for _ in range(args.requests):
        t += rng.expovariate(args.rate)
        n = int(round(math.exp(rng.uniform(lo, hi))))
        out.append(Request(t, [rng.randrange(3, args.vocab) for _ in range(n)]))
    return out


def batches(reqs: list[Request], window: float, width: int) -> list[list[Request]]:
    out: list[list[Request]] = []
    for r in reqs:
        if out and len(out[-1]) < width and r.arrival - out[-1][0].arrival <= window:
            out[-1].append(r)
        else:
            out.append([r])
    return out


def exact_spec(spec):
    """No buckets: the BucketSpec interface with width = batch size and an exact last segment."""
    from evalkit.model_adapters.gla.buckets import BucketSpec

    class ExactShapes(BucketSpec):
        def batch_bucket(self, n: int) -> int:
            return n

        def segments(self, total: int) -> list[int]:
            big = self.lengths[-1]
            return [big] * (total // big) + ([total % big] if total % big else [])

    return ExactShapes(spec.batch_sizes, spec.lengths)


def compile_counter(mode: str):
    """() -> (compilations, seconds) so far, from the compiler's own bookkeeping."""
    if mode == "xla":
        from evalkit.model_adapters.gla import xla
        return xla.compilations
    if mode == "compile":
        import torch._dynamo.utils as du
        return lambda: (len(du.compilation_time_metrics.get("_compile.compile_inner", [])),
                        sum(du.compilation_time_metrics.get("_compile.compile_inner", [])))
    return lambda: (0, 0.0)


def run_mode(args) -> dict:
    """Serve the stream in this process for one (mode, shapes) pair; a dict of its figures."""
    import torch
    import evalkit

    torch.set_num_threads(args.threads)
    opts = dict(args.model_args, length_buckets=args.length_buckets, batch_buckets=args.batch_buckets)
    if args.mode == "xla":
        model = evalkit.load_model(args.model, device="xla", **opts)
    elif args.mode == "compile":
        import torch._dynamo.config as dcfg
        dcfg.recompile_limit = dcfg.accumulated_recompile_limit = 100_000  # exact: a graph per shape
        model = evalkit.load_model(args.model, compile=True, compile_backend=args.compile_backend, **opts)
    else:
        model = evalkit.load_model(args.model, **opts)  # its runner runs the same units eagerly
    runner = model.runner
    if args.shapes == "exact":
        runner.spec = exact_spec(runner.spec)
    counter = compile_counter(args.mode)
    reqs = stream(args)
    clock, busy, latencies, computed, real = 0.0, 0.0, [], 0, 0
    c0, s0 = counter()
    plan = batches(reqs, args.window, runner.spec.batch_sizes[-1])
    for i, batch in enumerate(plan):
        if i == len(plan) // 2:
            half = counter()[0]  # compilations in the stream's second half: do they stop?
        start = max(clock, batch[-1].arrival)
        t0 = time.perf_counter()
        res = runner.run([(None, None, r.ids) for r in batch])
        for step in range(args.decode):
            tokens = [int(lg.argmax()) for lg, _ in res]  # the one read per token
            if step + 1 < args.decode:
                res = runner.decode(tokens, [s for _, s in res])
        took = time.perf_counter() - t0
        busy += took
        clock = start + took
        latencies += [clock - r.arrival for r in batch]
        width = runner.spec.batch_bucket(len(batch))
        computed += width * (sum(runner.spec.segments(max(len(r.ids) for r in batch))) + args.decode - 1)
        real += sum(len(r.ids) + args.decode - 1 for r in batch)
    c1, s1 = counter()
    latencies.sort()
    pct = lambda q: latencies[min(len(latencies) - 1, int(q * len(latencies)))]  # noqa: E731
    return {"mode": args.mode, "shapes": args.shapes, "compilations": c1 - c0, "compile_s": s1 - s0,
            "late_compilations": c1 - half,
            "compile_s_per_graph": (s1 - s0) / (c1 - c0) if c1 > c0 else 0.0,
            "busy_s": busy, "compile_share": (s1 - s0) / busy if busy else 0.0,
            "computed_per_real": computed / real, "p50_s": pct(0.5), "p99_s": pct(0.99),
            "buckets_touched": len(runner.buckets_touched), "shapes_seen": len(runner.shapes_seen)}


def positive(kind, cap):
    def parse(text: str):
        v = kind(text)
        if not 0 < v <= cap:
            raise argparse.ArgumentTypeError(f"expected a number in (0, {cap}], got {text}")
        return v
    return parse


def model_args(text: str) -> dict:
    from evalkit.cli.run import _model_args  # the parser `evalkit run --model-args` uses

    return _model_args(text)


def int_list(text: str) -> tuple[int, ...]:
    return tuple(positive(int, MAX_TOKENS)(x) for x in text.split(","))


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--requests", type=positive(int, MAX_REQUESTS), default=10)
    p.add_argument("--rate", type=positive(float, 1e4), default=0.5, help="arrivals per second")
    p.add_argument("--window", type=float, default=1.0, help="seconds a batch waits for company")
    p.add_argument("--min-length", type=positive(int, MAX_TOKENS), default=100)
    p.add_argument("--max-length", type=positive(int, MAX_TOKENS), default=8192)
    p.add_argument("--decode", type=positive(int, 256), default=4, help="greedy tokens per request")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--model", default="recall-gla-tiny")
    p.add_argument("--model-args", type=model_args, default={},
                   help="k=v,... load options, as for evalkit run (e.g. dtype=bf16 for laplace)")
    p.add_argument("--vocab", type=positive(int, 1 << 20), default=2048, help="token ids drawn below this")
    p.add_argument("--length-buckets", type=int_list, default=(128, 512))
    p.add_argument("--batch-buckets", type=int_list, default=(1, 2, 4))
    p.add_argument("--modes", default=",".join(MODES), help=f"subset of {','.join(MODES)}")
    p.add_argument("--compile-backend", default="aot_eager", help="torch.compile backend (inductor: slow)")
    p.add_argument("--threads", type=positive(int, 256), default=1)
    p.add_argument("--mode", choices=MODES, help=argparse.SUPPRESS)  # one mode, in a child process
    p.add_argument("--shapes", choices=("buckets", "exact"), help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.min_length > args.max_length:
        p.error(f"--min-length {args.min_length} exceeds --max-length {args.max_length}")
    if args.window < 0 or not math.isfinite(args.window):
        p.error(f"--window must be a finite number >= 0, got {args.window}")
    if args.mode:
        print(json.dumps(run_mode(args)))
        return 0

    modes = [m.strip() for m in args.modes.split(",") if m.strip()]
    bad = sorted(set(modes) - set(MODES))
    if bad:
        p.error(f"--modes: unknown {bad}; expected a subset of {','.join(MODES)}")
    if "xla" in modes and importlib.util.find_spec("torch_xla") is None:
        print("xla: skipped, torch_xla is not installed (make bench-arrivals uses .venv-xla)")
        modes.remove("xla")
    reqs = stream(args)
    print(f"{len(reqs)} requests over {reqs[-1].arrival:.1f} s, prompt tokens "
          f"{min(len(r.ids) for r in reqs)}..{max(len(r.ids) for r in reqs)}, "
          f"{len(batches(reqs, args.window, args.batch_buckets[-1]))} batches, {args.decode} decode "
          f"tokens each; length buckets {args.length_buckets}, batch buckets {args.batch_buckets}")
    rows = []
    child = [a for a in (argv if argv is not None else sys.argv[1:])]
    for mode in modes:
        for shapes in ("buckets", "exact"):
            r = subprocess.run([sys.executable, __file__, *child, "--mode", mode, "--shapes", shapes],
                               capture_output=True, text=True)
            if r.returncode:
                sys.stderr.write(r.stderr[-3000:])
                return r.returncode
            rows.append(json.loads(r.stdout.strip().splitlines()[-1]))
            x = rows[-1]
            label = f"{mode} ({args.compile_backend})" if mode == "compile" else mode
            print(f"{label:<22} {shapes:<8} compilations {x['compilations']:>3} "
                  f"({x['late_compilations']:>2} in the 2nd half)  compiling "
                  f"{x['compile_s']:7.1f} s of {x['busy_s']:7.1f} s busy ({100 * x['compile_share']:4.1f} %; "
                  f"{x['compile_s_per_graph']:.1f} s a graph)  "
                  f"computed/real tokens {x['computed_per_real']:.2f}  latency p50 {x['p50_s']:6.2f} s  "
                  f"p99 {x['p99_s']:6.2f} s", flush=True)
    for mode in modes:
        b, e = [next(x for x in rows if x["mode"] == mode and x["shapes"] == s) for s in ("buckets", "exact")]
        ratio = lambda k: f"{e[k] / b[k]:.2f}" if b[k] else "-"  # noqa: E731
        print(f"{mode}: exact / buckets: compilations {ratio('compilations')}, compile seconds "
              f"{ratio('compile_s')}, compile share {100 * e['compile_share']:.1f} % vs "
              f"{100 * b['compile_share']:.1f} %, computed/real tokens {ratio('computed_per_real')}, "
              f"p50 {ratio('p50_s')}, p99 {ratio('p99_s')}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
