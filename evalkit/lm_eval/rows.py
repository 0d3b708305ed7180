"""lm-eval's per-document results as evalkit sample rows, so the board publishes them.

lm-eval keeps one record per document when asked to log samples (doc, arguments, resps,
filtered_resps, target, and each metric's value). `doc_rows` turns one (model, task) pair's
records into rows of evalkit's sample record (evalkit.result.SampleResult, the format of a
run's samples.jsonl), one per document:
- task: the lm-eval task name; task_version: lm-eval's version of it, as a string;
  probe_id "<task>/doc<doc_id>"; probe_hash: a hash of the task, doc id and lm-eval's
  doc_hash (the same document on two models has the same one); question 0; kind: the task's
  output_type.
- target_length: the document's `max_length` (RULER's target length, in the tokenizer the
  task was built with); 0 for a task without one. depth 0.0 and load 0: lm-eval documents
  carry neither (a native probe has load >= 1, so 0 reads "not set").
- prompt_tokens / prompt_chars: the request's context as the evalkit model encodes it.
- generate_until: prediction (lm-eval's filtered response), gold (the target as a list), scores:
  evalkit's generation metrics (evalkit.scoring) of that answer, and the task's own metric
  where evalkit knows its definition: RULER's string_match_all / string_match_part, whose
  per-document value is taken from lm-eval (its length-named metric), for parity.
- multiple_choice: candidates (the gold choice first), candidate_logprobs (lm-eval's
  loglikelihoods in that order), gold [the gold choice] and evalkit's forced-choice metrics.
- other output types (loglikelihood, loglikelihood_rolling) have no answer evalkit scores:
  no rows; `doc_rows` says so in its note.
state_bytes is None (unknown: lm-eval does not hand the state over).

The rows of a run are written to RUN_DIR/lm_eval/samples.jsonl; results.json's
"lm_eval" -> "board" names the file, its sha256 and the tasks' version and config hash
(`board_entry`), which `board_part` reads back for evalkit.leaderboard.load.
"""
from __future__ import annotations

import hashlib
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Sequence

from evalkit import atomic, scoring
from evalkit.digest import sha256_file
from evalkit.probe import canonical_json
from evalkit.result import SampleResult

ROWS_FILE = "samples.jsonl"  # under RUN_DIR/lm_eval/


def ruler_metric(task: Any) -> str | None:
    """The evalkit metric a RULER task scores with, or None for any other task."""
    fn = getattr(task.config, "process_results", None)
    if getattr(fn, "__module__", "").startswith("lm_eval.tasks.ruler."):
        return scoring.RULER_SCORERS.get(getattr(fn, "__name__", ""))
    return None


def _gold_list(target: Any) -> list[str]:
    return [str(t) for t in target] if isinstance(target, (list, tuple)) else [str(target)]


def _probe_hash(task: str, doc_id: int, doc_hash: str) -> str:
    return hashlib.sha256(canonical_json([task, doc_id, doc_hash]).encode()).hexdigest()


def doc_rows(task_name: str, task: Any, records: Sequence[dict], *, model: str,
             model_hash: str, state_kind: str, version: str, seed: int,
             encode: Callable[[str], list[int]]) -> tuple[list[dict], str | None]:
    """(rows, note): one SampleResult dict per lm-eval record of `task_name` (its records in
    lm-eval's order); the note says why a task has no rows, else None."""
    kind = task.OUTPUT_TYPE
    if kind not in ("generate_until", "multiple_choice"):
        return [], (f"lm-eval task {task_name} ({kind}) has no per-document answer evalkit "
                    f"scores; its lm-eval results are in results.json, it is not on the board")
    ruler = ruler_metric(task)
    rows = []
    for rec in sorted(records, key=lambda r: r["doc_id"]):
        doc, doc_id = rec["doc"], int(rec["doc_id"])
        context = rec["arguments"][0][0]
        length = doc.get("max_length") if isinstance(doc, dict) else None
        base = SampleResult(
            model=model, model_hash=model_hash, task=task_name, task_version=version,
            probe_id=f"{task_name}/doc{doc_id}",
            probe_hash=_probe_hash(task_name, doc_id, rec["doc_hash"]), question=0,
            kind=kind, target_length=int(length) if isinstance(length, int) else 0,
            prompt_tokens=len(encode(context)), prompt_chars=len(context), depth=0.0, load=0,
            distance=0, seed=seed, prediction=None, gold=[], state_bytes=None,
            state_kind=state_kind)
        if kind == "generate_until":
            base.prediction = str(rec["filtered_resps"][0])
            base.gold = _gold_list(rec["target"])
            base.scores = scoring.score_sample(base.prediction, base.gold)
            if ruler:  # lm-eval's own value of RULER's metric, under the document's length
                base.scores[ruler] = float(rec[str(length)])
        else:
            choices = [str(c) for c in task.doc_to_choice(doc)]
            gold = rec["target"]
            if not isinstance(gold, int) or not 0 <= gold < len(choices):
                raise ValueError(f"lm-eval task {task_name} doc {doc_id}: target {gold!r} is not "
                                 f"one choice's index (of {len(choices)}); evalkit scores one "
                                 f"gold choice per document")
            lls = [float(r[0]) for r in rec["filtered_resps"]]
            order = [gold] + [i for i in range(len(choices)) if i != gold]
            base.candidates = [choices[i] for i in order]
            base.candidate_logprobs = [lls[i] for i in order]
            base.gold = [choices[gold]]
            base.scores = scoring.score_sample(None, base.gold, base.candidate_logprobs)
        rows.append(base.to_dict())
    return rows, None


