"""Issue 30, part 1: SmolLM2-135M as our native model, and its linearized twin layer.

- our model on SmolLM2's weights gives transformers' LlamaForCausalLM logits;
- a twin (every layer window_linear, fresh feature maps, gates and mixes) equals its parent on
  any context of at most W tokens, and differs beyond W;
- prefill, streamed prefill, decode and fork give one full forward pass's outputs, and the
  blocked op equals its token-by-token reference;
- the state's bytes are what the config's formula says and what the tensors hold;
- bad window_linear values are refused, naming the key.
"""
from __future__ import annotations

import itertools
import json

import pytest
import torch
from helpers import assert_streams_like_one_forward

from evalkit.model_adapters.gla.config import GLAConfig
from evalkit.model_adapters.gla.from_llama import config_from_llama, linearize, load_llama
from evalkit.model_adapters.gla.model import GLAForCausalLM
from evalkit.model_adapters.gla.ops.window_linear import chunk_window_linear, naive_window_linear

W = 64  # the family's window (LoLCATs' and Liger's)
PROMPTS = [  # three prompts of at most W tokens
    "The lighthouse keeper wrote down the ship's name, then the hour it passed, and finally the "
    "colour of its flag, because the harbour master had asked for all three every evening "
    "since the storm of last winter had carried away the old signal mast and the logbook.",
    "Question: what is the capital of France? Answer:",
    "def add(a, b):\n    return a + b\n",
]
SETTINGS = list(itertools.product(("hedgehog", "softmax"), ("key", "learned", "none")))
# on SmolLM2, each feature map and each gate at least once (inside W they cannot matter)
SMOL_SETTINGS = [("hedgehog", "key"), ("softmax", "learned"), ("hedgehog", "none")]


@pytest.fixture(autouse=True)
def _no_grad():
    with torch.no_grad():
        yield


@pytest.fixture(scope="module")
def smol_folder():
    from evalkit.model_adapters.embedded import convert_gguf_once
    return convert_gguf_once()


@pytest.fixture(scope="module")
def parent(smol_folder):
    return load_llama(smol_folder)


@pytest.fixture(scope="module")
def prompts(smol_folder):
    from transformers import AutoTokenizer
    tok = AutoTokenizer.from_pretrained(str(smol_folder), local_files_only=True)
    ids = [tok(p)["input_ids"] for p in PROMPTS]
    assert all(1 <= len(i) <= W for i in ids) and max(len(i) for i in ids) >= W - 16
    return [torch.tensor([i]) for i in ids]


@pytest.fixture(scope="module")
def parent_logits(parent, prompts):
    return [parent(ids) for ids in prompts]


# -- (a) SmolLM2 in our model --------------------------------------------------------------
def test_native_smollm2_equals_transformers(smol_folder, parent, prompts, parent_logits):
    from transformers import LlamaForCausalLM
    ref = LlamaForCausalLM.from_pretrained(str(smol_folder), dtype=torch.float32,
                                           local_files_only=True).eval()
    assert parent.config.mixers == ["attn"] * 30 and parent.config.tie_word_embeddings
    assert parent.num_parameters() == ref.num_parameters() == parent.config.param_count()
    for ids, ours in zip(prompts, parent_logits):
        diff = (ours - ref(ids).logits).abs().max().item()
        assert diff <= 1e-4, diff


def test_llama_features_we_lack_are_refused(smol_folder):
    d = json.loads((smol_folder / "config.json").read_text())
    for key, value in (("attention_bias", True), ("mlp_bias", True), ("hidden_act", "gelu"),
                       ("head_dim", 32), ("rope_parameters", {"rope_type": "yarn", "rope_theta": 1e5})):
        with pytest.raises(ValueError, match=key.split("_")[0]):
            config_from_llama({**d, key: value})


