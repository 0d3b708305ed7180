"""The Laplace 3B reconstruction reproduces the published figures, and `evalkit state` prints them."""
from __future__ import annotations

import argparse
import json
from pathlib import Path

import pytest
import torch

from evalkit.cli import state as state_cmd
from evalkit.model_adapters.facts import gla_facts
from evalkit.model_adapters.gla.config import GLAConfig
from evalkit.model_adapters.gla.model import GLAForCausalLM

CONFIG = Path(__file__).resolve().parents[1] / "configs" / "models" / "laplace-3b.json"


def test_laplace_3b_on_meta_device():
    cfg = GLAConfig.from_json(CONFIG)
    with torch.device("meta"):  # no memory: shapes only
        model = GLAForCausalLM(cfg)
        state = model.empty_state(1)
    params = model.num_parameters()
    assert params == cfg.param_count()
    assert abs(params / 3.028e9 - 1) < 1e-3
    assert cfg.num_hidden_layers == 24
    # State measured from the tensors (fp32 at run time) agrees with the formula ...
    assert state.nbytes() == cfg.state_bytes(torch.float32)
    # ... and the published bf16 figure: 28,311,552 B recurrent + 1,179,648 B conv tails.
    bf16 = cfg.state_bytes("bf16")
    assert bf16 == 29_491_200
    assert abs(bf16 / 29.5e6 - 1) < 0.01
    kv = gla_facts(cfg, "laplace").softmax_kv_bytes(8192, "bf16")
    assert kv == 2 * 24 * 3072 * 8192 * 2
    assert abs(kv / bf16 - 82) < 1


def parse(argv):
    p = argparse.ArgumentParser()
    state_cmd.add_parser(p.add_subparsers())
    return p.parse_args(argv)


@pytest.mark.parametrize("spec", [str(CONFIG), str(CONFIG.parent), "laplace", f"laplace:{CONFIG}"])
def test_state_command_json(spec, capsys, tmp_path):
    if spec == str(CONFIG.parent):  # a folder holding config.json
        (tmp_path / "config.json").write_text(CONFIG.read_text())
        spec = str(tmp_path)
    args = parse(["state", spec, "--context", "8192", "--dtype", "bf16", "--json"])
    assert state_cmd.run(args) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["parameters"] == 3_029_243_904
    assert out["state_bytes"] == 29_491_200
    assert out["kv_bytes"] == 2_415_919_104
    assert round(out["ratio"]) == 82


def test_state_command_text_and_errors(capsys):
    assert state_cmd.run(parse(["state", "laplace", "--context", "2048"])) == 0
    text = capsys.readouterr().out
    assert "3,029,243,904" in text and "29,491,200" in text and "20.5x" in text
    assert state_cmd.run(parse(["state", "gla"])) == 2  # registered, but no config without a path
    assert "no config without a checkpoint" in capsys.readouterr().err
    assert state_cmd.run(parse(["state", "no/such/config.json"])) == 2
    assert "unknown model" in capsys.readouterr().err
