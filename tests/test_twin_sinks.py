"""Issue 40, items 1 and 2: attention sinks and the gated delta-rule twin layer.

- the chunked ops equal their token-by-token references, with sinks stored and in the cache;
- prefill, streamed prefill, decode and fork give one full forward pass's outputs, for a
  windowed attention layer with sinks and for both twin states with sinks;
- a twin (either state) and the sink + window reference equal their parent on any context of
  at most S + W tokens (real SmolLM2-135M), and the sinks are what makes that so;
- what a query sees: sinks and window exactly, the rest only through the state (state_off);
- state bytes: formula = tensors; parameters: formula = model; bad values name their key.
"""
from __future__ import annotations

import pytest
import torch
from helpers import assert_streams_like_one_forward

from evalkit.model_adapters.gla.config import GLAConfig
from evalkit.model_adapters.gla.model import GLAForCausalLM
from evalkit.model_adapters.gla.ops.window_delta import chunk_window_delta, naive_window_delta
from evalkit.model_adapters.gla.ops.window_linear import (chunk_window_linear, naive_window_linear,
                                                         naive_window_softmax, window_softmax)


@pytest.fixture(autouse=True)
def _no_grad():
    with torch.no_grad():
        yield


# -- ops ------------------------------------------------------------------------------------
# (L cached, T new, n_sink in k, stored sinks older than the cache)
CASES = [(0, 1, 0, 0), (0, 17, 2, 0), (0, 17, 17, 0), (4, 9, 3, 0), (6, 1, 0, 2), (6, 40, 0, 3),
         (3, 12, 1, 1)]


def _inputs(L, T, n_stored, B=2, H=3, d=8, seed=0):
    g = torch.Generator().manual_seed(seed)
    q = torch.randn(B, H, T, d, generator=g)
    k, v = torch.randn(B, H, L + T, d, generator=g), torch.randn(B, H, L + T, d, generator=g)
    sk, sv = torch.randn(B, H, n_stored, d, generator=g), torch.randn(B, H, n_stored, d, generator=g)
    return q, k, v, (sk if n_stored else None), (sv if n_stored else None), g


@pytest.mark.parametrize("L,T,n_sink,n_stored", CASES)
def test_window_softmax_equals_reference(L, T, n_sink, n_stored):
    q, k, v, sk, sv, _ = _inputs(L, T, n_stored)
    want = naive_window_softmax(q, k, v, 5, n_sink=n_sink, sink_k=sk, sink_v=sv)
    for c in (1, 4, 64):
        got, Z = window_softmax(q, k, v, 5, n_sink=n_sink, sink_k=sk, sink_v=sv, chunk_size=c,
                                want_z=True)
        torch.testing.assert_close(got, want, atol=1e-5, rtol=1e-5)
        assert bool((Z >= 1).all())            # the row maximum's own term is exp(0) = 1


