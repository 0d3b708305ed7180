"""Layering and declaration rules, checked on the source: no import cycle (function-level imports
included), no module imports a layer above its own (LAYERS: core, the model side and tasks,
runs, commands; run with -s to see them), nothing probes an adapter's capabilities, and every
built-in model is declared exactly once, by one `register_model` call."""
from __future__ import annotations

import ast
from pathlib import Path

from evalkit.model_adapters.models import MODELS, model_names

ROOT = Path(__file__).resolve().parents[1]
ADAPTERS = ROOT / "model_adapters"


def package_of(path: Path) -> list[str]:
    """The installed package of a file under model_adapters/ (evalkit.model_adapters...)."""
    return ["evalkit", "model_adapters", *path.parent.relative_to(ADAPTERS).parts]


def imported_modules(source: str, package: list[str]) -> set[str]:
    """Every module a file imports, at any depth (function-local imports included)."""
    out: set[str] = set()
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            out.update(a.name for a in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = ".".join(package[: len(package) - node.level + 1]) if node.level else ""
            module = ".".join(x for x in (base, node.module) if x)
            out.add(module)
            out.update(f"{module}.{a.name}" for a in node.names)
    return out


def registered_names(path: Path) -> list[str]:
    """The first argument of every evalkit `register_model("name", ...)` call in a file
    (lm-eval has a decorator of the same name; the bridge's registration is lm-eval's)."""
    source = path.read_text()
    if "evalkit.model_adapters.models.register_model" not in imported_modules(source, package_of(path)):
        return []
    names = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Call) and getattr(node.func, "id", None) == "register_model":
            assert node.args and isinstance(node.args[0], ast.Constant), \
                f"{path}:{node.lineno}: register_model needs the name as a literal first argument"
            names.append(node.args[0].value)
    return names


def adapter_files() -> list[Path]:
    files = sorted(ADAPTERS.rglob("*.py"))
    assert len(files) > 10
    return files


def test_the_import_check_sees_local_and_relative_imports():
    pkg = package_of(ADAPTERS / "softmax" / "adapter.py")
    assert "evalkit.cli.models" in imported_modules("def f():\n    from evalkit.cli import models\n", pkg)
    assert "evalkit.cli" in imported_modules("import evalkit.cli\n", pkg)
    assert "evalkit.model_adapters.softmax.kv_cache" in imported_modules("from . import kv_cache\n", pkg)
    assert "evalkit.model_adapters.weights" in imported_modules("from ..weights import x\n", pkg)


def test_every_builtin_model_is_declared_exactly_once():
    declared: dict[str, list[str]] = {}
    for f in adapter_files():
        for name in registered_names(f):
            declared.setdefault(name, []).append(str(f.relative_to(ROOT)))
    twice = {n: where for n, where in declared.items() if len(where) > 1}
    assert not twice, twice
    # plugins other tests loaded in this process are in the registry too: compare built-ins
    builtins = [n for n in model_names() if MODELS.origin(n).startswith("evalkit.model_adapters.")]
    assert sorted(declared) == builtins
    for name in declared:  # and the registry records the declaring module
        assert MODELS.origin(name).startswith("evalkit.model_adapters.")


def test_models_are_declared_only_through_register_model():
    """No second way in: nothing outside model_adapters/models.py adds to the registry directly."""
    offenders = []
    for f in sorted((ROOT / "evalkit").rglob("*.py")) + adapter_files():
        if f == ADAPTERS / "models.py":
            continue
        text = f.read_text()
        if "MODELS.add(" in text:
            offenders.append(str(f.relative_to(ROOT)))
    assert not offenders, offenders


# -- the import graph of every evalkit module (evalkit/, tasks/, model_adapters/) ---------------
SOURCES = {"evalkit": ROOT / "evalkit", "evalkit.tasks": ROOT / "tasks",
           "evalkit.model_adapters": ROOT / "model_adapters"}


def module_files() -> dict[str, Path]:
    """Installed module name -> file, for every .py file of the three source folders."""
    out = {}
    for pkg, base in SOURCES.items():
        for f in base.rglob("*.py"):
            if pkg == "evalkit" and f.is_relative_to(ROOT / "evalkit" / "lm_eval" / "include"):
                continue  # lm-eval task helpers, copied next to exported YAML, not imported
            parts = list(f.relative_to(base).with_suffix("").parts)
            if parts[-1] == "__init__":
                parts.pop()
            out[".".join([pkg, *parts])] = f
    return out


def import_graph() -> dict[str, dict[str, int]]:
    """module -> {imported evalkit module: line}, function-level imports included. Importing
    a.b.c first runs package a.b's __init__ (unless the importer lives inside a.b), so that
    counts as an import of a.b too; the root package `evalkit` is left out (it runs first)."""
    files = module_files()
    graph = {}
    for mod, f in files.items():
        pkg = mod.split(".") if f.name == "__init__.py" else mod.split(".")[:-1]
        edges: dict[str, int] = {}
        for name, line in _imports(f.read_text(), pkg):
            target = name if name in files else name.rpartition(".")[0]
            if target not in files or target == mod:
                continue
            edges.setdefault(target, line)
            parts = target.split(".")
            for k in range(2, len(parts)):
                parent = ".".join(parts[:k])
                if parent in files and parent != mod and not mod.startswith(parent + "."):
                    edges.setdefault(parent, line)
        graph[mod] = edges
    return graph


