"""RULER's synthetic tasks (lm-eval 0.4.13, lm_eval/tasks/ruler/) built for a limited run.

- `limited_generation(limit, functions)`: RULER builds 500 documents per length whatever
  --limit says (`num_samples=500` is written into each task's dataset function), and lm-eval
  applies the limit only afterwards. Each generator draws its documents one after another
  from the global random state, so its first N documents are the same whether it makes N or
  500: while the tasks are built, each generator's num_samples is capped at the limit. The
  documents lm-eval then takes (its first N) are the ones an unlimited build would have given
  (with one exception: when a generator skips a document it cannot fit, a capped one yields
  fewer than N at that length and the next length fills in).
  The generators are patched in the module objects lm-eval's YAML loader itself uses
  (`_load_module_with_cache`, keyed by file modification time), and restored afterwards.
- `declare_lengths(tasks, lengths)`: RULER's YAMLs declare an aggregation only for their
  default lengths (4096 ... 131072) while process_results reports a metric named by each
  document's length; a run at other lengths got "No aggregation function defined for metric
  1024. Using mean." The built tasks get RULER's own aggregation (common_utils.aggregate_metrics)
  and higher_is_better for the run's lengths, as their metric_list would declare them.
"""
from __future__ import annotations

import contextlib
import inspect
from pathlib import Path
from typing import Any, Iterable, Iterator

from evalkit.lm_eval.offline import RULER

# the function of each RULER utility module that builds documents, as that module calls it
GENERATORS = {"niah_utils": "generate_samples", "vt_utils": "sys_vartrack_w_noise_random",
              "cwe_utils": "sys_word_pair_random", "fwe_utils": "sys_kwext",
              "qa_utils": "generate_samples"}


def _capped(fn: Any, cap: int) -> Any:
    sig = inspect.signature(fn)

    def capped(*args: Any, **kwargs: Any) -> Any:
        bound = sig.bind(*args, **kwargs)
        bound.apply_defaults()
        bound.arguments["num_samples"] = min(int(bound.arguments["num_samples"]), cap)
        return fn(*bound.args, **bound.kwargs)
    return capped


@contextlib.contextmanager
def limited_generation(limit: int | float | None, functions: Iterable[str]) -> Iterator[None]:
    """Cap RULER's document generators at `limit` documents while the tasks whose dataset
    functions are `functions` (module.fn names, offline.custom_datasets) are built. A
    fractional limit (< 1) or none builds everything (the fraction is of the whole set)."""
    if limit is None or limit < 1:
        yield
        return
    from lm_eval.tasks._yaml_loader import _load_module_with_cache

    from evalkit.lm_eval.ruler_nltk import import_prepare_niah

    import lm_eval.tasks.ruler.common_utils as common

    folder = Path(inspect.getfile(common))
    modules = sorted({fn[len(RULER):].split(".")[0] for fn in functions
                      if fn.startswith(RULER)} & set(GENERATORS))
    if modules:
        import_prepare_niah()  # niah_utils imports it: without the download, as always
    patched = []
    try:
        for name in modules:
            mod = _load_module_with_cache(folder.parent / f"{name}.py")
            original = getattr(mod, GENERATORS[name])
            setattr(mod, GENERATORS[name], _capped(original, int(limit)))
            patched.append((mod, GENERATORS[name], original))
        yield
    finally:
        for mod, attr, original in patched:
            setattr(mod, attr, original)


def declare_lengths(tasks: dict[str, Any], lengths: Iterable[int] | None) -> None:
    """Give each built RULER task an aggregation for the metric of every run length."""
    if not lengths:
        return
    for task in tasks.values():
        fn = getattr(task.config, "process_results", None)
        if not getattr(fn, "__module__", "").startswith(RULER):
            continue
        aggregate = inspect.getmodule(fn).aggregate_metrics  # the module that scores it
        for length in lengths:
            name = str(int(length))
            if name not in task.aggregation():
                task._aggregation_list[name] = aggregate
                task._higher_is_better[name] = True
