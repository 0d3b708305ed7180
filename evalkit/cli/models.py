"""`evalkit models`: the registered models with parameters, state kind and state bytes at N tokens.

    evalkit models [--tokens N] [--json] [--plugins my_model.py]

The numbers come from each model's `describe` function (see evalkit.model_adapters.models), computed without
loading weights; a model without one is a path loader, listed as NAME:PATH. A model that fails
to describe is listed with its error, and the command exits 1.
"""
from __future__ import annotations

import argparse
import json
from typing import Any

from evalkit.formatting import fmt_bytes
from evalkit.model_adapters.models import DEFAULT_TOKENS, describe_model, model_info, model_names
from evalkit.probe import check_tokens
from evalkit.runner.plugins import import_plugins


def add_parser(subparsers: Any) -> argparse.ArgumentParser:
    p = subparsers.add_parser("models", help="list registered models: parameters, state kind, "
                                             "state bytes at N tokens",
                              description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--json", action="store_true", help="print a JSON list instead of a table")
    p.add_argument("--plugins", action="append", default=[],
                   help="Python file or module declaring models (repeatable)")
    p.add_argument("--tokens", type=int, default=DEFAULT_TOKENS,
                   help=f"sequence length for the state-bytes column (default {DEFAULT_TOKENS})")
    p.set_defaults(func=run)
    return p


def _table(rows: list[dict], n_tokens: int) -> str:
    head = ["name", "kind", "parameters", "state kind", f"state bytes @{n_tokens}", "", "dtype",
            "trained length", "note"]
    body = []
    for r in rows:
        body.append([
            r["name"], r.get("kind") or "-",
            f"{r['parameters']:,}" if r.get("parameters") is not None else "-",
            r.get("state_kind") or "-",
            f"{r['state_bytes']:,}" if r.get("state_bytes") is not None else "-",
            fmt_bytes(r.get("state_bytes")) if r.get("state_bytes") is not None else "",
            r.get("dtype") or "-",
            f"{r['trained_length']:,}" if r.get("trained_length") else "-",
            r.get("error") or r.get("note") or "",
        ])
    widths = [max(len(str(x)) for x in col) for col in zip(head, *body)]
    right = {2, 4, 5, 7}  # numbers right-aligned

    def fmt(cells: list) -> str:
        return "  ".join((str(c).rjust(w) if i in right else str(c).ljust(w))
                         for i, (c, w) in enumerate(zip(cells, widths))).rstrip()
    lines = [fmt(head), fmt(["-" * w for w in widths])] + [fmt(b) for b in body]
    return "\n".join(lines)


def run(args: argparse.Namespace) -> int:
    n_tokens = check_tokens(args.tokens, "--tokens")
    import_plugins(args.plugins, "--plugins")
    rows, failed = [], False
    for name in model_names():
        try:
            rows.append(describe_model(name, n_tokens))
        except Exception as e:  # one broken model must not hide the others; rc says it failed
            failed = True
            rows.append({"name": name, "kind": model_info(name).kind,
                         "error": f"error: {type(e).__name__}: {e}"})
    if args.json:
        print(json.dumps(rows, indent=1))
    else:
        print(_table(rows, n_tokens))
    return 1 if failed else 0
