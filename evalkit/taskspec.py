"""Task specs: typed YAML task definitions, discovery, and probe generation over a grid.

Built-in tasks (the YAML files in `tasks/`) and users' own probes are found by the same
mechanism: every `*.yaml` in the built-in folder and in each include path is a task spec.

    task: my_password          # registry name
    version: "1"               # bump when generation changes (results are never mixed across)
    generator: evalkit.tasks.needle:generate   # module:function; a user's module is found
                                               # in the spec's include path
    description: passwords hidden in prose
    params: {...}              # checked against the generator module's `Params` model
    defaults: {lengths: [512], depths: [0.5], loads: [1], samples: 2}

Unknown keys and wrong types are errors naming the file, the key and the expected type.
Probe seeds are derived, never drawn: seed = sha256(task, version, base seed, length, depth,
load, sample index) reduced to [0, 2^31), so any single probe can be regenerated alone.
Evaluation seeds always lie below 2^31; training data (`evalkit train-tiny`) uses seeds at or
above 2^31, so no training item is ever an evaluation item.
"""
from __future__ import annotations

import hashlib
import importlib
import os
import signal
import sys
import threading
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Iterator, Sequence

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from evalkit.grid import Grid, errors_text
from evalkit.probe import Probe, canonical_json
from evalkit.registry import Registry
from evalkit.user_modules import load_user_file
from evalkit.yamlfile import read_yaml, validation_message

def _builtin_dir() -> Path:
    """The built-in task specs' folder: package data of evalkit.tasks, located, not imported
    as code (the task plugins sit a layer above this module)."""
    from importlib import resources

    return Path(str(resources.files("evalkit.tasks"))).resolve()


class SpecError(ValueError):
    """A task spec is invalid; the message names the file and the key."""


class Defaults(Grid):
    """A task file's `defaults`: the bottom layer of the grid, so every size is set."""
    lengths: tuple[int, ...] = (1024,)
    depths: tuple[float, ...] = (0.5,)
    loads: tuple[int, ...] = (1,)
    samples: int = 1


class TaskSpecModel(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)
    task: str = Field(pattern=r"^[A-Za-z][A-Za-z0-9_.-]*$")
    version: str = "1"
    generator: str = Field(pattern=r"^[A-Za-z_][\w.]*:[A-Za-z_]\w*$")
    description: str = ""
    include_path: tuple[str, ...] = ()
    params: dict[str, Any] = Field(default_factory=dict)
    defaults: Defaults = Defaults()


@dataclass(frozen=True)
class TaskSpec:
    name: str
    version: str
    description: str
    source: Path  # the YAML file
    generator_ref: str
    params: BaseModel
    defaults: Defaults
    generator: Callable[..., Probe]

    @property
    def shown_source(self) -> str:
        """Where the task file is, as results record it: `tasks/<file>` for a built-in task
        (the same in every clone and install), the absolute path for a user's own."""
        try:
            return f"tasks/{self.source.resolve().relative_to(_builtin_dir()).as_posix()}"
        except ValueError:
            return str(self.source)

    def config_hash(self) -> str:
        """Identity of the generation config: results from different hashes never mix."""
        d = {"task": self.name, "version": self.version, "generator": self.generator_ref,
             "params": self.params.model_dump(mode="json")}
        return hashlib.sha256(canonical_json(d).encode()).hexdigest()


def _module_file(mod_name: str, include: Sequence[Path]) -> Path | None:
    """The file `mod_name` names inside the include path (None: not a user module there)."""
    for folder in include:
        base = Path(folder, *mod_name.split("."))
        for f in (base.with_suffix(".py"), base / "__init__.py"):
            if f.is_file():
                return f.resolve()
    return None


