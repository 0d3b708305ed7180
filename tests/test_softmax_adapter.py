"""SoftmaxAdapter on tiny random Llama models built here: KV state, window (KV budget), limits.

`build_tiny_llama` is also used by tests/test_conformance.py.
"""
from __future__ import annotations

import hashlib
import os

os.environ.setdefault("HF_HUB_OFFLINE", "1")

import pytest
import torch

from evalkit.model_adapters.softmax import SoftmaxAdapter, describe_checkpoint, matched_window
from evalkit.model_adapters.weights import file_sha256
from evalkit.model_adapters.models import load_model
from evalkit.tokenization import encode

TEXT = ("the quick brown fox jumps over the lazy dog while a small bird sings in the old oak tree "
        "near the river and the farmer counts seven red apples before the sun goes down over the "
        "quiet hills where children play with a blue ball and an old man reads his paper").split()
CHAT_TEMPLATE = ("{% for m in messages %}<s> {{ m['role'] }} : {{ m['content'] }} </s> {% endfor %}"
                 "{% if add_generation_prompt %}<s> assistant : {% endif %}")


def build_tiny_llama(folder, *, layers: int = 2, max_positions: int = 256, seed: int = 0,
                     init: float = 0.2) -> str:
    """Save a random LlamaForCausalLM (safetensors) with a word-level tokenizer into `folder`.

    A large init scale makes the logits peaky, so greedy choices are stable under the tiny
    numerical differences between chunked and one-pass computation; greedy text never holds
    special tokens, so it re-encodes to the generated ids."""
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerFast

    words = ["<unk>", "<s>", "</s>", ":", "user", "assistant", "system"]
    words += sorted(set(TEXT) - set(words))
    words += [f"w{i}" for i in range(96 - len(words))]  # filler words: a 96-token vocabulary
    tk = Tokenizer(models.WordLevel({w: i for i, w in enumerate(words)}, unk_token="<unk>"))
    tk.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    tok = PreTrainedTokenizerFast(tokenizer_object=tk, bos_token="<s>", eos_token="</s>",
                                  unk_token="<unk>")
    tok.chat_template = CHAT_TEMPLATE
    cfg = LlamaConfig(vocab_size=len(words), hidden_size=64, intermediate_size=128,
                      num_hidden_layers=layers, num_attention_heads=4, num_key_value_heads=2,
                      head_dim=16, max_position_embeddings=max_positions, initializer_range=init,
                      bos_token_id=1, eos_token_id=2, pad_token_id=0, tie_word_embeddings=False)
    torch.manual_seed(seed)
    model = LlamaForCausalLM(cfg)
    with torch.no_grad():  # special tokens get logit 0: never the greedy choice (others reach >0)
        model.lm_head.weight[:3] = 0
    model.save_pretrained(str(folder))
    tok.save_pretrained(str(folder))
    return str(folder)


@pytest.fixture(scope="module")
def tiny_path(tmp_path_factory):
    return build_tiny_llama(tmp_path_factory.mktemp("tiny-llama"))


@pytest.fixture(scope="module")
def one_layer_path(tmp_path_factory):
    return build_tiny_llama(tmp_path_factory.mktemp("tiny-llama-1l"), layers=1, seed=1)


@pytest.fixture(scope="module")
def tiny(tiny_path):
    return SoftmaxAdapter(tiny_path, prefill_chunk=7)


def ids_of(adapter, n: int, offset: int = 0) -> list[int]:
    words = (TEXT * 8)[offset: offset + n]
    ids = encode(adapter.tokenizer, " ".join(words))
    assert len(ids) == n
    return ids


def reference_logits(adapter, ids, mask=None, positions=None) -> torch.Tensor:
    """One uncached HF forward: [len(ids), V] fp32."""
    kw = {}
    if mask is not None:
        kw["attention_mask"] = mask
    if positions is not None:
        kw["position_ids"] = torch.tensor([positions])
    with torch.inference_mode():
        return adapter.model(input_ids=torch.tensor([ids]), use_cache=False, **kw).logits[0].float()


