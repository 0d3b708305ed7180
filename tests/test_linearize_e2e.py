"""Issue 40, item 3: `evalkit linearize`'s end-to-end stage (KL to the parent, LoRA on q/k/v/o
plus the twin's own parameters) and the twin folder's merged delta, on the toy parent of
test_linearize.py (SmolLM2-135M's real weights and tokenizer, first two layers) and Alice.

- the stage lowers the held-out KL; its sweep, run, curve and LoRA are in the log and the card;
  the folder stores the deltas of q/k/v/o (evalkit-twin/2) and loads to the built twin;
- a run killed in the stage resumes at its last save and ends with the same tensors;
- the time cap stops the stage and the card says so;
- the merged delta is alpha/r B A, a save/load round trip gives identical logits, and a delta
  the parent cannot take is refused naming the file and the tensor; /1 folders still load;
- bad end-to-end settings are refused naming the key.
"""
from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
import yaml
from safetensors.torch import load_file

from evalkit.cli import main
from evalkit.model_adapters.gla.from_llama import linearize, load_llama
from evalkit.model_adapters.gla.twin import TwinError, load_twin, parent_hash, save_twin
from evalkit.training import linearize_e2e as e2e
from evalkit.training.linearize import Recipe
from evalkit.training.linearize_family import linearize_family
from test_linearize import W, build, corpus_roots, parent_dir, recipe_dict  # noqa: F401

PROJ = ("q_proj", "k_proj", "v_proj", "o_proj")
GLA = {"name": "toy-gla-w16-s2", "window": W, "sinks": 2}
GDN = {"name": "toy-gdn-w16-s2", "window": W, "sinks": 2, "state": "gated_delta",
       "gate": "learned"}   # its own gate, as the shipped recipe's gated delta twin
E2E = {"seq_len": 256, "batch": 1, "steps": 6, "minutes": 10, "warmup": 1,
       "sweep": {"lrs": [0.001, 0.003], "steps": 2}, "heldout_sequences": 2, "every": 3}


def e2e_recipe(roots, twins=None, **e2e_over) -> dict:
    """Stage 1 kept short (one rate, 2 steps): the stage under test is the second."""
    d = recipe_dict(roots, steps=2, sweep=None, lr=0.01, end_to_end={**E2E, **e2e_over})
    d["twins"] = twins or [GLA, GDN, {"name": "toy-gla-attn1", "from_twin": GLA["name"],
                                      "keep_worst": 1},
                           {"name": "toy-swa-w16-s2", "window": W, "sinks": 2, "window_only": True}]
    return d


@pytest.fixture(scope="module")
def built(tmp_path_factory, parent_dir, corpus_roots):
    return build(tmp_path_factory, parent_dir, e2e_recipe(corpus_roots))


@pytest.mark.parametrize("name", [GLA["name"], GDN["name"]])
def test_stage_lowers_heldout_kl_and_is_recorded(built, name):
    out, _, _, lines = built
    log = json.loads((out / name / "train_log.json").read_text())
    assert log["sinks"] == 2 and log["state"] == ("gated_delta" if "gdn" in name else "gla")
    st = log["end_to_end"]
    assert [s["lr"] for s in st["sweep"]] == [0.001, 0.003] and st["lr"] in (0.001, 0.003)
    f = st["final"]
    assert f["step"] == 6 and f["tokens"] == 6 * 256 and f["stop"] == "planned steps"
    assert [h["step"] for h in f["heldout"]] == [0, 3, 6] and len(f["loss"]) == 6
    assert f["heldout"][-1]["kl"] < 0.95 * f["heldout"][0]["kl"], f["heldout"]
    # rank 8 on q, o [576, 576] and k, v [192, 576] of both layers
    assert st["lora_rank"] == 8
    assert st["lora_parameters"] == 2 * 8 * (2 * (576 + 576) + 2 * (576 + 192))
    assert st["peak_rss_mib"] > 100
    names = sorted(f"model.layers.{i}.attn.{p}.weight" for i in (0, 1) for p in PROJ)
    meta = json.loads((out / name / "twin.json").read_text())
    assert meta["format"] == "evalkit-twin/2" and meta["delta"] == names == log["delta"]
    stored = load_file(str(out / name / "twin.safetensors"))
    # stored factored (rank 8): delta = b @ a, b [out, 8], a [8, in]
    assert sorted(stored) == sorted(meta["trained"] + [f"delta.{n}.{f}" for n in names
                                                       for f in "ab"])
    assert all(stored[f"delta.{n}.a"].shape[0] == 8 == stored[f"delta.{n}.b"].shape[1]
               and (stored[f"delta.{n}.b"] @ stored[f"delta.{n}.a"]).abs().max() > 0
               for n in names)
    assert {p.name for p in (out / name).iterdir()} == {
        "config.json", "twin.json", "twin.safetensors", "README.md", "train_log.json", "loss.png"}
    card = (out / name / "README.md").read_text()
    assert "Then end to end" in card and "LoRA of rank 8" in card and "held-out KL" in card
    gate = "learned" if "gdn" in name else "key"   # the member's own gate reaches the twin
    assert json.loads((out / name / "config.json").read_text())["window_linear"]["gate"] == gate
    assert f"{gate} gate" in card
    assert any(".attn.g_proj." in t for t in meta["trained"]) == (gate == "learned")
    assert "the first 2 tokens (sinks) and the last 16" in card
    assert any(f"{name}: end-to-end sweep lr 0.003" in s for s in lines)


