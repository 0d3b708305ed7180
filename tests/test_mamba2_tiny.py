"""recall-mamba2-tiny: a transformers Mamba-2 trained by `evalkit train-tiny` on exactly the
tiny pair's recipe and batches. Its parameters are checked against the GLA's before training,
`--only` trains it alone (the pair's folders untouched), the folder it writes loads through the
hf path and answers, and the shared batch draw is the one the pair always trained on."""
from __future__ import annotations

import json
import random
import re
from pathlib import Path

import pytest

from evalkit.cli import main
from evalkit.cli.train import load_config

REPO = Path(__file__).resolve().parents[1]
GLA_TINY_PARAMS = 1_345_408  # recall-gla-tiny's card
# the pair's toy recipe (test_train_tiny) with a Mamba-2 block at its width
TOY = ("stages:\n"
       "  - {tasks: [needle], lengths: [96], steps: 1, pool: 2}\n"
       "  - {tasks: [needle, multikey], lengths: [384], steps: 1, pool: 4}\n"
       "loads: {multikey: [4]}\nseq_len: 448\nbatch_tokens: 768\n"
       "warmup: 1\nhidden_size: 32\nnum_layers: 1\nnum_heads: 2\n"
       "intermediate_size: 96\nthreads: 1\n")
TOY_MAMBA2 = "mamba2: {num_layers: 2, state_size: 16, head_dim: 16, expand: 2}\n"


def _toy(tmp_path: Path, extra: str = TOY_MAMBA2) -> Path:
    path = tmp_path / "toy.yaml"
    path.write_text(TOY + extra)
    return path


def test_the_recipe_mamba2_is_within_5_percent_of_the_gla_and_a_far_one_is_refused():
    from evalkit.training.train import build_models

    cfg = load_config(str(REPO / "configs" / "train_tiny.yaml"))
    built = build_models(cfg, 2048, 0, 1, 2)  # the tiny tokenizer's 2,048 ids
    params = {k: sum(p.numel() for p in m.parameters()) for k, (m, _) in built.items()}
    assert params["gla"] == GLA_TINY_PARAMS
    assert params["mamba2"] == 1_347_028 and abs(params["mamba2"] / params["gla"] - 1) < 0.05
    m_cfg = built["mamba2"][1]
    assert m_cfg.num_heads * m_cfg.head_dim == m_cfg.expand * m_cfg.hidden_size
    assert not m_cfg.tie_word_embeddings and m_cfg.trained_length == cfg.seq_len == 1152
    assert m_cfg.head_dim % 16 == 0 and m_cfg.state_size <= 128 and m_cfg.chunk_size in (64, 128)
    far = cfg.model_copy(update={"mamba2": cfg.mamba2.model_copy(update={"num_layers": 10})})
    with pytest.raises(ValueError, match=r"recall-mamba2-tiny would have 1,\d{3},\d{3} "
                                         r"parameters, \+\d+\.\d % from recall-gla-tiny's "
                                         r"1,345,408 \(more than 5 %\); adjust mamba2"):
        build_models(far, 2048, 0, 1, 2)


def test_the_mamba2_block_is_typed(tmp_path):
    with pytest.raises(ValueError, match=r"'mamba2.colour'"):
        load_config(str(_toy(tmp_path, "mamba2: {num_layers: 2, colour: red}\n")))
    with pytest.raises(ValueError, match=r"'mamba2.head_dim'"):  # vLLM: multiples of 16
        load_config(str(_toy(tmp_path, "mamba2: {num_layers: 2, head_dim: 24}\n")))
    with pytest.raises(ValueError, match=r"not a multiple of head_dim 48"):
        load_config(str(_toy(tmp_path, "mamba2: {num_layers: 2, head_dim: 48}\n")))


def test_only_with_a_typo_lists_the_names_before_training(tmp_path, capsys):
    out = tmp_path / "out"
    assert main(["train-tiny", "--config", str(_toy(tmp_path)), "--out", str(out),
                 "--only", "recall-mamba-tiny"]) == 2
    err = capsys.readouterr().err
    assert "'recall-mamba-tiny'" in err and "did you mean 'recall-mamba2-tiny'" in err
    assert all(n in err for n in ("recall-gla-tiny", "recall-softmax-tiny", "recall-mamba2-tiny"))
    assert not out.exists()
    assert main(["train-tiny", "--config", str(_toy(tmp_path, "")), "--out", str(out),
                 "--only", "recall-mamba2-tiny"]) == 2  # a recipe without the block
    assert "no `mamba2` block" in capsys.readouterr().err and not out.exists()


