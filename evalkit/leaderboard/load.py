"""Read finished run folders (runs/<id>/) into pandas DataFrames.

A run counts only once its `DONE` marker exists: the runner writes it last, so a folder without
it is still running or crashed, and publishing it would show half a grid as if it were final.
DONE records the outputs' sha256 (evalkit.runner.rundir): a file changed since is refused.
Every problem is an error naming the file (and line or field) at fault.
"""
from __future__ import annotations

import json
import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterable

import pandas as pd

from evalkit import scoring
from evalkit.cell_stats import counted, miss_scores, response_time
from evalkit.result import SampleResult
from evalkit.lm_eval.rows import board_part
from evalkit.runner.arrivals import closed as closed_label
from evalkit.runner.rundir import check_output_sums
from evalkit.runner.shard import WHOLE, Shard, from_dict as shard_from_dict

RUN_FILES = ("results.json", "samples.jsonl", "DONE")
_SAMPLE_FIELDS = tuple(SampleResult.__dataclass_fields__)
# What the leaderboard cannot do without (the grid identity of a sample and its model).
REQUIRED = ("model", "model_hash", "task", "task_version", "probe_id", "probe_hash", "question",
            "target_length", "depth", "load", "seed", "state_kind")
SCORE_PREFIX = "score."  # metric columns in the samples frame: "score.<metric>"


@dataclass
class Run:
    path: Path
    run_id: str
    created: pd.Timestamp
    evalkit_version: str
    config_hash: str
    provenance: dict[str, Any]
    models: dict[str, dict[str, Any]]   # name -> identity (incl. "hash")
    tasks: dict[str, dict[str, Any]]    # name -> {"version", "config_hash", "source"}
    samples: pd.DataFrame = field(repr=False)
    shard: Shard = WHOLE                # a part of a suite run with --shard I/N


def _is_run(path: Path) -> bool:
    return any((path / f).exists() for f in RUN_FILES + ("config.json",))


def expand_run_dirs(paths: Iterable[str | Path]) -> list[Path]:
    """Run folders as given; a folder that is not a run itself stands for its runs (runs/)."""
    out: list[Path] = []
    for p in map(Path, paths):
        if not p.is_dir():
            raise FileNotFoundError(f"{p}: no such run folder")
        if _is_run(p):
            out.append(p)
            continue
        children = sorted(c for c in p.iterdir() if c.is_dir() and _is_run(c))
        if not children:
            raise FileNotFoundError(f"{p}: neither a run folder (no results.json, samples.jsonl "
                                    f"or DONE) nor a folder of runs")
        out.extend(children)
    return out


def _need(obj: dict, key: str, where: str, kind: type | tuple[type, ...]) -> Any:
    if key not in obj:
        raise ValueError(f"{where}: missing field {key!r}")
    if not isinstance(obj[key], kind):
        raise ValueError(f"{where}: field {key!r} should be {getattr(kind, '__name__', kind)}, "
                         f"got {type(obj[key]).__name__}")
    return obj[key]


def _read_json(path: Path) -> dict:
    try:
        obj = json.loads(path.read_bytes().decode("utf-8"))
    except ValueError as e:  # JSONDecodeError, UnicodeDecodeError
        raise ValueError(f"{path}: not valid JSON ({e})") from None
    if not isinstance(obj, dict):
        raise ValueError(f"{path}: expected a JSON object")
    return obj


def read_samples(path: Path) -> list[dict[str, Any]]:
    rows = []
    with open(path, "rb") as f:
        for i, line in enumerate(f, 1):
            if not line.strip():
                continue
            try:
                d = json.loads(line.decode("utf-8"))
            except ValueError as e:  # JSONDecodeError, UnicodeDecodeError
                raise ValueError(f"{path}:{i}: not valid JSON ({e})") from None
            if not isinstance(d, dict):
                raise ValueError(f"{path}:{i}: expected a JSON object")
            missing = [k for k in REQUIRED if d.get(k) is None]
            if missing:
                raise ValueError(f"{path}:{i}: missing field(s) {missing}")
            scores = d.get("scores") or {}
            if not isinstance(scores, dict):
                raise ValueError(f"{path}:{i}: field 'scores' should be an object")
            for k, v in scores.items():
                if not isinstance(v, (int, float)) or isinstance(v, bool) or not 0 <= v <= 1:
                    raise ValueError(f"{path}:{i}: scores[{k!r}] = {v!r} is not a number in [0, 1]")
            _check_timing(d, f"{path}:{i}")
            d["_line"] = i
            rows.append(d)
    return rows


