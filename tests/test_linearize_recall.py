"""The recall stage of `evalkit linearize` (evalkit/training/linearize_recall.py) on the toy
parent: a trained gated delta twin trained further on prose with snippets copied past its
window; its record, card and stored delta; resume; the recipe's checks; the weighted KL."""
from __future__ import annotations

import json
import shutil

import pytest
import torch
from safetensors.torch import load_file

from evalkit.model_adapters.gla.twin import full_delta, load_twin
from evalkit.training import linearize_e2e as e2e
from evalkit.training.linearize import Recipe
from evalkit.training.linearize_recall import combined_delta
from test_linearize import W, build, corpus_roots, parent_dir  # noqa: F401
from test_linearize_e2e import GDN, e2e_recipe, kill_and_resume

RECALL = {"seq_len": 256, "batch": 1, "steps": 6, "minutes": 10, "warmup": 1,
          "sweep": {"lrs": [0.001, 0.003], "steps": 2}, "heldout_sequences": 2, "every": 3,
          "copies": {"spans": 2, "span_len": 8, "min_distance": W, "max_distance": 120}}
MEMBER = {"name": "toy-gdn-recall", "from_twin": GDN["name"], "recall": True}


SOURCE_E2E = {"sweep": None, "lr": 0.003}  # the source's end-to-end stage, one rate (test time)


def recall_recipe(roots, **over) -> dict:
    d = e2e_recipe(roots, twins=[GDN, MEMBER], **SOURCE_E2E)
    d["recall"] = {**RECALL, **over}
    return d


@pytest.fixture(scope="module")
def built(tmp_path_factory, parent_dir, corpus_roots):
    return build(tmp_path_factory, parent_dir, recall_recipe(corpus_roots))


def test_stage_is_recorded_and_lowers_its_loss(built):
    out, recipe, status, lines = built
    assert status == {GDN["name"]: "built", MEMBER["name"]: "built"}
    log = json.loads((out / MEMBER["name"] / "train_log.json").read_text())
    assert log["kind"] == "recall" and log["from_twin"] == GDN["name"]
    assert log["state"] == "gated_delta" and log["sinks"] == 2 and log["window"] == W
    rc = log["recall"]
    assert [s["lr"] for s in rc["sweep"]] == [0.001, 0.003] and rc["lr"] in (0.001, 0.003)
    f = rc["final"]
    assert f["step"] == 6 and f["tokens"] == 6 * 256 and f["stop"] == "planned steps"
    assert [h["step"] for h in f["heldout"]] == [0, 3, 6]
    assert f["heldout"][-1]["kl"] < f["heldout"][0]["kl"], f["heldout"]
    for point in f["heldout"] + [rc["state_off"]]:
        assert set(point) >= {"kl", "copy_kl", "prose_kl", "copy_top1"}
        assert 0 <= point["copy_top1"] <= 1 and point["copy_kl"] >= 0
    assert 0 <= rc["parent_copy_top1"] <= 1
    assert rc["heldout_copy_positions"] == 2 * 2 * 7
    assert any(f"{MEMBER['name']}: recall sweep lr 0.003" in s for s in lines)
    card = (out / MEMBER["name"] / "README.md").read_text()
    assert "trained further by the recall stage" in card and "top-1 at a copy" in card
    assert "learned gate" in card  # the source's gate, not the recipe's
    assert "this twin, state off" in card


def test_the_two_stages_loras_are_one_delta(built, parent_dir):
    out = built[0]
    src_meta = json.loads((out / GDN["name"] / "twin.json").read_text())
    meta = json.loads((out / MEMBER["name"] / "twin.json").read_text())
    assert meta["delta"] == src_meta["delta"] and meta["delta"]
    src = load_file(str(out / GDN["name"] / "twin.safetensors"))
    own = load_file(str(out / MEMBER["name"] / "twin.safetensors"))
    for n in meta["delta"]:
        b, a = own[f"delta.{n}.b"], own[f"delta.{n}.a"]
        assert b.shape[1] == 16 == a.shape[0]       # rank 8 + 8, side by side
        assert torch.equal(b[:, :8], src[f"delta.{n}.b"]) and torch.equal(a[:8], src[f"delta.{n}.a"])
    # the folder loads, and the stage changed what the twin predicts past its window
    twin, _, _ = load_twin(out / MEMBER["name"])
    source, _, _ = load_twin(out / GDN["name"])
    ids = torch.arange(3, 3 + 120)[None] % 200
    with torch.no_grad():
        a, b = twin(ids).float(), source(ids).float()
    assert (a[0, W + 2:] - b[0, W + 2:]).abs().max() > 1e-4