# -- (b, c) the twin equals its parent inside the window, not beyond -----------------------
@pytest.mark.parametrize("feature_map,gate", SMOL_SETTINGS)
def test_twin_equals_parent_within_window(parent, prompts, parent_logits, feature_map, gate):
    twin = linearize(parent, window=W, feature_map=feature_map, gate=gate)
    assert twin.config.mixers == ["window_linear"] * 30
    for ids, want in zip(prompts, parent_logits):
        diff = (twin(ids) - want).abs().max().item()
        assert diff <= 1e-4, (ids.shape, diff)


def test_twin_differs_from_parent_beyond_window(parent, prompts):
    ids = torch.cat([prompts[0], prompts[1], prompts[2]], 1)[:, :W + 24]     # past the window
    assert ids.shape[1] > W
    twin = linearize(parent, window=W)
    a, b = twin(ids), parent(ids)
    inside = (a[:, :W] - b[:, :W]).abs().max().item()
    beyond = (a[:, W:] - b[:, W:]).abs().amax(-1)                              # [1, T - W]
    assert inside <= 1e-4, inside
    assert bool((beyond > 1e-2).all()), beyond   # every position past W sees the state


def test_twin_keeps_full_attention_layers(parent, prompts):
    """Some layers stay softmax attention (the -attn3 member): those come from `attn`."""
    twin = linearize(parent, window=8, layers=[i for i in range(30) if i not in (0, 14, 29)])
    assert [i for i, m in enumerate(twin.config.mixers) if m == "attn"] == [0, 14, 29]
    ids = prompts[1][:, :8]
    assert (twin(ids) - parent(ids)).abs().max().item() <= 1e-4


# -- (d) prefill, streamed prefill, decode and fork = one full forward ---------------------
def tiny(feature_map="hedgehog", gate="key", window=5, attn_layers=(), n_layers=3,
         **kw) -> GLAConfig:
    """4 query heads sharing 2 kv heads (GQA), rotary; window_linear but on `attn_layers`."""
    layers = [i for i in range(n_layers) if i not in attn_layers]
    cfg = GLAConfig(vocab_size=64, hidden_size=32, num_hidden_layers=n_layers, num_heads=4,
                    intermediate_size=64, tie_word_embeddings=True,
                    attn={"layers": list(attn_layers), "num_heads": 4, "num_kv_heads": 2,
                          "rope_theta": 1e4},
                    window_linear={"layers": layers, "window": window, "feature_map": feature_map,
                                   "feature_dim": 6, "gate": gate, **kw})
    cfg.validate()
    return cfg


def tiny_model(cfg: GLAConfig, seed: int = 0) -> GLAForCausalLM:
    torch.manual_seed(seed)
    m = GLAForCausalLM(cfg).eval()
    for block in m.model.layers:  # a gate that forgets visibly within the test's 23 tokens
        if hasattr(block.attn, "g_proj"):
            torch.nn.init.normal_(block.attn.g_proj.weight, std=1.0)
    return m


@pytest.mark.parametrize("feature_map,gate", SETTINGS)
def test_streamed_state_equals_one_forward(feature_map, gate):
    m = tiny_model(tiny(feature_map, gate))
    # segments straddle the window (5)
    assert_streams_like_one_forward(m, torch.randint(0, 64, (2, 23)), [(7, 3), (16, 4)])


def test_hybrid_of_attention_and_twin_layers_streams():
    m = tiny_model(tiny(attn_layers=(1,)))
    ids = torch.randint(0, 64, (1, 19))
    full = m(ids)
    last, state = m.prefill(ids[:, :12], segment=5)
    torch.testing.assert_close(last, full[:, 11], atol=1e-5, rtol=1e-5)
    for t in range(12, 19):
        logits, state = m.decode_step(ids[:, t], state)
        torch.testing.assert_close(logits, full[:, t], atol=1e-5, rtol=1e-5)


