"""CONTRIBUTING.md "Add a model", followed literally: its code block saved as one file, listed by
`evalkit models --plugins`, and run through `evalkit run` on the needle task."""
from __future__ import annotations

import contextlib
import io
import json
import re
from pathlib import Path

import pytest

from evalkit.cli import main

CONTRIBUTING = Path(__file__).resolve().parents[1] / "CONTRIBUTING.md"


def recipe_blocks(lang: str) -> list[str]:
    text = CONTRIBUTING.read_text()
    section = re.search(r"^## Add a model\n(.*?)(?=^## |\Z)", text, re.S | re.M)
    assert section, "CONTRIBUTING.md has no '## Add a model' section"
    return re.findall(rf"```{lang}\n(.*?)```", section.group(1), re.S)


@pytest.fixture(scope="module")
def toy_file(tmp_path_factory) -> str:
    [code] = recipe_blocks("python")
    path = tmp_path_factory.mktemp("recipe") / "toy_window.py"
    path.write_text(code)
    return str(path)


def test_the_recipe_is_one_file_with_one_registration(toy_file):
    code = Path(toy_file).read_text()
    assert code.count("@register_model(") == 1
    commands = recipe_blocks("sh")[0]
    assert "--plugins toy_window.py" in commands and "--models toy-window" in commands


def test_evalkit_models_lists_the_toy(toy_file):
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        rc = main(["models", "--json", "--tokens", "256", "--plugins", toy_file])
    rows = {r["name"]: r for r in json.loads(out.getvalue())}
    assert rc == 0
    toy = rows["toy-window"]
    assert (toy["kind"], toy["state_kind"], toy["parameters"], toy["state_bytes"]) == \
        ("toy-window", "window", 0, 4 * 256)


def _run(tmp_path, name, toy_file, *extra):
    out = tmp_path / name
    rc = main(["run", "--plugins", toy_file, "--models", "toy-window", *extra, "--tasks", "needle",
               "--lengths", "256", "--depths", "0.1,0.9", "--samples", "2", "--seed", "3",
               "--output", str(out), "--no-progress"])
    assert rc == 0 and (out / "DONE").is_file()
    return json.loads((out / "results.json").read_text())


def test_evalkit_run_scores_the_toy_and_its_window_forgets(tmp_path, toy_file):
    full = _run(tmp_path, "full", toy_file)
    assert full["summary"]["failed"] == 0
    assert {r["model"] for r in full["rows"]} == {"toy-window"}
    for row in full["rows"]:  # a 512-token window holds the whole 256-token prompt
        assert row["metrics"]["exact_match"]["mean"] == 1.0, row
        assert 4 * 200 < row["state_bytes"] <= 4 * 512

    small = _run(tmp_path, "small", toy_file, "--model-args", "window=32")
    early = [r for r in small["rows"] if r["depth"] == 0.1]
    assert early and all(r["metrics"]["exact_match"]["mean"] == 0.0 for r in early), early
    assert all(r["state_bytes"] == 4 * 32 for r in small["rows"])
    # the window is part of the identity, so the two runs never share cached samples
    assert full["models"]["toy-window"]["hash"] != small["models"]["toy-window"]["hash"]
