"""The GLA adapter on a random tiny fla-format checkpoint with its own tokenizer."""
from __future__ import annotations

import hashlib

import pytest
import torch

from evalkit.model_adapters.protocol import ModelAdapter
from evalkit.model_adapters.gla import GLAConfig
from evalkit.model_adapters.gla.buckets import counting_backend
from evalkit.model_adapters.models import ModelOptionError, load_model

from helpers import save_peaked_gla

TEXT = ["the cat sat on the mat and the dog sat on the log",
        "a fact: the capital of Portugal is Lisbon, the capital of Spain is Madrid",
        "numbers one two three four five six seven eight nine ten"] * 3


def build_tokenizer():
    from tokenizers import Tokenizer, models, pre_tokenizers, trainers, decoders
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.BPE(unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=300, special_tokens=["<unk>", "<s>", "</s>"],
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    tok.train_from_iterator(TEXT, trainer)
    return PreTrainedTokenizerFast(tokenizer_object=tok, unk_token="<unk>", bos_token="<s>",
                                   eos_token="</s>")


@pytest.fixture(scope="module")
def ckpt(tmp_path_factory):
    folder = tmp_path_factory.mktemp("gla-tiny")
    tok = build_tokenizer()
    tok.save_pretrained(folder)
    cfg = GLAConfig(vocab_size=len(tok), hidden_size=64, num_heads=2, num_hidden_layers=2,
                    use_short_conv=True, bos_token_id=tok.bos_token_id, eos_token_id=tok.eos_token_id)
    cfg.extra["evalkit_max_length"] = 512
    return save_peaked_gla(cfg, folder, 10)


@pytest.fixture(scope="module")
def model(ckpt):
    return load_model(f"gla:{ckpt}", chunk_size=16)


def ids(model, text):
    return model.tokenizer(text, add_special_tokens=False)["input_ids"]


def snapshot(state):
    return [t.clone() for t in state.state.tensors()] + [state.last_logits.clone()]


def unchanged(state, snap):
    return all(torch.equal(a, b) for a, b in zip(snapshot(state), snap))


def test_loads_by_name_path_and_alias(ckpt, model):
    assert isinstance(model, ModelAdapter)
    assert model.state_kind == "recurrent" and model.max_length == 512
    assert load_model(str(ckpt), max_length=64).max_length == 64  # a bare path: model_type gla
    lap = load_model(f"laplace:{ckpt}")
    assert lap.name.startswith("laplace:")
    ident = model.identity()
    assert ident["weights_hash"] == hashlib.sha256((ckpt / "model.safetensors").read_bytes()).hexdigest()
    assert ident["dtype"] == "fp32" and ident["device"] == "cpu" and len(ident["config_hash"]) == 64
    with pytest.raises(ValueError, match="needs a checkpoint folder"):
        load_model("gla")
    with pytest.raises(ModelOptionError, match=r"unknown option\(s\) colour \(accepted: .*chunk_size"):
        load_model(f"gla:{ckpt}", colour="red")


def test_prefill_extend_fork_and_state_bytes(model):
    a, b = ids(model, "the cat sat on the mat"), ids(model, " and the dog sat on the log")
    with pytest.raises(ValueError, match="at least one token"):
        model.prefill([])
    s = model.prefill(a)
    snap = snapshot(s)
    f = model.extend(model.fork(s), b)
    assert unchanged(s, snap)  # extending a fork leaves the original alone
    once = model.prefill(a + b)
    torch.testing.assert_close(f.last_logits, once.last_logits, rtol=1e-4, atol=1e-4)
    assert f.length == once.length == len(a + b)
    assert model.state_bytes(s) == model.config.state_bytes(torch.float32) == model.state_bytes_at(99)
    assert model.state_bytes(s) == sum(t.nbytes for t in model.state_tensors(s))


def test_score_matches_full_forward_and_keeps_state(model):
    ctx = ids(model, "a fact: the capital of Portugal is")
    conts = [ids(model, " Lisbon"), ids(model, " Madrid, the capital"), []]
    s = model.prefill(ctx)
    snap = snapshot(s)
    got = model.score(s, conts)
    assert unchanged(s, snap)
    with torch.no_grad():
        for cont, score in zip(conts[:2], got):
            logits = model.model(torch.tensor([ctx + cont]))[0]
            lp = torch.log_softmax(logits[len(ctx) - 1:-1], -1)
            want = lp.gather(-1, torch.tensor(cont)[:, None]).sum().item()
            assert score == pytest.approx(want, abs=1e-3)
    assert got[2] == 0.0


def test_generate_is_greedy_stops_and_keeps_state(model):
    s = model.prefill(ids(model, "numbers one two"))
    snap = snapshot(s)
    text = model.generate(s, 12)
    assert unchanged(s, snap)
    # The same greedy continuation by hand from full forwards.
    seq, out = ids(model, "numbers one two"), []
    with torch.no_grad():
        for _ in range(12):
            tok = int(model.model(torch.tensor([seq]))[0, -1].argmax())
            if tok == model.tokenizer.eos_token_id:
                break
            out.append(tok)
            seq.append(tok)
    assert text == model.tokenizer.decode(out)
    assert len(text) > 2
    stop = text[len(text) // 2:len(text) // 2 + 2]
    cut = model.generate(s, 12, stop=[stop])
    assert cut == text[:text.find(stop)]
    assert model.generate(s, 0) == ""


def test_prefill_batch_equals_single(model):
    batch = [ids(model, t) for t in ("the cat", "a fact: the capital of Spain is Madrid", "ten")]
    states = model.prefill_batch(batch)
    for st, p in zip(states, batch):
        one = model.prefill(p)
        torch.testing.assert_close(st.last_logits, one.last_logits, rtol=1e-5, atol=1e-5)
        for x, y in zip(st.state.tensors(), one.state.tensors()):
            torch.testing.assert_close(x, y, rtol=1e-5, atol=1e-5)


def test_compiled_and_bf16_backends(ckpt, model):
    backend = counting_backend()
    comp = load_model(f"gla:{ckpt}", chunk_size=16, compile=True, compile_backend=backend,
                      length_buckets=(16, 32), batch_buckets=(1,))
    p = ids(model, "the cat sat on the mat and the dog")
    s_c, s_e = comp.prefill(p), model.prefill(p)
    torch.testing.assert_close(s_c.last_logits, s_e.last_logits, rtol=1e-5, atol=1e-5)
    assert comp.generate(s_c, 3) == model.generate(s_e, 3)
    assert backend.count == 2  # one prefill bucket, one decode width
    assert comp.identity()["backend"] == "cpu-compiled"
    half = load_model(f"gla:{ckpt}", dtype="bf16", chunk_size=16)
    s_h = half.prefill(p)
    assert all(t.dtype == torch.float32 for t in s_h.state.tensors())
    assert half.identity()["dtype"] == "bf16"
    assert (s_h.last_logits - s_e.last_logits).abs().max() < 0.05 * s_e.last_logits.abs().max()


def test_neuron_without_sdk_is_a_clear_error(ckpt):
    try:
        import torch_neuronx  # noqa: F401
        pytest.skip("torch-neuronx is installed")
    except ImportError:
        pass
    with pytest.raises(ValueError, match="needs torch-neuronx"):
        load_model(f"gla:{ckpt}", device="neuron")
