"""Suite configs: which models, which tasks over which grid, and how to run them.

A suite is a YAML file (see configs/quick.yaml) or the same settings given as `evalkit run`
flags; flags override the file. Every key is typed; unknown keys and wrong types are errors
naming the file, the key and the expected type.

    name: quick
    models:                        # a registered name, or {name, spec, options}
      - smollm2-135m
      - {name: my-gla, spec: "gla:${GLA_CKPT}", options: {dtype: bfloat16}}
      - {name: my-vllm, spec: "served:${URL}", options: {...}, forced_choice: false}
    tasks:                         # task names, globs ("needle*") or groups, or mappings
      - needle                     #   with per-task grid overrides
      - {name: multikey, loads: [1, 4, 16, 64]}
      - {name: mqar, cells: [{length: 64, load: 4, samples: 250}]}  # listed cells, no product
    groups: {recall: [needle, "multikey*"]}
    lengths: [256, 512]            # grid defaults for every task (else each task's own)
    depths: [0.1, 0.5, 0.9]
    samples: 2
    limit: null                    # at most N probes per task (or a fraction if < 1)
    seed: 0
    batch_size: 1
    threads: null                  # torch CPU threads (default: torch's; 1 helps on busy cores)
    arrivals: null                 # served models only: poisson:RATE or trace:FILE (a load test)
    include: [my_tasks/]           # extra task folders, relative to this file
    plugins: [my_adapter.py]       # Python files/modules that register models, ditto

A task's `cells` lists its grid cells one by one instead of the product of lengths x loads
(a paired setting such as MQAR's (64 tokens, 4 pairs), (128, 32), ...), each with its own
sample count (default: the grid's samples); depths still come from the usual precedence and
apply to every cell. Seeds are those of the same (length, depth, load, index) in a product grid.

Grid precedence: command-line flags, then the task entry's overrides, then the suite's
defaults, then the task spec's own defaults. `${VAR}` in a model spec or a string option is
replaced by the environment variable (an unset one is an error), so a shared config can name
checkpoints without editing it; an option that is one `${VAR}` alone takes a number or boolean
as YAML reads it (`concurrency: ${C}`).

A model entry's `forced_choice: false` turns the forced-choice metric off for that model: no
candidate is scored (score() is never called, so a served sample is one request, one prefill
of its prompt); results.json's `models` record `forced_choice: false`, and the config hash and
the samples' cache keys differ from the same model with it on.
"""
from __future__ import annotations

import fnmatch
import hashlib
import math
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Sequence

from pydantic import (BaseModel, ConfigDict, Field, ValidationError, field_validator,
                      model_validator)

from evalkit.grid import (MAX_POINTS, SIZES, Grid, length_error, load_error,
                          samples_error)
from evalkit.probe import canonical_json
from evalkit.render import ANSWER_STOP
from evalkit.taskspec import GridPoint, SpecError, TaskSpec, discover, grid
from evalkit.runner.errors import SuiteError
from evalkit.runner.plugins import import_plugins
from evalkit.runner.suite_vars import expand, forced_choice
from evalkit.yamlfile import read_yaml, validation_message

# Groups every suite knows; a suite's own `groups:` may add more (not replace these).
BUILTIN_GROUPS: dict[str, tuple[str, ...]] = {"all": ("*",)}


class ModelEntry(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)
    name: str = Field(min_length=1)       # how results name it
    spec: str | None = None               # what load_model gets; defaults to `name`
    options: dict[str, Any] = Field(default_factory=dict)
    # the published result this model reproduces (a key of configs/published/*.yaml, e.g.
    # "gla-d64"); recorded in results.json, never hashed: it changes no answer
    published: str | None = Field(default=None, pattern=r"^[a-z0-9][a-z0-9._-]*$")
    # False: no forced-choice scoring for this model (greedy answers only); hashed when off.
    # A string is one `${VAR}` read as YAML (true / false), so one suite serves runs with and
    # without it (the served board: scored unloaded, greedy only under load)
    forced_choice: bool | str = True

    @property
    def spec_name(self) -> str:
        return self.spec or self.name


class Cell(BaseModel):
    """One grid cell of a task entry's `cells` list."""
    model_config = ConfigDict(extra="forbid", frozen=True)
    length: int
    load: int
    samples: int | None = None

    @model_validator(mode="after")
    def _bounded(self):  # the grid's own bounds (evalkit.grid)
        why = length_error(self.length) or load_error(self.load) or (
            samples_error(self.samples) if self.samples is not None else None)
        if why:
            raise ValueError(why)
        return self