def test_derived_twin_drops_the_restored_layers_deltas(built, parent_dir):
    out = built[0]
    src = json.loads((out / GLA["name"] / "twin.json").read_text())["delta"]
    derived = json.loads((out / "toy-gla-attn1" / "train_log.json").read_text())
    kept = derived["kept_attention"][0]
    assert json.loads((out / "toy-gla-attn1" / "twin.json").read_text())["delta"] == [
        n for n in src if not n.startswith(f"model.layers.{kept}.")]
    card = (out / "toy-gla-attn1" / "README.md").read_text()
    assert "trained end to end with the source's" in card
    twin, _, _ = load_twin(out / "toy-gla-attn1")
    parent = load_llama(parent_dir)
    for p in PROJ:  # the restored layer is the parent's own attention
        name = f"model.layers.{kept}.attn.{p}.weight"
        assert torch.equal(twin.state_dict()[name], parent.state_dict()[name])


def kill_and_resume(recipe, parent_dir, folder, monkeypatch, name: str
                    ) -> tuple[dict, list[str]]:
    """Build `recipe` into `folder`, killed at its KL stage's 8th step (the sweep's 2 x 2, then
    the run's 4th), then again to the end: (the stage's progress.json at the kill, the second
    build's log lines)."""
    real, calls = e2e.kl_step, {"n": 0}

    def dies(*args):
        calls["n"] += 1
        if calls["n"] == 2 * 2 + 4:
            raise KeyboardInterrupt
        return real(*args)

    monkeypatch.setattr(e2e, "kl_step", dies)
    with pytest.raises(KeyboardInterrupt):
        linearize_family(recipe, f"hf:{parent_dir}", folder, log=lambda s: None)
    saved = json.loads((folder / f".{name}.tmp" / "progress.json").read_text())
    monkeypatch.setattr(e2e, "kl_step", real)
    lines: list[str] = []
    linearize_family(recipe, f"hf:{parent_dir}", folder, log=lines.append)
    return saved, lines


def test_killed_stage_resumes_to_the_same_tensors(built, parent_dir, corpus_roots, tmp_path,
                                                  monkeypatch):
    out = built[0]
    d = e2e_recipe(corpus_roots, twins=[GLA], save_every_minutes=1e-6)
    recipe = Recipe.model_validate(d)
    assert recipe.member_hash(recipe.twins[0]) == built[1].member_hash(built[1].twins[0])
    saved, lines = kill_and_resume(recipe, parent_dir, tmp_path, monkeypatch, GLA["name"])
    assert saved["end_to_end"]["final"]["step"] == 3 and len(saved["end_to_end"]["sweep"]) == 2
    assert any("resuming the end-to-end run at step 3" in s for s in lines)
    assert not any("sweep lr" in s for s in lines)
    a = load_file(str(tmp_path / GLA["name"] / "twin.safetensors"))
    b = load_file(str(out / GLA["name"] / "twin.safetensors"))
    assert a.keys() == b.keys() and all(torch.allclose(a[k], b[k], atol=1e-6) for k in a)


def test_time_cap_stops_the_stage_and_says_so(parent_dir, corpus_roots, tmp_path):
    d = e2e_recipe(corpus_roots, twins=[GLA], minutes=1e-4, sweep=None, lr=0.001, steps=50)
    linearize_family(Recipe.model_validate(d), f"hf:{parent_dir}", tmp_path, log=lambda s: None)
    folder = tmp_path / GLA["name"]
    f = json.loads((folder / "train_log.json").read_text())["end_to_end"]["final"]
    assert 1 <= f["step"] < 50 and f["stop"] == "time cap (0.0001 min)"
    assert f["heldout"][-1]["step"] == f["step"]
    assert "of 50 steps (time cap (0.0001 min))" in (folder / "README.md").read_text()


