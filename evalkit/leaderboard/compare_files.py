"""The files `evalkit compare` writes: a report as NAME.json and NAME.md in one folder, each
atomically, never replacing a file of that name that compare did not write (the drift report
and the two-model paired report share this)."""
from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any, Callable

from evalkit.atomic import write_text
from evalkit.owned_folder import refuse_foreign


def marker(fmt: str) -> str:
    """The first line of a Markdown report: who wrote it, so a rerun may replace it."""
    return f"<!-- {fmt}: written by `evalkit compare`; rerunning it replaces this file -->"


def to_json(report: dict[str, Any]) -> str:
    """allow_nan=False: a non-finite number is a bug here, never written."""
    return json.dumps(report, indent=1, sort_keys=True, ensure_ascii=False, allow_nan=False) + "\n"


def _ours(path: Path, json_name: str, fmt: str) -> bool:
    try:
        if path.name == json_name:
            return json.loads(path.read_text(encoding="utf-8")).get("format") == fmt
        return path.read_text(encoding="utf-8").startswith(marker(fmt))
    except (OSError, ValueError, AttributeError):
        return False


def write_report(report: dict[str, Any], out: str | os.PathLike, *, fmt: str, json_name: str,
                 md_name: str, render_markdown: Callable[[dict[str, Any]], str]) -> list[Path]:
    """`json_name` and `md_name` in `out`; both texts are made before either file is written."""
    out = Path(out)
    if out.exists() and not out.is_dir():
        raise ValueError(f"--out {out}: exists and is not a folder")
    paths = [out / json_name, out / md_name]
    refuse_foreign(paths, lambda p: None if _ours(p, json_name, fmt)
                   else "not written by evalkit compare", command="evalkit compare", flag="--out")
    text_json, text_md = to_json(report), render_markdown(report)  # fail before writing
    write_text(paths[1], text_md)
    write_text(paths[0], text_json)
    return paths
