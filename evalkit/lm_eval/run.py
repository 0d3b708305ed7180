"""lm-eval's own tasks on evalkit models (`evalkit run --lm-eval-tasks niah_single_1 ...`).

`run_lm_eval_tasks` evaluates each (evalkit model, lm-eval task) pair through the lm-eval
bridge (`evalkit.lm_eval.bridge.EvalkitLM`) with lm-eval's `simple_evaluate`, one call per
pair (evalkit.lm_eval.pairs): a pair that raises is a failed entry naming the model, the task,
the function that raised and the error, and the other pairs still run. Documents with an
empty gold answer list are counted and left out of scoring. It writes, per model, into
output_dir/<model>/ (each file atomically):
- pairs/<task>.json: one scored pair (its key, entry and lm-eval results, and their sha256):
  a later call with the same key (model identity and options, task, settings, lm-eval
  version, the hash of evalkit's source) reuses it, so `evalkit run --resume` re-evaluates
  only the pairs that failed; a file whose content does not match its sha256 is evaluated
  again;
- results.json: lm-eval's results object for the model's scored tasks (results, configs,
  versions, n-samples, config...), without the samples;
- samples_<task>.jsonl: lm-eval's logged samples (doc, arguments, resps, filtered_resps,
  per-sample metrics), when log_samples is on.
and into output_dir/samples.jsonl every scored pair's documents as evalkit sample rows
(evalkit.lm_eval.rows: prediction, gold, scores), which `evalkit publish` puts on the board
beside evalkit's own tasks; the pair files hold them too, so a reused pair keeps its rows.

--limit N is applied before RULER builds its documents (evalkit.lm_eval.ruler_tasks: N per
length, not 500); RULER's metric at a run length its YAML does not list is aggregated as
RULER aggregates the others. progress=False silences every progress bar (lm-eval's, the
bridge's, RULER's generators'); lm-eval's `git describe` runs with its error output dropped
(outside a git checkout it printed "fatal: not a git repository").

Synthetic tasks that size their own data (RULER: niah_*, ...) need the evaluated model's
tokenizer: unless `metadata` names one, it is set to the model tokenizer's folder, so data are
built with the same tokenizer the model reads them with. RULER's lengths come from
metadata["max_seq_lengths"] (e.g. [1024]).

Offline (evalkit downloads nothing at run time): `LmEvalTasks` refuses, before any work, a
task whose data would have to be downloaded (evalkit.lm_eval.offline: RULER's QA and
essay-haystack tasks, hub data sets not in the local cache). RULER's code is imported with
nltk's punkt_tab download refused and its false "Downloaded" line dropped
(evalkit.lm_eval.ruler_nltk). Importing it needs the `wonderwords` package.
"""
from __future__ import annotations

import copy
import json
from pathlib import Path
from typing import Any, Sequence

from evalkit import atomic
from evalkit.formatting import slug
from evalkit.lm_eval.quiet import metadata_given, no_bars, quiet_git
from evalkit.probe import canonical_json
from evalkit.code_version import code_hash
from evalkit.lm_eval.rows import doc_rows, ruler_metric, task_entry, write_rows


def tokenizer_folder(tokenizer: Any) -> str | None:
    """The local folder a loaded tokenizer came from, if any (for lm-eval's synthetic tasks)."""
    path = getattr(tokenizer, "name_or_path", None)
    if path and Path(path).expanduser().is_dir():
        return str(Path(path).expanduser().resolve())
    return None