def _import_generator(ref: str, path: Path, include: Sequence[Path]) -> tuple[Callable, type]:
    mod_name, _, fn_name = ref.partition(":")
    file = _module_file(mod_name, include)
    added = [str(p) for p in include if str(p) not in sys.path]
    sys.path[:0] = added  # the user's module may import its neighbours
    try:
        try:
            if file is not None and "." not in mod_name:
                module = load_user_file(file, mod_name)
            else:
                module = importlib.import_module(mod_name)
        except ModuleNotFoundError as e:
            raise SpecError(f"{path}: key 'generator': module {mod_name!r} not found "
                            f"(include path: {[str(p) for p in include] or 'none'}; {e})") from e
        except Exception as e:  # the user's module fails as it is imported
            raise SpecError(f"{path}: key 'generator': importing {mod_name!r} "
                            f"({file or 'installed module'}) failed: {type(e).__name__}: {e}") from e
    finally:
        for p in added:
            sys.path.remove(p)
    loaded = getattr(module, "__file__", None)
    if file is not None and loaded and Path(loaded).resolve() != file:
        # A dotted user package is imported by name: one of that name from another folder
        # may already be loaded, and its code must not run for this task.
        raise SpecError(f"{path}: key 'generator': module {mod_name!r} resolves to {file}, but "
                        f"a module of that name from {loaded} is already loaded; rename one")
    fn = getattr(module, fn_name, None)
    if not callable(fn):
        raise SpecError(f"{path}: key 'generator': {mod_name!r} has no function {fn_name!r}")
    params_cls = getattr(module, "Params", None)
    if not (isinstance(params_cls, type) and issubclass(params_cls, BaseModel)):
        raise SpecError(f"{path}: key 'generator': module {mod_name!r} must define a pydantic "
                        f"`Params` model describing its params")
    return fn, params_cls


def load_spec(path: str | Path) -> TaskSpec:
    """Parse and validate one task YAML. Every problem is a SpecError naming the file and key."""
    path = Path(path)
    raw = read_yaml(path, SpecError, "task file")
    if not isinstance(raw, dict):
        raise SpecError(f"{path}: expected a mapping of keys (task, generator, params, ...), "
                        f"got {type(raw).__name__}")
    try:
        m = TaskSpecModel.model_validate(raw)
    except ValidationError as e:
        raise SpecError(validation_message(path, e)) from None
    include = [(path.parent / p).resolve() for p in m.include_path] or [path.parent.resolve()]
    fn, params_cls = _import_generator(m.generator, path, include)
    try:
        params = params_cls.model_validate(m.params)
    except ValidationError as e:
        raise SpecError(validation_message(path, e, "params")) from None
    return TaskSpec(m.task, m.version, m.description, path.resolve(), m.generator, params,
                    m.defaults, fn)


def discover(include_paths: Sequence[str | Path] = ()) -> Registry[TaskSpec]:
    """All task specs: built-in ones first, then each include path's. Name clashes are errors."""
    reg: Registry[TaskSpec] = Registry("task")
    folders = [_builtin_dir(), *[Path(p) for p in include_paths]]
    for folder in folders:
        if not folder.exists():
            raise SpecError(f"include path {folder}: does not exist")
        files = [folder] if folder.is_file() else sorted(folder.glob("*.yaml"))
        for f in files:
            spec = load_spec(f)
            reg.add(spec.name, spec, origin=str(f))
    return reg


EVAL_SEED_MASK = (1 << 31) - 1  # evaluation seeds < 2^31; training seeds >= 2^31


def probe_seed(spec: TaskSpec, base_seed: int, length: int, depth: float, load: int,
               index: int) -> int:
    key = canonical_json([spec.name, spec.version, base_seed, length, float(depth), load, index])
    return int.from_bytes(hashlib.sha256(key.encode()).digest()[:4], "big") & EVAL_SEED_MASK


@dataclass(frozen=True)
class GridPoint:
    length: int
    depth: float
    load: int
    index: int
    seed: int


def grid(spec: TaskSpec, *, lengths: Sequence[int] | None = None,
         depths: Sequence[float] | None = None, loads: Sequence[int] | None = None,
         samples: int | None = None, seed: int = 0) -> list[GridPoint]:
    """The task's grid points, each size given here or else the spec's default (None); an
    empty list or a size out of bounds is an error naming the field, never the default."""
    try:
        g = Grid(lengths=lengths, depths=depths, loads=loads, samples=samples)
    except ValidationError as e:
        raise SpecError(errors_text(e)) from None
    g = g.over(spec.defaults)
    try:
        g.total()
    except ValueError as e:
        raise SpecError(str(e)) from None
    return [GridPoint(L, float(dp), n, i, probe_seed(spec, seed, L, dp, n, i))
            for L in g.lengths for dp in g.depths for n in g.loads for i in range(g.samples)]


