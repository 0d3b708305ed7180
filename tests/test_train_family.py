"""`evalkit train-tiny` with a `models:` config: a capacity family at toy size. Every member is
trained at every swept rate on the same batches, the best held-out rate is kept and retrained
(or, with full-length sweep runs, kept as it is), and each card records the sweep."""
import json
from pathlib import Path

import pytest

from evalkit.cli import main
from evalkit.training.family import best_of

TOY = """\
stages: [{tasks: [train_mqar_dense], lengths: [160], steps: 4, pool: 6}]
include: [%s]
loads: {train_mqar_dense: [8]}
seq_len: 384
batch_tokens: 320
warmup: 1
context_weight: 0.1
hidden_size: 32
num_layers: 1
intermediate_size: 64
threads: 1
sweep: {lrs: [0.001, 0.01], scale: 0.5}
heldout: {task: multikey_mqar, length: 160, load: 8, n: 3}
models:
  - {name: toy-gla-h4, kind: gla, num_heads: 4, expand_k: 0.25}
  - {name: toy-gla-h1, kind: gla, num_heads: 1, expand_k: 1.0}
  - {name: toy-softmax, kind: softmax, num_heads: 2, num_layers: 2, intermediate_size: 32}
"""
TRAIN_TASKS = Path(__file__).resolve().parents[1] / "configs" / "train_tasks"


def test_family_sweeps_keeps_best_and_cards_the_sweep(tmp_path):
    from evalkit.model_adapters.gla_adapter import GLAAdapter
    from evalkit.model_adapters.softmax import SoftmaxAdapter

    cfg = tmp_path / "family.yaml"
    cfg.write_text(TOY % TRAIN_TASKS)
    out = tmp_path / "out"
    out.mkdir()
    (out / "NOTES.md").write_text("mine\n")
    assert main(["train-tiny", "--config", str(cfg), "--out", str(out)]) == 0
    assert sorted(p.name for p in out.iterdir()) == ["NOTES.md", "toy-gla-h1", "toy-gla-h4",
                                                      "toy-softmax"]  # work folder removed
    logs = {n: json.loads((out / n / "train_log.json").read_text())
            for n in ("toy-gla-h4", "toy-gla-h1", "toy-softmax")}
    states = [logs[n]["state_bytes"] for n in ("toy-gla-h4", "toy-gla-h1")]
    assert states[1] >= 4 * states[0] and logs["toy-softmax"]["state_bytes"] is None
    for name, log in logs.items():
        assert [s["lr"] for s in log["sweep"]] == [0.001, 0.01]
        assert all(s["steps"] == 2 for s in log["sweep"]) and len(log["history"]) == 4
        assert log["lr"] == best_of(log["sweep"])["lr"]
        card = (out / name / "README.md").read_text()
        assert "## Learning-rate sweep" in card and "| 0.01 | 2 |" in card
        assert all(f"`{n}`" in card for n in logs)  # the family table
    gla = GLAAdapter(str(out / "toy-gla-h1"), name="g")
    soft = SoftmaxAdapter(out / "toy-softmax")
    assert gla.num_parameters() == logs["toy-gla-h1"]["params"]
    assert soft.num_parameters() == logs["toy-softmax"]["params"]
    assert gla.state_bytes_at(1) == logs["toy-gla-h1"]["state_bytes"]
    # a member's own depth and MLP width, in its checkpoint and in every card's family table
    shape = json.loads((out / "toy-softmax" / "config.json").read_text())
    assert (shape["num_hidden_layers"], shape["intermediate_size"]) == (2, 32)
    cards = {n: (out / n / "README.md").read_text() for n in ("toy-gla-h1", "toy-softmax")}
    assert "| `toy-softmax` | softmax | 2 | 32 | 2 |" in cards["toy-gla-h1"]
    assert "| `toy-gla-h1` | gla | 1 | 64 | 1 |" in cards["toy-softmax"]
    assert "| width / layers / MLP / heads | 32 / 2 / 32 / 2 |" in cards["toy-softmax"]


