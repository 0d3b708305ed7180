"""A re-runnable hostile campaign: bad inputs, faults and races against every command.

    python tests/campaign/hostile.py --out hostile.json [--jobs 2] [--only SUBSTRING]

Each case runs the real command (`python -m evalkit ...` or `evalkit-lm-eval`) in a
subprocess, in a fresh temporary folder, under a timeout and an address-space limit
(RLIMIT_AS, 6 GB), with OMP_NUM_THREADS=1 and HF_HUB_OFFLINE=1. It is classified
automatically, in the categories of issue 12's table:

- clear error: exit 1 or 2 with a message on stderr naming what the case says is wrong
  (`names`), and no "Traceback";
- handled fault: a fault scenario (interrupt + resume, corrupt cache, concurrency, foreign
  files) that ended with the right outputs, verified by comparing them;
- error not naming file/field: exit 1/2 without a traceback, but without the named path/field;
- traceback only: a "Traceback" on stderr;
- silently wrong or accepted: exit 0 where an error was expected, or a wrong result;
- data lost: a file that existed before the command changed or vanished (hashes compared);
- hang / unbounded memory: the timeout or the memory limit was hit.

It prints the table, every case outside the first two categories with its command and
stderr tail, and writes a JSON report to --out. Not collected by pytest (no test_ prefix).
Cheap models only (oracle, forgetful, the tiny tokenizer; recall-gla-tiny where a real
checkpoint is needed); `train-tiny` is only given arguments that must be refused.
"""
from __future__ import annotations

import argparse
import hashlib
import json
import os
import resource
import shutil
import signal
import subprocess
import sys
import tempfile
import textwrap
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

from cases import cases  # noqa: E402
from support import *  # noqa: F401,F403,E402


def classify(case: Case, tmp: Path) -> dict:
    if case.scenario is not None:
        t0 = time.time()
        try:
            cat, detail = case.scenario(tmp)
        except Exception as e:  # a bug in the campaign itself, reported as such
            cat, detail = "silently wrong or accepted", f"campaign error: {type(e).__name__}: {e}"
        return {"category": cat, "command": case.name, "rc": None, "detail": detail,
                "stderr_tail": detail, "seconds": round(time.time() - t0, 1)}
    cmd = case.cmd(tmp) if callable(case.cmd) else case.cmd
    cmd = [str(c) for c in cmd]
    before = snapshot(tmp)
    before_files = set(before)
    t0 = time.time()
    proc, out, err = sh(cmd, tmp, case.timeout, case.env)
    secs = round(time.time() - t0, 1)
    after = snapshot(tmp)
    # Bad input must change nothing; an "ok" case's own check verifies what it must keep.
    lost = [f for f in before_files if after.get(f) != before[f]] if case.expect == "error" else []
    text = out + err
    rc = None if proc is None else proc.returncode
    base = {"command": " ".join(cmd), "rc": rc, "seconds": secs,
            "stderr_tail": err.strip()[-600:]}
    if proc is None or rc in (-9, 137) or "MemoryError" in err:
        return {**base, "category": "hang / unbounded memory",
                "detail": f"timeout {case.timeout}s" if proc is None else "memory limit"}
    if lost:
        return {**base, "category": "data lost", "detail": f"changed or removed: {lost[:5]}"}
    if "Traceback" in err:
        return {**base, "category": "traceback only", "detail": err.strip().splitlines()[-1]}
    problem = case.check(tmp, proc) if case.check else None
    if case.expect == "ok":
        if rc == 0 and not problem:
            return {**base, "category": "handled fault", "detail": "exit 0, outputs verified"}
        return {**base, "category": "silently wrong or accepted",
                "detail": problem or f"exit {rc} where success was expected"}
    if rc == 0:
        return {**base, "category": "silently wrong or accepted", "detail": "exit 0 on bad input"}
    if problem:
        return {**base, "category": "silently wrong or accepted", "detail": problem}
    if rc in (1, 2):
        missing = [n for n in case.names if n.lower() not in text.lower()]
        if missing:
            return {**base, "category": "error not naming file/field",
                    "detail": f"message lacks {missing}"}
        return {**base, "category": "clear error", "detail": (err.strip() or out.strip()).splitlines()[-1][:200]}
    return {**base, "category": "silently wrong or accepted", "detail": f"exit {rc}"}


def run_case(case: Case, root: Path) -> dict:
    tmp = Path(tempfile.mkdtemp(prefix="case-", dir=root))
    try:
        if case.setup:
            case.setup(tmp)
        res = classify(case, tmp)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return {"name": case.name, **res}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", required=True, help="JSON report to write")
    ap.add_argument("--jobs", type=int, default=2)
    ap.add_argument("--only", help="run only cases whose name contains this")
    args = ap.parse_args(argv)
    root = Path(tempfile.mkdtemp(prefix="evalkit-hostile-"))
    t0 = time.time()
    try:
        golden(root / "golden")
        todo = [c for c in cases() if not args.only or args.only in c.name]
        print(f"{len(todo)} cases, {args.jobs} at a time", file=sys.stderr, flush=True)
        with ThreadPoolExecutor(args.jobs) as pool:
            results = list(pool.map(lambda c: run_case(c, root), todo))
    finally:
        shutil.rmtree(root, ignore_errors=True)
    counts = {c: sum(r["category"] == c for r in results) for c in CATEGORIES}
    print("| outcome | count |\n|---|---|")
    for c in CATEGORIES:
        print(f"| {c} | {counts[c]} |")
    print(f"\n{len(results)} cases in {time.time() - t0:.0f} s\n")
    for r in results:
        if r["category"] not in CATEGORIES[:2]:
            print(f"[{r['category']}] {r['name']}\n  $ {r['command']}\n  rc={r['rc']}: {r['detail']}\n"
                  f"  stderr: {r['stderr_tail'][-300:]!r}\n")
    Path(args.out).write_text(json.dumps({"counts": counts, "cases": results,
                                          "wall_s": round(time.time() - t0)}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
