"""The MQAR twins' trainer end to end at toy sizes: sweep, best rate, final run, checkpoint and
card; a second call skips current members; a changed recipe retrains; bad input is named."""
import json

import pytest
import torch

from evalkit.cli.train_mqar import load_family
from evalkit.model_adapters.gla.adapter import GLAAdapter
from evalkit.tasks.mqar import mqar_batch
from evalkit.training.mqar import MQARFamily, best_rate, plan, query_loss, train_run
from evalkit.training.mqar_family import train_mqar_family

TOY = dict(train_mix=[{"length": 16, "load": 2, "count": 3}, {"length": 32, "load": 4, "batch": 8}],
           test_mix=[{"length": 16, "load": 2}, {"length": 32, "load": 8}], heldout=8, steps=6,
           sweep={"lrs": [0.003, 0.03], "steps": 3}, warmup=1, eval_every=3, jobs=1,
           models=[{"name": "toy-gla", "mixer": "gla", "d": 16},
                   {"name": "toy-attn", "mixer": "attn", "d": 16},
                   {"name": "toy-swa", "mixer": "swa", "d": 16, "window": 4, "lrs": [0.01]}])


def test_every_member_sees_the_same_batches():
    fam = MQARFamily.model_validate(TOY)
    assert plan(fam, 50) == plan(fam, 50)
    assert {(s.length, s.load) for s in plan(fam, 200)} == {(16, 2), (32, 4)}


def test_loss_reads_only_query_positions():
    fam = MQARFamily.model_validate(TOY)
    r = train_run(fam, fam.models[0], 0.01, 1)
    ids, t = mqar_batch(4, 32, 4, seed=5)
    x, y = torch.from_numpy(ids), torch.from_numpy(t)
    loss, pred = query_loss(r["model"], x, y)
    assert pred.shape == (16,)                       # 4 rows x 4 queries
    logits = r["model"](x)[y != -100]                # the full head, for comparison
    torch.testing.assert_close(loss, torch.nn.functional.cross_entropy(logits, y[y != -100]))


def test_toy_family_trains_resumes_and_cards(tmp_path, capsys):
    fam = MQARFamily.model_validate(TOY)
    out = tmp_path / "mqar"
    status = train_mqar_family(fam, out, config_path="toy.yaml", log=print)
    assert status == {"toy-gla": "trained", "toy-attn": "trained", "toy-swa": "trained"}
    for name, kind in (("toy-gla", "recurrent"), ("toy-attn", "kv"), ("toy-swa", "kv-window")):
        folder = out / name
        log = json.loads((folder / "train_log.json").read_text())
        card = (folder / "README.md").read_text()
        if name == "toy-swa":  # one rate given: nothing to sweep, and the card says so
            assert log["sweep"] == [] and log["lr"] == 0.01
            assert "No sweep: the recipe gives this member one rate (0.01)" in card
        else:
            assert log["lr"] == best_rate(log["sweep"])["lr"] and len(log["sweep"]) == 2
            assert "| lr | steps | held-out accuracy" in card
        assert f"| state kind | {kind} |" in card
        model = GLAAdapter(str(folder))
        assert model.state_kind == kind
        state = model.prefill(list(range(1, 20)))
        assert model.state_bytes(state) == sum(t.numel() * 4 for t in model.state_tensors(state))
        assert model.trained_length == 32
    before = {p: p.stat().st_mtime_ns for p in out.rglob("model.safetensors")}
    again = train_mqar_family(fam, out, log=print)
    assert set(again.values()) == {"current"}
    assert before == {p: p.stat().st_mtime_ns for p in out.rglob("model.safetensors")}
    # another recipe for one member: only that member is trained again
    changed = MQARFamily.model_validate({**TOY, "models": [*TOY["models"][:2],
                                                         {**TOY["models"][2], "lrs": [0.02]}]})
    assert train_mqar_family(changed, out, log=print)["toy-swa"] == "trained"
    assert before[out / "toy-gla" / "model.safetensors"] == \
        (out / "toy-gla" / "model.safetensors").stat().st_mtime_ns


def test_unknown_member_and_foreign_files_are_refused(tmp_path):
    fam = MQARFamily.model_validate(TOY)
    with pytest.raises(ValueError, match="no member 'toy-glaa'"):
        train_mqar_family(fam, tmp_path, only=["toy-glaa"])
    (tmp_path / "toy-gla").mkdir()
    (tmp_path / "toy-gla" / "notes.txt").write_text("mine")
    with pytest.raises(ValueError, match="notes.txt: not written by train-mqar; train-mqar never replaces"):
        train_mqar_family(fam, tmp_path, only=["toy-gla"])
    assert (tmp_path / "toy-gla" / "notes.txt").read_text() == "mine"


@pytest.mark.parametrize("patch,error", [
    ({"steps": 0}, "key 'steps': Input should be greater than or equal to 1"),
    ({"train_mix": [{"length": 16, "load": 5}]}, "length=16 cannot hold load=5"),
    ({"models": [{"name": "x", "mixer": "swa", "d": 16}]}, "window is set for mixer swa"),
    ({"models": [{"name": "x", "mixer": "gla", "d": 16, "heads": 2}]}, "key 'models.0.heads'"),
])
def test_bad_family_configs_name_the_key(tmp_path, patch, error):
    import yaml

    p = tmp_path / "fam.yaml"
    p.write_text(yaml.safe_dump({**TOY, **patch}))
    with pytest.raises(ValueError, match=error):
        load_family(str(p))


def test_the_shipped_family_config_loads():
    fam = load_family("configs/train_mqar.yaml")
    sizes = {m.name: m for m in fam.models}
    assert {"mqar-gla-d64", "mqar-attn-d64"} <= set(sizes)


def test_a_shipped_twin_is_described_as_it_loads():
    """`evalkit models` reads a twin's lengths from the config.json its adapter reads."""
    from evalkit.model_adapters.models import describe_model, load_model

    row, adapter = describe_model("mqar-gla-d32"), load_model("mqar-gla-d32")
    assert row["trained_length"] == adapter.trained_length == 256
    assert row["max_length"] == adapter.max_length