def task_entry(task_name: str, version: str, config: dict, lm_eval_version: str,
               metric: str | None = None) -> dict:
    """results.json's description of an lm-eval task, in the shape of evalkit's tasks; `metric`:
    the task's own metric (RULER's), which the board then uses as its recall, for parity."""
    return {"version": version,
            "config_hash": hashlib.sha256(canonical_json(config).encode()).hexdigest(),
            "source": f"lm-eval {lm_eval_version}: {task_name}",
            **({"metric": metric} if metric else {})}


def write_rows(folder: Path, rows: list[dict], tasks: dict[str, dict]) -> dict | None:
    """Write the run's lm-eval rows to folder/samples.jsonl; the "board" entry of results.json
    (file, sha256, tasks), or None (and no file) when there are none."""
    path = folder / ROWS_FILE
    if not rows:
        path.unlink(missing_ok=True)
        return None
    atomic.write_jsonl(path, rows)
    return {"samples": f"{folder.name}/{ROWS_FILE}", "sha256": sha256_file(path),
            "rows": len(rows), "tasks": tasks}


@dataclass(frozen=True)
class BoardPart:
    file: Path
    rows: list[dict]
    tasks: dict[str, dict]


def board_part(run_dir: Path, results: dict,
               read: Callable[[Path], list[dict]]) -> BoardPart | None:
    """The lm-eval rows a finished run holds (results.json "lm_eval" -> "board"), checked
    against the sha256 results.json records and read with `read` (the board's sample
    reader); None when it has none. A row names its model as lm-eval ran it (the model
    spec): it gets the run's name and hash for the model of that spec (the runner's hash holds
    more than the identity, e.g. the content of the model's config file)."""
    board = ((results.get("lm_eval") or {}) if isinstance(results, dict) else {}).get("board")
    if board is None:
        return None
    where = f"{run_dir / 'results.json'}: lm_eval.board"
    if not (isinstance(board, dict) and isinstance(board.get("samples"), str)
            and isinstance(board.get("sha256"), str) and isinstance(board.get("tasks"), dict)):
        raise ValueError(f"{where}: expected {{samples: file, sha256: hex, tasks: {{...}}}}")
    same = sorted(set(board["tasks"]) & set(results.get("tasks") or {}))
    if same:
        raise ValueError(f"{where}: lm-eval task(s) {', '.join(same)} have the name of an "
                         f"evalkit task of the run; the board cannot tell them apart")
    path = run_dir / board["samples"]
    if not path.is_file() or sha256_file(path) != board["sha256"]:
        raise ValueError(f"{path}: not the file the run wrote (gone, or its sha256 differs from "
                         f"{where}.sha256): corrupt or hand-edited; rebuild it with "
                         f"`evalkit run --resume {run_dir}`")
    by_spec: dict[str, list[tuple[str, str]]] = {}
    for name, m in (results.get("models") or {}).items():
        if isinstance(m, dict) and isinstance(m.get("spec"), str):
            by_spec.setdefault(m["spec"], []).append((name, str(m.get("hash"))))
    rows = read(path)
    for r in rows:
        found = by_spec.get(r["model"], [])
        if len(found) == 1:  # one run model of that spec: the rows are its rows
            r["model"], r["model_hash"] = found[0]
    return BoardPart(path, rows, board["tasks"])