class TaskEntry(Grid):
    name: str = Field(min_length=1)       # a task name, a glob, or a group
    cells: tuple[Cell, ...] | None = None  # listed (length, load) cells instead of a product

    @model_validator(mode="after")
    def _cells_or_product(self):
        if self.cells is not None:
            if not self.cells:
                raise ValueError("cells: empty; expected at least one {length, load} cell")
            if self.lengths is not None or self.loads is not None:
                raise ValueError("give either cells or lengths/loads, not both (cells list "
                                 "each (length, load) pair)")
            pairs = [(c.length, c.load) for c in self.cells]
            if len(set(pairs)) != len(pairs):
                raise ValueError(f"cells: a (length, load) pair appears twice in {pairs}")
        return self


class Generation(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)
    stop: tuple[str, ...] = ANSWER_STOP
    max_new_tokens: int | None = Field(default=None, ge=1)  # None: each question's own budget


class SuiteConfig(Grid):
    name: str = "adhoc"
    description: str = ""
    models: tuple[ModelEntry, ...] = ()
    tasks: tuple[TaskEntry, ...] = ()
    groups: dict[str, tuple[str, ...]] = Field(default_factory=dict)
    include: tuple[str, ...] = ()
    plugins: tuple[str, ...] = ()
    limit: float | None = Field(default=None, gt=0)
    seed: int = 0
    batch_size: int = Field(default=1, ge=1)
    threads: int | None = Field(default=None, ge=1)  # torch CPU threads per process
    log_samples: bool = False
    cache_dir: str | None = None
    generation: Generation = Generation()
    lm_eval_tasks: tuple[str, ...] = ()
    arrivals: str | None = None  # evalkit.runner.arrivals: when served requests are sent

    @field_validator("models", "tasks", mode="before")
    @classmethod
    def _names_to_entries(cls, v):
        # A bare string is shorthand for {name: ...}; converting first keeps errors simple.
        if isinstance(v, (list, tuple)):
            return [{"name": x} if isinstance(x, str) else x for x in v]
        return v

    @field_validator("limit")
    @classmethod
    def _limit(cls, v):
        if v is not None and v >= 1 and v != int(v):
            raise ValueError("must be a whole number of probes (>= 1) or a fraction in (0, 1)")
        return v


# -- parsing ------------------------------------------------------------------------------

def validate(raw: Any, where: str) -> SuiteConfig:
    if not isinstance(raw, dict):
        raise SuiteError(f"{where}: expected a mapping of keys (models, tasks, ...), "
                         f"got {type(raw).__name__}")
    try:
        return SuiteConfig.model_validate(raw)
    except ValidationError as e:
        raise SuiteError(validation_message(where, e)) from None


def _absolute(paths: Sequence[str], base: Path) -> tuple[str, ...]:
    out = []
    for p in paths:
        q = Path(os.path.expanduser(p))
        # A dotted module name stays as is; anything path-like is made absolute.
        if q.is_absolute() or "/" in p or p.endswith(".py") or (base / q).exists():
            out.append(str(q if q.is_absolute() else (base / q).resolve()))
        else:
            out.append(p)
    return tuple(out)


def load_suite(path: str | os.PathLike) -> SuiteConfig:
    """Read a suite YAML. `include` and `plugins` paths become absolute (relative to the file)."""
    path = Path(path)
    suite = validate(read_yaml(path, SuiteError, "suite config"), str(path))
    base = path.resolve().parent
    arrivals = suite.arrivals
    if arrivals and arrivals.startswith("trace:"):  # a trace file is relative to this file
        arrivals = "trace:" + str((base / Path(arrivals[6:]).expanduser()).resolve())
    return suite.model_copy(update={"include": _absolute(suite.include, base),
                                    "plugins": _absolute(suite.plugins, base),
                                    "arrivals": arrivals})


def override(suite: SuiteConfig, where: str, **changes: Any) -> SuiteConfig:
    """A copy with `changes` (None values ignored), validated as a whole again. A grid size
    changed here (a command-line flag) holds for every task: it is set on the suite and
    cleared from each task entry, the top of the grid precedence (evalkit.grid)."""
    changes = {k: v for k, v in changes.items() if v is not None}
    data = suite.model_dump()
    data.update(changes)
    pinned = [k for k in SIZES if k in changes]
    listed = [t["name"] for t in data["tasks"] if t.get("cells")]
    if listed and {"lengths", "loads"} & set(pinned):
        raise SuiteError(f"{where}: --lengths / --loads cannot hold for task(s) "
                         f"{', '.join(map(repr, listed))}: their entries list their (length, "
                         f"load) cells (select the task with --tasks for a product grid)")
    data["tasks"] = [{**t, **{k: None for k in pinned}} for t in data["tasks"]]
    return validate(data, where)


# -- resolution -----------------------------------------------------------------------------

@dataclass(frozen=True)
class ResolvedModel:
    name: str
    spec: str
    options: dict
    published: str | None = None
    served: bool = False   # behind a server (a served:URL spec): what --arrivals loads
    forced_choice: bool = True  # False: greedy answers only (the entry's forced_choice)