# ----------------------------------------------------------------------------- full KV cache

def test_loads_through_registry_and_matches_plain_forward(tiny_path):
    a = load_model(f"hf:{tiny_path}", prefill_chunk=5)
    b = load_model(tiny_path)  # a bare folder path picks the hf loader (model_type llama)
    assert isinstance(a, SoftmaxAdapter) and isinstance(b, SoftmaxAdapter)
    assert a.state_kind == "kv" and a.window is None and a.max_length == 256
    ids = ids_of(a, 23)
    ref = reference_logits(a, ids)
    # chunked prefill (chunks of 5) and token-by-token extension both equal one plain forward
    torch.testing.assert_close(a.prefill(ids).logits, ref[-1], rtol=1e-4, atol=1e-4)
    s = a.prefill(ids[:1])
    for t in ids[1:]:
        s = a.extend(s, [t])
    torch.testing.assert_close(s.logits, ref[-1], rtol=1e-4, atol=1e-4)
    assert s.length == 23


def test_score_equals_plain_log_probs(tiny):
    ids = ids_of(tiny, 30)
    ref = torch.log_softmax(reference_logits(tiny, ids), -1)
    state = tiny.prefill(ids[:20])
    want = sum(ref[i - 1, ids[i]].item() for i in range(20, 30))
    got, first = tiny.score(state, [ids[20:], ids[20:21]])
    assert got == pytest.approx(want, abs=1e-3)
    assert first == pytest.approx(ref[19, ids[20]].item(), abs=1e-4)


@pytest.mark.parametrize("window", [None, 6])
def test_batched_scoring_matches_one_by_one(tiny_path, window):
    batched = SoftmaxAdapter(tiny_path, window=window, prefill_chunk=4)
    single = SoftmaxAdapter(tiny_path, window=window, prefill_chunk=4, score_batch=1)
    ids = ids_of(batched, 40)
    conts = [ids[20: 20 + n] for n in (1, 9, 2, 5, 3)] + [ids[3:10]]
    state = batched.prefill(ids[:20])
    got = batched.score(state, conts)
    assert got == pytest.approx(single.score(single.prefill(ids[:20]), conts), abs=1e-4)
    assert got == pytest.approx([batched.score(state, [c])[0] for c in conts], abs=1e-4)


def test_state_bytes_is_the_measured_kv_cache(tiny):
    s = tiny.prefill(ids_of(tiny, 17))
    # 2 layers x (K and V) x 2 kv heads x 16 head dim x 4 bytes per token
    per_token = 2 * 2 * 2 * 16 * 4
    assert tiny.kv_bytes_per_token == per_token
    assert tiny.state_bytes(s) == 17 * per_token == tiny.state_bytes_at(17)
    assert tiny.state_bytes(s) == sum(t.untyped_storage().nbytes() for t in tiny.state_tensors(s))
    assert tiny.state_bytes_at(8192) == 8192 * per_token


def test_fork_copies_memory_and_generate_leaves_state_alone(tiny):
    s = tiny.prefill(ids_of(tiny, 12))
    f = tiny.fork(s)
    ptrs = {t.data_ptr() for t in tiny.state_tensors(s)}
    assert ptrs.isdisjoint(t.data_ptr() for t in tiny.state_tensors(f))
    before = [t.clone() for t in tiny.state_tensors(s)]
    tiny.generate(s, 10)
    tiny.score(s, [ids_of(tiny, 6, offset=3)])
    after = tiny.state_tensors(s)
    assert len(before) == len(after) and all(torch.equal(x, y) for x, y in zip(before, after))
    assert s.length == 12


def test_max_length_is_never_exceeded_silently(tiny_path):
    a = SoftmaxAdapter(tiny_path, max_length=20)
    ids = ids_of(a, 21)
    with pytest.raises(ValueError, match="max_length 20"):
        a.prefill(ids)
    s = a.prefill(ids[:20])
    assert len(a.generate(a.fork(s), 1).split()) == 1  # the 21st token needs no forward
    with pytest.raises(ValueError, match="max_length"):
        a.generate(s, 2)
    with pytest.raises(ValueError, match="max_length"):
        a.score(s, [ids[:2]])
    assert len(a.score(s, [ids[:1]])) == 1
    with pytest.raises(ValueError, match="max_length"):
        a.extend(a.prefill(ids[:19]), ids[:2])


