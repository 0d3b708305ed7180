"""Issue 30, part 2: `evalkit linearize` on a toy parent (SmolLM2-135M's real weights and
tokenizer, cut to its first two layers) and a toy corpus (Alice, cut into documents).

- the family builds: a trained twin (sweep, then the final run), a derived twin (its worst
  layer back to full attention) and a window-only reference; each folder holds its config,
  twin.json, only the trained tensors, a card, a log and a plot, nothing else;
- a twin loads by path through the GLA adapter, equals its parent on prompts inside the
  window, and differs past it; a changed parent is refused by hash;
- a second run finds every member current; a run killed mid-training resumes at its last
  save and ends with the tensors of an uninterrupted run;
- bad recipes and foreign files are refused before any work.
"""
from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
import torch
import yaml
from safetensors.torch import load_file, save_file

from evalkit.cli import main
from evalkit.model_adapters.gla.twin import TwinError, load_twin
from evalkit.model_adapters.models import load_model
from evalkit.training import linearize as lin
from evalkit.training.linearize import Recipe
from evalkit.training.linearize_family import linearize_family

W = 16
ALICE = Path(__file__).resolve().parents[1] / "evalkit" / "probes" / "data" / "alice.txt"


@pytest.fixture(scope="module")
def parent_dir(tmp_path_factory) -> Path:
    """SmolLM2-135M's first two layers as a Llama folder (real weights and tokenizer)."""
    from evalkit.model_adapters.embedded import convert_gguf_once

    src = convert_gguf_once()
    out = tmp_path_factory.mktemp("parent")
    cfg = json.loads((src / "config.json").read_text())
    cfg["num_hidden_layers"] = 2
    (out / "config.json").write_text(json.dumps(cfg))
    sd = load_file(str(src / "model.safetensors"))
    keep = {k: v for k, v in sd.items() if not k.startswith("model.layers.")
            or int(k.split(".")[2]) < 2}
    save_file(keep, str(out / "model.safetensors"))
    for f in ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json"):
        if (src / f).is_file():
            shutil.copyfile(src / f, out / f)
    return out


@pytest.fixture(scope="module")
def corpus_roots(tmp_path_factory) -> list[Path]:
    """Alice in documents of 3,000 characters under two roots (real prose, two 'packages')."""
    base = tmp_path_factory.mktemp("corpus")
    text = ALICE.read_text(encoding="utf-8")
    roots = [base / "pkg-a" / "_sources", base / "pkg-b" / "_sources"]
    for i in range(0, 48):
        root = roots[i % 2]
        (root / f"part{i // 10}").mkdir(parents=True, exist_ok=True)
        (root / f"part{i // 10}" / f"doc{i:02d}.rst.txt").write_text(text[i * 3000:(i + 1) * 3000])
    (roots[0] / "binary.rst.txt").write_bytes(b"\xff\xfe not text")
    return roots


def recipe_dict(roots, **over) -> dict:
    d = {"corpus": {"roots": {f"pkg{i}": str(r) for i, r in enumerate(roots)},
                    "heldout_percent": 20},
         "seq_len": 128, "batch": 2, "steps": 6, "minutes": 10, "warmup": 1,
         "sweep": {"lrs": [0.003, 0.01], "steps": 2}, "threads": 2,
         "eval": {"transfer_sequences": 2, "every": 3, "perplexity_lengths": [64, 256],
                  "perplexity_documents": 2},
         "twins": [{"name": "toy-gla-w16", "window": W},
                   {"name": "toy-gla-w16-attn1", "from_twin": "toy-gla-w16", "keep_worst": 1},
                   {"name": "toy-swa-w16", "window": W, "window_only": True}]}
    d.update(over)
    return d


def build(tmp_path_factory, parent_dir, recipe: dict):
    """The family of `recipe` built in a fresh folder: (folder, Recipe, status, log lines)."""
    out = tmp_path_factory.mktemp("twins")
    r = Recipe.model_validate(recipe)
    lines: list[str] = []
    return out, r, linearize_family(r, f"hf:{parent_dir}", out, log=lines.append), lines


