"""Issue 57, item 3: a bounded sparse cache for the twins (LoLA, arXiv 2505.23666), `sparse=N`.

- the op the model runs equals its token-by-token reference: outputs, state, cache and the
  token entering the state at every step;
- N = 0 is exactly the op without a cache; a cache that never fills leaves the state empty and
  is full causal attention;
- the tokens kept are the worst recalled: an independent replay (errors from the test's own
  formulas) picks the same token at every step;
- prefill, streamed prefill, decode and fork give one full forward's outputs with the option;
  sparse=0 is today's model bit for bit; state bytes count the cache and stop growing;
- the adapter: the option changes name and identity, bad values name the option.
"""
from __future__ import annotations

import json

import pytest
import torch
import torch.nn.functional as F
from helpers import TINY_TOKENIZER, assert_streams_like_one_forward
from test_twin_sinks import tiny_cfg, tiny_model

from evalkit.model_adapters.gla.ops.window_delta import naive_window_delta
from evalkit.model_adapters.gla.ops.window_linear import naive_window_linear, naive_window_softmax
from evalkit.model_adapters.gla.ops.window_sparse import chunk_window_sparse, naive_window_sparse
from evalkit.model_adapters.gla.sparse_cache import set_sparse, sparse_bytes
from evalkit.model_adapters.state_kind import StateBytes


@pytest.fixture(autouse=True)
def _no_grad():
    with torch.no_grad():
        yield


def op_inputs(kind, L, T, n0, n_stored, B=2, H=3, d=8, F_=6, seed=0, first=None):
    """Random op inputs: the pool is n0 cached tokens then k's L + T."""
    g = torch.Generator().manual_seed(seed)
    r = lambda *s: torch.randn(*s, generator=g)
    P = n0 + L + T
    first = 40 if first is None else first        # position of k[0]; cached tokens are older
    q, k, v = r(B, H, T, d), r(B, H, L + T, d), r(B, H, L + T, d)
    cache = (r(B, H, n0, d), r(B, H, n0, d), torch.rand(B, H, n0, generator=g) * 3,
             torch.stack([torch.randperm(first - 5, generator=g)[:n0] + 5
                          for _ in range(B * H)]).view(B, H, n0).float())
    if kind == "gla":
        fq, pf = r(B, H, T, F_).softmax(-1), r(B, H, P, F_).softmax(-1)
        pb, mix = None, torch.rand(H, generator=g) * 0.8 + 0.1
        S0 = torch.rand(B, H, F_, d + 1, generator=g) * (n0 + L > 0)
    else:
        fq, pf = F.normalize(r(B, H, T, d), dim=-1), F.normalize(r(B, H, P, d), dim=-1)
        pb, mix = torch.rand(B, H, P, generator=g), torch.rand(B, H, T, generator=g)
        S0 = r(B, H, d, d) * 0.3 * (n0 + L > 0)
    pu, log_a = r(B, H, P, d), -torch.rand(B, H, T, generator=g) * 0.3
    sk, sv = (r(B, H, n_stored, d), r(B, H, n_stored, d)) if n_stored else (None, None)
    return (kind, q, k, v, fq, pf, pu, pb, log_a, mix), S0, cache, first, sk, sv


# (L cached, T new, cached sparse tokens n0, n_sink in k, stored sinks, N)
CASES = [(0, 20, 0, 2, 0, 3), (0, 20, 0, 0, 0, 0), (4, 17, 2, 0, 2, 2), (5, 1, 3, 0, 2, 3),
         (5, 12, 3, 0, 0, 3), (0, 9, 0, 3, 0, 50)]