GENERATOR_TIMEOUT_S = 300.0   # per probe; EVALKIT_GENERATOR_TIMEOUT_S overrides it
MAX_GENERATOR_TIMEOUT_S = 86400.0


class GeneratorTimeout(SpecError):
    """A generator did not return within its time limit."""


def generator_timeout() -> float:
    raw = os.environ.get("EVALKIT_GENERATOR_TIMEOUT_S")
    if raw is None:
        return GENERATOR_TIMEOUT_S
    try:
        value = float(raw)
    except ValueError:
        value = float("nan")
    if not 0 < value <= MAX_GENERATOR_TIMEOUT_S:
        raise SpecError(f"EVALKIT_GENERATOR_TIMEOUT_S={raw!r}: expected seconds in "
                        f"(0, {MAX_GENERATOR_TIMEOUT_S:g}]")
    return value


@contextmanager
def _time_limit(seconds: float, what: str) -> Iterator[None]:
    """Raise GeneratorTimeout in this thread after `seconds`. A SIGALRM timer interrupts pure
    Python between two bytecodes (a `while True` loop included) without a second process, so
    the generator keeps its arguments (a live tokenizer) as they are. Off the main thread,
    where signals cannot be delivered, generation runs without a limit."""
    if threading.current_thread() is not threading.main_thread() or not hasattr(signal, "setitimer"):
        yield
        return

    def expired(signum, frame):
        raise GeneratorTimeout(f"{what} did not return within {seconds:g} s (a generator that "
                               f"never returns? raise EVALKIT_GENERATOR_TIMEOUT_S if it is "
                               f"just slow)")

    old_handler = signal.signal(signal.SIGALRM, expired)
    old_timer = signal.setitimer(signal.ITIMER_REAL, seconds)
    try:
        yield
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, old_handler)
        if old_timer[0]:  # someone else's timer was running: give it back
            signal.setitimer(signal.ITIMER_REAL, *old_timer)


def _generator_file(spec: TaskSpec) -> str:
    code = getattr(spec.generator, "__code__", None)
    return code.co_filename if code is not None else "?"


class GeneratorError(SpecError):
    """A generator raised, or returned something that is not a faithful probe."""


def generate_probes(spec: TaskSpec, tokenizer: Any, points: Sequence[GridPoint]) -> Iterator[Probe]:
    """The probes of `points`, each checked (evalkit.probe_checks) as it is made, and no two
    alike: every command that generates probes refuses the same faulty ones."""
    from evalkit.probe_checks import check_probe

    limit = generator_timeout()
    seen: dict[str, int] = {}
    for i, p in enumerate(points):
        where = (f"task {spec.name!r} ({spec.source}): generator {spec.generator_ref} "
                 f"({_generator_file(spec)}) at length={p.length}, depth={p.depth}, "
                 f"load={p.load}, sample {p.index}")
        try:
            with _time_limit(limit, where):
                probe = spec.generator(spec.params, task=spec.name, version=spec.version,
                                       tokenizer=tokenizer, length=p.length, depth=p.depth,
                                       load=p.load, seed=p.seed)
        except GeneratorTimeout:
            raise
        except Exception as e:  # the user's code: its fault is named, never a traceback
            raise GeneratorError(f"{where}: raised {type(e).__name__}: {e}") from e
        check_probe(probe, task=spec.name, version=spec.version, length=p.length,
                    depth=p.depth, load=p.load, seed=p.seed, tokenizer=tokenizer, where=where,
                    error=GeneratorError)
        j = seen.setdefault(probe.hash, i)
        if j != i:
            first = points[j]
            # A generator ignoring its seed or grid: the samples would be indistinguishable
            # and publish would refuse the run.
            raise GeneratorError(
                f"task {spec.name!r} ({spec.source}): generator {spec.generator_ref} returned "
                f"identical probes for (length={first.length}, depth={first.depth}, "
                f"load={first.load}, sample {first.index}) and (length={p.length}, "
                f"depth={p.depth}, load={p.load}, sample {p.index}); each grid point needs its "
                f"own probe (use the seed it is given)")
        yield probe