@pytest.fixture(scope="module")
def built(tmp_path_factory, parent_dir, corpus_roots):
    return build(tmp_path_factory, parent_dir, recipe_dict(corpus_roots))


def test_family_folders(built):
    out, recipe, status, lines = built
    assert status == {"toy-gla-w16": "built", "toy-gla-w16-attn1": "built", "toy-swa-w16": "built"}
    assert sorted(p.name for p in out.iterdir()) == sorted(status)  # no stage left behind
    base = {"config.json", "twin.json", "README.md", "train_log.json", "loss.png"}
    assert {p.name for p in (out / "toy-gla-w16").iterdir()} == base | {"twin.safetensors"}
    assert {p.name for p in (out / "toy-swa-w16").iterdir()} == base
    log = json.loads((out / "toy-gla-w16" / "train_log.json").read_text())
    assert [s["lr"] for s in log["sweep"]] == [0.003, 0.01] and log["lr"] in (0.003, 0.01)
    assert log["final"]["step"] == 6 and log["final"]["tokens"] == 6 * 2 * 128
    assert log["linearized_layers"] == [0, 1] and set(log["heldout_transfer"]) == {"0", "1"}
    assert log["corpus"]["skipped"] and "binary.rst.txt: not UTF-8" in log["corpus"]["skipped"][0]
    # the trained tensors alone: feature maps and mixes of both layers (the key gate has none)
    tensors = load_file(str(out / "toy-gla-w16" / "twin.safetensors"))
    assert sorted(tensors) == sorted(f"model.layers.{i}.attn.{n}" for i in (0, 1)
                                     for n in ("q_map", "k_map", "mix_logit"))
    assert not torch.equal(tensors["model.layers.0.attn.q_map"], torch.eye(64).repeat(9, 1, 1))
    # perplexity: equal to the parent's inside the window, the twin's own past it
    p = log["perplexity"]["256"]
    nll_t, nll_p = p["twin"]["nll_by_position"], p["parent"]["nll_by_position"]
    assert max(abs(a - b) for a, b in zip(nll_t[:W], nll_p[:W])) < 1e-3
    assert nll_t[W:] != nll_p[W:]
    # with its state off: the twin itself inside the window, its sinks and window alone past it
    off = p["state_off"]["nll_by_position"]
    assert max(abs(a - b) for a, b in zip(off[:W], nll_t[:W])) < 1e-3 and off[W:] != nll_t[W:]
    swa = json.loads((out / "toy-swa-w16" / "train_log.json").read_text())
    assert all("state_off" not in v for v in swa["perplexity"].values())  # it has no state
    # what the state holds, replayed on 2 held-out documents of the longest length (256)
    held = log["state_anatomy"]
    assert (held["tokens"], held["sequences"], held["distances"]) == (256, 2, [64, 128])
    assert sorted(held["layers"]) == ["0", "1"] and "state_anatomy" not in swa
    assert all(L["half_life"]["median"] > 0 and set(L["readout"]) == {"64", "128"}
               for L in held["layers"].values())
    derived = json.loads((out / "toy-gla-w16-attn1" / "train_log.json").read_text())
    worst = max(log["heldout_transfer"], key=lambda i: log["heldout_transfer"][i][1])
    assert derived["kept_attention"] == [int(worst)]
    assert derived["linearized_layers"] == [1 - int(worst)]
    card = (out / "toy-gla-w16" / "README.md").read_text()
    assert "toy-gla-w16" in card and "Held-out perplexity" in card and "nan" not in card.lower()
    assert "## What the state holds" in card and "| held at 128 |" in card
    assert "What the state holds" not in (out / "toy-swa-w16" / "README.md").read_text()


