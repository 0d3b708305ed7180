"""Memory policies on a softmax model (model_adapters/softmax/policy.py): `window=W,sinks=S` for
any softmax model and `keep_heads=K` (the K best KV heads whole, the rest sinks + window).

On the embedded tiny softmax model (recall-softmax-tiny, trained here) and, for grouped-query
heads, a tiny random Llama (tests/test_softmax_adapter.py). The references are independent of
the policy code: the KV-budget window path (kv_cache.window_mask) for the all-bounded policy,
the parent for keep-all, and one fresh forward of the parent with a per-head 4-D mask for a
mixed policy.
"""
from __future__ import annotations

import json
import os
import random

os.environ.setdefault("HF_HUB_OFFLINE", "1")

import pytest
import torch

from evalkit.model_adapters.models import load_model
from evalkit.model_adapters.softmax import SoftmaxAdapter
from evalkit.model_adapters.softmax import policy as mem

TINY = "recall-softmax-tiny"
TOL = 1e-5  # log-probabilities at fp32


def _ids(n: int, seed: int = 0, vocab: int = 2000) -> list[int]:
    rng = random.Random(seed)
    return [rng.randrange(5, vocab) for _ in range(n)]


def _lp(state) -> torch.Tensor:
    return torch.log_softmax(state.logits, -1)


@pytest.fixture(scope="module")
def heads_json(tmp_path_factory):
    """A real `evalkit heads` record of the tiny model (5 selection probes)."""
    from evalkit.retrieval_heads import measure

    doc = measure(load_model(TINY), samples=1)
    path = tmp_path_factory.mktemp("heads") / "tiny.json"
    path.write_text(json.dumps(doc))
    return path, doc


@pytest.mark.parametrize("window,sinks,chunk", [(16, 2, 50), (8, 0, 50), (33, 4, 2048)])
def test_window_sinks_equals_the_kv_budget_path(window, sinks, chunk):
    """The twins' W + S attention = the budget window W + S - 1 with S sinks (other code);
    chunk 2048: a prefill's bounded heads in several query blocks (policy.BLOCK)."""
    pol = load_model(TINY, window=window, sinks=sinks, prefill_chunk=chunk)
    ref = load_model(TINY, window=window + sinks - 1, sink=sinks, prefill_chunk=chunk)
    ids = _ids(700)
    for n in (1, sinks + 1, window, window + sinks + 1, 130, 700):
        a, b = pol.prefill(ids[:n]), ref.prefill(ids[:n])
        assert (_lp(a) - _lp(b)).abs().max().item() < TOL, n
    s = pol.prefill(ids[:200])
    conts = [ids[200:210], ids[200:203], ids[205:206]]
    assert pol.score(s, conts) == pytest.approx(ref.score(ref.prefill(ids[:200]), conts), abs=1e-4)
    assert pol.generate(s, 12) == ref.generate(ref.prefill(ids[:200]), 12)


@pytest.mark.parametrize("options", [dict(window=16, sinks=2), dict(window=24, sinks=4, keep_heads=5)])
def test_fork_equals_fresh_prefill(options, heads_json):
    """Prefill once, fork, extend = one fresh prefill of the whole sequence (and forks do not
    disturb each other)."""
    if "keep_heads" in options:
        options = {**options, "heads": str(heads_json[0])}
    m = load_model(TINY, prefill_chunk=37, **options)
    ids = _ids(500, seed=1)
    base = m.prefill(ids[:300])
    f1 = m.extend(m.fork(base), ids[300:420])
    f2 = m.extend(m.fork(base), ids[300:500])
    for fork, n in ((f1, 420), (f2, 500)):
        fresh = m.prefill(ids[:n])
        assert (_lp(fork) - _lp(fresh)).abs().max().item() < TOL
        assert m.state_bytes(fork) == m.state_bytes(fresh) == m.state_bytes_at(n)
    again = m.extend(m.fork(base), ids[300:420])  # base untouched by the forks
    assert (_lp(again) - _lp(f1)).abs().max().item() < TOL


def test_keep_every_head_is_the_parent(heads_json):
    parent = load_model(TINY)
    n_kv = parent.model.config.num_key_value_heads * parent.model.config.num_hidden_layers
    whole = load_model(TINY, window=8, sinks=2, keep_heads=n_kv, heads=str(heads_json[0]),
                       prefill_chunk=64)
    ids = _ids(600, seed=2)
    a, b = whole.prefill(ids), parent.prefill(ids)
    assert (_lp(a) - _lp(b)).abs().max().item() < TOL
    assert whole.state_bytes(a) == parent.state_bytes(b)
    assert whole.state_kind == "kv"


