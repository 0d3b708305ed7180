"""The grid's one model: one precedence rule (Grid.over) and one set of bounds, held alike by
a task file's defaults, a suite, a suite's task entry, a cell, a command-line flag and a
generator called directly."""
import argparse

import pytest

from evalkit.grid import MAX_LOAD, Grid
from evalkit.probes import check_grid_point
from evalkit.runner.suite import SuiteError, override, resolve, validate
from evalkit.taskspec import SpecError, discover, grid, load_spec

from helpers import REPO


def test_each_size_comes_from_the_first_layer_that_sets_it():
    flag, entry, suite = Grid(lengths=(512,)), Grid(lengths=(64,), samples=3), Grid(depths=(0.2,))
    assert flag.over(entry, suite).sizes() == {"lengths": (512,), "depths": (0.2,),
                                               "loads": None, "samples": 3}
    assert Grid().over(Grid()).sizes() == Grid().sizes()  # nothing set stays unset


def test_flags_beat_the_entry_the_suite_and_the_defaults():
    suite = validate({"models": ["oracle"], "lengths": [256], "samples": 2,
                      "tasks": [{"name": "needle", "lengths": [1024], "loads": [8]}]}, "s.yaml")
    (task,) = resolve(suite, "s.yaml").tasks
    assert (task.lengths, task.loads, task.samples) == ((1024,), (8,), 2)  # entry > suite
    (task,) = resolve(override(suite, "command line", lengths=[64], loads=[2]), "cli").tasks
    assert (task.lengths, task.loads, task.samples) == ((64,), (2,), 2)    # flag > entry
    spec = discover().get("needle")
    (task,) = resolve(validate({"models": ["oracle"], "tasks": ["needle"]}, "s"), "s").tasks
    assert (task.lengths, task.depths, task.loads) == (spec.defaults.lengths,
                                                       spec.defaults.depths, spec.defaults.loads)


BAD = f"load={MAX_LOAD + 1} must be a positive integer number of facts up to {MAX_LOAD:,}"


def test_one_bound_and_one_message_in_every_layer(tmp_path):
    suite = {"models": ["oracle"], "tasks": ["needle"]}
    with pytest.raises(SuiteError, match=f"s.yaml: key 'loads': {BAD}"):
        validate({**suite, "loads": [MAX_LOAD + 1]}, "s.yaml")
    with pytest.raises(SuiteError, match=f"s.yaml: key 'tasks.0.loads': {BAD}"):
        validate({**suite, "tasks": [{"name": "needle", "loads": [MAX_LOAD + 1]}]}, "s.yaml")
    with pytest.raises(SuiteError, match=f"s.yaml: key 'tasks.0.cells.0': .*{BAD}"):
        validate({**suite, "tasks": [{"name": "needle",
                                      "cells": [{"length": 64, "load": MAX_LOAD + 1}]}]}, "s.yaml")
    with pytest.raises(SuiteError, match=f"command line: key 'loads': {BAD}"):
        override(validate(suite, "s.yaml"), "command line", loads=[MAX_LOAD + 1])
    with pytest.raises(ValueError, match=f"^{BAD}$"):
        check_grid_point(64, 0.5, MAX_LOAD + 1)
    spec = discover().get("needle")
    with pytest.raises(SpecError, match=f"^{BAD}$"):
        grid(spec, loads=[MAX_LOAD + 1])
    src = (REPO / "configs" / "probes").resolve()
    task = tmp_path / "t.yaml"
    task.write_text(f"task: t\ngenerator: recipe_probe:generate\ninclude_path: ['{src}']\n"
                    f"defaults: {{loads: [{MAX_LOAD + 1}]}}\n")
    with pytest.raises(SpecError, match=f"t.yaml: key 'defaults.loads': {BAD}"):
        load_spec(task)


def test_an_empty_size_is_an_error_never_the_default():
    with pytest.raises(SuiteError, match="key 'depths': depths: empty; expected at least one"):
        validate({"models": ["oracle"], "tasks": ["needle"], "depths": []}, "s.yaml")
    with pytest.raises(SpecError, match="^lengths: empty"):
        grid(discover().get("needle"), lengths=[])


def test_a_length_flag_never_silently_skips_a_task_that_lists_its_cells():
    suite = validate({"models": ["oracle"], "tasks": [
        "needle", {"name": "mqar", "cells": [{"length": 64, "load": 4}]}]}, "s.yaml")
    with pytest.raises(SuiteError, match=r"--lengths / --loads cannot hold for task\(s\) 'mqar'"):
        override(suite, "command line", lengths=[128])
    (needle, mqar) = resolve(override(suite, "command line", samples=3), "cli").tasks
    assert needle.samples == 3 and len(mqar.points) == 3  # samples still hold for both
