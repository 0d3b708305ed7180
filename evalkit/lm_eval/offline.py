"""Which lm-eval tasks need data from the internet, decided from the task index alone.

evalkit downloads nothing at run time; lm-eval would try, and fail late (after every earlier
task ran) with a raw connection error naming a host. `refusals` reads each requested task's
YAML (functions unresolved: nothing is imported or built) and names what is missing:
- a hub `dataset_path` whose configuration (`dataset_name`) is not prepared in the local
  `datasets` cache (what `datasets` reads offline; the hub's download cache, or a `.no_exist`
  marker there, is not the data set), or a builder
  (`json`, `csv`, ...) whose `dataset_kwargs.data_files` are URLs;
- a `custom_dataset` function known to fetch data: RULER's QA tasks (SQuAD, HotpotQA, read
  from URLs with `requests`) and its essay-haystack needle tasks (Paul Graham's essays from
  the hub, split into sentences with NLTK's punkt_tab).
A custom_dataset function not in KNOWN and a Python task class without a dataset_path are
not checked: what they fetch is only known by running them.
"""
from __future__ import annotations

from dataclasses import dataclass, fields
from pathlib import Path
from typing import Any, Iterator

RULER = "lm_eval.tasks.ruler."
LOCAL_COPY = ("a local copy: a task YAML of your own with `dataset_path: <folder>` (or "
              "`dataset_path: json` and `dataset_kwargs: {data_files: <file>}`), run with "
              "`evalkit-lm-eval run --include_path <its folder>`")


@dataclass(frozen=True)
class Need:
    """Data a task needs and this machine lacks."""
    data: str      # what, e.g. "SQuAD 2.0's dev set (dev-v2.0.json)"
    source: str    # where lm-eval would fetch it from
    provide: str   # how to make it available offline

    def message(self, tasks: list[str]) -> str:
        return (f"{', '.join(tasks)} need{'s' if len(tasks) == 1 else ''} {self.data}, which "
                f"lm-eval would download from {self.source}; {self.provide}")


def _fixed_url(data: str, url: str, where: str) -> Need:
    return Need(data, url, f"lm-eval 0.4.13 fetches it in {where} on every build and reads no "
                f"local copy (no dataset_path or dataset_kwargs applies), so the task cannot run "
                f"offline; for a local copy, write a task YAML that includes lm-eval's and sets "
                f"`custom_dataset: !function` to your own reader, and run it with "
                f"`evalkit-lm-eval run --include_path <its folder>`")


ESSAYS = "baber/paul_graham_essays"
# lm-eval 0.4.13's custom_dataset functions that fetch data (tests/test_lm_eval_ruler_offline.py
# checks this table against lm-eval's source). Value: hub data sets, then plain-URL needs.
KNOWN: dict[str, tuple[tuple[str, ...], tuple[Need, ...]]] = {
    RULER + "qa_utils.get_squad": ((), (_fixed_url(
        "SQuAD 2.0's dev set (SQuAD, dev-v2.0.json)",
        "https://rajpurkar.github.io/SQuAD-explorer/dataset/dev-v2.0.json",
        "tasks/ruler/qa_utils.py read_squad()"),)),
    RULER + "qa_utils.get_hotpotqa": ((), (_fixed_url(
        "HotpotQA's dev set (hotpot_dev_distractor_v1.json)",
        "https://huggingface.co/datasets/namlh2004/hotpotqa/resolve/"
        "7e54db4656209750ff487f6fdf8e39a66dba136b/hotpot_dev_distractor_v1.json",
        "tasks/ruler/qa_utils.py read_hotpotqa()"),)),
    **{RULER + f"niah_utils.{fn}": ((ESSAYS,), ()) for fn in (
        "niah_single_2", "niah_single_3", "niah_multikey_1", "niah_multiquery",
        "niah_multivalue")},
}
ESSAY_FUNCTIONS = frozenset(k for k, (hub, _) in KNOWN.items() if ESSAYS in hub)


def refusals(tm: Any, names: list[str]) -> list[str]:
    """One sentence per missing piece of data, naming the tasks (among `names`, expanded to
    their leaf tasks by lm-eval's TaskManager `tm`'s index) that need it; [] when every task
    can be built offline."""
    needs: dict[Need, list[str]] = {}
    for task, cfg in _leaves(tm, names):
        for need in _needs(cfg):
            needs.setdefault(need, [])
            if task not in needs[need]:
                needs[need].append(task)
    return [need.message(tasks) for need, tasks in needs.items()]


def custom_datasets(tm: Any, names: list[str]) -> set[str]:
    """The custom_dataset functions (module.fn) of the leaf tasks of `names`."""
    return {fn for _, cfg in _leaves(tm, names)
            if (fn := function_name(cfg.get("custom_dataset")))}


def function_name(spec: Any) -> str | None:
    """`custom_dataset: !function mod.fn` as lm-eval names the module: the index keeps it as
    "<yaml folder>/mod.fn"; under lm_eval/tasks/ it is "lm_eval.tasks.<folder>.mod.fn"."""
    if not isinstance(spec, str):
        return None
    text = spec.replace("\\", "/")
    cut = text.find("/lm_eval/tasks/")
    return "lm_eval.tasks." + text[cut + len("/lm_eval/tasks/"):].replace("/", ".") \
        if cut >= 0 else text