def test_full_length_sweep_keeps_its_best_run_without_retraining(tmp_path):
    """sweep.scale 1: every rate trains the full schedule and the best run is the model, so
    the family costs one run per rate; the runs not kept leave nothing behind."""
    cfg = tmp_path / "family.yaml"
    cfg.write_text((TOY % TRAIN_TASKS).replace("scale: 0.5", "scale: 1.0")
                   .replace("  - {name: toy-gla-h4, kind: gla, num_heads: 4, expand_k: 0.25}\n", "")
                   .replace("  - {name: toy-softmax, kind: softmax, num_heads: 2, num_layers: 2, "
                            "intermediate_size: 32}\n", ""))
    out = tmp_path / "out"
    assert main(["train-tiny", "--config", str(cfg), "--out", str(out)]) == 0
    assert [p.name for p in out.iterdir()] == ["toy-gla-h1"]
    log = json.loads((out / "toy-gla-h1" / "train_log.json").read_text())
    assert all(s["steps"] == 4 for s in log["sweep"]) and len(log["history"]) == 4
    kept = next(s for s in log["sweep"] if s["lr"] == log["lr"])
    assert log["lr"] == best_of(log["sweep"])["lr"]
    assert (kept["heldout_em"], kept["seconds"]) == (log["heldout_em"], log["seconds"])
    card = (out / "toy-gla-h1" / "README.md").read_text()
    assert "Each rate trained on the full schedule" in card and "kept, not retrained" in card


def test_best_of_prefers_exact_match_then_lower_loss():
    runs = [{"lr": 1e-3, "heldout_em": 0.5, "heldout_answer_loss": 0.9},
            {"lr": 3e-3, "heldout_em": 0.5, "heldout_answer_loss": 0.4},
            {"lr": 1e-2, "heldout_em": 0.25, "heldout_answer_loss": 0.1}]
    assert best_of(runs)["lr"] == 3e-3


def test_family_config_errors_name_the_key(tmp_path, capsys):
    cfg = tmp_path / "family.yaml"
    cfg.write_text((TOY % TRAIN_TASKS).replace("toy-gla-h1", "toy-gla-h4")
                   .replace("lrs: [0.001, 0.01]", "lrs: []"))
    assert main(["train-tiny", "--config", str(cfg), "--out", str(tmp_path / "o")]) == 2
    err = capsys.readouterr().err
    assert "'sweep.lrs'" in err and "duplicate" not in err  # field errors come first
    cfg.write_text((TOY % TRAIN_TASKS).replace("toy-gla-h1", "toy-gla-h4"))
    assert main(["train-tiny", "--config", str(cfg), "--out", str(tmp_path / "o")]) == 2
    assert "duplicate name(s) ['toy-gla-h4']" in capsys.readouterr().err
    assert not (tmp_path / "o").exists()


@pytest.mark.parametrize("config", ["configs/train_capacity.yaml"])
def test_shipped_family_recipe_meets_the_issue(config):
    """Issue 14: >= 4 GLAs whose states span >= 16x, a softmax twin, >= 3 learning rates,
    and the final trainings within the budget's step count of the shipped recipe."""
    from evalkit.cli.train import load_config
    from evalkit.training.family import FamilyConfig
    from evalkit.training.train import build_gla

    root = Path(__file__).resolve().parents[1]
    cfg = load_config(str(root / config))
    assert isinstance(cfg, FamilyConfig) and len(cfg.sweep.lrs) >= 3
    glas = [m for m in cfg.models if m.kind == "gla"]
    assert len(glas) >= 4 and sum(m.kind == "softmax" for m in cfg.models) == 1
    states = [build_gla(cfg, 2048, (0, 0, 0), num_heads=m.num_heads, expand_k=m.expand_k,
                        expand_v=m.expand_v)[1].state_bytes("float32") for m in glas]
    assert max(states) >= 16 * min(states)


def test_shipped_family_recipe_builds_every_stage(tiny_tokenizer):
    """Every (task, length, load) a stage can draw makes a sequence within seq_len, so the
    family's training cannot fail on its data after hours of sweeps."""
    from evalkit.taskspec import discover
    from evalkit.cli.train import load_config
    from evalkit.training.data import TRAIN_SEED_BASE, training_sequence

    cfg = load_config(str(Path(__file__).resolve().parents[1] / "configs" / "train_capacity.yaml"))
    reg = discover(cfg.include)
    longest = 0
    for st in cfg.stages:
        for task in st.tasks:
            for length in st.lengths:
                for load in {**cfg.loads, **st.loads}.get(task, (1,)):
                    seq = training_sequence(reg.get(task), tiny_tokenizer, length=length,
                                            depth=0.5, load=load, seed=TRAIN_SEED_BASE)
                    longest = max(longest, len(seq.ids))
    assert longest <= cfg.seq_len + 1


def test_a_diverged_rate_is_never_kept():
    runs = [{"lr": 1e-3, "heldout_em": 0.0, "heldout_answer_loss": 2.0, "diverged_at": None},
            {"lr": 1e-1, "heldout_em": 0.0, "heldout_answer_loss": None, "diverged_at": 7}]
    assert best_of(runs)["lr"] == 1e-3