def test_adding_the_stage_leaves_the_other_members_current(corpus_roots):
    plain = Recipe.model_validate(e2e_recipe(corpus_roots, twins=[GDN], **SOURCE_E2E))
    with_recall = Recipe.model_validate(recall_recipe(corpus_roots))
    assert plain.member_hash(plain.twins[0]) == with_recall.member_hash(with_recall.twins[0])
    other = Recipe.model_validate(recall_recipe(corpus_roots, steps=7))
    assert other.member_hash(other.twins[1]) != with_recall.member_hash(with_recall.twins[1])
    assert other.member_hash(other.twins[0]) == with_recall.member_hash(with_recall.twins[0])


def test_killed_stage_resumes_to_the_same_tensors(built, parent_dir, corpus_roots, tmp_path,
                                                  monkeypatch):
    out = built[0]
    # the source, already built: copied so only the recall member trains here
    shutil.copytree(out / GDN["name"], tmp_path / GDN["name"])
    recipe = Recipe.model_validate({**recall_recipe(corpus_roots), "save_every_minutes": 1e-6,
                                    "recall": {**RECALL, "save_every_minutes": 1e-6}})
    saved, lines = kill_and_resume(recipe, parent_dir, tmp_path, monkeypatch, MEMBER["name"])
    assert saved["recall"]["final"]["step"] == 3 and len(saved["recall"]["sweep"]) == 2
    assert any(f"{GDN['name']}: current" in s for s in lines)
    assert any("resuming the recall run at step 3" in s for s in lines)
    a = load_file(str(tmp_path / MEMBER["name"] / "twin.safetensors"))
    b = load_file(str(out / MEMBER["name"] / "twin.safetensors"))
    assert a.keys() == b.keys() and all(torch.allclose(a[k], b[k], atol=1e-6) for k in a)


@pytest.mark.parametrize("change, message", [
    ({"recall": None}, "toy-gdn-recall: recall: true needs the recipe's `recall` stage"),
    ({"recall": {**RECALL, "copies": {**RECALL["copies"], "min_distance": W - 1}}},
     "recall.copies.min_distance 15 must be at least its window (16)"),
    ({"recall": {**RECALL, "seq_len": 128}},
     "recall: seq_len 128 is too short for 2 copies of 8 tokens up to 120 tokens back after 2 "
     "sinks (needs 138)"),
    ({"twins": [GDN, {**MEMBER, "keep_worst": 1}]}, "sets either keep_worst or recall: true"),
    ({"twins": [GDN, {"name": "x", "window": 8, "recall": True}]}, "x: recall needs from_twin"),
    ({"recall": {**RECALL, "copies": {**RECALL["copies"], "weight": 1}}}, "recall.copies.weight"),
])
def test_bad_recall_recipes_named(corpus_roots, change, message):
    d = {**recall_recipe(corpus_roots), **change}
    if d["recall"] is None:
        del d["recall"]
    with pytest.raises(ValueError, match=message.replace("(", r"\(").replace(")", r"\)")):
        Recipe.model_validate(d)


def test_weighted_kl_with_uniform_weights_is_the_mean():
    torch.manual_seed(0)
    head = torch.nn.Linear(8, 50, bias=False)
    ht, hp = torch.randn(2, 300, 8), torch.randn(2, 300, 8)
    mean = e2e.kl_sum(ht, hp, head) / 600
    assert e2e.kl_sum(ht, hp, head, weights=torch.full((2, 300), 1 / 600)) == pytest.approx(mean)
    one = torch.zeros(2, 300)
    one[1, 257] = 1.0   # a single position, in the second chunk
    with torch.no_grad():
        lp = torch.log_softmax(head(hp[1, 257]), -1)
        lq = torch.log_softmax(head(ht[1, 257]), -1)
        expect = float((lp.exp() * (lp - lq)).sum())
    assert e2e.kl_sum(ht, hp, head, weights=one) == pytest.approx(expect, rel=1e-5)


def test_combined_delta_adds_exactly():
    g = torch.Generator().manual_seed(0)
    f1 = (torch.randn(6, 2, generator=g), torch.randn(2, 5, generator=g))
    f2 = (torch.randn(6, 3, generator=g), torch.randn(3, 5, generator=g))
    full = torch.randn(6, 5, generator=g)
    out = combined_delta({"a": f1, "b": full, "c": f1}, {"a": f2, "b": f2, "d": full})
    assert out["a"][0].shape == (6, 5) and out["a"][1].shape == (5, 5)
    assert torch.allclose(full_delta(out["a"]), full_delta(f1) + full_delta(f2), atol=1e-6)
    assert torch.allclose(out["b"], full + full_delta(f2), atol=1e-6)
    assert out["c"] is f1 and out["d"] is full