def test_chunk_op_equals_token_by_token_reference():
    torch.manual_seed(0)
    B, H, d, F, Wn = 2, 3, 8, 10, 6
    for L, T in ((0, 1), (0, 5), (0, 17), (4, 9), (6, 1), (6, 40)):
        q = torch.randn(B, H, T, d)
        k, v = torch.randn(B, H, L + T, d), torch.randn(B, H, L + T, d)
        fq = torch.randn(B, H, T, F).softmax(-1)
        fk, u = torch.randn(B, H, T, F).softmax(-1), torch.randn(B, H, T, d)
        log_a = -torch.rand(B, H, T)
        mix = torch.rand(H) * 0.8 + 0.1
        S0 = torch.rand(B, H, F, d + 1) * (L > 0)
        want_o, want_S = naive_window_linear(q, k, v, fq, fk, u, log_a, mix, Wn, S0)
        for c in (1, 4, 64):
            o, S = chunk_window_linear(q, k, v, fq, fk, u, log_a, mix, Wn, S0, chunk_size=c)
            torch.testing.assert_close(o, want_o, atol=1e-5, rtol=1e-5)
            torch.testing.assert_close(S, want_S, atol=1e-5, rtol=1e-5)


# naive mode = chunk mode for the whole model: tests/test_twin_sinks.py (with and without sinks)


def test_window_sees_exactly_its_window_and_the_state_the_rest():
    """With gate none and no state contribution (mix -> window only), a token W back changes
    nothing; with the state it does: the linear part is what carries it."""
    m = tiny_model(tiny(gate="none", window=4, n_layers=1))
    ids = torch.randint(1, 64, (1, 12))
    older = ids.clone()
    older[0, 7] = (ids[0, 7] + 1) % 64                 # 4 tokens before the last: out of window
    assert not torch.allclose(m(older)[0, 11], m(ids)[0, 11], atol=1e-6)
    m.model.layers[0].attn.mix_logit.fill_(1e4)        # window weight 1: no linear part
    torch.testing.assert_close(m(older)[0, 11], m(ids)[0, 11])


# -- (e) the state: formula = tensors ------------------------------------------------------
@pytest.mark.parametrize("feature_map", ["hedgehog", "softmax"])
def test_state_bytes_match_formula_and_tensors(feature_map):
    cfg = tiny(feature_map, attn_layers=(1,))
    m = tiny_model(cfg)
    F = 2 * 6 if feature_map == "hedgehog" else 2 * 8
    assert cfg.window_linear_features == F
    for n in (3, 5, 17):
        _, state = m.prefill(torch.randint(0, 64, (1, n)))
        parts = state.parts()
        assert parts == cfg.state_parts(n)
        assert parts.total == state.nbytes() == sum(t.numel() * 4 for t in state.tensors())
        assert parts.kind == "hybrid"
        twin_layer = state.layers[0]
        assert twin_layer.recurrent.shape == (1, 4, F, 8 + 1)
        assert twin_layer.kv[0].shape == (1, 2, min(n, 5), 8) and twin_layer.seen == n
    # two twin layers: H*F*(d+1) fixed each, window KV 2 * 2 kv heads * 8 * min(n, W) each
    assert cfg.state_parts(100).fixed == 2 * 4 * F * 9 * 4
    assert cfg.state_parts(100).window == 2 * 2 * 16 * 5 * 4
    with pytest.raises(ValueError, match="context"):
        tiny(feature_map).state_bytes()


def test_param_count_matches_the_model():
    for feature_map, gate in SETTINGS:
        cfg = tiny(feature_map, gate, attn_layers=(2,))
        assert cfg.param_count() == GLAForCausalLM(cfg).num_parameters(), (feature_map, gate)


def test_config_round_trips_and_older_configs_keep_their_hash():
    cfg = tiny("softmax", "learned", mix=0.3)
    again = GLAConfig.from_dict(json.loads(json.dumps(cfg.to_dict())))
    assert again.to_dict() == cfg.to_dict() and again.mixers == cfg.mixers
    plain = GLAConfig(hidden_size=64, num_heads=2, num_hidden_layers=2)
    assert "window_linear" not in plain.to_dict()
    # the hash as it was before window_linear existed: every field but extra, hashed as JSON
    import dataclasses
    import hashlib
    before = {f.name: getattr(plain, f.name) for f in dataclasses.fields(plain)
              if f.name not in ("extra", "window_linear")}
    assert plain.config_hash() == hashlib.sha256(json.dumps(before, sort_keys=True).encode()).hexdigest()