@dataclass(frozen=True)
class ResolvedTask:
    spec: TaskSpec
    lengths: tuple[int, ...]
    depths: tuple[float, ...]
    loads: tuple[int, ...]
    samples: int
    points: tuple[GridPoint, ...]
    cells: tuple[Cell, ...] | None = None  # the entry's listed cells, if it used them

    @property
    def name(self) -> str:
        return self.spec.name


@dataclass(frozen=True)
class ResolvedSuite:
    suite: SuiteConfig
    source: str                   # the YAML file, or "command line"
    models: tuple[ResolvedModel, ...]
    tasks: tuple[ResolvedTask, ...]
    config: dict                  # everything that changes results; hashed
    config_hash: str
    arrivals: Any = None          # evalkit.runner.arrivals.Arrivals, or None: as fast as possible

    def document(self) -> dict:
        """config.json: the suite as given (paths absolute), its resolution and hash."""
        return {"config_hash": self.config_hash, "source": self.source,
                "suite": self.suite.model_dump(mode="json"), "resolved": self.config}


def _is_served(spec: str) -> bool:
    from evalkit.model_adapters.models import resolve_spec

    return resolve_spec(spec)[0].kind == "served"


def _holds_secret(text: str) -> bool:
    """Whether a URL inside a model spec or name carries credentials (user:pass@), a query, a
    fragment or path parameters (?token=..., ;token=...): such a spec is refused by the runner
    before it is loaded, printed or stored, and no message repeats it."""
    from evalkit.model_adapters.served.urls import holds_secret

    for piece in str(text).split("|"):
        if "://" not in piece:
            continue
        # from the URL's scheme on (a spec's "served:" before it is no part of it); a path
        # parameter (;token=...) hides a secret as a query does
        if holds_secret(piece[piece.rfind(":", 0, piece.index("://")) + 1:]):
            return True
    return False


def _check_model(spec: str, where: str, i: int, name: str) -> None:
    from evalkit.model_adapters.models import resolve_spec

    if _holds_secret(spec) or _holds_secret(name):
        raise SuiteError(f"{where}: key 'models.{i}': its URL holds credentials or a query string "
                         f"(not repeated here: it may be a secret); give the API root alone, "
                         f"served:http://HOST:PORT/v1, and the key through api_key_env=NAME")
    try:
        resolve_spec(spec)
    except (KeyError, FileNotFoundError, ValueError) as e:
        msg = e.args[0] if isinstance(e, KeyError) and e.args else e
        raise SuiteError(f"{where}: key 'models.{i}' ({name!r}): {msg}; or give NAME:PATH or a "
                         f"checkpoint path") from None


def _expand_task_name(pattern: str, names: list[str], groups: dict[str, tuple[str, ...]],
                      seen: tuple[str, ...] = ()) -> list[str]:
    if pattern in groups:
        if pattern in seen:
            raise SuiteError(f"task group {pattern!r} contains itself (via {' -> '.join(seen)})")
        out: list[str] = []
        for member in groups[pattern]:
            out += _expand_task_name(member, names, groups, seen + (pattern,))
        return out
    if pattern in names:
        return [pattern]
    if any(c in pattern for c in "*?["):
        hits = [n for n in names if fnmatch.fnmatchcase(n, pattern)]
        if hits:
            return hits
        raise SuiteError(f"task pattern {pattern!r} matches no task (known: {', '.join(names)})")
    raise SuiteError(f"unknown task or group {pattern!r} (tasks: {', '.join(names) or 'none'}; "
                     f"groups: {', '.join(sorted(groups)) or 'none'})")


def apply_limit(points: Sequence[GridPoint], limit: float | None) -> list[GridPoint]:
    """At most `limit` probes (a fraction if < 1), taken sample-index-first so every grid cell
    keeps its first samples before any cell gets a second."""
    if limit is None:
        return list(points)
    n = math.ceil(len(points) * limit) if limit < 1 else int(limit)
    order = sorted(range(len(points)), key=lambda i: (points[i].index, i))
    return [points[i] for i in sorted(order[:n])]


def _cell_points(spec: TaskSpec, cells: Sequence[Cell], depths: Sequence[float],
                 samples: int, seed: int) -> tuple[list[GridPoint], list[int], list[int]]:
    """The points of listed cells, in their order: each cell is a one-length, one-load grid
    (so its seeds equal a product grid's), with its own sample count."""
    points: list[GridPoint] = []
    for c in cells:
        points += grid(spec, lengths=[c.length], depths=depths, loads=[c.load],
                       samples=c.samples or samples, seed=seed)
    if len(points) > MAX_POINTS:
        raise SpecError(f"the cells hold {len(points):,} probes; at most {MAX_POINTS:,} per task")
    uniq = lambda xs: list(dict.fromkeys(xs))
    return points, uniq(c.length for c in cells), uniq(c.load for c in cells)


