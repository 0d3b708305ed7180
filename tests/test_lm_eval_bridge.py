"""evalkit models as lm-eval models: the LM protocol methods against the adapter and lm-eval's hf.

Two real models: the oracle reference adapter (exact, unbounded state) and a tiny random
Llama saved to a temporary folder, loaded both through evalkit ("hf:PATH") and through
lm-eval's own `hf` model, so every number is checked against lm-eval's implementation.
"""
import math

import pytest
import torch
from lm_eval.api.instance import Instance
from lm_eval.api.registry import get_model

from evalkit.lm_eval.bridge import EvalkitLM, prefix_groups
from helpers import TINY_TOKENIZER

MAX_LEN = 64  # the tiny Llama's max_position_embeddings: small, so rolling needs windows


def req(kind, *args):
    return Instance(kind, {}, tuple(args), 0)


@pytest.fixture(scope="module")
def tiny_llama(tmp_path_factory):
    """A random 2-layer Llama with the shared tiny tokenizer, saved as a local HF folder."""
    from transformers import LlamaConfig, LlamaForCausalLM

    from evalkit.tokenization import load_tokenizer

    tok = load_tokenizer(TINY_TOKENIZER)
    torch.manual_seed(0)
    cfg = LlamaConfig(vocab_size=len(tok), hidden_size=32, intermediate_size=64,
                      num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
                      max_position_embeddings=MAX_LEN, bos_token_id=tok.bos_token_id,
                      eos_token_id=tok.eos_token_id, tie_word_embeddings=False)
    folder = tmp_path_factory.mktemp("tiny-llama")
    LlamaForCausalLM(cfg).save_pretrained(folder)
    tok.save_pretrained(folder)
    return folder


@pytest.fixture(scope="module")
def pair(tiny_llama):
    """(evalkit's bridge, lm-eval's hf) on the same tiny Llama, fp32 on cpu."""
    ours = EvalkitLM.create_from_arg_string(f"name=hf:{tiny_llama},dtype=fp32",
                                            {"device": "cpu", "batch_size": 1})
    theirs = get_model("hf").create_from_arg_obj(
        {"pretrained": str(tiny_llama), "dtype": "float32"}, {"device": "cpu", "batch_size": 1})
    return ours, theirs


@pytest.fixture(scope="module")
def oracle():
    # lm-eval's CLI always passes --device (default cuda:0); the oracle takes none: ignored
    return EvalkitLM.create_from_arg_string("name=oracle", {"device": "cuda:0", "batch_size": 4})


def test_registered_with_lm_eval_next_to_its_own_models():
    assert get_model("evalkit") is EvalkitLM
    # registering must not hide lm-eval's lazily listed models
    assert get_model("hf").__name__ == "HFLM"


def test_loglikelihood_is_the_adapters_score(oracle):
    tok, ad = oracle.tokenizer, oracle.adapter
    ctx = "The magic number for Oslo is 4821. The magic number for Oslo is"
    conts = [" 4821", " 9075"]
    out = oracle.loglikelihood([req("loglikelihood", ctx, c) for c in conts])
    ctx_ids = tok.encode(ctx)
    want = ad.score(ad.prefill(ctx_ids), [tok.encode(ctx + c)[len(ctx_ids):] for c in conts])
    assert [lp for lp, _ in out] == pytest.approx(want)
    assert [g for _, g in out] == [True, False]  # " 4821" is what the oracle would generate
    # empty context: conditioned on the prefix token (BOS, else EOS), as lm-eval's hf does
    (lp, _), = oracle.loglikelihood([req("loglikelihood", "", "hello world")])
    cont = tok.encode("hello world", add_special_tokens=False)
    assert lp == pytest.approx(ad.score(ad.prefill([oracle.prefix_token_id]), [cont])[0])


def test_one_prefill_per_context(oracle):
    calls = []
    real = oracle.adapter.prefill
    oracle.adapter.prefill = lambda ids: calls.append(len(ids)) or real(ids)
    try:
        reqs = [req("loglikelihood", ctx, c) for ctx in ("a b c a b", "x y z x y")
                for c in (" c", " z", " q")]
        oracle.loglikelihood(reqs)
    finally:
        del oracle.adapter.prefill
    assert len(calls) == 2  # six requests, two contexts
    # share_prefix groups distinct prompts by their common prefix
    groups = prefix_groups([(1, 2, 3, 4), (1, 2, 3, 5), (9, 9)], share_prefix=3)
    assert groups == [((1, 2, 3), [(1, 2, 3, 4), (1, 2, 3, 5)]), ((9, 9), [(9, 9)])]