def _needs(cfg: dict) -> Iterator[Need]:
    custom = cfg.get("custom_dataset")
    if custom:  # lm-eval calls it instead of datasets.load_dataset
        hub, fixed = KNOWN.get(function_name(custom) or "", ((), ()))
        for repo in hub:  # loaded by name inside the function: only the cache can serve it
            need = _hub_need(repo, None, local_copy=False)
            if need:
                yield need
        yield from fixed
        if function_name(custom) in ESSAY_FUNCTIONS and not punkt_tab_installed():
            yield Need("NLTK's punkt_tab sentence tokenizer (to split the essays)",
                       "NLTK's data server (nltk.download('punkt_tab'))",
                       "install it once where there is network (`python -m nltk.downloader "
                       "punkt_tab`, or copy an nltk_data folder and set NLTK_DATA)")
        return
    path = cfg.get("dataset_path")
    if not path:
        return
    path = str(path)
    kwargs = cfg.get("dataset_kwargs") or {}
    if Path(path).expanduser().exists():
        return
    if path in _packaged_builders():
        remote = [f for f in _strings(kwargs.get("data_files")) if "://" in f]
        if remote:
            yield Need(f"the data files {', '.join(remote)}", "those URLs",
                       "download them once and point dataset_kwargs.data_files at the "
                       "local files (a task YAML of your own, run with "
                       "`evalkit-lm-eval run --include_path <its folder>`)")
        return
    need = _hub_need(path, cfg.get("dataset_name"))
    if need:
        yield need


def _hub_need(repo: str, config_name: Any, local_copy: bool = True) -> Need | None:
    config = str(config_name) if config_name else None
    if in_cache(repo, config):
        return None
    # one Need per repo, whatever the config: mmlu's 57 subtasks are one sentence
    name = " (each task's config: its dataset_name)" if config else ""
    load = f"datasets.load_dataset({repo!r}{', <dataset_name>' if config else ''})"
    return Need(f"the hub data set {repo}{name}, not in the local datasets cache "
                f"({cache_folder(repo)})",
                f"the Hugging Face hub ({repo})",
                f"fetch it once where there is network (`python -c \"import datasets; {load}\"`"
                f", same HF_HOME)" + (f", or use {LOCAL_COPY}" if local_copy else
                                      " (the task's code loads it by name: no local path "
                                      "applies)"))


def in_cache(repo: str, config: str | None = None) -> bool:
    """Whether `datasets` can load this data set's configuration offline: it was prepared in
    its cache, as CONFIG/VERSION/HASH/dataset_info.json naming that configuration (any one
    when `config` is None), which is where `datasets` looks when the hub is unreachable."""
    import json

    for info in cache_folder(repo).glob(f"{config or '*'}/*/*/dataset_info.json"):
        try:
            named = json.loads(info.read_text(encoding="utf-8")).get("config_name")
        except (OSError, ValueError, AttributeError):
            continue
        if config is None or named == config:
            return True
    return False


def cache_folder(repo: str) -> Path:
    """Where `datasets` keeps a hub data set it prepared (org___name, the name in snake case,
    as datasets.load names it)."""
    import datasets.config
    from datasets.naming import camelcase_to_snakecase

    *org, name = repo.split("/")
    return Path(datasets.config.HF_DATASETS_CACHE) / "___".join([*org, camelcase_to_snakecase(name)])


def punkt_tab_installed() -> bool:
    import nltk

    try:
        nltk.data.find("tokenizers/punkt_tab")
        return True
    except LookupError:
        return False


def _packaged_builders() -> set[str]:
    from datasets.packaged_modules import _PACKAGED_DATASETS_MODULES

    return set(_PACKAGED_DATASETS_MODULES)


def _strings(value: Any) -> Iterator[str]:
    if isinstance(value, str):
        yield value
    elif isinstance(value, dict):
        for v in value.values():
            yield from _strings(v)
    elif isinstance(value, (list, tuple)):
        for v in value:
            yield from _strings(v)


def _leaves(tm: Any, names: list[str]) -> Iterator[tuple[str, dict]]:
    """(leaf task name, its YAML config, includes merged, functions unresolved) for each name:
    a task itself, a tag's tasks, a group's members (recursively, with the group's and the
    member entry's overrides applied, as lm-eval's TaskFactory does), from the public face of
    lm-eval's TaskManager `tm`: all_tags, all_groups and task_index, whose entries hold each
    YAML as the index read it. lm-eval has no public call that expands a group to its tasks'
    configs without building the tasks, and building one downloads its data (TaskManager.load
    constructs every ConfigurableTask, whose __init__ calls download()): so the expansion is
    done here, on those configs."""
    from lm_eval.config import GroupConfig

    index, tags, groups = tm.task_index, set(tm.all_tags), set(tm.all_groups)
    structural = {f.name for f in fields(GroupConfig)}

    def leaves(names: list[str]) -> Iterator[tuple[str, dict]]:
        for name in names:
            entry = index.get(name)
            if entry is None:
                continue
            if name in tags:
                yield from leaves(sorted(entry.tags))
            elif name in groups:
                yield from members(dict(entry.cfg or {}), {})
            else:
                yield name, dict(entry.cfg or {})

    def members(group: dict, overrides: dict) -> Iterator[tuple[str, dict]]:
        inherited = {**{k: v for k, v in group.items() if k not in structural}, **overrides}
        listed = group.get("task")
        for item in listed if isinstance(listed, list) else []:
            if isinstance(item, str):
                base, extra = item, {}
            elif isinstance(item, dict) and "group" in item and item["group"] not in index:
                yield from members(item, inherited)  # an inline subgroup
                continue
            elif isinstance(item, dict):
                base = item.get("task") or item.get("group")
                extra = {k: v for k, v in item.items() if k not in ("task", "group")}
            else:
                continue
            if not (isinstance(base, str) and base in index):  # an inline task: its config
                yield str(base), {**inherited, **item}
                continue
            for leaf, cfg in leaves([base]):
                yield leaf, {**cfg, **inherited, **extra}

    return leaves(names)