class LmEvalTasks:
    """lm-eval tasks by name, checked against lm-eval's task index when made.

    The index is built once (the full one takes ~10 s): the check before anything is evaluated
    and every model's evaluation read the same one. Unknown names raise ValueError, naming them;
    so does a task whose data would have to be downloaded (evalkit.lm_eval.offline), naming
    the data and how to provide it. `units`: the names with globs expanded, one evaluation
    (and one result or failure) each per model.
    """

    def __init__(self, names: Sequence[str], include_path: str | Path | None = None,
                 include_defaults: bool = True) -> None:
        from lm_eval.tasks import TaskManager

        from evalkit.lm_eval import offline

        if not names:
            raise ValueError("name at least one lm-eval task")
        self.names = list(names)
        self._index = TaskManager(include_path=str(include_path) if include_path else None,
                                  include_defaults=include_defaults)
        matched = {t: self._index.match_tasks([t]) for t in self.names}
        unknown = [t for t, found in matched.items() if not found]
        if unknown:
            searched = ([str(include_path)] if include_path else []) + (
                ["lm-eval's own tasks"] if include_defaults else [])
            raise ValueError(f"unknown lm-eval task(s) {', '.join(unknown)} (searched "
                             f"{' and '.join(searched) or 'nothing'})")
        self.units = list(dict.fromkeys(u for t in self.names for u in matched[t]))
        refused = offline.refusals(self._index, self.units)
        if refused:
            raise ValueError("lm-eval task(s) need data that is not on this machine, and "
                             "evalkit downloads nothing at run time:\n  "
                             + "\n  ".join(refused))
        # every RULER task imports RULER's prepare_niah (see evalkit.lm_eval.ruler_nltk)
        self.dataset_functions = offline.custom_datasets(self._index, self.units)
        self.ruler = any(fn.startswith(offline.RULER) for fn in self.dataset_functions)

    def manager(self, metadata: dict) -> Any:
        """The index as a TaskManager that gives its tasks one model's `metadata`. lm-eval keeps
        metadata in the manager's task factory, not in the index, so only the factory is new."""
        from lm_eval.tasks._factory import TaskFactory

        tm = copy.copy(self._index)
        tm.metadata, tm._factory = metadata, TaskFactory(meta=metadata)
        return tm


# per-task keys of lm-eval's results object: a model's results.json is their union over pairs
PER_TASK = ("results", "groups", "group_subtasks", "configs", "versions", "n-shot",
            "higher_is_better", "n-samples", "task_hashes")


