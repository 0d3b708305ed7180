"""`evalkit models`: the registered models with parameters, state kind and state bytes at N tokens.

Where the numbers come from, per registered name:
- MODEL_INFO[name]["describe"]: a callable `describe(n_tokens=N) -> dict` with keys parameters,
  state_kind, state_bytes (and optionally dtype, max_length) computed without loading weights.
- a factory with a `config_path` attribute (the GLA convention `evalkit state` also reads): a
  GLA config, counted from the config alone (bf16 state, as published); `config_path = None`
  marks a path loader.
- MODEL_INFO[name]["kind"] == "loader": a path loader (e.g. "hf"); listed without numbers.
- otherwise the model is loaded and asked: num_parameters(), state_kind, and state_bytes_at(N)
  when it has one (a content-dependent state, e.g. the reference memories, has none).
A model that fails to describe is listed with its error, and the command exits 1.
"""
from __future__ import annotations

import argparse
import json
from typing import Any

DEFAULT_TOKENS = 8192


def add_parser(subparsers: Any) -> argparse.ArgumentParser:
    p = subparsers.add_parser("models", help="list registered models: parameters, state kind, "
                                             "state bytes at N tokens",
                              description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--json", action="store_true", help="print a JSON list instead of a table")
    p.add_argument("--tokens", type=int, default=DEFAULT_TOKENS,
                   help=f"sequence length for the state-bytes column (default {DEFAULT_TOKENS})")
    p.set_defaults(func=run)
    return p


def describe_model(name: str, n_tokens: int = DEFAULT_TOKENS) -> dict:
    """One row for `name`; raises when the model cannot be described."""
    from evalkit.models import MODEL_INFO, MODELS, load_model

    info = MODEL_INFO.get(name, {})
    factory = MODELS.get(name)
    _absent = object()
    config_path = getattr(factory, "config_path", _absent)
    row: dict[str, Any] = {"name": name, "kind": info.get("kind"), "parameters": None,
                           "state_kind": None, "state_bytes": None, "n_tokens": n_tokens,
                           "dtype": None, "description": info.get("description")}
    if "describe" in info:
        d = info["describe"](n_tokens=n_tokens)
    elif config_path is not _absent and config_path is not None:
        from evalkit.state_cmd import figures

        f = figures(name, n_tokens, "bf16")
        d = {"parameters": f["parameters"], "state_kind": info.get("state_kind", "recurrent"),
             "state_bytes": f["state_bytes"], "dtype": f["dtype"]}
    elif info.get("kind") == "loader" or config_path is None:
        row["note"] = f"path loader: {name}:PATH"
        return row
    else:
        model = load_model(name)
        at = getattr(model, "state_bytes_at", None)
        d = {"parameters": model.num_parameters() if hasattr(model, "num_parameters") else None,
             "state_kind": getattr(model, "state_kind", None),
             "state_bytes": None if at is None else int(at(n_tokens)),
             "max_length": getattr(model, "max_length", None),
             "trained_length": getattr(model, "trained_length", None)}
        if at is None:
            row["note"] = "state size depends on content (no state_bytes_at)"
        ident = model.identity() if hasattr(model, "identity") else {}
        d.setdefault("dtype", ident.get("dtype"))
        row["kind"] = row["kind"] or ident.get("kind")
    for key in ("parameters", "state_kind", "state_bytes", "dtype", "max_length", "trained_length",
                "note"):
        if key in d:
            row[key] = d[key]
    return row


def _human(n: int | None) -> str:
    if n is None:
        return "-"
    for unit, scale in (("GB", 1e9), ("MB", 1e6), ("kB", 1e3)):
        if n >= scale:
            return f"{n / scale:.2f} {unit}"
    return f"{n} B"


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
            _human(r.get("state_bytes")) if r.get("state_bytes") is not None else "",
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
    from evalkit.models import MODEL_INFO, model_names

    n_tokens = getattr(args, "tokens", DEFAULT_TOKENS)
    if n_tokens < 1:
        raise SystemExit(f"--tokens must be >= 1, got {n_tokens}")
    rows, failed = [], False
    for name in model_names():
        try:
            rows.append(describe_model(name, n_tokens))
        except Exception as e:  # one broken model must not hide the others; rc says it failed
            failed = True
            rows.append({"name": name, "kind": MODEL_INFO.get(name, {}).get("kind"),
                         "error": f"error: {type(e).__name__}: {e}"})
    if getattr(args, "json", False):
        print(json.dumps(rows, indent=1))
    else:
        print(_table(rows, n_tokens))
    return 1 if failed else 0
