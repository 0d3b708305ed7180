"""`evalkit train-tiny` end to end at toy size: data from the task plugins with training seeds,
both checkpoints written in their formats, loadable by their adapters, with model cards."""
import json

import pytest

from evalkit.cli import main
from evalkit.taskspec import EVAL_SEED_MASK, discover, grid
from evalkit.training.data import TRAIN_SEED_BASE, training_sequence


def test_training_seeds_never_overlap_evaluation_seeds(tiny_tokenizer):
    spec = discover().get("needle")
    assert max(p.seed for p in grid(spec, lengths=[512], samples=50)) <= EVAL_SEED_MASK
    assert TRAIN_SEED_BASE == EVAL_SEED_MASK + 1
    with pytest.raises(ValueError, match="below 2\\^31"):
        training_sequence(spec, tiny_tokenizer, length=256, depth=0.5, load=1, seed=7)
    seq = training_sequence(spec, tiny_tokenizer, length=256, depth=0.5, load=1,
                            seed=TRAIN_SEED_BASE + 3)
    answer = [t for t, m in zip(seq.ids, seq.answer_mask) if m]
    assert tiny_tokenizer.decode(answer).strip().isdigit() and len(seq.ids) <= 256 + len(answer)


def test_train_tiny_writes_loadable_pair_with_cards(tmp_path):
    cfg = tmp_path / "tiny.yaml"
    cfg.write_text("stages:\n"
                   "  - {tasks: [needle], lengths: [96], steps: 1, pool: 2}\n"
                   "  - {tasks: [needle, multikey], lengths: [384], steps: 2, pool: 4}\n"
                   "loads: {multikey: [4]}\nseq_len: 448\nbatch_tokens: 768\n"
                   "warmup: 1\nhidden_size: 32\nnum_layers: 1\nnum_heads: 2\n"
                   "intermediate_size: 96\nthreads: 1\n")
    assert main(["train-tiny", "--config", str(cfg), "--out", str(tmp_path / "out")]) == 0
    from evalkit.model_adapters.gla.adapter import GLAAdapter
    from evalkit.model_adapters.softmax import SoftmaxAdapter

    gla = GLAAdapter(str(tmp_path / "out" / "recall-gla-tiny"), name="g")
    soft = SoftmaxAdapter(tmp_path / "out" / "recall-softmax-tiny")
    assert abs(gla.num_parameters() - soft.num_parameters()) / soft.num_parameters() < 0.05
    ids = gla.tokenizer("The magic number is 4").input_ids
    assert len(gla.score(gla.prefill(ids), [[5]])) == 1 and soft.generate(soft.prefill(ids), 2)
    for name in ("recall-gla-tiny", "recall-softmax-tiny"):
        folder = tmp_path / "out" / name
        card = (folder / "README.md").read_text()
        assert "2^31" in card and "parameters" in card and "loss.png" in card
        assert "| 2 | `needle`, `multikey` | 384 | 2 | 4 | 2^31+2 .. 2^31+5 |" in card
        assert (folder / "loss.png").stat().st_size > 1000
        log = json.loads((folder / "train_log.json").read_text())
        assert len(log["history"]) == 3 and len(log["config"]["stages"]) == 2


def test_stages_draw_disjoint_seeds_and_reject_sequences_beyond_seq_len(tiny_tokenizer):
    from evalkit.training.train import TrainConfig, stage_pools

    stage = {"tasks": ["needle"], "lengths": [128], "steps": 1, "pool": 3}
    cfg = TrainConfig(stages=[stage, {**stage, "lengths": [200]}], seq_len=256)
    (a, pa), (b, pb) = stage_pools(cfg, discover(), tiny_tokenizer)
    assert (a, b) == (TRAIN_SEED_BASE, TRAIN_SEED_BASE + 3)
    assert {s.length for s in pa} == {128} and {s.length for s in pb} == {200}
    assert not {s.ids for s in pa} & {s.ids for s in pb}
    with pytest.raises(ValueError, match=r"stages\[1\].*more than seq_len=150"):
        stage_pools(TrainConfig(stages=[stage, {**stage, "lengths": [150]}], seq_len=150),
                    discover(), tiny_tokenizer)


def test_bad_training_config_names_the_key(tmp_path, capsys):
    cfg = tmp_path / "bad.yaml"
    cfg.write_text("stages: [{tasks: [needle], lengths: [64], steps: many}]\ncolour: red\n")
    assert main(["train-tiny", "--config", str(cfg), "--out", str(tmp_path / "o")]) == 2
    err = capsys.readouterr().err
    assert "'stages.0.steps'" in err and "'colour'" in err and str(cfg) in err


def test_out_that_is_a_file_fails_before_training(tmp_path, capsys):
    cfg = tmp_path / "tiny.yaml"
    cfg.write_text("stages: [{tasks: [needle], lengths: [96], steps: 100000, pool: 2}]\n"
                   "seq_len: 160\nhidden_size: 32\nnum_layers: 1\nnum_heads: 2\n"
                   "intermediate_size: 96\nthreads: 1\n")
    out = tmp_path / "afile"
    out.write_text("mine\n")
    assert main(["train-tiny", "--config", str(cfg), "--out", str(out)]) == 2  # no 100k steps
    assert str(out) in capsys.readouterr().err and out.read_text() == "mine\n"


def test_foreign_file_in_a_model_folder_is_refused_and_kept(tmp_path, capsys):
    cfg = tmp_path / "tiny.yaml"
    cfg.write_text("stages: [{tasks: [needle], lengths: [96], steps: 100000, pool: 2}]\n"
                   "seq_len: 160\nhidden_size: 32\nnum_layers: 1\nnum_heads: 2\n"
                   "intermediate_size: 96\nthreads: 1\n")
    mine = tmp_path / "D" / "recall-gla-tiny" / "important.txt"
    mine.parent.mkdir(parents=True)
    mine.write_text("keep me\n")
    assert main(["train-tiny", "--config", str(cfg), "--out", str(tmp_path / "D")]) == 2
    assert str(mine) in capsys.readouterr().err and mine.read_text() == "keep me\n"
