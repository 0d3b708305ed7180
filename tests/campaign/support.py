"""Helpers of the hostile campaign (hostile.py): commands, scratch runs, faults, races."""
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

REPO = Path(__file__).resolve().parents[2]
TOK = REPO / "model_adapters" / "tiny" / "tokenizer"
GLA = REPO / "model_adapters" / "tiny" / "recall-gla-tiny"
PY = sys.executable
MEM_LIMIT = 6 << 30
CATEGORIES = ("clear error", "handled fault", "error not naming file/field", "traceback only",
              "silently wrong or accepted", "data lost", "hang / unbounded memory")
GOOD_RUN = ["--models", "oracle", "--tasks", "needle", "--lengths", "256", "--depths", "0.5",
            "--samples", "2", "--no-progress"]


def evalkit(*args: str) -> list[str]:
    return [PY, "-m", "evalkit", *map(str, args)]


@dataclass
class Case:
    name: str
    cmd: Callable[[Path], list[str]] | list[str]
    names: tuple[str, ...] = ()           # what an error must name (substrings of stderr+stdout)
    setup: Callable[[Path], None] | None = None
    expect: str = "error"                 # "error" or "ok" (a fault scenario that must recover)
    check: Callable[[Path, subprocess.CompletedProcess], str | None] | None = None
    scenario: Callable[[Path], tuple[str, str]] | None = None  # runs itself: (category, detail)
    timeout: float = 120
    env: dict = field(default_factory=dict)


# -- helpers --------------------------------------------------------------------------------

def _limits() -> None:
    resource.setrlimit(resource.RLIMIT_AS, (MEM_LIMIT, MEM_LIMIT))
    os.setsid()


def _env(extra: dict | None = None) -> dict:
    env = {**os.environ, "OMP_NUM_THREADS": "1", "HF_HUB_OFFLINE": "1",
           "TOKENIZERS_PARALLELISM": "false", **(extra or {})}
    return env


def sh(cmd: list[str], cwd: Path, timeout: float, env: dict | None = None):
    """(CompletedProcess | None on timeout, stdout, stderr)."""
    p = subprocess.Popen(cmd, cwd=cwd, env=_env(env), stdout=subprocess.PIPE,
                         stderr=subprocess.PIPE, text=True, preexec_fn=_limits)
    try:
        out, err = p.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        os.killpg(p.pid, signal.SIGKILL)
        out, err = p.communicate()
        return None, out, err
    return subprocess.CompletedProcess(cmd, p.returncode, out, err), out, err


def snapshot(folder: Path) -> dict[str, str]:
    return {str(p.relative_to(folder)): hashlib.sha256(p.read_bytes()).hexdigest()
            for p in sorted(folder.rglob("*")) if p.is_file()}


def write(path: Path, text: str | bytes) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(text if isinstance(text, bytes) else text.encode())
    return path


def comparable(run_dir: Path) -> tuple:
    """What must be identical between two runs of one config: rows and predictions."""
    res = json.loads((run_dir / "results.json").read_text())
    rows = json.dumps(res.get("rows"), sort_keys=True)
    preds = [(s.get("probe_id"), s.get("question"), s.get("prediction"), s.get("scores"))
             for s in map(json.loads, (run_dir / "samples.jsonl").read_text().splitlines())]
    return rows, preds


GOLDEN: dict[str, Path] = {}


def golden(root: Path) -> None:
    """Finished runs every run-file case copies: oracle and forgetful on needle."""
    root.mkdir(parents=True, exist_ok=True)
    for name, model in (("oracle", "oracle"), ("forgetful", "forgetful")):
        out = root / name
        args = list(GOOD_RUN)
        args[1] = model
        proc, o, e = sh(evalkit("run", *args, "--output", out), root, 300)
        if proc is None or proc.returncode != 0:
            sys.exit(f"golden run {name} failed:\n{o}\n{e}")
        GOLDEN[name] = out


def copy_run(tmp: Path, name: str = "oracle", as_: str = "run") -> Path:
    dst = tmp / as_
    shutil.copytree(GOLDEN[name], dst)
    return dst


def old_done(run_dir: Path) -> Path:
    """The run as the runner wrote it before DONE recorded the outputs' sha256."""
    done = json.loads((run_dir / "DONE").read_text())
    done.pop("sha256", None)
    (run_dir / "DONE").write_text(json.dumps(done))
    return run_dir


