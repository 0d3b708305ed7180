"""The command line the shipped tokenizers' build scripts share: write, or `--check` that a
rebuild in a temporary folder gives the committed files byte for byte."""
from __future__ import annotations

import argparse
import filecmp
import sys
import tempfile
from pathlib import Path
from typing import Any, Callable


def _save(build: Callable[[], Any], out: Path) -> None:
    out.mkdir(parents=True, exist_ok=True)
    build().save_pretrained(str(out))


def main(build: Callable[[], Any], out: Path, description: str,
         argv: list[str] | None = None) -> int:
    """`build()` returns the tokenizer (a transformers fast tokenizer) to save."""
    ap = argparse.ArgumentParser(description=description)
    ap.add_argument("--check", action="store_true",
                    help="rebuild in a temporary folder and compare with the committed files")
    ap.add_argument("--out", type=Path, default=out)
    args = ap.parse_args(argv)
    if not args.check:
        _save(build, args.out)
        print(f"wrote {args.out}")
        return 0
    with tempfile.TemporaryDirectory() as tmp:
        _save(build, Path(tmp))
        names = sorted(p.name for p in Path(tmp).iterdir())
        _, mismatch, errors = filecmp.cmpfiles(tmp, args.out, names, shallow=False)
        if mismatch or errors:
            print(f"tokenizer differs from {args.out}: {mismatch + errors}", file=sys.stderr)
            return 1
    print(f"{args.out}: reproducible ({', '.join(names)})")
    return 0