@pytest.mark.parametrize("kind", ["gla", "gated_delta"])
@pytest.mark.parametrize("L,T,n0,n_sink,n_stored,N", CASES)
def test_chunk_equals_reference_outputs_and_chosen_tokens(kind, L, T, n0, n_sink, n_stored, N):
    args, S0, cache, first, sk, sv = op_inputs(kind, L, T, n0, n_stored)
    sinks = {"n_sink": n_sink, "sink_k": sk, "sink_v": sv}
    o, S, new, ent = naive_window_sparse(*args, 5, S0, N, cache, first, **sinks)
    for c in (1, 4, 64):
        o2, S2, new2, ent2 = chunk_window_sparse(*args, 5, S0, N, cache, first, chunk_size=c,
                                                 **sinks)
        torch.testing.assert_close(o2, o, atol=1e-5, rtol=1e-5)
        torch.testing.assert_close(S2, S, atol=1e-5, rtol=1e-5)
        assert torch.equal(ent2, ent)                           # the same token, every step
        assert torch.equal(new2[3], new[3])                     # the same cached positions
        for a, b in zip(new2[:3], new[:3]):
            torch.testing.assert_close(a, b, atol=1e-5, rtol=1e-5)
    n_cand = sum(1 for t in range(T) if t + L - 5 >= max(n_sink, 0))
    assert new[0].shape[2] == min(N, n0 + n_cand)               # bounded by N
    assert int((ent[0, 0] >= 0).sum()) == max(0, n0 + n_cand - N)