def flip_byte(data: bytes) -> bytes:
    """One bit flipped in the middle: a corruption that may keep the JSON valid."""
    i = len(data) // 2
    return data[:i] + bytes([data[i] ^ 0x01]) + data[i + 1:]


# -- user task generators (validate/run) ------------------------------------------------------

sys.path.insert(0, str(REPO / "tests"))
from test_hardening_validate import _GEN as GEN  # noqa: E402  (one correct generator, faults swapped in)

R = "probe = dataclasses.replace(probe, "
FAULTS = {
    "short probe (22 tokens for 256)": (R + "context=(Segment('The code is 4321.'),), questions=(dataclasses.replace(q, after_segment=1),), hash='')", "tokens"),
    "500K-token probe": (R + "context=probe.context + (Segment('x ' * 500000),), hash='')", "characters"),
    "tolerance 300": (R + "meta=dataclasses.replace(meta, tolerance=300), hash='')", "meta.tolerance"),
    "actual_length lies": (R + "meta=dataclasses.replace(meta, actual_length=200), hash='')", "meta.actual_length"),
    "empty context": (R + "context=(), questions=(dataclasses.replace(q, after_segment=0),), hash='')", "context is empty"),
    "max_new_tokens 0": (R + "questions=(dataclasses.replace(q, max_new_tokens=0),), hash='')", "max_new_tokens"),
    "max_new_tokens -3": (R + "questions=(dataclasses.replace(q, max_new_tokens=-3),), hash='')", "max_new_tokens"),
    "max_new_tokens 10**9": (R + "questions=(dataclasses.replace(q, max_new_tokens=10**9),), hash='')", "max_new_tokens"),
    "NaN meta depth": (R + "meta=dataclasses.replace(meta, depth=float('nan')), hash='')", "depth"),
    "NaN question depth": ("q2 = dataclasses.replace(q, depth=float('nan'))", "depth"),
    "inf in meta.extra": (R + "meta=dataclasses.replace(meta, extra=(('x', float('inf')),)), hash='')", "JSON"),
    "gold empty": (R + "questions=(dataclasses.replace(q, gold=('',), candidates=()),), hash='')", "gold"),
    "wrong seed": (R + "meta=dataclasses.replace(meta, seed=7), hash='')", "meta.seed"),
    "wrong task": (R + "task='needle', hash='')", "task"),
    "forged hash": ("object.__setattr__(probe, 'hash', 'f' * 64)", "hash"),
    "returns None": ("probe = None", "None"),
    "returns dict": ("probe = probe.to_dict()", "dict"),
    "returns str": ("probe = 'x'", "str"),
    "returns list": ("probe = [probe]", "list"),
    "raises ZeroDivisionError": ("probe = 1 / 0", "ZeroDivisionError"),
    "raises KeyError": ("probe = {}['k']", "KeyError"),
    "fact_token negative": (R + "questions=(dataclasses.replace(q, fact_token=-5),), hash='')", "fact_token"),
}


def user_task(folder: Path, fault: str = "pass", yaml_extra: str = "") -> Path:
    write(folder / "gen.py", textwrap.dedent(GEN.format(fault=fault)))
    write(folder / "t.yaml", "task: t\ngenerator: gen:generate\n"
                             "defaults: {lengths: [256], depths: [0.5], samples: 1}\n" + yaml_extra)
    return folder


# -- fault scenarios ------------------------------------------------------------------------

def interrupt_then_resume(sig: int):
    def scenario(tmp: Path) -> tuple[str, str]:
        out = tmp / "r"
        args = ["--models", "forgetful", "--tasks", "needle,needle_multi", "--lengths", "256,512",
                "--depths", "0,0.5,1", "--samples", "3", "--no-progress"]
        ref, _, e = sh(evalkit("run", *args, "--output", tmp / "ref"), tmp, 400)
        if ref is None or ref.returncode != 0:
            return "traceback only" if "Traceback" in e else "silently wrong or accepted", e[-400:]
        p = subprocess.Popen(evalkit("run", *args, "--output", out), cwd=tmp, env=_env(),
                             stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
                             preexec_fn=_limits)
        time.sleep(6)
        os.kill(p.pid, sig)
        try:
            _, err = p.communicate(timeout=60)
        except subprocess.TimeoutExpired:
            os.killpg(p.pid, signal.SIGKILL)
            return "hang / unbounded memory", f"did not stop after signal {sig}"
        if "Traceback" in err:
            return "traceback only", err[-400:]
        res, _, e2 = sh(evalkit("run", "--resume", out, "--no-progress"), tmp, 400)
        if res is None:
            return "hang / unbounded memory", "resume timed out"
        if res.returncode != 0:
            return ("traceback only" if "Traceback" in e2 else "silently wrong or accepted"), e2[-400:]
        if comparable(out) != comparable(tmp / "ref"):
            return "silently wrong or accepted", "resumed results differ from an uninterrupted run"
        return "handled fault", f"signal {sig} then --resume: identical rows and predictions"
    return scenario


