"""lm-eval's own tasks on evalkit models (`evalkit run --lm-eval-tasks niah_single_1 ...`).

`run_lm_eval_tasks` evaluates each evalkit model through the lm-eval bridge
(`evalkit.lm_eval.bridge.EvalkitLM`) with lm-eval's `simple_evaluate`, and
writes, per model, into output_dir/<model>/ (each file atomically):
- results.json: lm-eval's results object (results, configs, versions, n-samples, config...),
  without the samples;
- samples_<task>.jsonl: lm-eval's logged samples (doc, arguments, resps, filtered_resps,
  per-sample metrics), when log_samples is on.

Synthetic tasks that size their own data (RULER: niah_*, ...) need the evaluated model's
tokenizer: unless `metadata` names one, it is set to the model tokenizer's folder, so data are
built with the same tokenizer the model reads them with. RULER's lengths come from
metadata["max_seq_lengths"] (e.g. [1024]).

Offline notes (HF_HUB_OFFLINE=1): niah_single_1 (and the other "repeat"/"needle" haystack RULER
tasks) build their data locally. Importing lm-eval's RULER code needs the `wonderwords` package,
and calls nltk.download("punkt_tab") when NLTK's punkt_tab is not installed: offline that
attempt fails, is printed, and the task still runs (only the essay haystacks tokenize sentences,
and those tasks also download Paul Graham's essays from the hub, so they cannot run offline).
"""
from __future__ import annotations

import copy
import json
from pathlib import Path
from typing import Any, Sequence

from evalkit import atomic
from evalkit.formatting import slug


def tokenizer_folder(tokenizer: Any) -> str | None:
    """The local folder a loaded tokenizer came from, if any (for lm-eval's synthetic tasks)."""
    path = getattr(tokenizer, "name_or_path", None)
    if path and Path(path).expanduser().is_dir():
        return str(Path(path).expanduser().resolve())
    return None


class LmEvalTasks:
    """lm-eval tasks by name, checked against lm-eval's task index when made.

    The index is built once (the full one takes ~10 s): the check before anything is evaluated
    and every model's evaluation read the same one. Unknown names raise ValueError, naming them.
    """

    def __init__(self, names: Sequence[str], include_path: str | Path | None = None,
                 include_defaults: bool = True) -> None:
        from lm_eval.tasks import TaskManager

        if not names:
            raise ValueError("name at least one lm-eval task")
        self.names = list(names)
        self._index = TaskManager(include_path=str(include_path) if include_path else None,
                                  include_defaults=include_defaults)
        unknown = [t for t in self.names if not self._index.match_tasks([t])]
        if unknown:
            searched = ([str(include_path)] if include_path else []) + (
                ["lm-eval's own tasks"] if include_defaults else [])
            raise ValueError(f"unknown lm-eval task(s) {', '.join(unknown)} (searched "
                             f"{' and '.join(searched) or 'nothing'})")

    def manager(self, metadata: dict) -> Any:
        """The index as a TaskManager that gives its tasks one model's `metadata`. lm-eval keeps
        metadata in the manager's task factory, not in the index, so only the factory is new."""
        from lm_eval.tasks._factory import TaskFactory

        tm = copy.copy(self._index)
        tm.metadata, tm._factory = metadata, TaskFactory(meta=metadata)
        return tm


def run_lm_eval_tasks(models: Sequence[str], tasks: LmEvalTasks, *, output_dir: str | Path,
                      limit: int | float | None = None, model_options: dict | None = None,
                      metadata: dict | None = None, max_seq_lengths: Sequence[int] | None = None,
                      log_samples: bool = True,
                      seed: int | None = 0, num_fewshot: int | None = None,
                      gen_kwargs: dict | None = None, apply_chat_template: bool = False,
                      bootstrap_iters: int = 0) -> dict:
    """Run lm-eval `tasks` (checked when made, e.g. `LmEvalTasks(["niah_single_1"])`) on each
    evalkit model.

    model_options: {model: {options}}, each model's evalkit model and bridge options (dtype,
    device, max_gen_toks, ...); a model it does not name gets its defaults.
    metadata: task metadata; max_seq_lengths=[1024] is a shorthand for RULER's lengths.
    seed: one seed for python/numpy/torch/few-shot (None: lm-eval's defaults).
    bootstrap_iters=0 skips lm-eval's stderr bootstrap (slow, and not needed for parity).
    Returns {model: lm-eval's results without samples, plus "evalkit_files": the files written}.
    """
    from lm_eval import simple_evaluate
    from lm_eval.utils import handle_non_serializable

    from evalkit.lm_eval.bridge import EvalkitLM

    if not models:
        raise ValueError("run_lm_eval_tasks: name at least one evalkit model")
    out = Path(output_dir)
    seeds = {} if seed is None else {"random_seed": seed, "numpy_random_seed": seed,
                                     "torch_random_seed": seed, "fewshot_random_seed": seed}
    opts = dict(model_options or {})
    stray = [k for k in opts if k not in models]
    if stray or not all(isinstance(v, dict) for v in opts.values()):
        raise ValueError(f"run_lm_eval_tasks: model_options maps each model to its options "
                         f"({{model: {{option: value}}}}); {stray or list(opts)} are not "
                         f"models of this call ({list(models)})")
    all_results: dict[str, Any] = {}
    for name in models:
        lm = EvalkitLM(name=name, **opts.get(name, {}))
        meta = dict(metadata or {})
        if max_seq_lengths:
            meta["max_seq_lengths"] = [int(x) for x in max_seq_lengths]
        if not any(meta.get(k) for k in ("tokenizer", "pretrained")):
            folder = tokenizer_folder(lm.tokenizer)
            if folder:
                meta["tokenizer"] = folder
        res = simple_evaluate(model=lm, tasks=tasks.names, task_manager=tasks.manager(meta),
                              limit=limit, log_samples=log_samples, num_fewshot=num_fewshot,
                              gen_kwargs=gen_kwargs, apply_chat_template=apply_chat_template,
                              bootstrap_iters=bootstrap_iters, metadata=meta, **seeds)
        if res is None:  # not rank 0
            continue
        samples = res.pop("samples", None) or {}
        folder = out / slug(name, "model")
        files: dict[str, Any] = {"results": str(folder / "results.json"), "samples": {}}
        for task, rows in samples.items():
            path = folder / f"samples_{slug(task, 'model')}.jsonl"
            atomic.write_text(path, "".join(
                json.dumps(r, default=handle_non_serializable, ensure_ascii=False) + "\n"
                for r in rows))
            files["samples"][task] = str(path)
        atomic.write_text(folder / "results.json",
                          json.dumps(res, default=handle_non_serializable, indent=2,
                                     ensure_ascii=False) + "\n")
        res["evalkit_files"] = files
        all_results[name] = res
    return all_results