@pytest.mark.parametrize("kind", ["gla", "gated_delta"])
def test_no_cache_is_the_op_without_one(kind):
    """N = 0: every leaving token enters the state at once, exactly as ops/window_linear and
    ops/window_delta do (same inputs, the leaving token's own key features)."""
    L, T, W, n_sink = 3, 19, 5, 2
    (_, q, k, v, fq, pf, pu, pb, log_a, mix), S0, cache, first, sk, sv = \
        op_inputs(kind, L, T, 0, 2)
    sinks = {"n_sink": n_sink, "sink_k": sk, "sink_v": sv}
    o, S, new, ent = chunk_window_sparse(kind, q, k, v, fq, pf, pu, pb, log_a, mix, W, S0, 0,
                                         cache, first, **sinks)
    idx = torch.arange(T) + L - W
    has = (idx >= n_sink)
    at = lambda t: torch.where(has.view(1, 1, T, *[1] * (t.dim() - 3)),
                               t[:, :, idx.clamp(min=0)], 0.0)
    if kind == "gla":
        want_o, want_S = naive_window_linear(q, k, v, fq, at(pf), at(pu), log_a, mix, W, S0,
                                             **sinks)
    else:
        want_o, want_S = naive_window_delta(q, k, v, fq, at(pf), at(pu), log_a, at(pb),
                                            mix * has, W, S0, **sinks)
    torch.testing.assert_close(o, want_o, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(S, want_S, atol=1e-5, rtol=1e-5)
    assert new[0].shape[2] == 0
    assert torch.equal(ent[0, 0] >= 0, has) and torch.equal(ent[:, :, has], (first + idx[has])
                                                           .expand(2, 3, -1))


@pytest.mark.parametrize("kind", ["gla", "gated_delta"])
def test_a_cache_that_never_fills_is_full_attention(kind):
    """From an empty state, with N at least every token that leaves the window, nothing enters
    the state: each query sees every earlier token exactly (causal softmax attention)."""
    T = 24
    (_, q, k, v, fq, pf, pu, pb, log_a, mix), S0, cache, first, _, _ = op_inputs(kind, 0, T, 0, 0)
    o, S, new, ent = chunk_window_sparse(kind, q, k, v, fq, pf, pu, pb, log_a, mix, 5, S0, T,
                                         cache, 0, n_sink=1)
    torch.testing.assert_close(o, naive_window_softmax(q, k, v, T), atol=1e-5, rtol=1e-5)
    assert not S.any() and bool((ent == -1).all())
    assert new[3][0, 0].tolist() == list(range(1, T - 5))   # every non-sink that left


def replay_errors(kind, args, window, S0, N, first):
    """The test's own replay: the state as the equations in the module docstrings write it,
    each leaving token's recall error, the N worst kept; returns the position entering at each
    step [B, H, T] and the final cache's positions and errors."""
    _, q, k, v, fq, pf, pu, pb, log_a, mix = args
    B, H, T, d = q.shape
    L = k.shape[2] - T
    entered = torch.full((B, H, T), -1)
    kept = {}
    for b in range(B):
        for h in range(H):
            S = S0[b, h].double()
            cache = []                                   # (error, position, pool index)
            for t in range(T):
                j, goes = t + L - window, None
                if j >= 0:
                    f, u = pf[b, h, j].double(), pu[b, h, j].double()
                    if kind == "gla":           # normalised read-out num / den
                        got = (f @ S[:, :d]) / (f @ S[:, d]) if (f @ S[:, d]) > 0 else 0 * u
                    else:                       # S^T kd
                        got = S.T @ f
                    err = float(torch.linalg.vector_norm(u - got))
                    cache.append((err, first + j, j))
                    if len(cache) > N:
                        goes = min(cache, key=lambda e: e[0])
                        cache.remove(goes)
                a = float(log_a[b, h, t].exp())
                if goes is None:
                    S = a * S
                    continue
                entered[b, h, t] = goes[1]
                f, u = pf[b, h, goes[2]].double(), pu[b, h, goes[2]].double()
                if kind == "gla":
                    S = a * S + torch.outer(f, torch.cat([u, u.new_ones(1)]))
                else:
                    beta = float(pb[b, h, goes[2]])
                    S = a * (S - beta * torch.outer(f, f @ S)) + beta * torch.outer(f, u)
            kept[b, h] = sorted((p, e) for e, p, _ in cache)
    return entered, kept


@pytest.mark.parametrize("kind", ["gla", "gated_delta"])
def test_the_cache_keeps_the_worst_recalled_tokens(kind):
    T, W, N = 40, 4, 5
    args, S0, cache, first, _, _ = op_inputs(kind, 0, T, 0, 0, seed=3)
    S0 = S0.clone()
    o, S, new, ent = chunk_window_sparse(*args, W, S0, N, cache, first)
    want, kept = replay_errors(kind, args, W, S0, N, first)
    assert torch.equal(ent, want)
    for (b, h), entries in kept.items():
        got = sorted(zip(new[3][b, h].long().tolist(), new[2][b, h].tolist()))
        assert [p for p, _ in got] == [p for p, _ in entries]
        assert [e for _, e in got] == pytest.approx([e for _, e in entries], rel=1e-4)
    # not trivial: some steps evict an older cache token, others send the newcomer on
    leaving = first + torch.arange(T) - W
    full = ent >= 0
    assert bool((ent[full] == leaving.expand_as(ent)[full]).any())
    assert bool((ent[full] != leaving.expand_as(ent)[full]).any())


# -- the model ---------------------------------------------------------------------------
TWINS = [("gla", {"gate": "learned"}), ("gated_delta", {"gate": "learned"}),
         ("gated_delta", {"gate": "key"})]


@pytest.mark.parametrize("kind,kw", TWINS)
@pytest.mark.parametrize("sinks", [0, 2])
def test_streamed_state_with_a_sparse_cache_equals_one_forward(kind, kw, sinks):
    m = tiny_model(tiny_cfg(kind, sinks=sinks, attn_layers=(1,), **kw))
    set_sparse(m, 3)
    # segments straddle the window (5), the sinks and the cache's filling (3 more tokens).
    # No token twice: against the empty state of the first layer a token's error is its
    # value's norm, so a repeated token ties with itself and float rounding (which differs
    # between one pass and a stream) would pick between equals
    ids = torch.stack([torch.randperm(64)[:26] for _ in range(2)])
    assert_streams_like_one_forward(m, ids, [(2, 1), (9, 4), (17, 3)])


@pytest.mark.parametrize("kind", ["gla", "gated_delta"])
def test_model_reference_equals_chunk_and_sparse_0_is_todays_model(kind):
    m = tiny_model(tiny_cfg(kind, sinks=1, attn_layers=(1,)))
    ids = torch.randint(0, 64, (2, 30))
    today = m(ids)
    last, state = m.prefill(ids)
    set_sparse(m, 0)
    assert torch.equal(m(ids), today)                                   # bit for bit
    last0, state0 = m.prefill(ids)
    assert torch.equal(last0, last)
    assert all(torch.equal(a, b) for a, b in zip(state0.tensors(), state.tensors()))
    set_sparse(m, 4)
    for block in m.model.layers:
        block.attn.chunk_size = 7
    got = m(ids)
    assert (got - today).abs().max() > 1e-3                             # the cache matters
    for block in m.model.layers:
        block.attn.mode = "naive"
    torch.testing.assert_close(m(ids), got, atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("kind", ["gla", "gated_delta"])
def test_state_bytes_count_the_cache_and_stop_growing(kind):
    cfg = tiny_cfg(kind, window=5, sinks=2, n_layers=2)          # twin layers only
    m = tiny_model(cfg)
    set_sparse(m, 3)
    sizes = []
    for n in (1, 7, 8, 9, 10, 11, 30):
        _, state = m.prefill(torch.randint(0, 64, (1, n)))
        want = cfg.state_parts(n) + StateBytes(window=sparse_bytes(cfg, 3, n))
        assert state.parts() == want and state.nbytes() == want.total, n
        sizes.append(state.nbytes())
    cache = state.layers[0].sparse
    assert [tuple(t.shape) for t in cache] == [(1, 4, 3, 8), (1, 4, 3, 8), (1, 4, 3), (1, 4, 3)]
    assert sparse_bytes(cfg, 3, 30) == 2 * 4 * 3 * (2 * 8 + 2) * 4     # 2 twin layers, fp32
    # window and sinks are full from 7 tokens; the cache grows by one token a step to 5 + 2 + 3
    assert sizes[1] < sizes[2] < sizes[3] < sizes[4] == sizes[5] == sizes[6]


# -- the adapter -------------------------------------------------------------------------
@pytest.fixture
def folders(tmp_path):
    from evalkit.tokenization import load_tokenizer
    V = len(load_tokenizer(TINY_TOKENIZER))
    for name, kind in (("twin", "gated_delta"), ("swa", "swa")):
        cfg = tiny_cfg(kind, sinks=1, n_layers=2).to_dict()
        cfg["vocab_size"] = V
        (tmp_path / name).mkdir()
        (tmp_path / name / "config.json").write_text(json.dumps(cfg))
    return tmp_path


def test_the_option_changes_name_and_identity_and_bad_values_name_it(folders):
    from evalkit.model_adapters.gla.adapter import GLAAdapter
    load = lambda name, **kw: GLAAdapter(str(folders / name), random_seed=0,
                                         tokenizer=TINY_TOKENIZER, **kw)
    plain, zero, sparse = load("twin"), load("twin", sparse=0), load("twin", sparse=4)
    assert zero.identity() == plain.identity() and "sparse" not in plain.identity()
    assert sparse.identity()["sparse"] == 4 and sparse.name == plain.name + "-sparse4"
    assert {k for k in sparse.identity() if sparse.identity()[k] != plain.identity().get(k)} \
        == {"sparse", "name"}
    ids = list(range(3, 40))
    assert torch.equal(zero.prefill(ids).last_logits, plain.prefill(ids).last_logits)
    seq = sparse.prefill(ids)
    assert sparse.state_bytes(seq) == sparse.state_bytes_at(len(ids)) \
        == plain.state_bytes_at(len(ids)) + sparse_bytes(sparse.config, 4, len(ids))
    for bad in (-1, 65537, "4", 2.0, True):
        with pytest.raises(ValueError, match=r"^.*: sparse must be an integer"):
            load("twin", sparse=bad)
    with pytest.raises(ValueError, match="sparse=4 needs window_linear layers"):
        load("swa", sparse=4)
    with pytest.raises(ValueError, match="sparse=4 needs the state"):
        load("twin", sparse=4, state_off=True)