# -- (f) bad values name their key ---------------------------------------------------------
@pytest.mark.parametrize("change,key", [
    ({"window": 0}, "window_linear.window"),
    ({"window": 2.5}, "window_linear.window"),
    ({"feature_map": "identity"}, "window_linear.feature_map"),
    ({"feature_dim": 0}, "window_linear.feature_dim"),
    ({"gate": "sigmoid"}, "window_linear.gate"),
    ({"mix": 1.0}, "window_linear.mix"),
    ({"mix": True}, "window_linear.mix"),
    ({"windw": 4}, "window_linear.windw"),
    ({"layers": [3]}, "window_linear.layers"),
])
def test_bad_window_linear_values_are_refused(change, key):
    d = tiny().to_dict()
    d["window_linear"] = {**d["window_linear"], **change}
    with pytest.raises(ValueError, match=key.replace(".", r"\.")):
        GLAConfig.from_dict(d)


def test_window_linear_needs_attn_and_its_own_layers():
    d = tiny(attn_layers=(1,)).to_dict()
    with pytest.raises(ValueError, match="window"):
        GLAConfig.from_dict({**d, "window_linear": {"layers": [0]}})        # no window
    with pytest.raises(ValueError, match=r"in both attn\.layers and window_linear\.layers"):
        GLAConfig.from_dict({**d, "window_linear": {"layers": [0, 1], "window": 4}})
    with pytest.raises(ValueError, match="window_linear needs an attn mapping"):
        GLAConfig.from_dict({**d, "attn": None})


# -- the shipped family (model_adapters/twins/, built by make train-twins) ------------------
def test_shipped_reference_equals_parent_within_window(prompts, parent_logits):
    """The sink + window reference (shipped in the repo, so never skipped), assembled from the
    embedded parent, gives the parent's logits (fp32) on three prompts of at most W tokens.
    The stateful twins do not: their end-to-end stage moved q/k/v/o (the test below)."""
    from evalkit.model_adapters.models import load_model

    twin = load_model("smollm2-135m-swa-w64-s4")
    assert twin.identity()["window"] >= W
    for ids, want in zip(prompts, parent_logits):
        diff = (twin.model(ids) - want).abs().max().item()
        assert diff <= 1e-4, (ids.shape, diff)


@pytest.mark.parametrize("name, rank", [("smollm2-135m-gla-w64-s4", 8),
                                        ("smollm2-135m-gdn-w64-s4", 8),
                                        ("smollm2-135m-gdn-w64-s4-recall", 16)])
def test_shipped_twin_loads_small_and_its_state_matters(name, rank):
    """Each stateful twin (make train-twins): its folder holds the trained tensors and the
    LoRAs as low-rank factors (rank 8 a stage; the recall twin keeps its source's beside its
    own: no copy of a parent weight), it loads from the embedded parent, and past its 4 sinks +
    64-token window its state changes the logits (state_off=true is the same twin without it)."""
    from safetensors.torch import load_file

    from evalkit.model_adapters.linearized import TWINS_DIR
    from evalkit.model_adapters.models import load_model

    folder = TWINS_DIR / name
    meta = json.loads((folder / "twin.json").read_text())
    stored = load_file(str(folder / "twin.safetensors"))
    assert len(meta["delta"]) == 4 * 30 and all(
        stored[f"delta.{n}.a"].shape[0] == rank == stored[f"delta.{n}.b"].shape[1]
        for n in meta["delta"])
    assert (folder / "twin.safetensors").stat().st_size < 20 * 2**20
    on, off = load_model(name), load_model(name, state_off=True)
    ids = torch.arange(1000, 1000 + 4 + 64 + 40)[None]
    with torch.no_grad():
        a, b = on.model(ids), off.model(ids)
    assert torch.isfinite(a).all()
    assert torch.equal(a[:, :4 + 64], b[:, :4 + 64])   # nothing has left the window yet
    assert (a[:, -1] - b[:, -1]).abs().max() > 1e-3    # the state holds the older tokens