def test_twin_loads_and_equals_parent_inside_window(built, parent_dir):
    from evalkit.model_adapters.gla.from_llama import load_llama

    out = built[0]
    native = load_llama(parent_dir)

    def parent_last(ids):
        with torch.no_grad():
            return native(torch.tensor([ids]))[0, -1].float()

    for name in ("toy-gla-w16", "toy-gla-w16-attn1", "toy-swa-w16"):
        twin = load_model(str(out / name))
        ids = twin.tokenizer("Alice was beginning to get very tired of sitting by her sister on "
                             "the bank, and of having nothing to do: once or twice she had "
                             "peeped into the book her sister was reading",
                             add_special_tokens=False)["input_ids"]
        assert len(ids) > W + 8
        assert twin.identity()["parent_hash"] == json.loads(
            (out / name / "twin.json").read_text())["parent"]["hash"]
        assert twin.identity()["window"] == W  # what the board's distance plot marks
        inside = twin.prefill(ids[:W]).last_logits
        assert (inside - parent_last(ids[:W])).abs().max() < 1e-4
        past = twin.prefill(ids).last_logits
        assert (past - parent_last(ids)).abs().max() > 1e-3


def test_changed_parent_refused(built, parent_dir, tmp_path):
    out = built[0]
    other = tmp_path / "parent"
    shutil.copytree(parent_dir, other)
    sd = load_file(str(other / "model.safetensors"))
    sd["model.norm.weight"] = sd["model.norm.weight"] * 1.001
    save_file(sd, str(other / "model.safetensors"))
    twin = tmp_path / "twin"
    shutil.copytree(out / "toy-gla-w16", twin)
    meta = json.loads((twin / "twin.json").read_text())
    meta["parent"]["model"] = f"hf:{other}"
    (twin / "twin.json").write_text(json.dumps(meta))
    with pytest.raises(TwinError, match="now has weights hash .* trained on"):
        load_twin(twin)


def test_second_run_is_current(built, parent_dir):
    out, recipe, _, _ = built
    lines: list[str] = []
    assert linearize_family(recipe, f"hf:{parent_dir}", out, log=lines.append) == {
        n: "current" for n in ("toy-gla-w16", "toy-gla-w16-attn1", "toy-swa-w16")}


def flat(tree, key=""):
    """{"a/b": leaf} of a JSON tree (pytest.approx compares flat mappings only)."""
    if isinstance(tree, dict):
        return {k: v for name, sub in tree.items() for k, v in flat(sub, f"{key}/{name}").items()}
    if isinstance(tree, list):
        return {k: v for i, sub in enumerate(tree) for k, v in flat(sub, f"{key}/{i}").items()}
    return {key: tree}


def test_measures_added_to_a_current_twin(built, parent_dir, tmp_path):
    """A twin built before the state-off perplexity and the state's anatomy existed gets them
    on the next run: its log and card only, the weights untouched."""
    out, recipe, _, _ = built
    shutil.copytree(out / "toy-gla-w16", tmp_path / "toy-gla-w16")
    path = tmp_path / "toy-gla-w16" / "train_log.json"
    full = json.loads(path.read_text())
    old = json.loads(path.read_text())
    for v in old["perplexity"].values():
        del v["state_off"]
    del old["state_anatomy"]
    path.write_text(json.dumps(old))
    weights = (tmp_path / "toy-gla-w16" / "twin.safetensors").read_bytes()
    lines: list[str] = []
    only = Recipe.model_validate({**recipe.model_dump(mode="json"), "twins": [
        t for t in recipe.model_dump(mode="json")["twins"] if t["name"] == "toy-gla-w16"]})
    assert linearize_family(only, f"hf:{parent_dir}", tmp_path, log=lines.append) == {
        "toy-gla-w16": "current"}
    assert any("state-off perplexity and state anatomy added" in line for line in lines)
    again = json.loads(path.read_text())
    for L, v in again["perplexity"].items():
        assert v["state_off"]["ppl"] == pytest.approx(full["perplexity"][L]["state_off"]["ppl"],
                                                      rel=1e-6)
    assert (tmp_path / "toy-gla-w16" / "twin.safetensors").read_bytes() == weights
    assert flat(again["state_anatomy"]) == pytest.approx(flat(full["state_anatomy"]), rel=1e-6)
    assert "twin, state off" in (tmp_path / "toy-gla-w16" / "README.md").read_text()
    lines.clear()  # measured once: the next run only skips it
    linearize_family(only, f"hf:{parent_dir}", tmp_path, log=lines.append)
    assert not any("added" in line for line in lines)


