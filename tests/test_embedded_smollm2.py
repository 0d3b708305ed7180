"""smollm2-135m: convert-once cache, facts `evalkit models` reports, a 2K-token needle, KV budget."""
from __future__ import annotations

import argparse
import contextlib
import io
import json
import os
import random

os.environ.setdefault("HF_HUB_OFFLINE", "1")

import pytest

from evalkit.model_adapters.smollm2 import (_MARKER, convert_gguf_once, converted_dir,
                                            smollm2_gguf_path)
from evalkit.model_adapters.softmax import SoftmaxAdapter, describe_checkpoint
from evalkit.model_adapters.weights import file_sha256
from evalkit.model_adapters.models import load_model
from evalkit.tokenization import encode

# SmolLM2-135M: 30 layers, 3 KV heads of 64 dims; fp32 K and V per token
KV_BYTES_PER_TOKEN = 2 * 30 * 3 * 64 * 4
PARAMETERS = 134_515_008
LAPLACE_STATE_BYTES = 29_491_200  # docs/DESIGN.md: the Laplace 3B recurrent state, bf16


@pytest.fixture(scope="session")
def smol():
    return load_model("smollm2-135m")


def needle_prompt(tokenizer, n_tokens: int = 2000, seed: int = 7) -> tuple[list[int], str]:
    """A chat prompt: ~n_tokens of varied filler sentences, a needle at 50% depth, a question."""
    rng = random.Random(seed)
    subjects = ["The old lighthouse keeper", "A young botanist", "The city council",
                "My neighbour's cat", "The museum guide", "A travelling musician", "The river ferry",
                "An amateur astronomer", "The village baker", "A retired sailor", "The school choir",
                "A quiet librarian"]
    verbs = ["repainted", "photographed", "argued about", "carefully measured", "wrote a poem about",
             "forgot", "sold", "repaired", "visited", "described"]
    objects = ["the wooden bridge", "a field of sunflowers", "the broken clock tower",
               "an abandoned greenhouse", "the northern harbour", "a box of old maps",
               "the winter market", "a copper kettle", "the hillside vineyard", "a stack of letters"]
    tails = ["before the rain started.", "on a Tuesday morning.", "while the tourists watched.",
             "for the third time that year.", "without telling anyone.",
             "during the long festival.", "after a heated debate.", "just before sunset."]
    sentences: list[str] = []
    while len(encode(tokenizer, " ".join(sentences))) < n_tokens:
        sentences.append(f"{rng.choice(subjects)} {rng.choice(verbs)} {rng.choice(objects)} "
                         f"{rng.choice(tails)}")
    sentences.insert(len(sentences) // 2, "The special magic number for Lisbon is 4821.")
    question = "What is the special magic number for Lisbon? Answer with the number only."
    text = tokenizer.apply_chat_template(
        [{"role": "user", "content": " ".join(sentences) + "\n\n" + question}],
        tokenize=False, add_generation_prompt=True)
    return encode(tokenizer, text), "4821"


def test_converted_once_and_reused(smol):
    gguf = smollm2_gguf_path()
    assert gguf.name == "SmolLM2-135M-Instruct.Q4_1.gguf"
    folder = converted_dir(gguf)
    marker = folder / _MARKER
    meta = json.loads(marker.read_text())
    assert meta["gguf_sha256"] == file_sha256(gguf) and folder.name == meta["gguf_sha256"][:16]
    assert (folder / "model.safetensors").is_file() and smol.path == str(folder)
    stamp = marker.stat().st_mtime_ns
    assert convert_gguf_once(gguf) == folder
    assert marker.stat().st_mtime_ns == stamp  # not converted again
    ident = smol.identity()
    assert ident["gguf_sha256"] == meta["gguf_sha256"]
    assert ident["weights_hash"] == file_sha256(folder / "model.safetensors")
    assert ident["name"] == "smollm2-135m" and ident["dtype"] == "fp32"


def test_facts(smol):
    assert smol.num_parameters() == PARAMETERS
    assert smol.kv_bytes_per_token == KV_BYTES_PER_TOKEN
    assert smol.state_bytes_at(8192) == 8192 * KV_BYTES_PER_TOKEN == 377_487_360
    assert smol.max_length == 8192 and smol.state_kind == "kv"
    assert smol.tokenizer.chat_template and "<|im_start|>" in smol.tokenizer.chat_template
    with pytest.raises(ValueError, match="takes no path"):
        load_model("smollm2-135m:/some/path")


def test_evalkit_models_lists_it_without_loading_weights(smol):
    from evalkit.cli import models as models_cmd

    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        rc = models_cmd.run(argparse.Namespace(json=True, tokens=8192, plugins=[]))
    rows = {r["name"]: r for r in json.loads(out.getvalue())}
    assert rc == 0, [r for r in rows.values() if "error" in r]
    row = rows["smollm2-135m"]
    assert (row["parameters"], row["state_kind"], row["state_bytes"]) == (PARAMETERS, "kv", 377_487_360)
    assert (rows["hf"]["kind"], rows["hf"]["note"]) == ("softmax", "path loader: hf:PATH")
    # before conversion `evalkit models` reads the GGUF header instead: same numbers
    d = describe_checkpoint(smollm2_gguf_path(), n_tokens=8192)
    assert (d["parameters"], d["state_bytes"], d["max_length"]) == (PARAMETERS, 377_487_360, 8192)


def test_answers_a_2k_token_needle(smol):
    ids, answer = needle_prompt(smol.tokenizer)
    assert 2000 <= len(ids) <= 2200
    state = smol.prefill(ids)
    assert smol.state_bytes(state) == len(ids) * KV_BYTES_PER_TOKEN
    out = smol.generate(state, 16)
    assert answer in out, f"SmolLM2 answered {out!r}"
    # the answer's tokens are also the model's preferred continuation among distractors
    cands = [encode(smol.tokenizer, v) for v in (answer, "4812", "1284", "4821.5")]
    scores = smol.score(state, cands)
    assert scores[0] == max(scores[:3])


def test_memory_matched_window_forgets_the_needle(smol):
    """The same weights with a 256-token KV budget lose a needle 1000 tokens back."""
    ids, answer = needle_prompt(smol.tokenizer)
    w = SoftmaxAdapter(smol.path, name="smollm2-135m", window=256)
    state = w.prefill(ids)
    assert w.state_bytes(state) == 256 * KV_BYTES_PER_TOKEN
    out = w.generate(state, 16)
    assert answer not in out, f"window 256 still answered {out!r}"


def test_kv_budget_matches_a_recurrent_state():
    m = load_model("smollm2-135m", kv_budget_bytes=LAPLACE_STATE_BYTES)
    assert m.window == LAPLACE_STATE_BYTES // KV_BYTES_PER_TOKEN == 640
    assert m.state_kind == "kv-window" and m.name == "smollm2-135m[window=640]"
    assert m.state_bytes_at(8192) == 640 * KV_BYTES_PER_TOKEN <= LAPLACE_STATE_BYTES
    assert m.identity()["kv_budget_bytes"] == LAPLACE_STATE_BYTES


@pytest.mark.slow
def test_gguf_file_loads_directly(smol):
    """A .gguf path goes through transformers' GGUF loader (dequantised on load: ~20 s) and
    gives the logits of the converted checkpoint."""
    import torch

    direct = load_model(str(smollm2_gguf_path()))
    assert isinstance(direct, SoftmaxAdapter) and direct.name == "SmolLM2-135M-Instruct.Q4_1"
    ids = encode(smol.tokenizer, "The capital of France is")
    assert encode(direct.tokenizer, "The capital of France is") == ids
    torch.testing.assert_close(direct.prefill(ids).logits, smol.prefill(ids).logits,
                               rtol=1e-5, atol=1e-5)
    assert direct.identity()["weights_hash"] == file_sha256(smollm2_gguf_path())