# ---------------------------------------------------------------------------------------
# The merged delta and the twin folder
# ---------------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def merged(parent_dir):
    """The toy parent's twin with a LoRA of random B (a trained one's shape), merged."""
    parent = load_llama(parent_dir)
    torch.manual_seed(0)
    twin = linearize(parent, window=W)
    lora = e2e.LoRA(twin, [0, 1], rank=8, alpha=16, seed=0)
    with torch.no_grad():
        for b in lora.B.values():
            b.normal_(0, 0.02)
    ids = torch.arange(100, 100 + 3 * W)[None]
    with torch.no_grad():
        hooked = twin(ids)
    return parent, twin, lora, lora.merge(), hooked, ids


def test_merged_delta_is_scale_b_a(merged):
    parent, twin, lora, delta, hooked, ids = merged
    assert sorted(delta) == sorted(lora.targets) and len(delta) == 8 and lora.scale == 2.0
    for n in delta:  # stored factored, (2 B, A); merged = W + (2 B) A, what the loader adds
        b, a = delta[n]
        assert torch.equal(b, 2.0 * lora.B[n].detach()) and torch.equal(a, lora.A[n].detach())
        assert torch.equal(b @ a, 2.0 * (lora.B[n] @ lora.A[n]).detach())  # 2: a power of two
        assert torch.equal(twin.state_dict()[n], parent.state_dict()[n] + b @ a)
    with torch.no_grad():
        assert (twin(ids) - hooked).abs().max() < 1e-4  # merged = the hooks' forward


def test_save_load_round_trip_with_delta(merged, tmp_path):
    parent, twin, _, delta, _, ids = merged
    names = sorted(n for n, _ in twin.named_parameters() if n not in parent.state_dict())
    save_twin(tmp_path, "t", twin, "hf:unused", parent_hash(parent), names, "r", delta)
    loaded, _, got = load_twin(tmp_path, parent)
    assert got["delta"] == sorted(delta)
    with torch.no_grad():
        assert torch.equal(loaded(ids), twin(ids))


def test_whole_and_factored_deltas_load_alike_and_half_a_factor_is_refused(merged, tmp_path):
    from safetensors.torch import load_file, save_file

    parent, twin, _, delta, _, ids = merged
    names = sorted(n for n, _ in twin.named_parameters() if n not in parent.state_dict())
    whole = {n: b @ a for n, (b, a) in delta.items()}
    (tmp_path / "w").mkdir()
    save_twin(tmp_path / "w", "t", twin, "hf:unused", parent_hash(parent), names, "r", whole)
    assert all(f"delta.{n}" in load_file(str(tmp_path / "w" / "twin.safetensors")) for n in whole)
    with torch.no_grad():
        assert torch.equal(load_twin(tmp_path / "w", parent)[0](ids), twin(ids))
    save_twin(tmp_path, "t", twin, "hf:unused", parent_hash(parent), names, "r", delta)
    stored = load_file(str(tmp_path / "twin.safetensors"))
    gone = f"delta.{sorted(delta)[0]}.a"
    del stored[gone]
    save_file(stored, str(tmp_path / "twin.safetensors"))
    with pytest.raises(TwinError, match=r"expected the tensor itself, or factors"):
        load_twin(tmp_path, parent)


@pytest.mark.parametrize("change, message", [
    ("missing", "delta delta.model.layers.7.attn.q_proj.weight: the parent has no tensor"),
    ("shape", "delta delta.model.layers.0.attn.q_proj.weight has shape (4, 576), the parent's"),
])
def test_bad_delta_refused(merged, tmp_path, change, message):
    parent, twin, _, delta, _, _ = merged
    names = sorted(n for n, _ in twin.named_parameters() if n not in parent.state_dict())
    bad = dict(delta)
    if change == "missing":
        bad["model.layers.7.attn.q_proj.weight"] = bad.pop("model.layers.0.attn.q_proj.weight")
    else:
        bad["model.layers.0.attn.q_proj.weight"] = torch.zeros(4, 576)
    save_twin(tmp_path, "t", twin, "hf:unused", parent_hash(parent), names, "r", bad)
    with pytest.raises(TwinError) as e:
        load_twin(tmp_path, parent)
    assert str(tmp_path / "twin.safetensors") in str(e.value) and message in str(e.value)