def run_lm_eval_tasks(models: Sequence[str], tasks: LmEvalTasks, *, output_dir: str | Path,
                      limit: int | float | None = None, model_options: dict | None = None,
                      metadata: dict | None = None, max_seq_lengths: Sequence[int] | None = None,
                      log_samples: bool = True,
                      seed: int | None = 0, num_fewshot: int | None = None,
                      gen_kwargs: dict | None = None, apply_chat_template: bool = False,
                      bootstrap_iters: int = 0, progress: bool = True) -> dict:
    """Run lm-eval `tasks` (checked when made, e.g. `LmEvalTasks(["niah_single_1"])`) on each
    evalkit model, one (model, task) pair at a time; a pair scored before with the same key
    is read back from output_dir, not evaluated again.

    model_options: {model: {options}}, each model's evalkit model and bridge options (dtype,
    device, max_gen_toks, ...); a model it does not name gets its defaults.
    metadata: task metadata; max_seq_lengths=[1024] is a shorthand for RULER's lengths.
    seed: one seed for python/numpy/torch/few-shot (None: lm-eval's defaults).
    bootstrap_iters=0 skips lm-eval's stderr bootstrap (slow, and not needed for parity).
    progress=False: no progress bar at all.
    Returns {"models": {model: lm-eval's results for its scored tasks, without samples, plus
    "evalkit_files"}, "pairs": [one entry per (model, task): model, task, status "scored" or
    "failed", reused, empty_gold ({task: count, of, doc_ids, built_by}), then n_samples and
    samples, or error, raised_in and line], "failed": failed pairs, "reused": pairs read back,
    "empty_gold": documents left out for an empty gold list, "problems": one line each (the
    failed pairs, then the left-out documents of scored ones, then tasks without board
    rows), "board": the per-document rows' file, sha256 and tasks (evalkit.lm_eval.rows;
    None when no pair has rows)}.
    """
    import lm_eval

    from evalkit.lm_eval.bridge import EvalkitLM

    if not models:
        raise ValueError("run_lm_eval_tasks: name at least one evalkit model")
    out = Path(output_dir)
    opts = dict(model_options or {})
    stray = [k for k in opts if k not in models]
    if stray or not all(isinstance(v, dict) for v in opts.values()):
        raise ValueError(f"run_lm_eval_tasks: model_options maps each model to its options "
                         f"({{model: {{option: value}}}}); {stray or list(opts)} are not "
                         f"models of this call ({list(models)})")
    settings = {"limit": limit, "seed": seed, "num_fewshot": num_fewshot,
                "gen_kwargs": gen_kwargs, "apply_chat_template": apply_chat_template,
                "bootstrap_iters": bootstrap_iters, "log_samples": log_samples,
                "lm_eval": lm_eval.__version__, "evalkit_code": code_hash()}
    # lm-eval's per-document records are always asked for: they become the board's rows
    evaluate_kw = {"log_samples": True, "num_fewshot": num_fewshot,
                   "gen_kwargs": gen_kwargs, "apply_chat_template": apply_chat_template,
                   "bootstrap_iters": bootstrap_iters, **_seeds(seed)}
    by_model: dict[str, Any] = {}
    pairs: list[dict] = []
    rows: list[dict] = []
    row_tasks: dict[str, dict] = {}
    for name in models:
        with no_bars(not progress):
            lm = EvalkitLM(name=name, **opts.get(name, {}))
        identity = lm.adapter.identity()
        # the model as lm-eval ran it; a board gives the rows the run's name and hash of the
        # model of this spec (evalkit.lm_eval.rows.board_part)
        row_model = {"model": name, "model_hash": _checksum(_plain(
                         {"identity": identity, "options": opts.get(name, {})})),
                     "state_kind": str(lm.adapter.state_kind), "seed": seed or 0}
        meta = dict(metadata or {})
        if max_seq_lengths:
            meta["max_seq_lengths"] = [int(x) for x in max_seq_lengths]
        if not any(meta.get(k) for k in ("tokenizer", "pretrained")):
            folder = tokenizer_folder(lm.tokenizer)
            if folder:
                meta["tokenizer"] = folder
        base = {"model": name, "identity": identity, "options": opts.get(name, {}),
                "metadata": meta, **settings}
        folder = out / slug(name, "model")
        scored: list[dict] = []
        manager = None
        for task in tasks.units:
            key = _plain({**base, "task": task})
            stored = _read_pair(folder, task)
            if stored is not None and stored.get("key") == key:
                entry, result = {**stored["entry"], "reused": True}, stored["result"]
                board = stored["board"]
            else:
                manager = manager or tasks.manager(meta)
                with no_bars(not progress), quiet_git(), metadata_given():
                    entry, result, board = _evaluate(lm, tasks, manager, name, task, key,
                                                     folder, limit=limit, meta=meta,
                                                     evaluate_kw=evaluate_kw, row_model=row_model,
                                                     log_samples=log_samples)
            pairs.append(entry)
            if result is not None:
                scored.append(result)
                rows.extend(board["rows"])
                row_tasks.update(board["tasks"])
        by_model[name] = _write_model(folder, scored, [p for p in pairs if p["model"] == name])
    problems = [p["line"] for p in pairs if p["status"] == "failed"] + [
        line for p in pairs for line in p.get("empty_gold_lines", [])] + list(dict.fromkeys(
            line for p in pairs for line in p.get("board_notes", [])))
    return {"models": by_model, "pairs": pairs,
            "board": write_rows(out, rows, row_tasks),
            "failed": sum(p["status"] == "failed" for p in pairs),
            "reused": sum(p["reused"] for p in pairs),
            "empty_gold": sum(r["count"] for p in pairs
                              for r in p.get("empty_gold", {}).values()),
            "problems": problems}