def resolve(suite: SuiteConfig, source: str = "command line") -> ResolvedSuite:
    """Check models exist, expand task names/globs/groups and compute each task's grid."""
    import_plugins(suite.plugins, source)
    if not suite.models:
        raise SuiteError(f"{source}: no models (give --models or a `models:` list)")
    if not suite.tasks and not suite.lm_eval_tasks:
        raise SuiteError(f"{source}: no tasks (give --tasks or a `tasks:` list)")
    models = []
    names_seen: set[str] = set()
    for i, m in enumerate(suite.models):
        if m.name in names_seen:
            raise SuiteError(f"{source}: key 'models.{i}': model name {m.name!r} appears twice")
        names_seen.add(m.name)
        spec = expand(m.spec_name, source, f"models.{i}.spec")
        options = expand(dict(m.options), source, f"models.{i}.options")
        _check_model(spec, source, i, m.name)
        models.append(ResolvedModel(m.name, spec, options, m.published, _is_served(spec),
                                    forced_choice(m.forced_choice, source, i)))

    try:
        registry = discover(suite.include)
    except SpecError as e:
        raise SuiteError(f"{source}: key 'include': {e}") from None
    names = registry.names()
    groups = {**BUILTIN_GROUPS, **suite.groups}
    chosen: dict[str, TaskEntry] = {}
    for i, entry in enumerate(suite.tasks):
        try:
            expanded = _expand_task_name(entry.name, names, groups)
        except SuiteError as e:
            raise SuiteError(f"{source}: key 'tasks.{i}': {e}") from None
        for name in expanded:
            prev = chosen.get(name)
            grid_of = lambda e: e.model_dump(exclude={"name"})
            if prev is not None and grid_of(prev) != grid_of(entry):
                raise SuiteError(f"{source}: key 'tasks.{i}': task {name!r} is selected twice "
                                 f"with different grids (by {prev.name!r} and {entry.name!r})")
            chosen.setdefault(name, entry)

    tasks = []
    for name, entry in chosen.items():
        spec = registry.get(name)
        g = entry.over(suite, spec.defaults)
        lengths, depths, loads, samples = g.lengths, g.depths, g.loads, g.samples
        try:
            if entry.cells:
                points, lengths, loads = _cell_points(spec, entry.cells, depths, samples,
                                                      suite.seed)
            else:
                points = grid(spec, lengths=lengths, depths=depths, loads=loads,
                              samples=samples, seed=suite.seed)
        except SpecError as e:
            raise SuiteError(f"{source}: task {name!r}: {e}") from None
        tasks.append(ResolvedTask(spec, tuple(lengths), tuple(float(d) for d in depths),
                                  tuple(loads), samples,
                                  tuple(apply_limit(points, suite.limit)), entry.cells))

    # Only what changes results is hashed: not batch size, threads, output paths, logging, or
    # where task files live (a task's own config hash covers its generator and params).
    config = {
        "models": [{"name": m.name, "spec": m.spec, "options": m.options,
                    **({} if m.forced_choice else {"forced_choice": False})} for m in models],
        "tasks": [{"task": t.name, "version": t.spec.version, "config_hash": t.spec.config_hash(),
                   "lengths": list(t.lengths), "depths": list(t.depths), "loads": list(t.loads),
                   "samples": t.samples, "probes": len(t.points),
                   **({"cells": [c.model_dump() for c in t.cells]} if t.cells else {})}
                  for t in tasks],
        "limit": suite.limit, "seed": suite.seed,
        "generation": suite.generation.model_dump(mode="json"),
        "lm_eval_tasks": list(suite.lm_eval_tasks),
    }
    arrivals = _arrivals(suite.arrivals, models, source)
    if arrivals is not None:  # only when set: every other config keeps its hash
        config["arrivals"] = arrivals.config()
    digest = hashlib.sha256(canonical_json(config).encode()).hexdigest()
    return ResolvedSuite(suite, source, tuple(models), tuple(tasks), config, digest, arrivals)


def _arrivals(text: str | None, models: Sequence[ResolvedModel], source: str):
    """The parsed schedule. It loads the served models; in-process ones run unloaded beside
    them (a load test of this process's own model would measure the test, not a deployment),
    so one suite holds both and a shared --cache-dir evaluates the in-process ones once."""
    if text is None:
        return None
    from evalkit.runner.arrivals import parse

    try:
        arrivals = parse(text, f"{source}: key 'arrivals'")
    except ValueError as e:
        raise SuiteError(str(e)) from None
    if not any(m.served for m in models):
        names = ", ".join(m.name for m in models)
        raise SuiteError(f"{source}: key 'arrivals': no served model ({names} run in this "
                         f"process); arrivals load a server: give a served:URL model")
    return arrivals