def test_bad_inputs_raise_clearly(tiny_path, tiny):
    with pytest.raises(ValueError, match="at least one token"):
        tiny.prefill([])
    with pytest.raises(ValueError, match="outside the vocabulary"):
        tiny.prefill([1, 10_000])
    with pytest.raises(ValueError, match="empty continuation"):
        tiny.score(tiny.prefill([1, 5]), [[]])
    with pytest.raises(ValueError, match="either window or kv_budget_bytes"):
        SoftmaxAdapter(tiny_path, window=4, kv_budget_bytes=10_000)
    with pytest.raises(ValueError, match="sink"):
        SoftmaxAdapter(tiny_path, window=4, sink=4)
    with pytest.raises(ValueError, match="less than one token"):
        SoftmaxAdapter(tiny_path, kv_budget_bytes=100)
    with pytest.raises(ValueError, match="dtype"):
        SoftmaxAdapter(tiny_path, dtype="int8")
    with pytest.raises(FileNotFoundError, match="does not exist"):
        SoftmaxAdapter(tiny_path + "-missing")
    with pytest.raises(ValueError, match="needs a path"):
        load_model("hf")


def test_generate_stops_at_eos_and_stop_strings(tiny):
    s = tiny.prefill(ids_of(tiny, 9))
    full = tiny.generate(s, 12)
    words = full.split()
    assert len(words) == 12  # no special tokens in greedy text (see build_tiny_llama)
    stop = words[5]
    cut = tiny.generate(s, 12, stop=[stop])
    assert cut == full[: full.find(stop)]
    # eos: force it by making eos the top logit of a forked state
    f = tiny.fork(s)
    f.logits[2] = f.logits.max() + 10
    assert tiny.generate(f, 5) == ""


def test_identity_hashes_the_weights(tiny):
    ident = tiny.identity()
    path = os.path.join(tiny.path, "model.safetensors")
    assert ident["weights_hash"] == hashlib.sha256(open(path, "rb").read()).hexdigest()
    assert ident["weights_hash"] == file_sha256(path)
    assert ident["dtype"] == "fp32" and ident["window"] is None and ident["device"] == "cpu"


def test_bf16_option(tiny_path):
    a = SoftmaxAdapter(tiny_path, dtype="bf16")
    s = a.prefill([1, 5, 6, 7])
    assert a.identity()["dtype"] == "bf16" and s.logits.dtype == torch.float32
    assert a.state_bytes(s) == 4 * 2 * 2 * 2 * 16 * 2  # bf16: 2 bytes per element
    assert a.state_bytes_at(8192) == 8192 * 2 * 2 * 2 * 16 * 2


def test_describe_checkpoint_matches_the_loaded_model(tiny_path, tiny):
    d = describe_checkpoint(tiny_path, n_tokens=8192)
    assert d["parameters"] == tiny.num_parameters()
    assert d["state_bytes"] == tiny.state_bytes_at(8192)
    assert d["state_kind"] == "kv" and d["max_length"] == 256
    w = describe_checkpoint(tiny_path, window=10, n_tokens=8192)
    assert w["state_bytes"] == 10 * tiny.kv_bytes_per_token and w["state_kind"] == "kv-window"


# ----------------------------------------------------------------------------- KV budget window

def window_mask_reference(n: int, window: int, sink: int) -> torch.Tensor:
    """[1, 1, n, n] bool mask written out position by position (independent of the adapter)."""
    m = torch.zeros(n, n, dtype=torch.bool)
    for q in range(n):
        for k in range(q + 1):
            m[q, k] = k < sink or k >= q - (window - sink)
    return m[None, None]


