"""CONTRIBUTING.md "Add a task", followed literally: its YAML and generator are written to a
folder, its commands run, and the probes they write are exact-length and well formed."""
import itertools
import json
import re
import shlex

import yaml

from evalkit.cli import main
from evalkit.probe import Probe
from evalkit.render import prompt_length

from helpers import REPO, TINY_TOKENIZER
from tasks_support import check_measured


def recipe_blocks() -> dict[str, str]:
    text = (REPO / "CONTRIBUTING.md").read_text()
    section = text.split("\n## Add a task\n", 1)[1].split("\n## ", 1)[0]
    blocks = dict(re.findall(r"```(\w+)\n(.*?)```", section, re.S))
    assert set(blocks) == {"yaml", "python", "bash"}, blocks.keys()
    return blocks


def test_add_a_task_recipe(tiny_tokenizer, tmp_path, monkeypatch, capsys):
    blocks = recipe_blocks()
    spec = yaml.safe_load(blocks["yaml"])
    folder = tmp_path / "my_tasks"
    folder.mkdir()
    (folder / "box_colours.yaml").write_text(blocks["yaml"])
    (folder / "box_colours.py").write_text(blocks["python"])
    monkeypatch.chdir(tmp_path)

    for line in blocks["bash"].strip().splitlines():
        argv = shlex.split(line.replace("model_adapters/tiny/tokenizer", str(TINY_TOKENIZER)))
        assert argv[0] == "evalkit"
        assert main(argv[1:]) == 0, capsys.readouterr()
    out = capsys.readouterr().out
    assert "ok      my_tasks/box_colours.yaml: task 'box_colours'" in out

    probes = [Probe.from_dict(json.loads(line))  # from_dict re-checks each stored hash
              for line in (tmp_path / "probes.jsonl").read_text().splitlines()]
    d = spec["defaults"]
    grid = set(itertools.product(d["lengths"], d["depths"], d["loads"]))
    assert {(p.meta.target_length, p.meta.depth, p.meta.load) for p in probes} == grid
    assert len(probes) == len(grid) * d["samples"]
    for p in probes:
        check_measured(p, tiny_tokenizer)
        assert p.meta.actual_length == prompt_length(p, tiny_tokenizer) == p.meta.target_length
        assert p.task == "box_colours" and p.task_version == "1" and not p.chat
        q, = p.questions
        box = re.fullmatch(r"What colour is box (\d+)\?", q.text).group(1)
        assert q.answer_prefix == f"Box {box} is painted"
        context = "".join(s.text for s in p.context)
        facts = re.findall(r"Box (\d+) is painted (\w+)\.", context)
        assert len(facts) == p.meta.load and (box, q.gold[0]) in facts
        assert len(q.candidates) == 4 and q.candidates[0] == q.gold[0]
        assert {v for _, v in facts} <= set(q.candidates)  # in-context colours come first
        segments = [s.text.strip() for s in p.context]
        assert f"Box {box} is painted {q.gold[0]}." in segments  # each fact is its own segment
        if p.meta.target_length >= 1024:
            assert abs(q.depth - p.meta.depth) <= 0.01