def test_killed_run_resumes_to_the_same_tensors(built, parent_dir, corpus_roots, tmp_path,
                                                monkeypatch):
    out = built[0]
    d = recipe_dict(corpus_roots, save_every_minutes=1e-6, twins=[{"name": "toy-gla-w16", "window": W}])
    recipe = Recipe.model_validate(d)
    assert recipe.member_hash(recipe.twins[0]) == built[1].member_hash(built[1].twins[0])
    real, calls = lin.transfer_losses, {"n": 0}

    def dies(twin, io, backward):
        calls["n"] += backward
        if calls["n"] == 2 * 2 + 4:  # the sweep's 2 x 2 steps, then the 4th final step
            raise KeyboardInterrupt
        return real(twin, io, backward)

    monkeypatch.setattr(lin, "transfer_losses", dies)
    with pytest.raises(KeyboardInterrupt):
        linearize_family(recipe, f"hf:{parent_dir}", tmp_path, log=lambda s: None)
    saved = json.loads((tmp_path / ".toy-gla-w16.tmp" / "progress.json").read_text())
    assert saved["final"]["step"] == 3 and len(saved["sweep"]) == 2
    monkeypatch.setattr(lin, "transfer_losses", real)
    lines: list[str] = []
    linearize_family(recipe, f"hf:{parent_dir}", tmp_path, log=lines.append)
    assert any("resuming the final run at step 3" in s for s in lines)
    assert not any("sweep lr" in s for s in lines)
    a = load_file(str(tmp_path / "toy-gla-w16" / "twin.safetensors"))
    b = load_file(str(out / "toy-gla-w16" / "twin.safetensors"))
    assert a.keys() == b.keys() and all(torch.allclose(a[k], b[k], atol=1e-6) for k in a)


@pytest.mark.parametrize("change, message", [
    ({"lr": 0.01}, "give either lr or a sweep"),
    ({"twins": [{"name": "x", "from_twin": "y", "keep_worst": 1}]}, "must name a trained twin"),
    ({"twins": [{"name": "x"}]}, "set window"),
    ({"seq_len": 10 ** 6}, "seq_len"),
    ({"bogus": 1}, "unknown key 'bogus'"),
])
def test_bad_recipes_named(corpus_roots, tmp_path, capsys, change, message):
    path = tmp_path / "recipe.yaml"
    path.write_text(yaml.safe_dump(recipe_dict(corpus_roots, **change)))
    assert main(["linearize", "hf:/nowhere", "--recipe", str(path), "--out", str(tmp_path / "o")]) == 2
    err = capsys.readouterr().err
    assert str(path) in err and message in err


def test_foreign_file_and_missing_corpus_refused_first(corpus_roots, parent_dir, tmp_path, capsys):
    path = tmp_path / "recipe.yaml"
    path.write_text(yaml.safe_dump(recipe_dict(corpus_roots)))
    (tmp_path / "o" / "toy-gla-w16").mkdir(parents=True)
    (tmp_path / "o" / "toy-gla-w16" / "notes.txt").write_text("mine")
    assert main(["linearize", f"hf:{parent_dir}", "--recipe", str(path), "--out",
                 str(tmp_path / "o")]) == 2
    assert "notes.txt: not written by linearize" in capsys.readouterr().err
    path.write_text(yaml.safe_dump(recipe_dict([tmp_path / "no-docs"])))
    assert main(["linearize", f"hf:{parent_dir}", "--recipe", str(path), "--out",
                 str(tmp_path / "p")]) == 2
    assert "roots.pkg0: " in (err := capsys.readouterr().err) and "no-docs is not a folder" in err
    assert (tmp_path / "o" / "toy-gla-w16" / "notes.txt").read_text() == "mine"