def _check_timing(d: dict, where: str) -> None:
    """What a cell's response times are read from (cell_stats.response_time): latency_s a
    finite number >= 0, attempts a whole number >= 0; either may be absent (null)."""
    lat, attempts = d.get("latency_s"), d.get("attempts")
    if lat is not None and (not isinstance(lat, (int, float)) or isinstance(lat, bool)
                            or not math.isfinite(lat) or lat < 0):
        raise ValueError(f"{where}: latency_s = {lat!r} is not a finite number of seconds >= 0")
    if attempts is not None and (not isinstance(attempts, int) or isinstance(attempts, bool)
                                 or attempts < 0):
        raise ValueError(f"{where}: attempts = {attempts!r} is not a whole number >= 0")


def load_run(path: str | Path) -> Run:
    path = Path(path)
    if not path.is_dir():
        raise FileNotFoundError(f"{path}: no such run folder")
    if not (path / "DONE").exists():
        raise ValueError(f"{path}: incomplete run (no DONE marker); it is still running or "
                         f"stopped early. Finish or resume it before publishing")
    for name in ("results.json", "samples.jsonl"):
        if not (path / name).is_file():
            raise FileNotFoundError(f"{path}: DONE is present but {name} is missing")
    check_output_sums(path, _read_json(path / "DONE"))
    rpath = path / "results.json"
    res = _read_json(rpath)
    run_id = _need(res, "run_id", str(rpath), str)
    created_raw = _need(res, "created", str(rpath), str)
    try:
        created = pd.Timestamp(created_raw)
        created = created.tz_localize("UTC") if created.tzinfo is None else created.tz_convert("UTC")
    except ValueError:
        raise ValueError(f"{rpath}: field 'created' is not a date/time: {created_raw!r}") from None
    models = _need(res, "models", str(rpath), dict)
    tasks = _need(res, "tasks", str(rpath), dict)
    for t, info in tasks.items():
        where = f"{rpath}: tasks[{t!r}]"
        if not isinstance(info, dict):
            raise ValueError(f"{where}: expected an object")
        _need(info, "version", where, str)
        _need(info, "config_hash", where, str)
    # provenance.json duplicates results.json's copy; a garbage one is still refused, by name
    ppath = path / "provenance.json"
    provenance = _read_json(ppath) if ppath.is_file() else None
    provenance = res.get("provenance", provenance)

    spath = path / "samples.jsonl"
    parts = [(spath, read_samples(spath))]
    lm = board_part(path, res, read_samples)  # lm-eval's per-document rows, if any
    if lm is not None:
        tasks = {**tasks, **lm.tasks}
        parts.append((lm.file, lm.rows))
    parts = [(p, rows) for p, rows in parts if rows]
    if not parts:
        raise ValueError(f"{spath}: no samples")
    df = pd.concat([_frame(rows, p, tasks, models) for p, rows in parts], ignore_index=True)
    # served models' latencies are a deployment's (the board shows their percentiles)
    df["served"] = df["model"].map(lambda m: (models.get(m) or {}).get("kind") == "served")
    # an answer of a served run made before response times were recorded (no service_s) was
    # timed from its send: no response time (leaderboard.served shows it as service time)
    df.loc[df["served"] & df["answered"] & df["service_s"].isna(), "response_s"] = float("nan")
    # a served sample of a run made before closed-loop loads were recorded: its concurrency
    # from the model's options ("?" where they do not say)
    old = df["served"] & (df["arrivals"] == "")
    df.loc[old, "arrivals"] = df.loc[old, "model"].map(lambda m: closed_label(
        ((models.get(m) or {}).get("options") or {}).get("concurrency", "?")))
    shard = shard_from_dict(res.get("shard"), str(rpath))
    df["shards"] = shard.count  # N shards offer one schedule together (leaderboard.served)
    df["run_id"] = run_id
    df["run_created"] = created
    df["run_dir"] = str(path)
    return Run(path=path, run_id=run_id, created=created,
               evalkit_version=str(res.get("evalkit_version", "")),
               config_hash=str(res.get("config_hash", "")), provenance=provenance or {},
               models=models, tasks=tasks, samples=df, shard=shard)


