"""The gated delta-rule ops: the naive reference against the formula written out by hand,
and the chunked (WY / UT-transform) form against the naive one."""
from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from evalkit.model_adapters.gla.ops.gated_delta import chunk_gated_delta, naive_recurrent_gated_delta

B, H, K, V = 2, 3, 16, 24
TOL = dict(rtol=1e-4, atol=1e-4)


def inputs(T, seed=0, k_dim=K, v_dim=V, decay=3.0, beta=(-3.0, 3.0), dtype=torch.float32):
    """Normalised q, k (the caller's job in the real layer), log decay g <= 0 (larger `decay`
    is slower forgetting; logsigmoid(-40) ~ -40 is near-total forgetting each token), beta
    uniform in sigmoid(beta range), and a random initial state."""
    gen = torch.Generator().manual_seed(seed)
    q = F.normalize(torch.randn(B, T, H, k_dim, generator=gen), dim=-1)
    k = F.normalize(torch.randn(B, T, H, k_dim, generator=gen), dim=-1)
    v = torch.randn(B, T, H, v_dim, generator=gen)
    g = F.logsigmoid(torch.randn(B, T, H, generator=gen) + decay)
    lo, hi = beta
    b = torch.sigmoid(lo + (hi - lo) * torch.rand(B, T, H, generator=gen))
    s0 = torch.randn(B, H, k_dim, v_dim, generator=gen)
    return [x.to(dtype) for x in (q, k, v)] + [g, b], s0


def both(args, s0, **kw):
    """(naive, chunk) results, each (o, final_state), on the same arguments."""
    return [op(*args, initial_state=s0, output_final_state=True, **kw)
            for op in (naive_recurrent_gated_delta, chunk_gated_delta)]


def assert_same(got, want, **tol):
    torch.testing.assert_close(got[0], want[0], **(tol or TOL))
    torch.testing.assert_close(got[1], want[1], **(tol or TOL))


def test_reference_matches_the_formula_by_hand():
    # Column-vector convention of the paper, S as [V, K]; the op stores S^T as [K, V].
    k1, k2 = torch.tensor([0.6, 0.8]), torch.tensor([1.0, 0.0])
    v1, v2 = torch.tensor([1.0, -2.0]), torch.tensor([0.5, 3.0])
    q1, q2 = torch.tensor([0.0, 1.0]), torch.tensor([0.8, -0.6])
    a, b = torch.tensor([0.9, 0.5]), torch.tensor([0.7, 0.4])
    S0 = torch.tensor([[1.0, 2.0], [-1.0, 0.5]])
    eye, S, want = torch.eye(2), S0, []
    for kt, vt, qt, at, bt in zip((k1, k2), (v1, v2), (q1, q2), a, b):
        S = at * S @ (eye - bt * torch.outer(kt, kt)) + bt * torch.outer(vt, kt)
        want.append(S @ qt * 0.5)
    stack = lambda *xs: torch.stack(xs).view(1, 2, 1, 2)  # [B=1, T=2, H=1, 2]
    o, s = naive_recurrent_gated_delta(
        stack(q1, q2), stack(k1, k2), stack(v1, v2), a.log().view(1, 2, 1), b.view(1, 2, 1),
        scale=0.5, initial_state=S0.T.reshape(1, 1, 2, 2), output_final_state=True)
    torch.testing.assert_close(o[0, :, 0], torch.stack(want))
    torch.testing.assert_close(s[0, 0], S.T)


@pytest.mark.parametrize("op", [naive_recurrent_gated_delta, chunk_gated_delta])
def test_full_writes_store_and_overwrite_values(op):
    # b = 1, a = 1, orthonormal keys: reading at k_i returns v_i exactly; writing k_1 again
    # replaces its value (a delta rule) instead of adding to it.
    e = torch.eye(2)
    k = torch.stack([e[0], e[1], e[0]]).view(1, 3, 1, 2)
    v = torch.tensor([[1.0, 2.0], [3.0, -4.0], [7.0, 0.0]]).view(1, 3, 1, 2)
    ones = torch.ones(1, 3, 1)
    _, s = op(k, k, v, ones * 0, ones, scale=1.0, output_final_state=True)
    read = e @ s[0, 0]                          # q = e_i reads row i of the [K, V] state
    torch.testing.assert_close(read, torch.tensor([[7.0, 0.0], [3.0, -4.0]]))
    o, _ = op(k[:, :2], k[:, :2], v[:, :2], ones[:, :2] * 0, ones[:, :2], scale=1.0)
    torch.testing.assert_close(o[0, :, 0], v[0, :2, 0])  # o_t = S_t k_t = v_t


@pytest.mark.parametrize("T", [1, 5, 63, 64, 65, 200])
@pytest.mark.parametrize("with_state", [False, True])
def test_chunk_equals_naive(T, with_state):
    args, s0 = inputs(T, seed=T)
    naive, chunk = both(args, s0 if with_state else None)
    assert chunk[0].shape == (B, T, H, V) and chunk[1].shape == (B, H, K, V)
    assert_same(chunk, naive)