def _seeds(seed: int | None) -> dict[str, int]:
    """simple_evaluate's seeds: `seed` for all four, or lm-eval's own defaults when None."""
    from lm_eval.defaults import DEFAULT_OTHER_SEED, DEFAULT_RANDOM_SEED

    first, other = (DEFAULT_RANDOM_SEED, DEFAULT_OTHER_SEED) if seed is None else (seed, seed)
    return {"random_seed": first, "numpy_random_seed": other, "torch_random_seed": other,
            "fewshot_random_seed": other}


def _evaluate(lm: Any, tasks: LmEvalTasks, manager: Any, model: str, task: str, key: dict,
              folder: Path, *, limit: int | float | None, meta: dict, evaluate_kw: dict,
              row_model: dict, log_samples: bool) -> tuple[dict, dict | None, dict | None]:
    """Build and score one pair; write its files when it scored. (entry, lm-eval results or
    None when it failed, its board rows and tasks or None)."""
    import random

    import lm_eval
    import numpy as np
    from lm_eval import simple_evaluate
    from lm_eval.utils import handle_non_serializable, set_torch_seed

    from evalkit.lm_eval.pairs import docs_to_score, empty_gold_line, evaluate_pair
    from evalkit.lm_eval.ruler_nltk import import_prepare_niah
    from evalkit.lm_eval.ruler_tasks import declare_lengths, limited_generation

    built: dict[str, Any] = {}

    def run() -> tuple[dict, dict]:
        if tasks.ruler:
            import_prepare_niah()
        # RULER draws its documents from the global generators while it builds them, so they
        # are seeded first, as simple_evaluate does before it builds: each pair's documents
        # are the same whatever pairs ran before it (what reusing a stored pair relies on).
        random.seed(evaluate_kw["random_seed"])
        np.random.seed(evaluate_kw["numpy_random_seed"])
        set_torch_seed(evaluate_kw["torch_random_seed"])
        with limited_generation(limit, tasks.dataset_functions):
            loaded = manager.load([task])  # builds the data: lm-eval's own errors start here
        declare_lengths(loaded["tasks"], meta.get("max_seq_lengths"))
        built.update(loaded["tasks"])
        samples, empty = docs_to_score(loaded["tasks"], limit)
        top = ([loaded["groups"][task]] if task in loaded["groups"]
               else list(loaded["tasks"].values()))
        res = simple_evaluate(model=lm, tasks=top, task_manager=manager,
                              limit=None if samples else limit, samples=samples,
                              metadata=meta, **evaluate_kw)
        if res is None:
            raise RuntimeError("lm-eval returned no results (this process is not rank 0)")
        return res, empty

    done = evaluate_pair(model, task, run)
    entry: dict[str, Any] = {"model": model, "task": task, "status": done["status"],
                             "reused": False}
    stale = folder / "pairs" / f"{slug(task, 'task')}.json"
    if done["status"] == "failed":
        stale.unlink(missing_ok=True)  # an older result of other settings is not this one
        failed = ("error", "raised_in", "line", "empty_gold")
        return {**entry, **{k: done[k] for k in failed}}, None, None
    res = done["results"]
    samples = res.pop("samples", None) or {}
    files: dict[str, str] = {}
    board: dict[str, Any] = {"rows": [], "tasks": {}}
    notes = []
    for name, records in samples.items():
        if log_samples:
            path = folder / f"samples_{slug(name, 'task')}.jsonl"
            atomic.write_text(path, "".join(
                json.dumps(r, default=handle_non_serializable, ensure_ascii=False) + "\n"
                for r in records))
            files[name] = str(path)
        version = str(res.get("versions", {}).get(name))
        got, note = doc_rows(name, built[name], records, version=version,
                             encode=lambda text: lm.tok_encode(text), **row_model)
        if note:
            notes.append(note)
        if got:
            board["rows"].extend(got)
            board["tasks"][name] = task_entry(name, version, _plain(res["configs"][name]),
                                              lm_eval.__version__, ruler_metric(built[name]))
    entry.update({"empty_gold": done["empty_gold"],
                  "empty_gold_lines": [empty_gold_line(model, name, r)
                                       for name, r in done["empty_gold"].items()],
                  "board_notes": notes,
                  "n_samples": res.get("n-samples", {}), "samples": files})
    doc = json.loads(json.dumps({"key": key, "entry": entry, "result": res, "board": board},
                                default=handle_non_serializable))  # as a reader sees it
    atomic.write_text(stale, json.dumps({**doc, "sha256": _checksum(doc)}, indent=1,
                                        ensure_ascii=False) + "\n")
    return entry, _plain(res), doc["board"]


