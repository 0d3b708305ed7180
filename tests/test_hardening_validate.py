"""Issue 12 item 3: `validate` runs the same probe checks as `run`, and a user's generator that
returns something wrong, or raises, gets an error naming the file, the function and what was
expected. Each case here said "ok" (or printed a traceback) before the checks existed."""
from __future__ import annotations

import textwrap
from pathlib import Path

import pytest

from evalkit.cli import main as cli_main
from runner_support import build_tokenizer

# A correct generator; each case swaps one line of it for a fault.
_GEN = '''
import dataclasses, random
from pydantic import BaseModel
from evalkit import probes as kit
from evalkit.probe import Probe, Segment
from evalkit.render import prompt_length

class Params(BaseModel):
    pass

def generate(params, *, task, version, tokenizer, length, depth, load, seed):
    ask = kit.Ask(item=0, text="What is the code?", prefix="The code is", gold=("4321",),
                  candidates=())
    probe = kit.assemble(task=task, version=version, tokenizer=tokenizer, length=length,
                         depth=depth, load=load, seed=seed, items=[kit.Item("The code is 4321.")],
                         questions=[ask], stream=kit.start_stream(random.Random(seed), "filler"),
                         offsets=[])
    meta, q = probe.meta, probe.questions[0]
    {fault}
    return probe
'''

CASES = {
    # fault line -> what the message must say
    "probe = dataclasses.replace(probe, context=(Segment('The code is 4321.'),), questions=(dataclasses.replace(q, after_segment=1),), hash=''); probe = dataclasses.replace(probe, meta=dataclasses.replace(meta, actual_length=prompt_length(probe, tokenizer)), hash='')":
        r"prompt is \d+ tokens; expected 256",                                # 22 tokens for 256
    "probe = dataclasses.replace(probe, context=probe.context + (Segment('x ' * 500000),), hash='')":
        r"characters, far beyond a 256-token prompt",                         # a 500K-token probe
    "probe = dataclasses.replace(probe, meta=dataclasses.replace(meta, actual_length=256, tolerance=300), hash='')":
        r"meta\.tolerance is 300; expected an integer in \[0, 2\]",
    "probe = dataclasses.replace(probe, meta=dataclasses.replace(meta, actual_length=255), hash='')":
        r"meta\.actual_length is 255 but the prompt measures 256 tokens",    # a lie
    "probe = dataclasses.replace(probe, context=(), questions=(dataclasses.replace(q, after_segment=0),), hash='')":
        r"the context is empty",
    "probe = dataclasses.replace(probe, questions=(dataclasses.replace(q, max_new_tokens=0),), hash='')":
        r"questions\[0\]\.max_new_tokens is 0; expected an integer in \[1, 4096\]",
    "probe = dataclasses.replace(probe, questions=(dataclasses.replace(q, max_new_tokens=-3),), hash='')":
        r"max_new_tokens is -3",
    "probe = dataclasses.replace(probe, meta=dataclasses.replace(meta, depth=float('nan')), hash='')":
        r"meta\.depth is nan; expected 0\.5",
    "probe = dataclasses.replace(probe, meta=dataclasses.replace(meta, extra=(('x', float('inf')),)), hash='')":
        r"not plain JSON",
    "probe = dataclasses.replace(probe, meta=dataclasses.replace(meta, tokenizer_hash='t'), hash='')":
        r"meta\.tokenizer_hash is 't'",
    "object.__setattr__(probe, 'hash', 'f' * 64)":
        r"does not match the probe's content",
    "probe = None": r"returned None \(a missing `return`\?\); expected an evalkit\.probe\.Probe",
    "probe = probe.to_dict()": r"returned a dict .*expected an evalkit\.probe\.Probe",
    "probe = 'The code is 4321.'": r"returned a str .*expected an evalkit\.probe\.Probe",
    "probe = 1 / 0": r"raised ZeroDivisionError: division by zero",
}


def _task(folder: Path, fault: str) -> Path:
    folder.mkdir(parents=True)
    (folder / "gen.py").write_text(textwrap.dedent(_GEN.format(fault=fault)))
    (folder / "t.yaml").write_text("task: t\ngenerator: gen:generate\n"
                                   "defaults: {lengths: [256], depths: [0.5], samples: 1}\n")
    return folder


