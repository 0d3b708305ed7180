"""Layering and declaration rules, checked on the source: adapters never import command modules,
and every built-in model is declared exactly once, by one `register_model` call."""
from __future__ import annotations

import ast
from pathlib import Path

from evalkit.models import MODELS, model_names

ROOT = Path(__file__).resolve().parents[1]
ADAPTERS = ROOT / "model_adapters"
COMMANDS = ("evalkit.cli",)


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
    if "evalkit.models.register_model" not in imported_modules(source, package_of(path)):
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


def test_no_adapter_imports_a_command_module():
    bad = [f"{f.relative_to(ROOT)} imports {m}"
           for f in adapter_files() for m in sorted(imported_modules(f.read_text(), package_of(f)))
           if any(m == c or m.startswith(c + ".") for c in COMMANDS)]
    assert not bad, bad


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
    """No second way in: nothing outside evalkit/models.py adds to the registry directly."""
    offenders = []
    for f in sorted((ROOT / "evalkit").rglob("*.py")) + adapter_files():
        if f == ROOT / "evalkit" / "models.py":
            continue
        text = f.read_text()
        if "MODELS.add(" in text:
            offenders.append(str(f.relative_to(ROOT)))
    assert not offenders, offenders