def _frame(rows: list[dict], spath: Path, tasks: dict[str, dict],
           models: dict[str, dict]) -> pd.DataFrame:
    """One row per sample. A failed sample carries its misses as scores (cell_stats.miss_scores:
    0 in every metric its answer would have had), so every table counts it the same way."""
    for r in rows:
        if r.get("error") is not None:
            fc = scoring.scores_forced_choice(models.get(r["model"]))
            r["scores"] = miss_scores(r.get("kind"), len(r.get("candidates") or ()), fc)
        elif r.get("flag") is None:  # a metric added since the run: scored from the answer
            try:
                r["scores"] = scoring.fill_missing(r.get("scores") or {}, r.get("prediction"),
                                                   r.get("gold") or [], r.get("kind"))
            except ValueError as e:
                raise ValueError(f"{spath}:{r['_line']}: {e}") from None
    metrics = sorted({m for r in rows for m in (r.get("scores") or {})})
    scoring.check_names(metrics, f"{spath}: scores")
    flat = []
    for r in rows:
        t = r["task"]
        if t not in tasks:
            raise ValueError(f"{spath}:{r['_line']}: task {t!r} is not listed in results.json "
                             f"'tasks' (known: {sorted(tasks)})")
        if str(r["task_version"]) != tasks[t]["version"]:
            raise ValueError(f"{spath}:{r['_line']}: task_version {r['task_version']!r} differs "
                             f"from results.json tasks[{t!r}].version {tasks[t]['version']!r}")
        d = {k: r.get(k) for k in _SAMPLE_FIELDS if k not in
             ("scores", "candidates", "candidate_logprobs", "gold")}
        d["candidate_logprobs"] = tuple(r.get("candidate_logprobs") or ())  # served drift
        d["task_version"] = str(d["task_version"])
        d["task_config_hash"] = tasks[t]["config_hash"]
        d["task_metric"] = str(tasks[t].get("metric") or "")  # a task's own recall (RULER's)
        d["line"] = r["_line"]
        # one definition of a cell's numbers (evalkit.cell_stats): what counts, and the time
        d["scored"] = counted(r.get("error"), r.get("flag"))
        d["answered"] = r.get("error") is None and r.get("flag") is None
        d["response_s"] = response_time(r.get("latency_s"), r.get("error"), r.get("attempts"))
        scores = r.get("scores") or {}
        for m in metrics:
            d[SCORE_PREFIX + m] = float(scores[m]) if m in scores else float("nan")
        flat.append(d)
    df = pd.DataFrame(flat)
    df["depth"] = df["depth"].astype(float)
    df["arrivals"] = df["arrivals"].fillna("").astype(str)  # "": sent as fast as possible
    for c in ("target_length", "load", "question", "seed"):
        df[c] = df[c].astype("int64")
    # Sizes may be absent on a sample that failed before its prompt was built.
    for c in ("prompt_tokens", "prompt_chars", "state_bytes", "response_s"):
        df[c] = pd.to_numeric(df[c], errors="coerce").astype("float64")
    # `scored`: the sample counts in its cell's numbers (answered, or failed: a miss), not
    # flagged (over the model's length, a fact in its sinks: never attempted); `answered`:
    # scored from an answer. State bytes are an answer's: none for a failure.
    df.loc[df["error"].notna(), "state_bytes"] = float("nan")
    key = ["model_hash", "task", "probe_hash", "question"]
    dup = df[df.duplicated(key, keep=False)]
    if len(dup):
        r = dup.iloc[0]
        raise ValueError(f"{spath}:{int(r['line'])}: duplicate sample (model {r['model']}, probe "
                         f"{r['probe_id']}, question {r['question']}); each must appear once")
    return df


def metric_columns(df: pd.DataFrame) -> list[str]:
    return [c[len(SCORE_PREFIX):] for c in df.columns if c.startswith(SCORE_PREFIX)]
