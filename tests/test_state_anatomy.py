"""Issue 40: what a twin's state holds (evalkit.training.state_anatomy).

- the replay is the layer's own memory: replayed from what a real twin layer recorded, it ends
  in the state the layer returns (both kinds of state, sinks, GQA, a learned gate);
- hand-computed cases: orthonormal keys with no forgetting are read back whole at any distance;
  a constant gate of 1/2 leaves the delta rule 2^-s of a value s steps later, while GLA's
  normalised read-out cancels it; half-lives; tokens that never entered are never read;
- a learned gate starts each head at its own half-life, 64 to 8,192 tokens log-spaced.
"""
from __future__ import annotations

import math

import pytest
import torch
from test_twin_sinks import tiny_cfg, tiny_model

from evalkit.model_adapters.gla.window_linear import LEARNED_HALF_LIVES, learned_gate_bias
from evalkit.training.state_anatomy import half_lives, layer_anatomy, replay, state_anatomy


def _orthonormal(B, H, T, K, seed=0):
    g = torch.Generator().manual_seed(seed)
    q, _ = torch.linalg.qr(torch.randn(K, K, generator=g, dtype=torch.float64))
    return q[:T].float().expand(B, H, T, K).clone()          # row t = key t, orthonormal


@pytest.mark.parametrize("kind,kw", [("gated_delta", {"gate": "learned"}),
                                     ("gated_delta", {"gate": "key"}),
                                     ("gla", {"gate": "learned"}),
                                     ("gla", {"feature_map": "softmax"})])
def test_replay_ends_in_the_layers_own_state(kind, kw):
    m = tiny_model(tiny_cfg(kind, window=5, sinks=2, attn_layers=(1,), **kw))
    layers = {i: b.attn for i, b in enumerate(m.model.layers) if hasattr(b.attn, "record")}
    assert sorted(layers) == [0, 2]
    for a in layers.values():
        a.record = []
    with torch.no_grad():
        _, state = m.prefill(torch.randint(0, 64, (2, 23), generator=torch.Generator().manual_seed(1)))
    for i, a in layers.items():
        (rec,) = a.record
        assert rec["has"].tolist() == [False] * 7 + [True] * 16   # S + W = 7 tokens never enter
        _, S = replay(rec["key"], rec["value"], rec["log_a"], rec["has"], (), rec.get("beta"))
        torch.testing.assert_close(S, state.layers[i].recurrent.float(), atol=1e-5, rtol=1e-4)
        a.record = None


def test_delta_rule_keeps_orthonormal_facts_and_a_half_gate_halves_them():
    B, H, T, K = 1, 2, 12, 16
    key, value = _orthonormal(B, H, T, K), torch.randn(B, H, T, K)
    has, ones = torch.ones(T, dtype=torch.bool), torch.ones(B, H, T)
    read, _ = replay(key, value, torch.zeros(B, H, T), has, (-1, 0, 3, 11), beta=ones)
    assert read[0][0] == pytest.approx(1, abs=1e-5) and read[0][1] == pytest.approx(0, abs=1e-5)
    assert read[11] == (pytest.approx(1, abs=1e-5), pytest.approx(0, abs=1e-5), B * H)
    assert read[-1][0] == pytest.approx(0, abs=1e-5)       # orthogonal: nothing before it
    half = torch.full((B, H, T), math.log(0.5))
    read, _ = replay(key, value, half, has, (0, 1, 3), beta=ones)
    for s in (0, 1, 3):   # written undecayed at its own step, then halved each step
        assert read[s][0] == pytest.approx(0.5 ** s, rel=1e-4)


def test_gla_normalised_readout_cancels_a_uniform_gate():
    B, H, T, F, V = 1, 1, 6, 8, 4
    key = torch.eye(F)[:T].expand(B, H, T, F).clone()          # one-hot features
    value = torch.randn(B, H, T, V)
    read, _ = replay(key, value, torch.full((B, H, T), math.log(0.5)),
                     torch.ones(T, dtype=torch.bool), (0, 5))
    assert read[5][0] == pytest.approx(1, abs=1e-5) and read[5][1] == pytest.approx(0, abs=1e-5)


def test_tokens_that_never_entered_are_not_read_and_half_lives():
    B, H, T, K = 1, 3, 10, 16
    key = _orthonormal(B, H, T, K)
    has = torch.tensor([False] * 4 + [True] * 6)
    read, _ = replay(key, torch.randn(B, H, T, K), torch.zeros(B, H, T), has, (0, 3, 9),
                     beta=torch.ones(B, H, T))
    assert read[0][2] == 6 * B * H and read[3][2] == 3 * B * H and 9 not in read
    log_a = torch.stack([torch.full((T,), math.log(0.5) / 10), torch.full((T,), math.log(0.5) / 100),
                         torch.zeros(T)])[None]
    assert half_lives(log_a, has)[:2] == [pytest.approx(10), pytest.approx(100)]
    assert half_lives(log_a, has)[2] == math.inf
    rec = {"key": key, "value": torch.randn(B, H, T, K), "log_a": log_a, "has": has,
           "beta": torch.ones(B, H, T), "lookback": torch.full((B, H, T), 0.25)}
    out = layer_anatomy(rec, window=4, distances=(4, 8))
    assert out["half_life"]["heads_without_forgetting"] == 1
    assert out["half_life"]["min"] == pytest.approx(10) and out["lookback"] == pytest.approx(0.25)
    assert set(out["readout"]) == {"4", "8"}


def test_state_anatomy_on_a_twin_and_none_without_a_state():
    m = tiny_model(tiny_cfg("gated_delta", window=5, sinks=2, gate="learned"))
    a = state_anatomy(m, torch.randint(0, 64, (2, 40)), distances=(8, 16, 64))
    assert a["distances"] == [8, 16] and sorted(a["layers"]) == ["0", "1", "2"]
    assert all(math.isfinite(L["readout"]["8"]["held"]) for L in a["layers"].values())
    assert all(b.attn.record is None for b in m.model.layers)   # switched off again
    assert state_anatomy(tiny_model(tiny_cfg("swa")), torch.randint(0, 64, (1, 20))) is None


def test_learned_gate_starts_each_head_at_its_own_half_life():
    b = learned_gate_bias(9, 16.0)
    life = math.log(0.5) / (torch.nn.functional.logsigmoid(b.double()) / 16)
    want = torch.logspace(math.log10(LEARNED_HALF_LIVES[0]), math.log10(LEARNED_HALF_LIVES[1]), 9,
                          dtype=torch.float64)
    torch.testing.assert_close(life, want, rtol=1e-4, atol=0)
    m = tiny_model(tiny_cfg("gated_delta", gate="learned"))
    torch.testing.assert_close(m.model.layers[0].attn.g_proj.bias.detach(), learned_gate_bias(4, 16.0))