@pytest.fixture(scope="module")
def tok_dir(tmp_path_factory):
    return build_tokenizer(tmp_path_factory.mktemp("tok"))


def test_a_correct_generator_is_ok(tmp_path, capsys):
    assert cli_main(["validate", str(_task(tmp_path / "t", "pass"))]) == 0
    assert "ok " in capsys.readouterr().out


@pytest.mark.parametrize("fault", list(CASES))
def test_validate_and_run_refuse_the_same_faulty_probe(fault, tmp_path, tok_dir, capsys):
    import re

    folder = _task(tmp_path / "t", fault)
    assert cli_main(["validate", str(folder)]) == 1
    out = capsys.readouterr()
    assert "Traceback" not in out.out + out.err
    msg = out.out
    assert "INVALID" in msg and "t.yaml" in msg and "gen:generate" in msg and "gen.py" in msg
    assert re.search(CASES[fault], msg), msg
    # run refuses it with the same message, one line, exit 2, leaving nothing behind
    rc = cli_main(["run", "--models", "oracle", "--model-args", f"tokenizer={tok_dir}",
                   "--tasks", "t", "--include", str(folder), "--samples", "1",
                   "--output", str(tmp_path / "r"), "--no-progress"])
    err = capsys.readouterr().err
    assert rc == 2 and len(err.strip().splitlines()) == 1 and "Traceback" not in err
    assert re.search(CASES[fault], err) and "gen:generate" in err
    assert not (tmp_path / "r").exists()


def test_two_grid_points_giving_one_probe_are_refused_by_every_command(tmp_path):
    from evalkit.taskspec import GeneratorError, discover, generate_probes, grid
    from evalkit.tokenization import load_tokenizer
    from helpers import TINY_TOKENIZER

    spec = discover([_task(tmp_path / "t", "pass")]).get("t")
    point = grid(spec)[0]
    with pytest.raises(GeneratorError, match=r"identical probes .*sample 0.*sample 0"):
        list(generate_probes(spec, load_tokenizer(TINY_TOKENIZER), [point, point]))


def test_a_module_that_fails_to_import_names_the_file(tmp_path, capsys):
    folder = _task(tmp_path / "t", "pass")
    (folder / "gen.py").write_text("import os\nraise RuntimeError('boom at import')\n")
    assert cli_main(["validate", str(folder)]) == 1
    out = capsys.readouterr().out
    assert "t.yaml: key 'generator': importing 'gen'" in out and "gen.py" in out
    assert "RuntimeError: boom at import" in out


def test_validate_on_a_folder_without_task_files_is_an_error(tmp_path, capsys):
    (tmp_path / "empty").mkdir()
    assert cli_main(["validate", str(tmp_path / "empty")]) == 2
    assert "empty: no task files (*.yaml) in this folder" in capsys.readouterr().err


@pytest.mark.parametrize("flags, message", [
    (["--samples", "0"], "samples=0 must be a positive integer up to 100,000"),
    (["--samples", "1000000000"], "samples=1000000000 must be a positive integer up to 100,000"),
    (["--lengths", "99999999"], "length=99999999 must be a positive integer number of tokens up to"),
    (["--loads", "10000000"], "load=10000000 must be a positive integer number of facts up to"),
    (["--lengths", ","], "lengths: empty"),
    (["--depths", "nan"], "depth=nan outside [0, 1]"),
    (["--lengths", "1000,2000,3000,4000", "--depths", "0,0.1,0.2,0.3,0.4,0.5,0.6,0.7,0.8,0.9",
      "--samples", "100000"], "the grid holds 4,000,000 probes"),
])
def test_generate_bounds_every_grid_size(flags, message, tmp_path, capsys):
    from helpers import TINY_TOKENIZER

    rc = cli_main(["generate", "needle", "--tokenizer", str(TINY_TOKENIZER),
                   "--out", str(tmp_path / "p.jsonl"), *flags])
    assert rc == 2 and message in capsys.readouterr().err
    assert not (tmp_path / "p.jsonl").exists()