def test_the_draw_is_the_pairs_and_no_model_changes_another(tmp_path, tiny_tokenizer):
    from evalkit.taskspec import discover
    from evalkit.training.train import (batch_schedule, batch_seeds, draw_batches, select_kinds,
                                        stage_pools, train_models)

    cfg = load_config(str(_toy(tmp_path)))
    assert select_kinds(cfg) == ["gla", "softmax", "mamba2"]
    assert select_kinds(load_config(str(_toy(tmp_path, "")))) == ["gla", "softmax"]
    pools = stage_pools(cfg, discover(cfg.include), tiny_tokenizer)
    # the draw the pair was trained with before the family shared one loop
    rng, legacy = random.Random(cfg.seed), []
    for by_len, L in batch_schedule(cfg.stages, pools):
        legacy.append((L, rng.sample(by_len[L], min(len(by_len[L]),
                                                    max(1, cfg.batch_tokens // L)))))
    seeds = batch_seeds(pools)
    legacy = [(L, [seeds[id(s)] for s in seqs]) for L, seqs in legacy]
    assert [(L, [seeds[id(s)] for s in seqs]) for L, seqs in draw_batches(cfg, pools)] == legacy
    quiet = lambda *a, **k: None
    pair = train_models(cfg, tiny_tokenizer, ("gla", "softmax"), log=quiet)
    family = train_models(cfg, tiny_tokenizer, None, log=quiet)
    assert [len(s) for _, s in legacy] == [2, 2]  # min(pool, 768 // 96), 768 // 384
    assert pair["batches"] == family["batches"] == legacy
    assert set(family["history"]) == {"gla", "softmax", "mamba2"}
    for k in ("gla", "softmax"):  # bit for bit: the Mamba-2 beside them changes nothing
        assert pair["history"][k] == family["history"][k]
        assert pair["answer_history"][k] == family["answer_history"][k]


def test_only_mamba2_writes_a_loadable_folder_and_leaves_the_pair(tmp_path):
    from evalkit.model_adapters.embedded import _describe_recurrent
    from evalkit.model_adapters.recurrent.adapter import RecurrentAdapter
    from evalkit.model_adapters.models import load_model, model_info

    out, recipe = tmp_path / "out", str(_toy(tmp_path))
    assert main(["train-tiny", "--config", recipe, "--out", str(out),
                 "--only", "recall-gla-tiny", "--only", "recall-softmax-tiny"]) == 0
    snapshot = lambda: {p: p.read_bytes() for p in sorted(out.rglob("*")) if p.is_file()}
    pair = snapshot()
    assert main(["train-tiny", "--config", recipe, "--out", str(out),
                 "--only", "recall-mamba2-tiny"]) == 0
    assert {p: b for p, b in snapshot().items() if "mamba2" not in p.parent.name} == pair
    assert sorted(p.name for p in out.iterdir()) == ["recall-gla-tiny", "recall-mamba2-tiny",
                                                     "recall-softmax-tiny"]
    folder = out / "recall-mamba2-tiny"
    assert {"config.json", "model.safetensors", "tokenizer.json", "tokenizer_config.json",
            "chat_template.jinja", "README.md", "loss.png", "train_log.json"} <= \
        {p.name for p in folder.iterdir()}
    assert sum(p.stat().st_size for p in folder.iterdir()) < 12 * 2**20
    config = json.loads((folder / "config.json").read_text())
    assert config["model_type"] == "mamba2" and config["trained_length"] == 448
    log = json.loads((folder / "train_log.json").read_text())
    assert len(log["history"]) == 2 and log["config"]["mamba2"]["num_layers"] == 2

    model = load_model(f"hf:{folder}", name="recall-mamba2-tiny")  # the registered name's loader
    assert isinstance(model, RecurrentAdapter)
    assert model_info("recall-mamba2-tiny").options is RecurrentAdapter
    assert model.state_kind == "recurrent" and model.max_length is None
    ids = model.tokenizer("The magic number is 4").input_ids
    state = model.prefill(ids)
    answer = model.generate(state, 2)  # greedy text of 2 tokens
    assert isinstance(answer, str) and answer
    assert all(x < 0 for x in model.score(state, [[5], [6, 7]]))
    described = _describe_recurrent(folder, len(ids))
    assert described["parameters"] == model.num_parameters() == log["params"]
    assert described["state_bytes"] == model.state_bytes(state) == model.state_bytes_at(1)

    card = (folder / "README.md").read_text()
    params = int(re.search(r"^\| parameters \| ([\d,]+)", card, re.M).group(1).replace(",", ""))
    assert params == log["params"]
    assert re.search(r"^\| trained length \| 448 tokens", card, re.M)
    width, layers = re.search(r"^\| width / layers[^|]*\| (\d+) / (\d+) /", card, re.M).groups()
    assert (int(width), int(layers)) == (config["hidden_size"], config["num_hidden_layers"])
    assert "Mamba2ForCausalLM" in card and "recall-gla-tiny" in card and "2^31" in card
    gla_log = json.loads((out / "recall-gla-tiny" / "train_log.json").read_text())
    assert f"| twins' final loss (same batches) | `recall-gla-tiny` " \
           f"{sum(gla_log['history']) / 2:.4f}" in card  # the pair's earlier run, same recipe
    assert f"| 256 | {model.state_bytes_at(256):,} B |" in card
