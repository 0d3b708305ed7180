"""`evalkit heads` (evalkit/retrieval_heads.py): Wu et al.'s retrieval score per attention head
on the embedded tiny softmax model, checked against the model's own eager attention weights."""
from __future__ import annotations

import json
import os
import subprocess
import sys

os.environ.setdefault("HF_HUB_OFFLINE", "1")

import pytest
import torch

from evalkit.model_adapters.models import load_model
from evalkit.retrieval_heads import (HEADS_SEED_BASE, copy_probe, measure, selection_points)
from evalkit.taskspec import EVAL_SEED_MASK, discover, generate_probes, grid

TINY = "recall-softmax-tiny"


@pytest.fixture(scope="module")
def tiny():
    return load_model(TINY)


@pytest.fixture(scope="module")
def doc(tiny):
    return measure(tiny, samples=1)


def test_selection_probes_are_never_evaluation_probes(tiny):
    spec = discover().get("needle")
    points = selection_points(spec, [1024], [0.1, 0.5, 0.9], 3, seed=0)
    assert all(p.seed >= HEADS_SEED_BASE > EVAL_SEED_MASK for p in points)
    assert points == selection_points(spec, [1024], [0.1, 0.5, 0.9], 3, seed=0)  # pure
    assert len({p.seed for p in points}) == len(points)
    sel = {p.hash for p in generate_probes(spec, tiny.tokenizer, points)}
    ev = {p.hash for p in generate_probes(spec, tiny.tokenizer, grid(
        spec, lengths=[1024], depths=[0.1, 0.5, 0.9], samples=3, seed=0))}
    assert not sel & ev


def test_scores_equal_the_eager_attention_argmax(tiny, doc):
    """The recorded argmax = the argmax of the model's own eager attention weights (another
    attention implementation, output_attentions), counted the same way."""
    from transformers import AutoModelForCausalLM

    eager = AutoModelForCausalLM.from_pretrained(tiny.path, attn_implementation="eager",
                                                 local_files_only=True).eval()
    spec = discover().get("needle")
    sel = doc["selection"]
    points = selection_points(spec, sel["lengths"], sel["depths"], sel["samples"], sel["seed"])
    n_layers, n_heads = doc["n_layers"], doc["n_heads"]
    hits = torch.zeros(n_layers, n_heads, dtype=torch.long)
    steps = 0
    for probe in generate_probes(spec, tiny.tokenizer, points):
        cp = copy_probe(probe, tiny.tokenizer)
        with torch.inference_mode():
            att = eager(input_ids=torch.tensor([cp.ids]), output_attentions=True).attentions
        for pos, tok in cp.steps:
            steps += 1
            for layer in range(n_layers):
                top = att[layer][0, :, pos].argmax(-1)
                for h in range(n_heads):
                    p = int(top[h])
                    hits[layer, h] += int(p in cp.needle and cp.ids[p] == tok)
    assert steps == doc["copy_steps"] > 0
    assert hits.tolist() == doc["query_hits"]
    assert hits.sum() > 0  # some head copies: the score measures something on this model


def test_record_shape_and_ranking(doc):
    n_kv, groups = doc["n_kv_heads"], doc["n_heads"] // doc["n_kv_heads"]
    for q_row, kv_row in zip(doc["query_scores"], doc["kv_scores"]):
        assert all(0.0 <= s <= 1.0 for s in q_row)
        assert kv_row == [max(q_row[h * groups:(h + 1) * groups]) for h in range(n_kv)]
    ranked = [s for _, _, s in doc["kv_ranking"]]
    assert ranked == sorted(ranked, reverse=True)
    assert len(doc["kv_ranking"]) == doc["n_layers"] * n_kv
    assert doc["selection"]["probes"] == len(doc["probes"]) == 5


def test_measure_is_deterministic(tiny, doc):
    assert measure(tiny, samples=1)["query_hits"] == doc["query_hits"]


def test_cli_writes_json_and_heat_map_and_refuses_to_overwrite(tmp_path):
    out = tmp_path / "h" / "tiny.json"
    cmd = [sys.executable, "-m", "evalkit", "heads", TINY, "--samples", "1", "--depths", "0.5",
           "--output", str(out)]
    r = subprocess.run(cmd, capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr
    doc = json.loads(out.read_text())
    assert doc["format"] == "evalkit-heads/1" and doc["selection"]["probes"] == 1
    assert out.with_suffix(".png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert "query heads score > 0.1" in r.stdout
    before = out.read_bytes()
    again = subprocess.run(cmd, capture_output=True, text=True, timeout=300)
    assert again.returncode == 2 and "exists" in again.stderr and out.read_bytes() == before
    bad = subprocess.run(cmd[:-1] + [str(tmp_path / "x.txt")], capture_output=True, text=True,
                         timeout=300)
    assert bad.returncode == 2 and "expected a .json file name" in bad.stderr
    policy = subprocess.run(cmd[:-1] + [str(tmp_path / "p.json"), "--model-args",
                                        "window=8,sinks=2"], capture_output=True, text=True,
                            timeout=300)
    assert policy.returncode == 2 and "measure the whole model" in policy.stderr
    too_long = subprocess.run(cmd[:-1] + [str(tmp_path / "l.json"), "--lengths", "4096"],
                              capture_output=True, text=True, timeout=300)
    assert too_long.returncode == 2 and "max_length" in too_long.stderr
    assert not (tmp_path / "l.json").exists()