def concurrent(build: Callable[[Path], list[list[str]]], verify: Callable[[Path, list], str | None]):
    def scenario(tmp: Path) -> tuple[str, str]:
        cmds = build(tmp)
        procs = [subprocess.Popen(c, cwd=tmp, env=_env(), stdout=subprocess.PIPE,
                                  stderr=subprocess.PIPE, text=True, preexec_fn=_limits)
                 for c in cmds]
        results = []
        for p in procs:
            try:
                o, e = p.communicate(timeout=300)
            except subprocess.TimeoutExpired:
                os.killpg(p.pid, signal.SIGKILL)
                return "hang / unbounded memory", "a concurrent command never finished"
            results.append((p.returncode, o, e))
        if any("Traceback" in e for _, _, e in results):
            return "traceback only", next(e for _, _, e in results if "Traceback" in e)[-400:]
        problem = verify(tmp, results)
        if problem:
            return "silently wrong or accepted", problem
        return "handled fault", "; ".join(f"rc={rc}" for rc, _, _ in results)
    return scenario


def two_runs_same_output(tmp: Path) -> list[list[str]]:
    return [evalkit("run", *GOOD_RUN, "--output", tmp / "r")] * 2


def verify_one_run(tmp: Path, results: list) -> str | None:
    ok = [r for r in results if r[0] == 0]
    if not ok:
        return "neither concurrent run finished"
    if comparable(tmp / "r") != comparable(GOLDEN["oracle"]):
        return "the surviving run differs from a lone run"
    return None


def two_resumes(tmp: Path) -> list[list[str]]:
    run = copy_run(tmp)
    (run / "DONE").unlink()
    return [evalkit("run", "--resume", run, "--no-progress")] * 2


def verify_resumed(tmp: Path, results: list) -> str | None:
    if not any(r[0] == 0 for r in results):
        return "no resume finished"
    return None if comparable(tmp / "run") == comparable(GOLDEN["oracle"]) else "results differ"


def two_publishes(tmp: Path) -> list[list[str]]:
    copy_run(tmp)
    return [evalkit("publish", tmp / "run", "--to", tmp / "lb", "--bootstrap", "200")] * 2


def verify_published(tmp: Path, results: list) -> str | None:
    if not any(r[0] == 0 for r in results):
        return "no publish finished"
    if not (tmp / "lb").is_dir() or not any((tmp / "lb").iterdir()):
        return "leaderboard folder empty"
    return None


def corrupt_cache_then_run(edit: Callable[[Path], None]):
    def scenario(tmp: Path) -> tuple[str, str]:
        cache = tmp / "cache"
        first, _, e = sh(evalkit("run", *GOOD_RUN, "--output", tmp / "a", "--cache-dir", cache), tmp, 200)
        if first is None or first.returncode != 0:
            return "traceback only" if "Traceback" in e else "silently wrong or accepted", e[-400:]
        for f in sorted(cache.rglob("*.json"))[:3]:
            edit(f)
        second, _, e = sh(evalkit("run", *GOOD_RUN, "--output", tmp / "b", "--cache-dir", cache), tmp, 200)
        if second is None:
            return "hang / unbounded memory", "second run timed out"
        if "Traceback" in e:
            return "traceback only", e[-400:]
        if second.returncode == 0 and comparable(tmp / "b") == comparable(tmp / "a"):
            return "handled fault", "corrupt entries recomputed"
        if second.returncode in (1, 2) and "cache" in e:
            return "clear error", e.strip().splitlines()[-1]
        return "silently wrong or accepted", f"rc={second.returncode}: {e[-300:]}"
    return scenario


# -- the cases ------------------------------------------------------------------------------
