"""The GLA model: analytic sizes, parallel vs recurrent forms, fork/extend, streaming, training."""
from __future__ import annotations

import pytest
import torch

from evalkit.model_adapters.gla.config import GLAConfig
from evalkit.model_adapters.gla.model import GLAForCausalLM


def tiny(**kw) -> GLAConfig:
    base = dict(vocab_size=101, hidden_size=64, num_heads=4, num_hidden_layers=2, expand_k=0.5,
                expand_v=1.0, use_short_conv=True, conv_size=4)
    base.update(kw)
    return GLAConfig(**base)


def make(cfg: GLAConfig, seed: int = 0, chunk_size: int = 16) -> GLAForCausalLM:
    torch.manual_seed(seed)
    m = GLAForCausalLM(cfg).init_weights(seed)
    with torch.no_grad():  # larger-than-init weights so that differences would show
        for name, p in m.named_parameters():
            if "norm" not in name:
                p.mul_(8)
    m.set_ops(chunk_size=chunk_size)
    return m.eval()


VARIANTS = {
    "conv": dict(),
    "noconv": dict(use_short_conv=False),
    "kv-groups": dict(num_kv_heads=2),
    "tied": dict(tie_word_embeddings=True),
    "no-gate": dict(use_output_gate=False),
    "unfused-norm": dict(fuse_norm=False, clamp_min=-0.05),
    "no-affine": dict(elementwise_affine=False, intermediate_size=96),
}


@pytest.mark.parametrize("variant", list(VARIANTS))
def test_param_count_matches_modules(variant):
    cfg = tiny(**VARIANTS[variant])
    with torch.device("meta"):
        m = GLAForCausalLM(cfg)
    assert m.num_parameters() == cfg.param_count()


def test_mlp_width_follows_fla_rounding():
    assert GLAConfig(hidden_size=1024).mlp_intermediate_size == 2816   # 2730 -> multiple of 256
    assert GLAConfig(hidden_size=2048).mlp_intermediate_size == 5632
    assert GLAConfig(hidden_size=64, intermediate_size=100).mlp_intermediate_size == 100