def _imports(source: str, package: list[str]) -> list[tuple[str, int]]:
    out = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            out += [(a.name, node.lineno) for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = ".".join(package[: len(package) - node.level + 1]) if node.level else ""
            module = ".".join(x for x in (base, node.module) if x)
            out += [(f"{module}.{a.name}", node.lineno) for a in node.names]
    return out


def cycles(graph: dict[str, dict[str, int]]) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    found = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        for w in graph.get(v, {}):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while comp[-1:] != [v]:
                comp.append(stack.pop())
            if len(comp) > 1:
                found.append(sorted(comp))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return found


def test_no_import_cycle_among_evalkit_modules():
    """Function-level imports count too, so a cycle cannot hide behind an import placed in a
    function: a lazy import is fine only where it breaks no cycle (e.g. to keep `evalkit
    --help` fast)."""
    assert cycles(import_graph()) == []


def test_the_cycle_check_sees_a_cycle_through_a_package_init():
    graph = {"evalkit.a": {"evalkit.b.m": 3, "evalkit.b": 3}, "evalkit.b": {"evalkit.b.p": 1},
             "evalkit.b.p": {"evalkit.a": 9}, "evalkit.b.m": {}}
    assert cycles(graph) == [["evalkit.a", "evalkit.b", "evalkit.b.p"]]
    assert cycles({**graph, "evalkit.b.p": {}}) == []


# The layers, lowest first; a module imports only from its own layer or the ones below. The
# root package's __init__ (the public names: `from evalkit import load_model`) is the one
# module above them all.
LAYERS = (
    ("core: probes, scoring, registry, files", ("evalkit",)),
    ("the model side and the task plugins", ("evalkit.model_adapters", "evalkit.tasks")),
    ("runs, training, boards, lm-eval", ("evalkit.runner", "evalkit.training",
                                         "evalkit.leaderboard", "evalkit.lm_eval")),
    ("commands", ("evalkit.cli", "evalkit.lm_eval.cli", "evalkit.lm_eval.hook",
                  "evalkit.__main__")),
)


def layer_of(mod: str) -> int:
    """The layer of `mod`: the one holding its longest matching package prefix."""
    best, length = 0, 0
    for i, (_, prefixes) in enumerate(LAYERS):
        for p in prefixes:
            if (mod == p or mod.startswith(p + ".")) and len(p) > length:
                best, length = i, len(p)
    return best


def test_no_module_imports_a_layer_above_its_own():
    graph = import_graph()
    for i, (name, prefixes) in enumerate(LAYERS):  # what a reader checks the rule against
        members = sorted(m for m in graph if layer_of(m) == i and m != "evalkit")
        print(f"layer {i}, {name}: {len(members)} modules ({', '.join(prefixes)})")
    bad = [f"{mod} (layer {layer_of(mod)}) imports {target} (layer {layer_of(target)}, line {line})"
           for mod, edges in graph.items() if mod != "evalkit"
           for target, line in edges.items() if layer_of(target) > layer_of(mod)]
    assert not bad, bad
    assert layer_of("evalkit.model_adapters.gla.model") == 1 and layer_of("evalkit.probe") == 0
    assert layer_of("evalkit.lm_eval.cli") == 3 and layer_of("evalkit.lm_eval.run") == 2


PROBES = ("getattr", "hasattr")


def probed_adapters(source: str) -> list[tuple[int, str]]:
    """(line, call) of every getattr/hasattr on an adapter: a name `adapter` or `model`, or an
    attribute `.adapter` (run.adapter, self.adapter)."""
    out = []
    for node in ast.walk(ast.parse(source)):
        if (isinstance(node, ast.Call) and getattr(node.func, "id", None) in PROBES
                and node.args):
            target = node.args[0]
            if (isinstance(target, ast.Name) and target.id in ("adapter", "model")) or \
                    (isinstance(target, ast.Attribute) and target.attr == "adapter"):
                out.append((node.lineno, ast.unparse(node)))
    return out


def test_no_capability_probing_on_adapters():
    """The runner, executor, board and bridges ask an adapter's declared capabilities
    (evalkit.model_adapters.protocol.CAPABILITIES, checked once at load by check_capabilities, the one place
    that may look); nothing probes an adapter with getattr or hasattr."""
    files = [f for f in sorted((ROOT / "evalkit").rglob("*.py")) if f.name != "adapter.py"]
    assert len(files) > 50
    bad = [f"{f.relative_to(ROOT)}:{line}: {call}" for f in files
           for line, call in probed_adapters(f.read_text())]
    assert not bad, bad
    assert probed_adapters("x = getattr(run.adapter, 'abort', None)\n")  # the check sees it
    assert probed_adapters("hasattr(model, 'state_parts')\n")
    assert not probed_adapters("getattr(config, 'head_dim', None)\n")


def test_every_package_folder_is_installed():
    """pyproject's explicit package list names every folder with an __init__.py under the
    three roots it maps (a missing one installs editable but not from a wheel)."""
    import tomllib

    cfg = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]
    found = {".".join((pkg, *init.parent.relative_to(ROOT / folder).parts))
             for pkg, folder in cfg["package-dir"].items()
             for init in (ROOT / folder).rglob("__init__.py")
             if "__pycache__" not in init.parts}
    assert found == set(cfg["packages"]), sorted(found ^ set(cfg["packages"]))