@pytest.mark.parametrize("case", [
    dict(decay=40.0),                 # g ~ 0: no decay at all
    dict(decay=-40.0),                # g ~ -40 per token: cumulative -2500 inside a chunk
    dict(beta=(-12.0, -9.0)),         # beta near 0: almost no writes
    dict(beta=(9.0, 12.0)),           # beta near 1: full overwrites
    dict(k_dim=32, v_dim=8),          # K != V, both ways
    dict(k_dim=8, v_dim=40),
])
def test_chunk_equals_naive_across_regimes(case):
    args, s0 = inputs(150, seed=7, **case)
    naive, chunk = both(args, s0)
    assert torch.isfinite(chunk[0]).all() and torch.isfinite(chunk[1]).all()
    assert_same(chunk, naive)


@pytest.mark.parametrize("chunk_size", [1, 7, 16, 128])
def test_chunk_size_is_configurable(chunk_size):
    args, s0 = inputs(100, seed=1)
    naive, chunk = both(args, s0)
    assert_same(chunk_gated_delta(*args, initial_state=s0, output_final_state=True,
                                  chunk_size=chunk_size), naive)


def test_empty_input_returns_the_initial_state():
    args, s0 = inputs(0, seed=2)
    for o, s in both(args, s0):
        assert o.shape == (B, 0, H, V)
        torch.testing.assert_close(s, s0)
    assert chunk_gated_delta(*args, output_final_state=True)[1].abs().sum() == 0


@pytest.mark.parametrize("op", [naive_recurrent_gated_delta, chunk_gated_delta])
def test_decoding_step_by_step_equals_one_forward(op):
    args, s0 = inputs(20, seed=3)
    o_all, s_all = chunk_gated_delta(*args, initial_state=s0, output_final_state=True)
    s, outs = s0, []
    for t in range(20):
        o, s = op(*(x[:, t:t + 1] for x in args), initial_state=s, output_final_state=True)
        outs.append(o)
    assert_same((torch.cat(outs, 1), s), (o_all, s_all))


def test_two_prefills_equal_one():
    args, s0 = inputs(300, seed=4)
    o_all, s_all = chunk_gated_delta(*args, initial_state=s0, output_final_state=True)
    o1, s1 = chunk_gated_delta(*(x[:, :170] for x in args), initial_state=s0, output_final_state=True)
    o2, s2 = chunk_gated_delta(*(x[:, 170:] for x in args), initial_state=s1, output_final_state=True)
    assert_same((torch.cat([o1, o2], 1), s2), (o_all, s_all))


def test_state_is_fp32_and_its_bytes_are_b_h_k_v_4():
    args, _ = inputs(10, seed=5, k_dim=8, v_dim=12, dtype=torch.bfloat16)
    for o, s in both(args, None):
        assert o.dtype == torch.bfloat16 and s.dtype == torch.float32
        assert s.numel() * s.element_size() == B * H * 8 * 12 * 4
    assert chunk_gated_delta(*args)[1] is None  # no final state unless asked


def test_scale_defaults_to_k_to_the_minus_half():
    args, s0 = inputs(30, seed=6)
    o_default, _ = chunk_gated_delta(*args, initial_state=s0)
    o_one, _ = chunk_gated_delta(*args, initial_state=s0, scale=1.0)
    torch.testing.assert_close(o_default, o_one * K ** -0.5, **TOL)


def test_chunk_gradients_match_naive():
    args, s0 = inputs(40, seed=8)
    leaves = [x.clone().requires_grad_() for x in args + [s0]]
    grads = []
    for op in (naive_recurrent_gated_delta, chunk_gated_delta):
        for x in leaves:
            x.grad = None
        kw = dict(chunk_size=16) if op is chunk_gated_delta else {}
        o, s = op(*leaves[:5], initial_state=leaves[5], output_final_state=True, **kw)
        (o.square().sum() + s.sum()).backward()
        grads.append([x.grad.clone() for x in leaves])
    for want, got in zip(*grads):
        assert torch.isfinite(got).all()
        torch.testing.assert_close(got, want, rtol=1e-3, atol=1e-3)


@pytest.mark.parametrize("op", [naive_recurrent_gated_delta, chunk_gated_delta])
@pytest.mark.parametrize("index, shape, name", [
    (0, (B, 4, H), "q"),
    (1, (B, 4, H, K + 1), "k"),
    (2, (B, 5, H, V), "v"),
    (3, (B, 4, H, 1), "g"),
    (4, (B, 4), "beta"),
    (5, (B, H, V, K), "initial_state"),
])
def test_wrong_shapes_are_named(op, index, shape, name):
    args, s0 = inputs(4, seed=9)
    args = args + [s0]
    args[index] = torch.zeros(shape)
    with pytest.raises(ValueError, match=rf"^{name} must have shape \["):
        op(*args[:5], initial_state=args[5])