@pytest.mark.parametrize("L,T,n_sink,n_stored", CASES)
def test_chunk_window_linear_with_sinks_equals_reference(L, T, n_sink, n_stored):
    q, k, v, sk, sv, g = _inputs(L, T, n_stored)
    B, H, _, d = q.shape
    F = 10
    fq = torch.randn(B, H, T, F, generator=g).softmax(-1)
    fk, u = torch.randn(B, H, T, F, generator=g).softmax(-1), torch.randn(B, H, T, d, generator=g)
    log_a, mix = -torch.rand(B, H, T, generator=g), torch.rand(H, generator=g) * 0.8 + 0.1
    S0 = torch.rand(B, H, F, d + 1, generator=g) * (L > 0)
    sinks = {"n_sink": n_sink, "sink_k": sk, "sink_v": sv}
    want_o, want_S = naive_window_linear(q, k, v, fq, fk, u, log_a, mix, 5, S0, **sinks)
    for c in (1, 4, 64):
        o, S = chunk_window_linear(q, k, v, fq, fk, u, log_a, mix, 5, S0, chunk_size=c, **sinks)
        torch.testing.assert_close(o, want_o, atol=1e-5, rtol=1e-5)
        torch.testing.assert_close(S, want_S, atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("L,T,n_sink,n_stored", CASES)
def test_chunk_window_delta_equals_reference(L, T, n_sink, n_stored):
    q, k, v, sk, sv, g = _inputs(L, T, n_stored)
    B, H, _, d = q.shape
    unit = lambda t: torch.nn.functional.normalize(t, dim=-1)
    qd, kd = unit(torch.randn(B, H, T, d, generator=g)), unit(torch.randn(B, H, T, d, generator=g))
    vd = torch.randn(B, H, T, d, generator=g)
    log_a = -torch.rand(B, H, T, generator=g)
    beta, lam = torch.rand(B, H, T, generator=g), torch.rand(B, H, T, generator=g)
    S0 = torch.randn(B, H, d, d, generator=g) * (L > 0)
    sinks = {"n_sink": n_sink, "sink_k": sk, "sink_v": sv}
    want_o, want_S = naive_window_delta(q, k, v, qd, kd, vd, log_a, beta, lam, 5, S0, **sinks)
    for c in (1, 4, 64):
        o, S = chunk_window_delta(q, k, v, qd, kd, vd, log_a, beta, lam, 5, S0, chunk_size=c,
                                  **sinks)
        torch.testing.assert_close(o, want_o, atol=1e-5, rtol=1e-5)
        torch.testing.assert_close(S, want_S, atol=1e-5, rtol=1e-5)


# -- tiny models: streaming = one forward ---------------------------------------------------
def tiny_cfg(kind: str, window=5, sinks=2, n_layers=3, attn_layers=(), **kw) -> GLAConfig:
    """4 query heads sharing 2 kv heads (GQA), rotary. kind: "swa" (windowed attention with
    sinks), "gla" or "gated_delta" (twin layers on every layer but attn_layers)."""
    attn = {"layers": list(attn_layers), "num_heads": 4, "num_kv_heads": 2, "rope_theta": 1e4}
    if kind == "swa":
        return GLAConfig(vocab_size=64, hidden_size=32, num_hidden_layers=n_layers, num_heads=4,
                         intermediate_size=64, tie_word_embeddings=True,
                         attn={**attn, "layers": list(range(n_layers)), "window_size": window,
                               "sinks": sinks})
    spec = {"layers": [i for i in range(n_layers) if i not in attn_layers], "window": window,
            "sinks": sinks, "state": kind, **kw}
    if kind == "gla":
        spec.setdefault("feature_dim", 6)
    cfg = GLAConfig(vocab_size=64, hidden_size=32, num_hidden_layers=n_layers, num_heads=4,
                    intermediate_size=64, tie_word_embeddings=True, attn=attn, window_linear=spec)
    cfg.validate()
    return cfg


def tiny_model(cfg: GLAConfig, seed: int = 0) -> GLAForCausalLM:
    torch.manual_seed(seed)
    m = GLAForCausalLM(cfg).eval()
    for block in m.model.layers:  # visible forgetting, writing and look-back within 23 tokens
        for name in ("g_proj", "l_proj"):
            if hasattr(block.attn, name):
                torch.nn.init.normal_(getattr(block.attn, name).weight, std=1.0)
        if hasattr(block.attn, "b_key"):
            torch.nn.init.normal_(block.attn.b_key, std=1.0)
    return m


KINDS = [("swa", {}), ("gla", {"gate": "learned"}), ("gla", {"feature_map": "softmax"}),
         ("gated_delta", {"gate": "key"}), ("gated_delta", {"gate": "learned"})]


@pytest.mark.parametrize("kind,kw", KINDS)
@pytest.mark.parametrize("sinks", [1, 3])
def test_streamed_state_equals_one_forward(kind, kw, sinks):
    m = tiny_model(tiny_cfg(kind, sinks=sinks, **kw))
    # prefill segments straddle the sinks (1 or 3) and the window (5)
    assert_streams_like_one_forward(m, torch.randint(0, 64, (2, 23)), [(2, 1), (16, 4)])


@pytest.mark.parametrize("kind", ["gla", "gated_delta"])
@pytest.mark.parametrize("sinks", [0, 2])
def test_model_in_naive_mode_equals_chunk_mode(kind, sinks):
    m = tiny_model(tiny_cfg(kind, sinks=sinks, attn_layers=(1,)))
    ids = torch.randint(0, 64, (2, 30))
    for block in m.model.layers:
        block.attn.chunk_size = 7
    want = m(ids)
    for block in m.model.layers:
        block.attn.mode = "naive"
    torch.testing.assert_close(m(ids), want, atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("kind", ["swa", "gla", "gated_delta"])
def test_a_query_sees_sinks_and_window_and_the_rest_only_through_the_state(kind):
    """Last query at 15, window 4 (12..15), sinks 2 (0, 1). A sink token changes the output
    even with the state off; a middle token (5) only through the state."""
    m = tiny_model(tiny_cfg(kind, window=4, sinks=2, n_layers=1))
    ids = torch.randint(1, 64, (1, 16))

    def changed(i: int) -> bool:
        other = ids.clone()
        other[0, i] = (ids[0, i] + 1) % 64
        return not torch.allclose(m(other)[0, 15], m(ids)[0, 15], atol=1e-6)

    assert changed(1) and changed(12)              # a sink, the window's oldest token
    assert changed(5) == (kind != "swa")           # only a state carries the middle
    m.model.layers[0].attn.state_off = True
    assert changed(1) and changed(12) and not changed(5)


# -- SmolLM2-135M: twin = parent on S + W tokens ------------------------------------------
PROMPT = ("The lighthouse keeper wrote down the ship's name, then the hour it passed, and finally "
          "the colour of its flag, because the harbour master had asked for all three every "
          "evening since the storm of last winter had carried away the old signal mast and the "
          "logbook.")


@pytest.fixture(scope="module")
def smol():
    from transformers import AutoTokenizer

    from evalkit.model_adapters.embedded import convert_gguf_once
    from evalkit.model_adapters.gla.from_llama import load_llama
    folder = convert_gguf_once()
    ids = AutoTokenizer.from_pretrained(str(folder), local_files_only=True)(PROMPT)["input_ids"]
    assert 50 <= len(ids) <= 64, len(ids)
    parent = load_llama(folder)
    ids = torch.tensor([ids])
    return parent, ids, parent(ids)


@pytest.mark.parametrize("spec", [{"state": "gla"}, {"state": "gated_delta"}, {"window_only": True}])
def test_twin_with_sinks_equals_parent_on_s_plus_w_tokens(smol, spec):
    from evalkit.model_adapters.gla.from_llama import linearize
    parent, ids, want = smol
    T, S = ids.shape[1], 4
    W = T - S                                     # the whole prompt is sinks + window
    if spec.get("window_only"):
        cfg = parent.config.to_dict()
        cfg["attn"] = {**cfg["attn"], "window_size": W, "sinks": S}
        twin = GLAForCausalLM(GLAConfig.from_dict(cfg)).eval()
        twin.load_state_dict(parent.state_dict())
    else:
        twin = linearize(parent, window=W, sinks=S, **spec)
        for block in twin.model.layers:   # a state that would show if anything entered it
            if hasattr(block.attn, "l_proj"):
                torch.nn.init.constant_(block.attn.l_proj.bias, 3.0)
    diff = (twin(ids).log_softmax(-1) - want.log_softmax(-1)).abs().max().item()
    assert diff <= 1e-4, diff
    if spec.get("window_only"):                    # without the sinks the same window differs
        cfg["attn"]["sinks"] = 0
        nosink = GLAForCausalLM(GLAConfig.from_dict(cfg)).eval()
        nosink.load_state_dict(parent.state_dict())
        assert (nosink(ids) - want).abs().max().item() > 1e-2


# -- sizes and checks ---------------------------------------------------------------------
@pytest.mark.parametrize("kind", ["swa", "gla", "gated_delta"])
def test_state_bytes_match_formula_and_tensors(kind):
    cfg = tiny_cfg(kind, window=5, sinks=3, attn_layers=() if kind == "swa" else (1,))
    m = tiny_model(cfg)
    for n in (1, 3, 5, 8, 17):
        _, state = m.prefill(torch.randint(0, 64, (1, n)))
        assert state.parts() == cfg.state_parts(n), n
        assert state.parts().total == state.nbytes()
    kv_per_token = 2 * 2 * 8 * 4                              # K and V, 2 kv heads of 8, fp32
    layer = state.layers[0]
    assert [t.shape[2] for t in layer.kv] == [5, 5, 3, 3]     # window K, V; sinks K, V
    if kind == "gated_delta":
        assert layer.recurrent.shape == (1, 4, 8, 8)
        assert cfg.state_parts(100).fixed == 2 * 4 * 8 * 8 * 4
    assert cfg.state_parts(100).window == (3 if kind == "swa" else 2) * kv_per_token * (5 + 3)


@pytest.mark.parametrize("kind,kw", KINDS)
def test_param_count_matches_the_model(kind, kw):
    cfg = tiny_cfg(kind, attn_layers=() if kind == "swa" else (2,), **kw)
    assert cfg.param_count() == GLAForCausalLM(cfg).num_parameters()


@pytest.mark.parametrize("where,change,key", [
    ("attn", {"sinks": 2, "window_size": None}, "attn.sinks"),
    ("attn", {"sinks": -1, "window_size": 4}, "attn.sinks"),
    ("window_linear", {"sinks": "4"}, "window_linear.sinks"),
    ("window_linear", {"sinks": 10_000}, "window_linear.sinks"),
    ("window_linear", {"state": "mamba"}, "window_linear.state"),
    ("window_linear", {"state": "gated_delta", "feature_dim": 8}, "window_linear.feature_dim"),
])
def test_bad_values_are_refused_naming_the_key(where, change, key):
    cfg = tiny_cfg("gla").to_dict()
    cfg[where] = {**cfg[where], **change}
    if where == "window_linear" and change.get("state") == "gated_delta":
        cfg[where].pop("feature_map", None)
    with pytest.raises(ValueError, match=key.replace(".", r"\.")):
        GLAConfig.from_dict(cfg)


def test_state_off_is_the_sink_window_reference_and_its_own_row(smol, tmp_path):
    """A twin folder loaded with state_off=true answers as the parent limited to its sinks
    and window (here: no end-to-end stage, so the same weights), and says so in its identity;
    with the state on it differs past the window."""
    from evalkit.model_adapters.gla.from_llama import linearize
    from evalkit.model_adapters.gla.twin import parent_hash, save_twin, trained_names
    from evalkit.model_adapters.gla.adapter import GLAAdapter
    parent, ids, _ = smol
    sha = parent_hash(parent)
    twin = linearize(parent, window=16, sinks=4, state="gated_delta")
    for block in twin.model.layers:
        torch.nn.init.constant_(block.attn.l_proj.bias, 3.0)
    ref = parent.config.to_dict()
    ref["attn"] = {**ref["attn"], "window_size": 16, "sinks": 4}
    ref_model = GLAForCausalLM(GLAConfig.from_dict(ref))
    for name, model in (("twin", twin), ("ref", ref_model)):
        (tmp_path / name).mkdir()
        save_twin(tmp_path / name, name, model, "smollm2-135m", sha,
                  trained_names(model, parent), "test")
    prompt = torch.cat([ids, ids], 1)[0].tolist()                  # past S + W
    on, off = GLAAdapter(str(tmp_path / "twin")), GLAAdapter(str(tmp_path / "twin"), state_off=True)
    window = GLAAdapter(str(tmp_path / "ref"))
    lp = lambda a: a.prefill(prompt).last_logits.log_softmax(-1)
    assert (lp(off) - lp(window)).abs().max().item() <= 1e-4
    assert (lp(on) - lp(off)).abs().max().item() > 1e-2
    assert off.identity()["state_off"] is True and "state_off" not in on.identity()
    assert off.identity()["sinks"] == window.identity()["sinks"] == 4
    with pytest.raises(ValueError, match="state_off=true needs window_linear"):
        GLAAdapter(str(tmp_path / "ref"), state_off=True)


def test_a_fact_inside_the_sinks_is_flagged_naming_the_model_and_s(tmp_path, capsys):
    """A model that keeps its first S tokens exact would recall a fact placed there without
    its state: such a sample is flagged in_sinks (not scored, not failed: exit status 0) and
    the run names the model and S; deeper facts run."""
    import json

    from helpers import TINY_TOKENIZER, save_peaked_gla

    from evalkit.cli import main as cli_main
    from evalkit.tokenization import load_tokenizer
    V = len(load_tokenizer(TINY_TOKENIZER))
    cfg = GLAConfig(vocab_size=V, hidden_size=32, num_hidden_layers=2, num_heads=4,
                    intermediate_size=64, attn={"layers": [0, 1], "num_heads": 4,
                                                "window_size": 16, "sinks": 8})
    save_peaked_gla(cfg, tmp_path / "ckpt", 1.0)
    out = tmp_path / "run"
    code = cli_main(["run", "--models", f"gla:{tmp_path / 'ckpt'}", "--model-args",
                     f"tokenizer={TINY_TOKENIZER}", "--tasks", "needle",
                     "--lengths", "128", "--depths", "0.0,0.5", "--output", str(out)])
    samples = [json.loads(line) for line in (out / "samples.jsonl").read_text().splitlines()]
    inside = [s for s in samples if s["depth"] == 0.0]
    name = f"gla:{tmp_path / 'ckpt'}"
    assert code == 0 and inside
    assert all(s["flag"] == "in_sinks" and s["error"] is None and not s["scores"] for s in inside)
    err = capsys.readouterr().err
    assert f"{len(inside)} samples flagged in_sinks, not evaluated" in err
    assert f"{name}'s first 8 tokens" in err
    deeper = [s for s in samples if s["depth"] == 0.5]
    assert deeper and all(s["error"] is None and s["flag"] is None and s["scores"] for s in deeper)
    results = json.loads((out / "results.json").read_text())
    assert results["summary"]["flags"] == {"in_sinks": len(inside)}