def test_keep_none_is_the_bounded_policy(heads_json):
    none = load_model(TINY, window=16, sinks=2, keep_heads=0, heads=str(heads_json[0]))
    bounded = load_model(TINY, window=16, sinks=2)
    ids = _ids(300, seed=3)
    assert torch.equal(_lp(none.prefill(ids)), _lp(bounded.prefill(ids)))
    assert none.state_kind == bounded.state_kind == "kv-window"
    assert none.identity() != bounded.identity()  # keep_heads is part of the identity


def test_keep_heads_keeps_the_best_heads_and_counts_their_bytes(heads_json):
    path, doc = heads_json
    k, W, S = 3, 16, 2
    m = load_model(TINY, window=W, sinks=S, keep_heads=k, heads=str(path))
    best = sorted((l, h) for l, h, _ in doc["kv_ranking"][:k])
    ident = m.identity()
    assert sorted(map(tuple, ident["whole_heads"])) == best
    assert ident["keep_heads"] == k and ident["sinks"] == S and ident["window"] == W
    assert m.name == f"{TINY}[keep_heads={k},window={W},sinks={S}]"
    cfg = m.model.config
    n_kv, d = cfg.num_key_value_heads, cfg.head_dim
    head_token = 2 * d * 4  # K and V, fp32
    for n in (1, 10, 17, 18, 300, 700):
        s = m.prefill(_ids(n, seed=4))
        bounded = min(n, S + W - 1)
        expected = head_token * (k * n + (cfg.num_hidden_layers * n_kv - k) * bounded)
        assert m.state_bytes(s) == m.state_bytes_at(n) == expected, n
        parts = m.state_parts(s)
        assert parts.growing == head_token * k * n and parts.total == expected
    assert m.state_kind == "kv"


@pytest.mark.parametrize("chunk,block", [(9, 256), (2048, 16)])
def test_mixed_policy_equals_one_masked_parent_forward(tmp_path, monkeypatch, chunk, block):
    """Grouped-query heads: one KV head of two whole per layer. Reference: the parent's own
    sdpa path given a per-query-head 4-D mask, one forward, no cache tricks. Small chunks, or
    one chunk in many query blocks."""
    monkeypatch.setattr(mem, "BLOCK", block)
    from test_softmax_adapter import build_tiny_llama

    path = build_tiny_llama(tmp_path / "gqa", layers=2, max_positions=256, init=0.05)
    parent = SoftmaxAdapter(path)
    cfg = parent.model.config
    n_kv, groups = cfg.num_key_value_heads, cfg.num_attention_heads // cfg.num_key_value_heads
    W, S, full = 6, 2, ((1,), (0,))
    m = SoftmaxAdapter(path, window=W, sinks=S, prefill_chunk=chunk)
    m.policy = mem.MemoryPolicy(W, S, full, n_kv)  # the heads by hand (no needle task here)
    ids = _ids(80, seed=5, vocab=90)
    got = m.extend(m.prefill(ids[:31]), ids[31:])

    T = len(ids)
    qp, kp = torch.arange(T)[:, None], torch.arange(T)[None, :]
    causal = kp <= qp
    bounded = causal & ((kp < S) | (kp > qp - W))

    def layer_mask(layer_full):
        rows = [causal if h // groups in layer_full else bounded
                for h in range(cfg.num_attention_heads)]
        return torch.stack(rows)[None]

    # one mask per layer: run layer by layer through a hook on each attention module
    masks = [layer_mask(f) for f in full]
    hooks = [layer.self_attn.register_forward_pre_hook(
        lambda mod, args, kwargs, i=i: (args, {**kwargs, "attention_mask": masks[i]}),
        with_kwargs=True) for i, layer in enumerate(parent.model.model.layers)]
    try:
        with torch.inference_mode():
            ref = parent.model(input_ids=torch.tensor([ids])).logits[0, -1].float()
    finally:
        for h in hooks:
            h.remove()
    assert (torch.log_softmax(got.logits, -1) - torch.log_softmax(ref, -1)).abs().max() < TOL
    # and the policy matters: the parent's own answer differs
    assert (parent.prefill(ids).logits - got.logits).abs().max() > 1e-3