@pytest.mark.parametrize("window,sink,chunk", [(6, 0, 4), (6, 2, 5), (9, 3, 1), (5, 0, 64)])
def test_window_equals_sliding_window_attention(tiny_path, window, sink, chunk):
    a = SoftmaxAdapter(tiny_path, window=window, sink=sink, prefill_chunk=chunk)
    assert a.state_kind == "kv-window" and f"window={window}" in a.name
    ids = ids_of(a, 31)
    ref = reference_logits(a, ids, mask=window_mask_reference(len(ids), window, sink))
    for t in (3, window, window + 1, 17, 30):
        torch.testing.assert_close(a.prefill(ids[: t + 1]).logits, ref[t], rtol=1e-4, atol=1e-4)
    # split at an arbitrary point and extended token by token: same logits, capped bytes
    s = a.prefill(ids[:11])
    for t in ids[11:]:
        s = a.extend(s, [t])
        assert a.state_bytes(s) <= window * a.kv_bytes_per_token
    torch.testing.assert_close(s.logits, ref[-1], rtol=1e-4, atol=1e-4)
    assert a.state_bytes(s) == window * a.kv_bytes_per_token == a.state_bytes_at(31)
    # scoring runs on through the window too
    got = a.score(a.prefill(ids[:20]), [ids[20:]])[0]
    lp = torch.log_softmax(ref, -1)
    assert got == pytest.approx(sum(lp[i - 1, ids[i]].item() for i in range(20, 31)), abs=1e-3)


def test_one_layer_window_sees_only_the_last_tokens(one_layer_path):
    """With one layer, a window of W is exactly the model run on the W+1 last tokens at their
    absolute positions: everything older is gone."""
    w = 6
    a = SoftmaxAdapter(one_layer_path, window=w, prefill_chunk=4)
    ids = ids_of(a, 40)
    for t in (w + 1, 20, 39):
        kept = list(range(t - w, t + 1))
        ref = reference_logits(a, [ids[i] for i in kept], positions=kept)[-1]
        torch.testing.assert_close(a.prefill(ids[: t + 1]).logits, ref, rtol=1e-4, atol=1e-4)
    sinks = SoftmaxAdapter(one_layer_path, window=w, sink=2, prefill_chunk=3)
    kept = [0, 1] + list(range(39 - (w - 2), 40))
    # an explicit causal mask: HF would read the jump in position ids as two packed sequences
    causal = torch.ones(len(kept), len(kept), dtype=torch.bool).tril()[None, None]
    ref = reference_logits(a, [ids[i] for i in kept], mask=causal, positions=kept)[-1]
    torch.testing.assert_close(sinks.prefill(ids).logits, ref, rtol=1e-4, atol=1e-4)


def test_window_really_forgets(tiny_path):
    """Changing a token older than layers x window leaves the windowed model's output exactly
    unchanged, while the full-cache model does see it."""
    w, layers = 5, 2
    win = SoftmaxAdapter(tiny_path, window=w, prefill_chunk=8)
    full = SoftmaxAdapter(tiny_path)
    ids = ids_of(win, 40)
    far = list(ids)
    far[39 - layers * w - 1] = (far[39 - layers * w - 1] + 1) % 90 + 3
    near = list(ids)
    near[37] = (near[37] + 1) % 90 + 3
    base = win.prefill(ids).logits
    torch.testing.assert_close(win.prefill(far).logits, base, rtol=0, atol=1e-6)
    assert (win.prefill(near).logits - base).abs().max() > 1e-3
    assert (full.prefill(far).logits - full.prefill(ids).logits).abs().max() > 1e-3


def test_kv_budget_bytes_gives_the_matched_window(tiny_path, tiny):
    per = tiny.kv_bytes_per_token
    assert matched_window(10 * per + per - 1, per) == 10
    a = SoftmaxAdapter(tiny_path, kv_budget_bytes=10 * per + per - 1)
    assert a.window == 10 and a.state_bytes_at(100) == 10 * per <= a.kv_budget_bytes
    s = a.prefill(ids_of(a, 50))
    assert a.state_bytes(s) == 10 * per
    assert a.identity()["window"] == 10 and a.identity()["kv_budget_bytes"] == 10 * per + per - 1