def test_format_1_reads_as_no_delta_and_unknown_keys_refused(merged, tmp_path):
    parent, twin, _, _, _, ids = merged
    names = sorted(n for n, _ in twin.named_parameters() if n not in parent.state_dict())
    save_twin(tmp_path, "t", twin, "hf:unused", parent_hash(parent), names, "r")
    meta = json.loads((tmp_path / "twin.json").read_text())
    del meta["delta"]
    (tmp_path / "twin.json").write_text(json.dumps({**meta, "format": "evalkit-twin/1"}))
    loaded, _, got = load_twin(tmp_path, parent)
    assert got["delta"] == [] and got["format"] == "evalkit-twin/2"
    (tmp_path / "twin.json").write_text(json.dumps({**meta, "format": "evalkit-twin/1",
                                                    "delta": [], "extra": 1}))
    with pytest.raises(TwinError, match="expected keys"):
        load_twin(tmp_path, parent)


@pytest.mark.parametrize("change, message", [
    ({"end_to_end": {**E2E, "lora_rank": 0}}, "key 'end_to_end.lora_rank'"),
    ({"end_to_end": {**E2E, "bogus": 1}}, "unknown key 'end_to_end.bogus'"),
    ({"end_to_end": {**E2E, "lr": 0.01}}, "give either lr or a sweep"),
    ({"end_to_end": {**E2E, "seq_len": 18}}, "toy-gla-w16-s2: end_to_end.seq_len 18 must be past"),
    ({"twins": [{"name": "x", "window": 8, "sinks": 65}]}, "key 'twins.0.sinks'"),
    ({"twins": [{"name": "x", "window": 8, "state": "lstm"}]}, "key 'twins.0.state'"),
    ({"twins": [{"name": "x", "window": 8, "window_only": True, "state": "gated_delta"}]},
     "a window-only reference keeps no attention layer and has no state"),
])
def test_bad_end_to_end_recipes_named(corpus_roots, tmp_path, capsys, change, message):
    path = tmp_path / "recipe.yaml"
    path.write_text(yaml.safe_dump({**e2e_recipe(corpus_roots), **change}))
    assert main(["linearize", "hf:/nowhere", "--recipe", str(path), "--out", str(tmp_path / "o")]) == 2
    err = capsys.readouterr().err
    assert str(path) in err and message in err


def test_shipped_recipe_is_issue_40s_family():
    from evalkit.yamlfile import read_typed

    r = read_typed(Path(__file__).resolve().parents[1] / "configs" / "linearize.yaml", Recipe,
                   "linearize recipe")
    assert [(m.name, m.kind, m.window, m.sinks, m.state) for m in r.twins] == [
        ("smollm2-135m-swa-w64-s4", "window_only", 64, 4, "gla"),
        ("smollm2-135m-gla-w64-s4", "trained", 64, 4, "gla"),
        ("smollm2-135m-gdn-w64-s4", "trained", 64, 4, "gated_delta"),
        ("smollm2-135m-gdn-w64-s4-recall", "recall", None, 0, "gla")]
    e = r.end_to_end
    assert e.seq_len >= 2048 and e.lora_rank == 8 and all(r.has_end_to_end(m) for m in r.twins[1:3])
    # both stateful twins learn their gate (the same gate: a gap between them compares states);
    # the reference, which has no state, keeps the recipe's (key) gate
    assert [r.gate_of(m) for m in r.twins[:3]] == ["key", "learned", "learned"]
    # the recall member: the gated delta twin, its copies past its window
    assert r.twins[3].from_twin == "smollm2-135m-gdn-w64-s4"
    assert r.recall.copies.min_distance >= 64 and r.recall.lora_rank == 8


def test_a_members_own_gate(corpus_roots):
    """A member's `gate` overrides the recipe's and reaches the twin; unset, it is left out of
    the member hash, so folders built before the field existed stay current."""
    from evalkit.training.linearize import Member

    base = e2e_recipe(corpus_roots)
    r = Recipe.model_validate(base)
    own = Recipe.model_validate({**base, "twins": [{**base["twins"][0], "gate": "learned"}]})
    same = Recipe.model_validate({**base, "twins": [{**base["twins"][0], "gate": r.gate}]})
    m, m_own = r.twins[0], own.twins[0]
    assert r.gate_of(m) == r.gate and own.gate_of(m_own) == "learned"
    assert "gate" not in json.dumps(m.model_dump(mode="json", exclude={"gate"}))
    assert r.member_hash(m) != own.member_hash(m_own) != same.member_hash(same.twins[0])
    assert r.member_hash(m) != same.member_hash(same.twins[0])  # set = hashed, even if equal
    with pytest.raises(ValueError, match="window-only reference"):
        Member(name="w", window=8, window_only=True, gate="learned")
