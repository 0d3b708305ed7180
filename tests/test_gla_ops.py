"""The three GLA operator forms agree: chunked and single-step against the naive recurrence."""
from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from evalkit.model_adapters.gla.ops.gla import chunk as chunk_module
from evalkit.model_adapters.gla.ops.gla import chunk_gla, fused_recurrent_gla, naive_recurrent_gla

B, H, K, V = 2, 2, 16, 32


def inputs(T, seed=0, gate_scale=3.0, dtype=torch.float32):
    g = torch.Generator().manual_seed(seed)
    q, k = torch.randn(B, T, H, K, generator=g), torch.randn(B, T, H, K, generator=g)
    v = torch.randn(B, T, H, V, generator=g)
    gk = F.logsigmoid(torch.randn(B, T, H, K, generator=g) * gate_scale) / 16
    s0 = torch.randn(B, H, K, V, generator=g)
    return [x.to(dtype) for x in (q, k, v, gk)], s0


@pytest.fixture(params=["one-matmul", "log-space"])
def scores_path(request, monkeypatch):
    """Run a test through each way chunk_gla forms in-chunk scores (see chunk.py)."""
    if request.param == "log-space":
        monkeypatch.setattr(chunk_module, "FAST_SPAN", -1.0)
    return request.param


def test_test_gates_take_the_one_matmul_path():
    # The default inputs must really exercise the fast path: span per 128-chunk <= FAST_SPAN.
    (_, _, _, g), _ = inputs(1000, seed=1000)
    span = -g[:, :896].unflatten(1, (7, 128)).sum(2).min()
    assert 5 < span <= chunk_module.FAST_SPAN


@pytest.mark.parametrize("T", [1, 127, 128, 129, 1000])
@pytest.mark.parametrize("with_state", [False, True])
def test_chunk_equals_naive(T, with_state, scores_path):
    (q, k, v, g), s0 = inputs(T, seed=T)
    init = s0 if with_state else None
    o_ref, s_ref = naive_recurrent_gla(q, k, v, g, init, output_final_state=True)
    o, s = chunk_gla(q, k, v, g, init, output_final_state=True)
    assert o.shape == (B, T, H, V) and s.shape == (B, H, K, V) and s.dtype == torch.float32
    torch.testing.assert_close(o, o_ref, rtol=1e-4, atol=1e-4)
    torch.testing.assert_close(s, s_ref, rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("chunk_size", [16, 48, 64, 256])
def test_chunk_size_is_configurable(chunk_size, scores_path):
    (q, k, v, g), s0 = inputs(200, seed=1)
    o_ref, s_ref = naive_recurrent_gla(q, k, v, g, s0, True)
    o, s = chunk_gla(q, k, v, g, s0, True, chunk_size=chunk_size)
    torch.testing.assert_close(o, o_ref, rtol=1e-4, atol=1e-4)
    torch.testing.assert_close(s, s_ref, rtol=1e-4, atol=1e-4)


def test_chunk_is_stable_under_strong_decay():
    # Gates near logsigmoid(-40): cumulative log decay of thousands inside one chunk.
    (q, k, v, _), s0 = inputs(300, seed=2)
    g = F.logsigmoid(torch.randn(B, 300, H, K) * 40)
    o_ref, s_ref = naive_recurrent_gla(q, k, v, g, s0, True)
    o, s = chunk_gla(q, k, v, g, s0, True)
    assert torch.isfinite(o).all() and torch.isfinite(s).all()
    # b = cumsum(g) reaches about -4000 here, so fp32 rounding of b alone is ~4e-4 relative.
    torch.testing.assert_close(o, o_ref, rtol=1e-3, atol=2e-3)
    torch.testing.assert_close(s, s_ref, rtol=1e-3, atol=2e-3)


def test_state_carries_across_calls():
    (q, k, v, g), s0 = inputs(300, seed=3)
    o_all, s_all = chunk_gla(q, k, v, g, s0, True)
    o1, s1 = chunk_gla(q[:, :170], k[:, :170], v[:, :170], g[:, :170], s0, True)
    o2, s2 = chunk_gla(q[:, 170:], k[:, 170:], v[:, 170:], g[:, 170:], s1, True)
    torch.testing.assert_close(torch.cat([o1, o2], 1), o_all, rtol=1e-4, atol=1e-4)
    torch.testing.assert_close(s2, s_all, rtol=1e-4, atol=1e-4)


def test_single_step_form_decodes_like_naive():
    (q, k, v, g), s0 = inputs(12, seed=4)
    o_ref, s_ref = naive_recurrent_gla(q, k, v, g, s0, True)
    s, outs = s0, []
    for t in range(12):
        o, s = fused_recurrent_gla(q[:, t:t + 1], k[:, t:t + 1], v[:, t:t + 1], g[:, t:t + 1], s, True)
        outs.append(o)
    torch.testing.assert_close(torch.cat(outs, 1), o_ref, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(s, s_ref, rtol=1e-5, atol=1e-5)
    assert fused_recurrent_gla(q, k, v, g)[1] is None  # no final state unless asked


def test_chunk_gradients_match_naive(scores_path):
    (q, k, v, g), s0 = inputs(40, seed=5)
    leaves = [x.clone().requires_grad_() for x in (q, k, v, g, s0)]
    grads = []
    for op in (naive_recurrent_gla, lambda *a, **kw: chunk_gla(*a, chunk_size=16, **kw)):
        for x in leaves:
            x.grad = None
        o, s = op(*leaves[:4], leaves[4], output_final_state=True)
        (o.square().sum() + s.sum()).backward()
        grads.append([x.grad.clone() for x in leaves])
    for a, b in zip(*grads):
        assert torch.isfinite(b).all()
        torch.testing.assert_close(b, a, rtol=1e-3, atol=1e-3)


def test_bf16_inputs_keep_dtype_and_fp32_state():
    (q, k, v, g), s0 = inputs(150, seed=6)
    o32, s32 = chunk_gla(q, k, v, g, s0, True)
    o16, s16 = chunk_gla(q.bfloat16(), k.bfloat16(), v.bfloat16(), g, s0, True)
    assert o16.dtype == torch.bfloat16 and s16.dtype == torch.float32
    torch.testing.assert_close(o16.float(), o32, rtol=5e-2, atol=5e-2)
