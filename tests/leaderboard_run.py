"""The leaderboard tests' shared real run and the plain-Python helpers that check it.

One real run (the runner, the oracle and forgetful reference adapters, the shared tiny
tokenizer, the real needle generator on two small grids: depth x length, and a load sweep);
table values are recomputed from its samples.jsonl with plain Python (json, statistics), not
with the leaderboard's pandas code.
"""
from __future__ import annotations

import json
import math
import shutil
import statistics
from pathlib import Path

from helpers import restamp

# forgetful keeps this many n-gram entries: enough for 128-token prompts, not for 256+, so
# facts at depth 0 are lost at the longer lengths (a real recall gap against the oracle).
CAPACITY = 1200
NEEDLE_YAML = """task: lb_needle
version: "1"
generator: evalkit.tasks.needle:generate
description: depth x length grid (leaderboard tests)
params: {haystack: prose, digits: 4}
defaults: {lengths: [128, 256, 512], depths: [0.0, 1.0], loads: [1], samples: 2}
"""
LOAD_YAML = """task: lb_load
version: "1"
generator: evalkit.tasks.needle:generate
description: load sweep (leaderboard tests)
params: {haystack: prose, digits: 4}
defaults: {lengths: [256], depths: [0.5], loads: [1, 2, 4, 8], samples: 2}
"""
PRIMARY = "word_match"


def make_real_run(tmp_path_factory) -> Path:
    from evalkit.runner import resolve, run_suite
    from evalkit.runner.suite import validate

    root = tmp_path_factory.mktemp("lbrun")
    (root / "tasks").mkdir()
    (root / "tasks" / "lb_needle.yaml").write_text(NEEDLE_YAML)
    (root / "tasks" / "lb_load.yaml").write_text(LOAD_YAML)
    suite = {"name": "lbtest", "include": [str(root / "tasks")],
             "models": ["oracle", {"name": "forgetful", "options": {"capacity": CAPACITY}}],
             "tasks": ["lb_needle", "lb_load"]}
    out = run_suite(resolve(validate(suite, "test"), "test"), output=root / "run",
                    progress=False)
    assert (out.run_dir / "DONE").exists() and out.failed == 0
    return out.run_dir


def samples_of(run: Path) -> list[dict]:
    return [json.loads(line) for line in (run / "samples.jsonl").read_text().splitlines()]


def scored(s: dict) -> bool:
    return s["error"] is None and s["flag"] is None


def mean_wilson(vals: list[float]) -> tuple[float, float, float]:
    """(mean, lo, hi): the mean and its 95 % Wilson interval, by the textbook formula."""
    m, n, z = statistics.fmean(vals), len(vals), 1.959963984540054
    centre, half = m + z * z / (2 * n), z * math.sqrt(m * (1 - m) / n + z * z / (4 * n * n))
    return m, (centre - half) / (1 + z * z / n), (centre + half) / (1 + z * z / n)


def readme_table(readme: str, heading: str, nth: int = 0) -> list[list[str]]:
    """The nth Markdown table after `heading`, as rows of cells (header first)."""
    text = readme.split(heading + "\n", 1)[1]
    tables, cur = [], []
    for line in text.splitlines():
        if line.startswith("|"):
            if not line.startswith("| ---") and not line.startswith("|---"):
                cur.append([c.strip() for c in line.strip("|").split(" | ")])
        elif cur:
            tables.append(cur)
            cur = []
        if line.startswith("## ") and tables:
            break
    if cur:
        tables.append(cur)
    return tables[nth]


def snapshot(folder: Path) -> dict[str, bytes]:
    return {p.relative_to(folder).as_posix(): p.read_bytes()
            for p in sorted(folder.rglob("*")) if p.is_file()}


def copy_run(src: Path, dst: Path, *, run_id: str | None = None, created: str | None = None,
             edit_sample=None, edit_results=None) -> Path:
    """A copy of a real run with its identity or samples changed, as a rerun would have."""
    shutil.copytree(src, dst, ignore=shutil.ignore_patterns("cache"))
    res = json.loads((dst / "results.json").read_text())
    res["run_id"] = run_id or dst.name
    if created:
        res["created"] = created
    if edit_results:
        edit_results(res)
    (dst / "results.json").write_text(json.dumps(res))
    if edit_sample:
        rows = [edit_sample(s) for s in samples_of(dst)]
        (dst / "samples.jsonl").write_text(
            "".join(json.dumps(s) + "\n" for s in rows if s is not None))
    return restamp(dst)