@pytest.mark.parametrize("variant", ["conv", "noconv", "kv-groups", "no-gate", "unfused-norm"])
def test_full_forward_equals_token_by_token(variant):
    m = make(tiny(**VARIANTS[variant]))
    ids = torch.randint(0, 101, (2, 45), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        full = m(ids)
        state, steps = None, []
        for t in range(ids.shape[1]):
            logits, state = m.decode_step(ids[:, t], state if state is not None else m.empty_state(2))
            steps.append(logits)
    torch.testing.assert_close(torch.stack(steps, 1), full, rtol=1e-4, atol=1e-4)


def test_naive_and_chunk_modes_agree():
    m = make(tiny())
    ids = torch.randint(0, 101, (1, 70), generator=torch.Generator().manual_seed(2))
    with torch.no_grad():
        chunk = m(ids)
        m.set_ops(mode="naive")
        naive = m(ids)
    torch.testing.assert_close(chunk, naive, rtol=1e-4, atol=1e-4)


def test_fork_then_extend_equals_one_pass():
    m = make(tiny(num_kv_heads=2))
    g = torch.Generator().manual_seed(3)
    a, b = torch.randint(0, 101, (1, 37), generator=g), torch.randint(0, 101, (1, 29), generator=g)
    with torch.no_grad():
        _, s_a = m.prefill(a)
        before = [t.clone() for t in s_a.tensors()]
        fork = s_a.clone()
        logits_b, s_ab = m.forward_state(b, fork)
        last_once, s_once = m.prefill(torch.cat([a, b], 1))
        full = m(torch.cat([a, b], 1))
    torch.testing.assert_close(logits_b, full[:, 37:], rtol=1e-4, atol=1e-4)
    torch.testing.assert_close(logits_b[:, -1], last_once, rtol=1e-4, atol=1e-4)
    for x, y in zip(s_ab.tensors(), s_once.tensors()):
        torch.testing.assert_close(x, y, rtol=1e-4, atol=1e-4)
    for x, y in zip(s_a.tensors(), before):  # the forked-from state is untouched
        assert torch.equal(x, y)


def test_streaming_prefill_is_bounded_by_the_segment():
    cfg = tiny()
    m = make(cfg)
    ids = torch.randint(0, 101, (1, 300), generator=torch.Generator().manual_seed(4))
    widths = []
    hook = m.model.embeddings.register_forward_hook(lambda mod, inp, out: widths.append(inp[0].shape[1]))
    with torch.no_grad():
        last, state = m.prefill(ids, segment=64)
        hook.remove()
        full = m(ids)
    assert max(widths) == 64 and len(widths) == 5  # 300 tokens in segments of <= 64
    torch.testing.assert_close(last, full[:, -1], rtol=1e-4, atol=1e-4)
    # The state is per layer [H, d_k, d_v] plus conv tails, and its bytes match the formula.
    layer = state.layers[0]
    assert layer.recurrent.shape == (1, cfg.num_heads, cfg.head_k_dim, cfg.head_v_dim)
    assert [t.shape for t in layer.conv] == [(1, 32, 4), (1, 32, 4), (1, 64, 4)]
    assert all(t.dtype == torch.float32 for t in state.tensors())
    assert state.nbytes() == cfg.state_bytes(torch.float32)


def test_prefill_consumes_a_state_only_when_handed_over():
    """A caller's state survives prefill; with consume=True its layers are released as they
    are used (one state held, not two) and the result is the same."""
    m = make(tiny())
    ids = torch.randint(0, 101, (1, 200), generator=torch.Generator().manual_seed(6))
    with torch.no_grad():
        _, s0 = m.prefill(ids[:, :70], segment=32)
        before = [t.clone() for t in s0.tensors()]
        kept_last, kept = m.prefill(ids[:, 70:], s0, segment=32)
        assert all(torch.equal(x, y) for x, y in zip(s0.tensors(), before))
        last, state = m.prefill(ids[:, 70:], s0, segment=32, consume=True)
    assert all(layer is None for layer in s0.layers)
    assert torch.equal(last, kept_last)
    assert all(torch.equal(x, y) for x, y in zip(state.tensors(), kept.tensors()))


def test_state_is_fp32_for_bf16_weights():
    cfg = tiny()
    m32 = make(cfg)
    m16 = make(cfg).to(torch.bfloat16)
    ids = torch.randint(0, 101, (1, 40), generator=torch.Generator().manual_seed(5))
    with torch.no_grad():
        l32, _ = m32.prefill(ids)
        l16, s16 = m16.prefill(ids)
    assert all(t.dtype == torch.float32 for t in s16.tensors())
    assert l16.dtype == torch.float32
    assert (l16 - l32).abs().max() < 0.05 * l32.abs().max()


def test_training_backward_through_chunked_op():
    cfg = tiny(vocab_size=32, num_hidden_layers=1)
    torch.manual_seed(0)
    m = GLAForCausalLM(cfg).init_weights(0)
    m.set_ops(chunk_size=16)
    data = torch.arange(64).remainder(32).view(1, 64).repeat(2, 1)  # a learnable sequence
    opt = torch.optim.AdamW(m.parameters(), lr=3e-3)
    losses = []
    for _ in range(15):
        logits = m(data[:, :-1])
        loss = torch.nn.functional.cross_entropy(logits.reshape(-1, 32), data[:, 1:].reshape(-1))
        opt.zero_grad()
        loss.backward()
        assert all(p.grad is not None and torch.isfinite(p.grad).all() for p in m.parameters())
        opt.step()
        losses.append(loss.item())
    assert losses[-1] < 0.5 * losses[0]


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("gated", [False, True])
def test_rms_norm_is_flas_formula(dtype, gated):
    """The fused F.rms_norm path gives fla's numbers: fp32 statistics, the weight and the
    swish gate in fp32, one rounding to the input's dtype at the end; with autograd too."""
    from evalkit.model_adapters.gla.model import RMSNorm

    g = torch.Generator().manual_seed(0)
    x = (torch.randn(3, 17, 96, generator=g) * 3).to(dtype)
    gate = torch.randn(3, 17, 96, generator=g).to(dtype) if gated else None
    norm = RMSNorm(96, 1e-6).to(dtype)
    with torch.no_grad():
        norm.weight.copy_(torch.randn(96, generator=g))
    ref = x.float() * torch.rsqrt(x.float().pow(2).mean(-1, keepdim=True) + 1e-6) * norm.weight.float()
    if gated:
        ref = ref * torch.nn.functional.silu(gate.float())
    ref = ref.to(dtype)
    before = None if gate is None else gate.clone()
    with torch.no_grad():
        out = norm(x, gate)
    assert out.dtype == dtype
    tol = 0 if dtype == torch.float32 else 1e-2  # bf16: at most an ulp apart where they differ
    assert torch.allclose(out.float(), ref.float(), rtol=tol, atol=1e-6 if tol == 0 else 1e-2)
    assert (out != ref).float().mean() < (1e-4 if dtype == torch.float32 else 0.01)
    assert torch.equal(norm(x, gate), out)  # the autograd path: the same numbers
    if gated:
        assert torch.equal(gate, before)  # the caller's gate is never overwritten in place
