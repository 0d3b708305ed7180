"""GLA prefill benchmark on a small config; every figure is a ratio measured in this one run.

1. Speed, tokens/s at 1K, 4K and 16K tokens: the chunked GLA operator vs the naive
   token-by-token recurrence (the operator alone, and a whole 2-layer model's prefill with
   each operator), plus, at 1K and 4K, prefill through the decoding step (what a recurrent
   model costs without a parallel form).
2. Memory: peak resident memory added by a streaming prefill of 64K tokens vs 4K tokens, each
   in a fresh subprocess. The kernel's high-water mark (VmHWM) is reset right before the
   prefill (/proc/self/clear_refs), so the peak counts what the prefill allocates, not
   start-up. A one-pass (unstreamed) 8K prefill is measured for contrast.
3. Efficiency: the chunked GLA layer's matmul FLOP/s (executed matmul FLOPs counted
   analytically / measured time) as a fraction of this machine's measured FLOP/s for a large
   matmul at the same dtype and thread count.

Timings are the best of several repeats, on one thread by default and then in CPU time of
that thread (time.thread_time), so that other processes on a shared machine do not count:
with two threads on a busy machine the naive loop's thousands of small ops mostly measure
OpenMP barriers waiting for a descheduled thread. With --threads > 1 the clock is wall time.
The load average printed with the results says how busy the machine was.

    python benchmarks/gla_prefill.py [--threads N] [--json]
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time

import torch
import torch.nn.functional as F

from evalkit.model_adapters.gla.config import GLAConfig
from evalkit.model_adapters.gla.model import GatedLinearAttention, GLAForCausalLM
from evalkit.model_adapters.gla.ops.gla import chunk_gla, naive_recurrent_gla

CFG = dict(vocab_size=4096, hidden_size=256, num_heads=4, num_hidden_layers=2, expand_k=0.5,
           expand_v=1.0, use_short_conv=True, conv_size=4)
CHUNK, SEGMENT = 128, 2048


CLOCK = time.thread_time  # main() switches to wall time when torch uses several threads


def best_time(fn, repeats: int) -> float:
    fn()  # warm-up
    times = []
    for _ in range(repeats):
        t0 = CLOCK()
        fn()
        times.append(CLOCK() - t0)
    return min(times)


def make_model(cfg: GLAConfig) -> GLAForCausalLM:
    model = GLAForCausalLM(cfg).init_weights(0).eval()
    model.set_ops(chunk_size=CHUNK)
    return model


def op_inputs(T: int, H: int, K: int, V: int):
    g = torch.Generator().manual_seed(T)
    q, k = torch.randn(1, T, H, K, generator=g), torch.randn(1, T, H, K, generator=g)
    v = torch.randn(1, T, H, V, generator=g)
    gk = F.logsigmoid(torch.randn(1, T, H, K, generator=g)) / 16
    return q, k, v, gk


@torch.no_grad()
def op_speedup(T: int, H: int, K: int, V: int, naive_repeats: int) -> tuple[float, float]:
    """Operator tokens/s: (chunked, naive)."""
    q, k, v, gk = op_inputs(T, H, K, V)
    t_chunk = best_time(lambda: chunk_gla(q, k, v, gk, chunk_size=CHUNK), 5)
    t_naive = best_time(lambda: naive_recurrent_gla(q, k, v, gk), naive_repeats)
    return T / t_chunk, T / t_naive


@torch.no_grad()
def speed(cfg: GLAConfig) -> dict:
    out = {}
    model = make_model(cfg)
    H, K, V = cfg.num_heads, cfg.head_k_dim, cfg.head_v_dim
    for T in (1024, 4096, 16384):
        g = torch.Generator().manual_seed(T)
        slow = 1 if T > 4096 else 3
        chunk_tok_s, naive_tok_s = op_speedup(T, H, K, V, slow)
        ids = torch.randint(0, cfg.vocab_size, (1, T), generator=g)
        model.set_ops(mode="chunk")
        t_mchunk = best_time(lambda: model.prefill(ids, segment=SEGMENT), 3)
        model.set_ops(mode="naive")
        t_mnaive = best_time(lambda: model.prefill(ids, segment=SEGMENT), slow)
        model.set_ops(mode="chunk")
        r = {"op_chunk_tok_s": chunk_tok_s, "op_naive_tok_s": naive_tok_s,
             "op_speedup": chunk_tok_s / naive_tok_s,
             "model_chunk_tok_s": T / t_mchunk, "model_naive_tok_s": T / t_mnaive,
             "model_speedup": t_mnaive / t_mchunk}
        if T <= 4096:
            def decode_loop():
                state = model.empty_state(1)
                for t in range(T):
                    _, state = model.decode_step(ids[:, t], state)
            t_dec = best_time(decode_loop, 1)
            r.update(model_decode_loop_tok_s=T / t_dec, model_speedup_vs_decode_loop=t_dec / t_mchunk)
        out[T] = r
    # The operator at the Laplace 3B head size (d_k 192, d_v 384; 2 of its 8 heads), 4K tokens.
    c, n = op_speedup(4096, 2, 192, 384, 2)
    out["laplace_heads_4096"] = {"op_chunk_tok_s": c, "op_naive_tok_s": n, "op_speedup": c / n}
    return out


def layer_matmul_flops(cfg: GLAConfig, T: int, C: int = CHUNK) -> float:
    """Matmul FLOPs one chunked GLA layer executes over T tokens (masked halves included:
    the matmuls compute them)."""
    h, dk, dv = cfg.hidden_size, cfg.key_dim, cfg.value_dim
    H, K, V = cfg.num_heads, cfg.head_k_dim, cfg.head_v_dim
    r = cfg.gate_low_rank_dim
    proj = 2 * T * h * (dk + cfg.key_dim_per_group + cfg.value_dim_per_group + dv)   # q k v g
    proj += 2 * T * dv * h + 2 * T * (h * r + r * cfg.key_dim_per_group)           # o, gate
    levels, s = 0, 4  # scores of blocks s >= 4 are matmuls: per chunk sum_s (C/2s) * 2 s^2 K
    while s < C:
        levels += C * s * K
        s *= 2
    op = H * (T // C * levels + 2 * T * (C + K) * V + 2 * T * K * V)  # scores, [A|q]@[v;S], U
    return float(proj + op)


@torch.no_grad()
def efficiency(cfg: GLAConfig, T: int = 4096) -> dict:
    n = 1024
    a, b = torch.randn(n, n), torch.randn(n, n)
    t_mm = best_time(lambda: a @ b, 10)
    mm = 2 * n ** 3 / t_mm
    layer = GatedLinearAttention(cfg).eval()
    layer.chunk_size = CHUNK
    x = torch.randn(1, T, cfg.hidden_size)
    t_layer = best_time(lambda: layer(x), 5)
    achieved = layer_matmul_flops(cfg, T) / t_layer
    return {"dtype": "fp32", "tokens": T, "matmul_gflops": mm / 1e9, "layer_gflops": achieved / 1e9,
            "fraction": achieved / mm}


def _status_kb(key: str) -> int:
    for line in open("/proc/self/status"):
        if line.startswith(key + ":"):
            return int(line.split()[1])
    raise RuntimeError(f"no {key} in /proc/self/status")


def memory_child(T: int, segment: int) -> None:
    """In a subprocess: peak resident memory added by one prefill of T tokens."""
    model = make_model(GLAConfig(**CFG))
    ids = torch.randint(0, CFG["vocab_size"], (1, T), generator=torch.Generator().manual_seed(0))
    model.prefill(ids[:, :256], segment=256)  # warm-up: libraries, thread pools
    before = _status_kb("VmRSS")
    with open("/proc/self/clear_refs", "w") as f:
        f.write("5")  # reset the high-water mark to the current RSS
    t0 = time.perf_counter()
    model.prefill(ids, segment=segment)
    secs = time.perf_counter() - t0
    print(json.dumps({"tokens": T, "segment": segment, "seconds": secs,
                      "peak_added_bytes": (_status_kb("VmHWM") - before) * 1024}))


def memory(threads: int) -> dict:
    def run(T: int, segment: int) -> dict:
        # A fixed mmap threshold makes glibc return freed blocks to the OS, so resident memory
        # follows what the prefill holds instead of the allocator's fragmentation.
        env = dict(os.environ, MALLOC_MMAP_THRESHOLD_="65536")
        res = subprocess.run([sys.executable, __file__, "--threads", str(threads),
                              "--_memory-child", str(T), str(segment)],
                             capture_output=True, text=True, check=True, env=env)
        return json.loads(res.stdout.strip().splitlines()[-1])

    s4, s64, one = run(4096, SEGMENT), run(65536, SEGMENT), run(8192, 8192)
    return {"stream_4k": s4, "stream_64k": s64, "one_pass_8k": one,
            "ratio_64k_4k": s64["peak_added_bytes"] / s4["peak_added_bytes"],
            "one_pass_8k_vs_stream_4k": one["peak_added_bytes"] / s4["peak_added_bytes"]}


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--threads", type=int, default=1, help="torch threads (default 1)")
    p.add_argument("--json", action="store_true")
    p.add_argument("--_memory-child", nargs=2, type=int, help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    torch.set_num_threads(args.threads)
    global CLOCK
    CLOCK = time.thread_time if args.threads == 1 else time.perf_counter
    if args._memory_child:
        memory_child(*args._memory_child)
        return 0
    cfg = GLAConfig(**CFG)
    load0 = os.getloadavg()[0]
    res = {"config": CFG, "chunk": CHUNK, "segment": SEGMENT, "threads": args.threads,
           "clock": CLOCK.__name__,
           "speed": speed(cfg), "memory": memory(args.threads), "efficiency": efficiency(cfg)}
    res["load_average"] = [load0, os.getloadavg()[0]]
    if args.json:
        print(json.dumps(res, indent=1))
        return 0
    print(f"GLA prefill benchmark: hidden {cfg.hidden_size}, {cfg.num_hidden_layers} layers, "
          f"{cfg.num_heads} heads (d_k {cfg.head_k_dim}, d_v {cfg.head_v_dim}), chunk {CHUNK}, "
          f"{args.threads} thread(s), clock {res['clock']}, load average {load0:.1f} -> {res['load_average'][1]:.1f} "
          f"on {os.cpu_count()} CPUs")
    print("chunked / naive, tokens/s:")
    for T, r in res["speed"].items():
        if T == "laplace_heads_4096":
            print(f"    4096 tokens at Laplace head size (d_k 192, d_v 384, 2 heads): operator "
                  f"{r['op_speedup']:5.1f}x ({r['op_chunk_tok_s']:,.0f} vs {r['op_naive_tok_s']:,.0f})")
            continue
        line = (f"  {T:>6} tokens: operator {r['op_speedup']:5.1f}x ({r['op_chunk_tok_s']:,.0f} vs "
                f"{r['op_naive_tok_s']:,.0f}); model prefill {r['model_speedup']:5.1f}x "
                f"({r['model_chunk_tok_s']:,.0f} vs {r['model_naive_tok_s']:,.0f})")
        if "model_speedup_vs_decode_loop" in r:
            line += f"; vs decode-step loop {r['model_speedup_vs_decode_loop']:5.1f}x"
        print(line)
    m = res["memory"]
    mib = lambda d: d["peak_added_bytes"] / 2 ** 20  # noqa: E731
    print(f"streaming prefill, peak added memory 64K / 4K tokens: {m['ratio_64k_4k']:.2f}x "
          f"({mib(m['stream_64k']):.0f} vs {mib(m['stream_4k']):.0f} MiB); "
          f"one-pass 8K / streamed 4K: {m['one_pass_8k_vs_stream_4k']:.2f}x")
    e = res["efficiency"]
    print(f"chunked layer at {e['tokens']} tokens: {e['layer_gflops']:.1f} GFLOP/s = "
          f"{e['fraction']:.2f} of measured {e['dtype']} matmul ({e['matmul_gflops']:.1f} GFLOP/s)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
