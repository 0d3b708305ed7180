"""Random weights at load time (random_seed; `laplace` without a checkpoint): seeded and
reproducible, named in the identity, and refused by `evalkit publish`."""
from __future__ import annotations

import json

import pytest
import torch
import yaml

from evalkit.cli import main as evalkit_main
from evalkit.model_adapters import embedded
from evalkit.model_adapters.gla import GLAConfig
from evalkit.model_adapters.models import load_model
from evalkit.tokenization import load_tokenizer

from helpers import TINY_TOKENIZER, save_peaked_gla
from runner_support import suite_dict


@pytest.fixture(scope="module")
def ckpt(tmp_path_factory):
    folder = tmp_path_factory.mktemp("gla-random")
    tok = load_tokenizer(TINY_TOKENIZER)
    tok.save_pretrained(folder)
    cfg = GLAConfig(vocab_size=len(tok), hidden_size=64, num_heads=2, num_hidden_layers=2,
                    use_short_conv=True, bos_token_id=tok.bos_token_id,
                    eos_token_id=tok.eos_token_id)
    return save_peaked_gla(cfg, folder, 10)


def logits(model, ids=(5, 9, 17, 3, 11)):
    return model.prefill(list(ids)).last_logits


def test_random_seed_is_reproducible_and_named(ckpt):
    a, b = load_model(f"gla:{ckpt}", random_seed=3), load_model(f"gla:{ckpt}", random_seed=3)
    other, real = load_model(f"gla:{ckpt}", random_seed=4), load_model(f"gla:{ckpt}")
    assert torch.equal(logits(a), logits(b))
    assert not torch.allclose(logits(a), logits(other))
    assert not torch.allclose(logits(a), logits(real))
    ident = a.identity()
    assert ident["random_weights"] is True
    assert ident["weights_hash"] == "random:normal(0,0.02):seed=3"
    assert "random_weights" not in real.identity()
    assert a.identity()["config_hash"] == real.identity()["config_hash"]
    # in the target dtype from the start, every parameter real (none left on meta)
    half = load_model(f"gla:{ckpt}", random_seed=3, dtype="bf16")
    assert {p.dtype for p in half.model.parameters()} == {torch.bfloat16}


@pytest.mark.parametrize("seed", [-1, "1", 1.5, True])
def test_bad_random_seed_is_named(ckpt, seed):
    with pytest.raises(ValueError, match="random_seed"):
        load_model(f"gla:{ckpt}", random_seed=seed)


def test_laplace_without_a_path_is_random(ckpt, monkeypatch, capsys):
    # the 3B config itself is measured by `make bench-real`; here the same route at toy size
    monkeypatch.setattr(embedded, "LAPLACE_CONFIG", ckpt / "config.json")
    model = load_model("laplace", tokenizer=str(TINY_TOKENIZER), random_seed=2)
    assert model.name == "laplace" and model.identity()["random_weights"] is True
    assert "random weights (seed 2)" in capsys.readouterr().err
    assert torch.equal(logits(model), logits(load_model(f"gla:{ckpt}", random_seed=2)))


def test_publish_refuses_random_weights(ckpt, tmp_path, capsys):
    suite = suite_dict(TINY_TOKENIZER, models=({"name": f"gla:{ckpt}",
                                                "options": {"random_seed": 0}},),
                       lengths=[64], depths=[0.5], loads=[1], samples=1)
    path = tmp_path / "suite.yaml"
    path.write_text(yaml.safe_dump(suite))
    run = tmp_path / "run"
    assert evalkit_main(["run", "--config", str(path), "--output", str(run),
                         "--no-progress"]) == 0
    res = json.loads((run / "results.json").read_text())
    assert [m["random_weights"] for m in res["models"].values()] == [True]
    capsys.readouterr()
    board = tmp_path / "board"
    assert evalkit_main(["publish", str(run), "--to", str(board)]) != 0
    err = capsys.readouterr().err
    assert "refusing to publish random-weight model(s)" in err and str(run) in err
    assert not board.exists()
