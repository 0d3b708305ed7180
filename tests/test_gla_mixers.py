"""Mixer twins: attention, sliding-window attention and gated-convolution layers in our model.

Decode-with-state must equal one full forward pass (fla's rule), the state's bytes must be
what the config's formula says and what the tensors hold, and fla's hybrid config must round
trip through a checkpoint folder."""
import pytest
import torch

from evalkit.model_adapters.gla.checkpoint import build_model, load_checkpoint, save_checkpoint
from evalkit.model_adapters.gla.config import GLAConfig



@pytest.fixture(autouse=True)
def _no_grad():
    with torch.no_grad():
        yield


def twin(mixer: str, d: int = 32, window: int | None = None, rope: float | None = 10000.0,
         **kw) -> GLAConfig:
    """Zoology's two-layer model: a gated convolution, then the mixer under test; no MLP."""
    extra = {}
    if mixer == "attn":
        extra["attn"] = {"layers": [1], "num_heads": 2, "num_kv_heads": 1, "window_size": window,
                         "rope_theta": rope}
    cfg = GLAConfig(vocab_size=64, hidden_size=d, num_hidden_layers=2, num_heads=2,
                    gated_conv={"layers": [0], "kernel_size": 3}, use_mlp=False,
                    tie_word_embeddings=True, **extra, **kw)
    cfg.validate()
    return cfg


def model_of(cfg: GLAConfig, seed: int = 0):
    torch.manual_seed(seed)
    return build_model(cfg).eval()


@pytest.mark.parametrize("mixer,window,rope", [("gla", None, None), ("attn", None, 1e4),
                                               ("attn", 5, 1e4), ("attn", None, None),
                                               ("attn", 5, None)])
def test_streamed_state_equals_one_forward(mixer, window, rope):
    cfg = twin(mixer, window=window, rope=rope)
    m = model_of(cfg)
    ids = torch.randint(0, 64, (2, 23))
    full = m(ids)                                                       # [2, 23, V]
    # prefill in uneven segments, then decode the rest one token at a time
    last, state = m.prefill(ids[:, :7], segment=3)
    torch.testing.assert_close(last, full[:, 6].float(), atol=1e-5, rtol=1e-5)
    last, state = m.prefill(ids[:, 7:16], state, segment=4)
    torch.testing.assert_close(last, full[:, 15].float(), atol=1e-5, rtol=1e-5)
    for t in range(16, 23):
        logits, state = m.decode_step(ids[:, t], state)
        torch.testing.assert_close(logits, full[:, t].float(), atol=1e-5, rtol=1e-5)


def test_window_attends_to_exactly_its_window():
    """A query sees itself and the window-1 tokens before it: changing an older token changes
    nothing at the query's output, changing the oldest one inside the window does."""
    m = model_of(twin("attn", window=4))
    m.model.layers[0].attn.conv1d.weight.zero_()  # so only attention carries information
    ids = torch.randint(1, 64, (1, 12))
    base = m(ids)[0, 11]
    older, inside = ids.clone(), ids.clone()
    older[0, 7] = (ids[0, 7] + 1) % 64    # 4 tokens back: outside a window of 4
    inside[0, 8] = (ids[0, 8] + 1) % 64   # 3 tokens back: inside
    torch.testing.assert_close(m(older)[0, 11], base)
    assert not torch.allclose(m(inside)[0, 11], base)


@pytest.mark.parametrize("mixer,window,kind", [("gla", None, "recurrent"), ("attn", None, "kv"),
                                               ("attn", 5, "kv-window")])
def test_state_bytes_match_formula_and_tensors(mixer, window, kind):
    cfg = twin(mixer, window=window)
    m = model_of(cfg)
    for n in (3, 17):
        _, state = m.prefill(torch.randint(0, 64, (1, n)))
        parts = state.parts()
        assert parts == cfg.state_parts(n)
        assert parts.total == state.nbytes() == sum(t.numel() * 4 for t in state.tensors())
        assert parts.kind == cfg.state_kind == kind


def test_published_state_sizes():
    """Based's GLA points (2 heads, expand_k 0.5, expand_v 1, a kernel-3 conv layer): d 64 ->
    4,864 B, d 128 -> 17,920 B, d 256 -> 68,608 B; attention d 64 at 1,024 tokens: 2*64*1024*4
    plus the conv tail."""
    for d, want in ((64, 4864), (128, 17920), (256, 68608)):
        assert twin("gla", d=d, use_short_conv=False).state_bytes() == want
    attn = twin("attn", d=64)
    assert attn.state_bytes(context=1024) == 2 * 64 * 1024 * 4 // 2 + 64 * 3 * 4  # 1 kv head of 2
    with pytest.raises(ValueError, match="context"):
        attn.state_bytes()


def test_param_count_matches_the_model():
    for mixer, window in (("gla", None), ("attn", None), ("attn", 3)):
        cfg = twin(mixer, window=window)
        assert cfg.param_count() == model_of(cfg).num_parameters()


def test_hybrid_config_round_trips_through_a_checkpoint(tmp_path):
    cfg = twin("attn", window=6)
    m = model_of(cfg)
    save_checkpoint(m, cfg, tmp_path)
    m2, cfg2 = load_checkpoint(tmp_path)
    assert cfg2.to_dict() == cfg.to_dict()
    assert cfg2.mixers == ["gated_conv", "attn"]
    ids = torch.randint(0, 64, (1, 9))
    torch.testing.assert_close(m2(ids), m(ids))


@pytest.mark.parametrize("attn,error", [
    ({"layers": [1], "num_heads": 2, "heads": 2}, "attn.heads is not a known key"),
    ({"num_heads": 2}, "attn.layers is required"),
    ({"layers": [2], "num_heads": 2}, r"attn.layers must be a list of layer indices in \[0, 2\)"),
    ({"layers": [0], "num_heads": 2}, r"layer\(s\) \[0\] are in both"),
    ({"layers": [1], "num_heads": 3}, "attn.num_heads=3 must divide hidden_size=32"),
    ({"layers": [1], "num_heads": 2, "window_size": 0}, "attn.window_size must be null or a positive"),
    ({"layers": [1], "num_heads": 2, "rope_theta": 0}, "attn.rope_theta must be a positive number"),
])
def test_bad_mixer_configs_name_the_key(attn, error):
    d = twin("gla").to_dict()
    d["attn"] = attn
    with pytest.raises(ValueError, match=error):
        GLAConfig.from_dict(d, source="x/config.json")
