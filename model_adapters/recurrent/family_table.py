"""The README's table of transformers' recurrent and hybrid families, generated from the code:
every family the installed transformers ships (discover.py), built as a tiny random model
(tiny_configs.py: hidden 64, 2-4 layers), its state counted by role from a prefill at each
length (cache_state.py), whether it needs token-by-token feeding after a prefill (the load-time
probe, stepwise.py), or the exact reason it is refused.

    python -m evalkit.model_adapters.recurrent.family_table [--lengths 256,1024] [--dtype fp32]

prints the Markdown table (the bytes are the tiny models', for comparing families' layouts,
not any checkpoint's).
"""
from __future__ import annotations

import argparse
from typing import Any, Sequence

import torch

MEASURE_VOCAB = 256
MAX_LENGTH = 65_536  # tiny models, one forward each: longer only costs time and memory


def family_rows(lengths: Sequence[int] = (256, 1024), dtype: torch.dtype = torch.float32,
                only: Sequence[str] | None = None) -> list[dict[str, Any]]:
    """One row per discovered family (or the model_types in `only`, in discovery order)."""
    import transformers
    from transformers import AutoModelForCausalLM

    from evalkit.model_adapters.cache_state import UnknownCacheError, cache_state, roles_of
    from evalkit.model_adapters.recurrent.discover import recurrent_families
    from evalkit.model_adapters.recurrent.formula import UnsupportedFamily
    from evalkit.model_adapters.recurrent.forward import Stepper
    from evalkit.model_adapters.recurrent.stepwise import drops_state_on_chunks
    from evalkit.model_adapters.recurrent.tiny_configs import tiny_config

    rows = []
    for model_type, cls_name in recurrent_families():
        if only is not None and model_type not in only:
            continue
        row: dict[str, Any] = {"family": model_type, "class": cls_name}
        try:
            cfg = tiny_config(getattr(transformers, cls_name).config_class, MEASURE_VOCAB)
            torch.manual_seed(0)
            model = AutoModelForCausalLM.from_config(cfg, dtype=dtype).eval()
            stepper = Stepper(model)
            row["stepwise"] = drops_state_on_chunks(stepper, MEASURE_VOCAB)
            roles: set[str] = set()
            for n in lengths:
                ids = torch.randint(0, MEASURE_VOCAB, (1, n),
                                    generator=torch.Generator().manual_seed(n))
                with torch.inference_mode():
                    holder, _ = stepper.forward(None, ids, 0, all_logits=False)
                sb = cache_state(holder)
                roles |= set(roles_of(holder))
                row[n] = sb.total
                row["kind"] = sb.kind
            row["roles"] = sorted(roles)
        except (UnknownCacheError, UnsupportedFamily) as e:
            row["refused"] = str(e)
        rows.append(row)
    return rows


def markdown(rows: list[dict[str, Any]], lengths: Sequence[int] = (256, 1024)) -> str:
    head = ["family", "kind", "state by role"] + [f"bytes at {n:,}" for n in lengths] \
        + ["token by token after a prefill"]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for r in rows:
        if "refused" in r:
            cells = [r["family"], "refused", r["refused"]] + [""] * len(lengths) + [""]
        else:
            cells = [r["family"], r["kind"], ", ".join(r["roles"])] \
                + [f"{r[n]:,}" for n in lengths] + ["yes" if r["stepwise"] else "no"]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> int:
    from evalkit.model_adapters.dtypes import parse_dtype

    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--lengths", default="256,1024", help="comma-separated token counts")
    p.add_argument("--dtype", default="fp32")
    args = p.parse_args(argv)
    try:
        lengths = [int(x) for x in args.lengths.split(",")]
    except ValueError:
        p.error(f"--lengths: expected comma-separated integers, got {args.lengths!r}")
    if any(not 1 <= n <= MAX_LENGTH for n in lengths):
        p.error(f"--lengths: every length must be between 1 and {MAX_LENGTH:,}, got "
                f"{args.lengths!r}")
    try:
        dtype = parse_dtype(args.dtype)
    except ValueError as e:
        p.error(f"--dtype: {e}")
    print(markdown(family_rows(lengths, dtype), lengths))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
