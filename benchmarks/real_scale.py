"""The brief's serving figures at real size: Laplace 3B (GLA) against a softmax model of the same
width and depth, every figure measured in this one run through evalkit.model_adapters.cost (what
`evalkit cost` measures, the same code).

Models (random weights, --dtype, default bf16):
- laplace:       configs/models/laplace-3b.json (hidden 3072, 24 layers, 8 heads, d_k 192, d_v 384);
- softmax-kv24:  transformers LlamaForCausalLM, 24 layers, hidden 3072, 24 heads of 128 with 24 KV
                 heads (the brief's comparison), SwiGLU 8192, SDPA, vocabulary 50,257;
- softmax-kv8:   the same with 8 KV heads (grouped-query, as Llama 3.2 3B).
Figures:
- decode ms per output token after each --contexts length (default 2K, 8K, 32K), as ratios
  to the shortest: the GLA's (brief: +0.5 % from 2K to 8K) against the softmax's;
- state bytes measured from the GLA's tensors (brief: 29,491,200 counted in bf16; evalkit
  holds it in fp32) against the softmax KV cache measured at the context nearest 8K (brief:
  about 82x with 24 KV heads);
- prefill at each --prefill-contexts length (default 1K, 4K, 16K) as a fraction of this
  machine's matmul limit (a 2048x3072 @ 3072x3072 matmul, same dtype and threads);
- peak resident memory added by the prefill at the longest context over the shortest.
Goals, printed met / missed: GLA decode 8K/2K <= 1.01 and 32K/2K <= 1.02 (the second and
third contexts over the first); GLA prefill >= 0.80 of the matmul limit at every length;
GLA peak memory at the longest context <= 1.05x the shortest.

Run in parts with --models and the context flags; --layers N keeps the real width at N layers
(a quick end-to-end check: `--layers 2 --contexts 256,512,1024 --prefill-contexts 256,1024`).

    python benchmarks/real_scale.py [--models laplace,softmax-kv24,softmax-kv8]
        [--contexts 2048,8192,32768] [--prefill-contexts 1024,4096,16384] [--decode 16]
        [--layers 24] [--dtype bf16] [--threads N] [--json]
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

from evalkit.model_adapters import cost, cost_model

ROOT = Path(__file__).resolve().parents[1]
LAPLACE = ROOT / "configs" / "models" / "laplace-3b.json"
MODELS = ("laplace", "softmax-kv24", "softmax-kv8")
BRIEF_STATE = 29_491_200  # bytes, bf16, the full 24 layers
GOALS = {"decode": (1.01, 1.02), "prefill_fraction": 0.80, "peak_memory": 1.05}


def csv_ints(text: str) -> list[int]:
    try:
        return [int(x) for x in text.split(",") if x.strip()]
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected comma-separated integers, got {text!r}") from None


def model_config(name: str, layers: int | None, max_len: int):
    if name == "laplace":
        from evalkit.model_adapters.gla.config import GLAConfig

        cfg = GLAConfig.from_json(LAPLACE)
        if layers is not None:
            cfg.num_hidden_layers = layers
        return cfg
    from transformers import LlamaConfig

    kv = {"softmax-kv24": 24, "softmax-kv8": 8}[name]
    return LlamaConfig(vocab_size=50257, hidden_size=3072, intermediate_size=8192,
                       num_hidden_layers=24 if layers is None else layers,
                       num_attention_heads=24, num_key_value_heads=kv, head_dim=128,
                       hidden_act="silu", max_position_embeddings=max_len, rms_norm_eps=1e-6,
                       tie_word_embeddings=False, bos_token_id=50256, eos_token_id=50256)


def measure(name: str, args) -> dict:
    contexts = sorted(set(args.contexts) | set(args.prefill_contexts))
    cfg = model_config(name, args.layers, max(contexts) + args.decode + 2)
    cm = cost_model.build_cost_model(cfg, args.dtype, name=name)
    t0 = time.perf_counter()
    try:
        res = cost.measure_cost(cm, contexts, decode=args.decode, decode_contexts=args.contexts,
                                prefill_contexts=args.prefill_contexts, threads=args.threads)
    except cost_model.CostError as e:
        return {"model": name, "refused": str(e)}
    res["seconds"] = time.perf_counter() - t0
    res["rows"] = {r["context"]: r for r in res["rows"]}
    return res


def verdict(ok: bool) -> str:
    return "met" if ok else "MISSED"


def model_figures(name: str, res: dict, args) -> dict:
    """Print one model's figures as soon as it is measured (a long run interrupted later keeps
    them in its log); returns them."""
    c = sorted(args.contexts)
    near8k = min(c, key=lambda t: abs(t - 8192))
    if "refused" in res:
        print(f"\n{name}: refused: {res['refused']}", flush=True)
        return res
    run, rows = res["run"], res["rows"]
    print(f"\n{name}: {run['parameters']:,} parameters, {run['dtype']}, {run['threads']} "
          f"thread(s), built in {run['build_seconds']:.1f} s, measured in {res['seconds']:.0f} s; "
          f"matmul limit {run['matmul_limit_flops_per_s'] / 1e9:.0f} GFLOP/s")
    fig: dict = {"run": run, "rows": list(rows.values())}
    dec = {t: rows[t]["decode_ms_per_token"] for t in c if rows[t]["decode_ms_per_token"]}
    if dec:
        base = dec[c[0]]
        fig["decode_ratios"] = {f"{t}/{c[0]}": dec[t] / base for t in c[1:]}
        print("  decode ms/token: " + ", ".join(f"{t:,}: {dec[t]:.1f}" for t in c)
              + "; ratios " + ", ".join(f"{k} {v:.3f}" for k, v in fig["decode_ratios"].items()))
    fig["prefill_fraction"] = {t: rows[t]["prefill_fraction_of_matmul_limit"]
                               for t in args.prefill_contexts}
    print("  prefill, fraction of the matmul limit: " + ", ".join(
        f"{t:,}: {rows[t]['prefill_fraction_of_matmul_limit']:.1%} "
        f"({rows[t]['prefill_tokens_per_s']:,.1f} tok/s; 2N count "
        f"{rows[t]['prefill_fraction_2n']:.1%})" for t in sorted(args.prefill_contexts)))
    peak = {t: rows[t]["peak_memory_bytes"] for t in c}
    fig["peak_memory_ratio"] = peak[c[-1]] / max(peak[c[0]], 1)
    print("  peak memory added by the prefill: " + ", ".join(
        f"{t:,}: {peak[t] / 2 ** 20:,.0f} MiB" for t in c)
        + f"; {c[-1]:,}/{c[0]:,} = {fig['peak_memory_ratio']:.3f}x")
    st = rows[near8k]
    fig["state_bytes"] = {"measured": st["state_bytes_measured"],
                          "formula": st["state_bytes_formula"],
                          "at_model_dtype": st["state_bytes_at_model_dtype"],
                          "context": near8k, "kind": st["state_parts_measured"]["kind"]}
    print(f"  state at {near8k:,}: measured {st['state_bytes_measured']:,} B "
          f"({st['state_parts_measured']['kind']}), formula {st['state_bytes_formula']:,} B, "
          f"elements at {run['dtype']}: {st['state_bytes_at_model_dtype']:,} B", flush=True)
    return fig


def report(figures: dict, args) -> dict:
    """Print the comparisons and goals across the measured models; returns them as one object."""
    out: dict = {"models": figures, "goals": []}
    c = sorted(args.contexts)
    near8k = min(c, key=lambda t: abs(t - 8192))
    gla = figures.get("laplace")
    if gla and "refused" not in gla:
        g = out["models"]["laplace"]
        layers = args.layers or 24
        expect = BRIEF_STATE * layers // 24
        s = g["state_bytes"]["at_model_dtype"]
        print(f"\nGLA state: {s:,} B counted at {args.dtype} (expected {expect:,} for {layers} "
              f"layers: {s / expect:.4f}x), held {g['state_bytes']['measured']:,} B (fp32)")
        for name in ("softmax-kv24", "softmax-kv8"):
            sm = out["models"].get(name)
            if sm and "state_bytes" in sm:
                kv = sm["state_bytes"]["measured"]
                print(f"  {name} KV measured at {near8k:,}: {kv:,} B = {kv / s:.1f}x the GLA state "
                      f"({kv / g['state_bytes']['measured']:.1f}x the fp32-held one)")
                out.setdefault("kv_over_state", {})[name] = kv / s
        print("\nDecode cost per output token, ratio to the shortest context:")
        for key, ratio in g.get("decode_ratios", {}).items():
            line = f"  {key}: GLA {ratio:.3f}"
            for name in ("softmax-kv24", "softmax-kv8"):
                sm = out["models"].get(name, {})
                if key in sm.get("decode_ratios", {}):
                    line += f", {name} {sm['decode_ratios'][key]:.3f}"
            print(line)
        print("\nGoals (GLA):")
        goals = []
        for (key, ratio), limit in zip(g.get("decode_ratios", {}).items(), GOALS["decode"]):
            goals.append((f"decode {key} <= {limit}", ratio, ratio <= limit))
        for t, f in sorted(g["prefill_fraction"].items()):
            goals.append((f"prefill {t:,} >= {GOALS['prefill_fraction']:.0%} of the matmul limit",
                          f, f >= GOALS["prefill_fraction"]))
        goals.append((f"peak memory {c[-1]:,}/{c[0]:,} <= {GOALS['peak_memory']}x",
                      g["peak_memory_ratio"], g["peak_memory_ratio"] <= GOALS["peak_memory"]))
        for text, value, ok in goals:
            print(f"  {text}: {value:.4f} {verdict(ok)}")
        out["goals"] = [{"goal": t, "value": v, "met": ok} for t, v, ok in goals]
    return out


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--models", default=",".join(MODELS),
                   help=f"comma-separated, of {', '.join(MODELS)} (default all)")
    p.add_argument("--contexts", type=csv_ints, default=[2048, 8192, 32768],
                   help="decode and peak-memory contexts (default 2048,8192,32768)")
    p.add_argument("--prefill-contexts", type=csv_ints, default=[1024, 4096, 16384],
                   help="prefill-fraction contexts (default 1024,4096,16384)")
    p.add_argument("--decode", type=int, default=16, help="decode steps per context (default 16)")
    p.add_argument("--layers", type=int, default=None,
                   help="depth at the real width (default 24: the real models)")
    p.add_argument("--dtype", default="bf16")
    p.add_argument("--threads", type=int, default=None, help="torch threads (default all cores)")
    p.add_argument("--json", action="store_true", help="print the figures as one JSON object")
    args = p.parse_args(argv)
    t0 = time.perf_counter()
    names = [m.strip() for m in args.models.split(",") if m.strip()]
    unknown = [m for m in names if m not in MODELS]
    try:
        if unknown or not names:
            raise cost_model.CostError(f"--models: unknown {', '.join(unknown) or '(none given)'}; "
                                 f"expected some of {', '.join(MODELS)}")
        if args.layers is not None and not 1 <= args.layers <= 24:
            raise cost_model.CostError(f"--layers must be between 1 and 24, got {args.layers}")
        if len(args.contexts) < 2:
            raise cost_model.CostError("--contexts: give at least two lengths (ratios to the shortest)")
        args.contexts = cost.check_contexts(args.contexts)
        args.prefill_contexts = cost.check_contexts(args.prefill_contexts, "--prefill-contexts")
        cost.check_decode(args.decode)
        if args.decode < 1:
            raise cost_model.CostError("--decode must be at least 1 here (decode ratios are a figure)")
        cost.check_threads(args.threads)
        cost_model.check_dtype(args.dtype)
    except cost_model.CostError as e:
        print(f"real_scale: error: {e}", file=sys.stderr)
        return 2
    print(f"real-scale benchmark: {', '.join(names)}; contexts {args.contexts}, prefill "
          f"{args.prefill_contexts}, {args.decode} decode steps, {args.layers or 24} layers, "
          f"{args.dtype}; load average {os.getloadavg()[0]:.1f} on {os.cpu_count()} CPUs")
    figures = report({name: model_figures(name, measure(name, args), args) for name in names},
                     args)
    wall = time.perf_counter() - t0
    figures["wall_seconds"] = wall
    figures["load_average_end"] = os.getloadavg()[0]
    print(f"\nwall time {wall:.0f} s ({wall / 60:.1f} min); load average at the end "
          f"{figures['load_average_end']:.1f}")
    if args.json:
        print(json.dumps(figures, default=str))
    return 0


if __name__ == "__main__":
    sys.exit(main())
