"""`evalkit state MODEL_OR_CONFIG --context N [--dtype bf16] [--measure] [--json]`.

Prints, without loading weights, a model's parameter count, its state per sequence at N
tokens, the KV cache of a softmax model of the same width and depth at N tokens, and their
ratio. MODEL_OR_CONFIG: a config.json, a checkpoint folder holding one, "name:PATH", or a
registered model declared with a `config` (e.g. laplace). GLA configs and every transformers
family whose cache holds recurrent states or conv tails are understood; for the latter the
state is split into fixed, window and growing bytes and by role (recurrent, conv, window_kv,
kv, indexer), from the config's formula and, with --measure (the default for a checkpoint
folder), from an actual prefill of N tokens into a random model of that config.
"""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from evalkit.model_adapters.models import config_file
from evalkit.probe import check_tokens


def add_parser(subparsers) -> argparse.ArgumentParser:
    p = subparsers.add_parser(
        "state", help="state bytes vs a softmax KV cache, from the config alone",
        description=__doc__.split("\n\n")[1] if __doc__ else None)
    p.add_argument("model", metavar="MODEL_OR_CONFIG",
                   help="config.json, checkpoint folder, name:PATH or registered model name")
    p.add_argument("--context", type=int, default=8192, help="tokens for the KV-cache comparison")
    p.add_argument("--dtype", default="bf16", help="element type of state and cache (bf16, fp32)")
    p.add_argument("--measure", action=argparse.BooleanOptionalAction, default=None,
                   help="also prefill N tokens into a random model of the config and count its "
                        "cache (recurrent/hybrid families; default: on unless a config.json file is named)")
    p.add_argument("--json", action="store_true", help="print one JSON object")
    p.set_defaults(func=run)
    return p


def resolve_config(spec: str) -> Path:
    return config_file(spec)


def figures(spec: str, context: int, dtype: str = "bf16", measure: bool | None = None) -> dict:
    from evalkit.model_adapters.dtypes import dtype_name, parse_dtype
    from evalkit.model_adapters.facts import facts_of, read_config

    check_tokens(context, "--context")
    cfg_path = resolve_config(spec)
    config = read_config(cfg_path)
    facts = facts_of(config, cfg_path)
    if facts.family != "gla":
        from evalkit.model_adapters.recurrent.state_hf import hf_figures

        if measure is None:  # a checkpoint is meant to run here; a bare config.json is not
            measure = not Path(spec).expanduser().is_file()
        return hf_figures(cfg_path, config, context, dtype, measure=bool(measure))
    dt = parse_dtype(dtype)
    parts, kv = facts.state_at(context, dt), facts.softmax_kv_bytes(context, dt)
    return {"config": str(cfg_path), "dtype": dtype_name(dt), "context": context,
            "parameters": facts.parameters(), "state_bytes": parts.total, "kv_bytes": kv,
            "ratio": kv / parts.total, "state_kind": parts.kind, "fixed": parts.fixed,
            "window": parts.window, "growing": parts.growing}


def run(args: argparse.Namespace) -> int:
    try:
        f = figures(args.model, args.context, args.dtype, args.measure)
    except (FileNotFoundError, ValueError, KeyError) as e:
        print(f"evalkit state: {e}", file=sys.stderr)
        return 2
    if args.json:
        print(json.dumps(f))
        return 0
    if "family" in f:
        from evalkit.model_adapters.recurrent.state_hf import print_hf

        print_hf(f)
        return 0
    print(f"config       {f['config']}")
    print(f"parameters   {f['parameters']:,} ({f['parameters'] / 1e9:.3f} B)")
    print(f"state        {f['state_bytes']:,} B per sequence ({f['state_bytes'] / 1e6:.2f} MB, {f['dtype']}, "
          f"{f['state_kind']}): fixed {f['fixed']:,} + window {f['window']:,} + growing {f['growing']:,}")
    print(f"KV cache     {f['kv_bytes']:,} B for a same-width softmax model at {f['context']:,} tokens "
          f"({f['kv_bytes'] / 1e9:.3f} GB)")
    print(f"ratio        {f['ratio']:.1f}x")
    return 0