@pytest.mark.parametrize("options,words", [
    (dict(sinks=4), "need window"),
    (dict(window=16, sinks=2, sink=2), "one or the other"),
    (dict(window=16, sinks=2, kv_budget_bytes=100_000), "not both"),
    (dict(window=0, sinks=0), "window must be >= 1"),
    (dict(window=8, sinks=-1), "sinks must be >= 0"),
    (dict(heads="x.json"), "only meaningful with keep_heads"),
])
def test_bad_policy_options(options, words):
    with pytest.raises(ValueError, match=words):
        load_model(TINY, **options)


def test_bad_heads_files(tmp_path, heads_json):
    path, doc = heads_json
    with pytest.raises(FileNotFoundError, match="does not exist"):
        load_model(TINY, window=8, sinks=2, keep_heads=2, heads=str(tmp_path / "none.json"))
    too_many = doc["n_layers"] * doc["n_kv_heads"] + 1
    with pytest.raises(ValueError, match=f"keep_heads={too_many}"):
        load_model(TINY, window=8, sinks=2, keep_heads=too_many, heads=str(path))
    other = tmp_path / "other.json"
    other.write_text(json.dumps({**doc, "weights_hash": "0" * 64}))
    with pytest.raises(ValueError, match=r"other.json: field 'weights_hash'"):
        load_model(TINY, window=8, sinks=2, keep_heads=2, heads=str(other))
    edited = tmp_path / "edited.json"
    scores = [list(r) for r in doc["kv_scores"]]
    scores[0][0] = 5.0
    edited.write_text(json.dumps({**doc, "kv_scores": scores}))
    with pytest.raises(ValueError, match="kv_ranking"):
        load_model(TINY, window=8, sinks=2, keep_heads=2, heads=str(edited))
    broken = tmp_path / "broken.json"
    broken.write_text("{")
    with pytest.raises(ValueError, match="broken.json: not a readable JSON"):
        load_model(TINY, window=8, sinks=2, keep_heads=2, heads=str(broken))


def test_keep_heads_without_a_file_measures_and_records(heads_json):
    """No heads file: the heads are measured at load with the selection defaults, recorded."""
    m = load_model(TINY, window=8, sinks=2, keep_heads=2)
    rec = m.identity()["heads"]
    assert rec["source"] == "computed at load" and rec["selection"]["task"] == "needle"
    from evalkit.retrieval_heads import DEFAULTS
    assert rec["selection"]["samples"] == DEFAULTS["samples"]


def test_smollm2_window_sinks_is_the_twin_reference():
    """`smollm2-135m` with window=64,sinks=4 is the board's sink + window reference
    (smollm2-135m-swa-w64-s4, the GLA code's attention with sinks) on real text past the
    window: the same continuation log-probabilities and greedy text; its state holds the 67
    keys a next query reads (the twin stores 68)."""
    pol = load_model("smollm2-135m", window=64, sinks=4)
    twin = load_model("smollm2-135m-swa-w64-s4")
    text = ("Alice was beginning to get very tired of sitting by her sister on the bank, and of "
            "having nothing to do: once or twice she had peeped into the book her sister was "
            "reading, but it had no pictures or conversations in it, 'and what is the use of a "
            "book,' thought Alice 'without pictures or conversations?' ") * 4
    ids = pol.tokenizer(text)["input_ids"][:220]
    assert len(ids) == 220
    conts = [ids[200:201], ids[200:212]]
    a, b = pol.prefill(ids[:200]), twin.prefill(ids[:200])
    assert pol.score(a, conts) == pytest.approx(twin.score(b, conts), abs=1e-4)
    assert pol.generate(a, 12) == twin.generate(b, 12)
    per_token = pol.kv_bytes_per_token
    assert pol.state_bytes(a) == 67 * per_token and twin.state_bytes(b) == 68 * per_token


def test_keep_heads_scores_batched_as_one_by_one(heads_json):
    """Continuations scored as one batch on a shared policy cache = each alone."""
    opts = dict(window=16, sinks=2, keep_heads=4, heads=str(heads_json[0]))
    batched, single = load_model(TINY, **opts), load_model(TINY, score_batch=1, **opts)
    ids = _ids(400, seed=6)
    conts = [ids[300:330], ids[300:302], ids[310:311], ids[320:345]]
    a = batched.score(batched.prefill(ids[:300]), conts)
    b = single.score(single.prefill(ids[:300]), conts)
    assert a == pytest.approx(b, abs=1e-4)
    # and each equals its own fresh prefill's log-probabilities
    for c, got in zip(conts[:2], a):
        fresh = sum(torch.log_softmax(single.prefill(ids[:300] + c[:j]).logits, -1)[c[j]].item()
                    for j in range(len(c)))
        assert got == pytest.approx(fresh, abs=1e-3)