def _checksum(doc: dict) -> str:
    import hashlib

    return hashlib.sha256(canonical_json(doc).encode()).hexdigest()


def _read_pair(folder: Path, task: str) -> dict | None:
    """A stored pair, or None: absent, unreadable, or not the bytes it was written with (its
    sha256 differs: edited or torn): the pair is evaluated again."""
    path = folder / "pairs" / f"{slug(task, 'task')}.json"
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):  # absent, unreadable or not JSON
        return None
    if not (isinstance(data, dict) and {"key", "entry", "result", "board"} <= set(data)):
        return None
    return data if data.pop("sha256", None) == _checksum(data) else None


def _write_model(folder: Path, scored: list[dict], entries: list[dict]) -> dict:
    """The model's lm-eval results over its scored pairs, as results.json (removed when none
    scored, so no earlier run's file stands for this one)."""
    from lm_eval.utils import handle_non_serializable

    path = folder / "results.json"
    if not scored:
        path.unlink(missing_ok=True)
        return {"evalkit_files": {"results": None, "samples": {}}}
    merged: dict[str, Any] = {}
    for res in scored:
        for k, v in res.items():
            if k in PER_TASK and isinstance(v, dict):
                merged.setdefault(k, {}).update(v)
            else:
                merged[k] = v
    atomic.write_text(path, json.dumps(merged, default=handle_non_serializable, indent=2,
                                       ensure_ascii=False) + "\n")
    samples = {t: f for e in entries for t, f in e.get("samples", {}).items()}
    return {**merged, "evalkit_files": {"results": str(path), "samples": samples}}


def _plain(obj: Any) -> Any:
    """As JSON reads it back (tuples as lists, other objects as strings): comparable with a
    stored key."""
    return json.loads(json.dumps(obj, sort_keys=True, default=str))


def supply_tokenizer(args) -> None:
    """lm-eval builds task metadata from --model_args + --metadata before it loads the model, and
    synthetic tasks (RULER) read their tokenizer from it: lm-eval's `hf` model has one there
    (pretrained=), `--model evalkit` only name=. For `--model evalkit`, load the model now, as
    lm-eval will (it then gets this instance: no second load), and add its tokenizer folder to
    the metadata, as `evalkit run --lm-eval-tasks` does. Called by evalkit-lm-eval (cli.py)
    and by the installed hook (hook.py) between parsing and running."""
    if getattr(args, "model", None) != "evalkit":
        return
    from lm_eval.config.evaluate_config import EvaluatorConfig

    from evalkit.lm_eval.bridge import EvalkitLM

    cfg = EvaluatorConfig.from_cli(args)
    if any(cfg.metadata.get(k) for k in ("tokenizer", "pretrained")):
        return
    lm = EvalkitLM.preload(cfg.model_args, {"batch_size": cfg.batch_size,
                                            "max_batch_size": cfg.max_batch_size,
                                            "device": cfg.device})
    folder = tokenizer_folder(lm.tokenizer)
    if folder:
        args.metadata = {**(args.metadata or {}), "tokenizer": folder}
