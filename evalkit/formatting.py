"""How evalkit writes numbers, sizes, names and tables for people: one definition of each.

    >>> fmt_bytes(4864), fmt_bytes(29_491_200), fmt_bytes(512)
    ('4.86 kB', '29.5 MB', '512 B')
    >>> fmt_len(8192), fmt_len(1000)
    ('8k', '1,000')
    >>> slug("lm-eval/needle @ 1k")
    'lm-eval_needle_1k'
    >>> print(markdown_table(["model", "a|b"], [["gla", 1]]))
    | model | a\\|b |
    | --- | --- |
    | gla | 1 |
"""
from __future__ import annotations

import math
import re
from typing import Any, Sequence


def fmt_bytes(b: float | None) -> str:
    """Decimal units, three significant digits; an em dash for no value (None or NaN)."""
    if b is None or (isinstance(b, float) and math.isnan(b)):
        return "—"
    for unit, scale in (("GB", 1e9), ("MB", 1e6), ("kB", 1e3)):
        if b >= scale:
            return f"{b / scale:.3g} {unit}"
    return f"{b:.0f} B"


def fmt_len(n: float) -> str:
    """A token length: whole multiples of 1,024 as `8k`, others with thousands separators."""
    n = float(n)
    if n >= 1024 and n % 1024 == 0:
        return f"{int(n // 1024)}k"
    return f"{n:,.0f}"


def fmt_interval(row: Any, col: str = "recall") -> str:
    """" [lo, hi]": a row's 95 % interval of `col` (its `<col>_lo`, `<col>_hi`, as
    evalkit.cell_stats gives them); "" where it has none.

        >>> fmt_interval({"recall_lo": 0.301, "recall_hi": 0.954}), fmt_interval({})
        (' [0.30, 0.95]', '')
    """
    lo, hi = row.get(f"{col}_lo"), row.get(f"{col}_hi")
    if any(v is None or math.isnan(v) for v in (lo, hi)):
        return ""
    return f" [{lo:.2f}, {hi:.2f}]"


def slug(text: str, empty: str = "x") -> str:
    """`text` as a file-name-safe word (letters, digits, `_.-`); `empty` if nothing is left."""
    return re.sub(r"[^A-Za-z0-9_.-]+", "_", text).strip("_") or empty


def md_cell(v: Any) -> str:
    """One Markdown table cell: pipes escaped, line breaks as spaces (either would break the row)."""
    return str(v).replace("|", "\\|").replace("\n", " ")


def markdown_table(header: Sequence[Any], rows: Sequence[Sequence[Any]]) -> str:
    """A Markdown table (no trailing newline); cells through md_cell."""
    lines = ["| " + " | ".join(map(md_cell, header)) + " |",
             "|" + "|".join(" --- " for _ in header) + "|"]
    lines += ["| " + " | ".join(map(md_cell, r)) + " |" for r in rows]
    return "\n".join(lines)
