"""Typed task specs, discovery and custom probes: every bad input is a clear, named error."""
import textwrap
from pathlib import Path

import pytest

from evalkit.cli import main
from evalkit.taskspec import SpecError, discover, grid, load_spec

from helpers import REPO, TINY_TOKENIZER

PROBES = REPO / "configs" / "probes"
GOOD = """\
task: recipes2
version: "3"
generator: recipe_probe:generate
include_path: ["{inc}"]
params: {{n_candidates: 4}}
defaults: {{lengths: [256], depths: [0.5], loads: [1], samples: 2}}
"""


def write(tmp_path: Path, text: str, name: str = "t.yaml") -> Path:
    p = tmp_path / name
    p.write_text(textwrap.dedent(text))
    return p


def good(tmp_path, **repl) -> str:
    text = GOOD.format(inc=PROBES)
    for a, b in repl.items():
        text = text.replace(a, b)
    return text


def test_custom_probe_loads_and_generates(tiny_tokenizer, tmp_path):
    spec = load_spec(write(tmp_path, good(tmp_path)))
    assert spec.name == "recipes2" and spec.params.n_candidates == 4
    pts = grid(spec, seed=1)
    assert len(pts) == 2 and pts[0].seed != pts[1].seed
    probe = spec.generator(spec.params, task=spec.name, version=spec.version,
                           tokenizer=tiny_tokenizer, length=256, depth=0.5, load=1,
                           seed=pts[0].seed)
    assert abs(probe.meta.actual_length - 256) <= probe.meta.tolerance
    # Seeds are derived, so the same grid point always gives the same probe.
    assert grid(spec, seed=1) == pts and grid(spec, seed=2) != pts


@pytest.mark.parametrize("edit, message", [
    (("version: \"3\"", "version: \"3\"\ncolour: red"), "unknown key 'colour'"),
    (("{n_candidates: 4}", "{n_candidates: 4, spice: hot}"), "unknown key 'params.spice'"),
    (("{n_candidates: 4}", "{n_candidates: many}"), "key 'params.n_candidates'.*integer"),
    (("samples: 2", "samples: 0"), "key 'defaults.samples': samples=0 must be a positive integer"),
    (("depths: [0.5]", "depths: [1.5]"), r"key 'defaults.depths'.*\[0, 1\]"),
    (("generator: recipe_probe:generate", "generator: nowhere_mod:generate"),
     "key 'generator': module 'nowhere_mod' not found"),
    (("generator: recipe_probe:generate", "generator: recipe_probe:nothing"),
     "has no function 'nothing'"),
    (("generator: recipe_probe:generate", "generator: not a ref"), "key 'generator'"),
    (("task: recipes2\n", ""), "missing required key 'task'"),
])
def test_spec_errors_name_file_and_key(tmp_path, edit, message):
    path = write(tmp_path, good(tmp_path, **{edit[0]: edit[1]}))
    with pytest.raises(SpecError, match=message) as e:
        load_spec(path)
    assert str(path) in str(e.value)


def test_malformed_yaml_and_non_mapping(tmp_path):
    with pytest.raises(SpecError, match="malformed YAML"):
        load_spec(write(tmp_path, "task: [unclosed\n"))
    with pytest.raises(SpecError, match="expected a mapping"):
        load_spec(write(tmp_path, "- a\n- b\n"))


def test_unknown_task_suggests_close_names():
    reg = discover([PROBES])
    with pytest.raises(KeyError, match="did you mean 'recipes'"):
        reg.get("recipe")


def test_task_name_collision_names_both_files(tmp_path):
    write(tmp_path, good(tmp_path), "a.yaml")
    write(tmp_path, good(tmp_path), "b.yaml")
    with pytest.raises(KeyError, match=r"already registered \(by .*a.yaml\).*b.yaml"):
        discover([tmp_path])


def test_grid_rejects_bad_overrides(tmp_path):
    spec = load_spec(write(tmp_path, good(tmp_path)))
    with pytest.raises(SpecError, match=r"depth=-0.1 outside \[0, 1\]"):
        grid(spec, depths=[-0.1])
    with pytest.raises(SpecError, match="length=0"):
        grid(spec, lengths=[0])


def test_generator_errors_are_not_clamped(tiny_tokenizer, tmp_path):
    spec = load_spec(write(tmp_path, good(tmp_path)))
    with pytest.raises(ValueError, match="length=8 is too short"):
        spec.generator(spec.params, task="r", version="1", tokenizer=tiny_tokenizer, length=8,
                       depth=0.5, load=1, seed=0)


def test_cli_tasks_validate_generate(tmp_path, capsys):
    assert main(["tasks", "--include", str(PROBES)]) == 0
    assert "recipes" in capsys.readouterr().out
    assert main(["validate", str(PROBES)]) == 0
    assert "ok" in capsys.readouterr().out
    bad = write(tmp_path, good(tmp_path, **{"{n_candidates: 4}": "{n_candidates: 0}"}))
    assert main(["validate", str(bad)]) == 1
    assert "params.n_candidates" in capsys.readouterr().out
    out = tmp_path / "p.jsonl"
    assert main(["generate", "recipes", "--include", str(PROBES), "--lengths", "256",
                 "--depths", "0,1", "--tokenizer", str(TINY_TOKENIZER), "--out", str(out),
                 "--parquet", str(tmp_path / "p.parquet")]) == 0
    assert len(out.read_text().splitlines()) == 4  # 2 depths x 2 loads x 1 sample
    import pandas as pd

    assert len(pd.read_parquet(tmp_path / "p.parquet")) == 4


def test_cli_reports_missing_tokenizer_and_unknown_task(tmp_path, capsys):
    rc = main(["generate", "recipes", "--include", str(PROBES), "--tokenizer",
               str(tmp_path / "nope"), "--out", str(tmp_path / "x.jsonl")])
    assert rc == 2 and "no such tokenizer folder or tokenizer.json" in capsys.readouterr().err
    rc = main(["generate", "recipez", "--include", str(PROBES), "--tokenizer",
               str(TINY_TOKENIZER), "--out", str(tmp_path / "x.jsonl")])
    assert rc == 2 and "unknown task 'recipez'" in capsys.readouterr().err


def test_results_record_a_builtin_task_file_the_same_in_every_clone(tmp_path):
    assert discover().get("needle").shown_source == "tasks/needle.yaml"
    path = write(tmp_path, good(tmp_path))
    assert load_spec(path).shown_source == str(path)  # a user's own file: where it is