def test_shared_prefix_forks_give_the_same_numbers(oracle):
    reqs = [req("loglikelihood", f"k1 v1 k2 v2 k3 v3 k{i} v{i} k{i}", f" v{i}") for i in (1, 2, 3)]
    base = oracle.loglikelihood(reqs)
    oracle.share_prefix = 4
    try:
        assert oracle.loglikelihood(reqs) == base
    finally:
        oracle.share_prefix = 0


def test_rolling_streams_whole_text_when_there_is_no_window(oracle):
    assert oracle.max_length is None
    text = "one two three one two three four five one two three four five six"
    (total,) = oracle.loglikelihood_rolling([req("loglikelihood_rolling", text)])
    ad, ids = oracle.adapter, oracle.tok_encode(text)
    assert total == pytest.approx(ad.score(ad.prefill([oracle.prefix_token_id]), [ids])[0])
    assert oracle.loglikelihood_rolling([req("loglikelihood_rolling", "")]) == [0.0]


def test_matches_lm_evals_hf_model(pair):
    ours, theirs = pair
    ll = [req("loglikelihood", "Alice was beginning to get", " very tired"),
          req("loglikelihood", "Alice was beginning to get", " bored"),
          req("loglikelihood", "", "Alice was"),
          req("loglikelihood", "The Queen said ", "off with")]  # trailing space moves over
    for (a, _), (b, _) in zip(ours.loglikelihood(ll), theirs.loglikelihood(ll)):
        assert a == pytest.approx(b, abs=1e-4)
    # a text longer than the 64-token window: lm-eval's rolling windows, token for token
    text = " ".join(["Alice sat on the bank by her sister with nothing to do."] * 12)
    assert len(ours.tok_encode(text)) > 2 * MAX_LEN
    roll = [req("loglikelihood_rolling", text)]
    assert ours.loglikelihood_rolling(roll)[0] == pytest.approx(
        theirs.loglikelihood_rolling(roll)[0], rel=1e-5)
    gen = [req("generate_until", "Alice was beginning", {"until": ["\n"], "max_gen_toks": 12}),
           req("generate_until", "The Queen", {"until": ["the"], "max_gen_toks": 20,
                                               "do_sample": False})]
    assert ours.generate_until(gen) == theirs.generate_until(gen)


def test_generate_until_stops_and_budget(oracle):
    ctx = "one two three four five. one two three four five. one two"
    full, = oracle.generate_until([req("generate_until", ctx, {"until": [], "max_gen_toks": 20})])
    assert full.startswith(" three four five.")
    cut, = oracle.generate_until([req("generate_until", ctx,
                                      {"until": ["five"], "max_gen_toks": 20})])
    assert cut == full[: full.index("five")]
    short, = oracle.generate_until([req("generate_until", ctx, {"until": [], "max_gen_toks": 1})])
    assert len(oracle.tok_encode(short, add_special_tokens=False)) == 1 and full.startswith(short)
    with pytest.raises(ValueError, match="greedily"):
        oracle.generate_until([req("generate_until", ctx, {"do_sample": True, "temperature": 1.0})])


def test_never_truncates(pair):
    ours, _ = pair
    long_ctx = " ".join(["word"] * 3 * MAX_LEN)
    with pytest.raises(ValueError, match="never truncates"):
        ours.loglikelihood([req("loglikelihood", long_ctx, " word")])
    with pytest.raises(ValueError, match="max_gen_toks"):
        ours.generate_until([req("generate_until", "Alice", {"max_gen_toks": MAX_LEN})])


def test_clear_errors_and_provenance(oracle):
    with pytest.raises(ValueError, match="name="):
        EvalkitLM()
    with pytest.raises(KeyError, match="unknown model"):
        EvalkitLM(name="no-such-model")
    info = oracle.get_model_info()
    assert info["evalkit_model"] == "oracle" and info["evalkit_identity"]["name"] == "oracle"
    assert math.isfinite(oracle.loglikelihood([req("loglikelihood", "a", " b")])[0][0])


def test_library_modules_import_no_command_module():
    """The bridge is an lm-eval model over evalkit's adapters, export and run are libraries:
    none of them may import a command module (evalkit.cli, *_cmd)."""
    import ast

    from helpers import REPO

    for name in ("bridge", "export", "run", "hook"):
        path = REPO / "evalkit" / "lm_eval" / f"{name}.py"
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, (ast.Import, ast.ImportFrom)):
                mods = [a.name for a in node.names] if isinstance(node, ast.Import) else [
                    node.module or ""]
                bad = [m for m in mods if m == "evalkit.cli" or m.startswith("evalkit.cli.")
                       or m.endswith("_cmd") or m.endswith("_cmds")]
                assert not bad, f"{path.name}:{node.lineno} imports {bad}"
