"""transformers' recurrent and hybrid families behind `hf:PATH`, on tiny random checkpoints built
here (tests/hf_families.py): cached scoring equals one full forward, the reported bytes are the
cache's tensors, the config's formula equals a measured prefill, and an unknown cache class is
one clear error."""
from __future__ import annotations

import json
import os

os.environ.setdefault("HF_HUB_OFFLINE", "1")

import pytest
import torch

from hf_families import FAMILIES, build_family, family_config

from evalkit.model_adapters.cache_state import (UnknownCacheError, cache_state, cache_tensors,
                                                fork_cache)
from evalkit.model_adapters.recurrent.adapter import RecurrentAdapter
from evalkit.model_adapters.recurrent.family import state_family
from evalkit.model_adapters.recurrent.formula import state_at
from evalkit.model_adapters.recurrent.formula import UnsupportedFamily
from evalkit.model_adapters.recurrent.measure import measured_at
from evalkit.model_adapters.models import load_model
from evalkit.tokenization import encode

TEXT = ("the quick brown fox jumps over the lazy dog while a small bird sings in the old oak tree "
        "near the river and the farmer counts seven red apples before the sun goes down")
# Summed log-probabilities of a continuation, cached vs one full forward (fp32): the observed
# gap is below 5e-5 for every family over continuations of up to 44 tokens (summation order
# differs between chunked, stepwise and one-pass scans).
TOL = 1e-4
KIND = {"mamba": "recurrent", "falcon_mamba": "recurrent", "mamba2": "recurrent",
        "rwkv": "recurrent", "jamba": "hybrid", "bamba": "hybrid", "falcon_h1": "hybrid",
        "zamba2": "hybrid", "qwen3_next": "hybrid",
        "lfm2": "kv"}  # short convolutions beside attention: a conv tail is not a recurrent state


@pytest.fixture(scope="module", params=FAMILIES)
def family(request, tmp_path_factory):
    folder = build_family(request.param, tmp_path_factory.mktemp(request.param))
    return request.param, folder, load_model(f"hf:{folder}", prefill_chunk=5)


def _full_logprobs(adapter, ids: list[int]) -> torch.Tensor:
    with torch.inference_mode():
        return torch.log_softmax(adapter.model(torch.tensor([ids])).logits[0].float(), -1)


def test_cached_continuation_equals_full_forward(family):
    name, _, a = family
    assert isinstance(a, RecurrentAdapter) and a.state_kind == KIND[name]
    ids = encode(a.tokenizer, TEXT)
    ref = _full_logprobs(a, ids)
    s = a.prefill(ids[:12])  # chunks of 5: a prefill in three forwards (one for Mamba, Jamba)
    conts = [ids[12:], ids[12:15], ids[12:13]]
    want = [sum(ref[i - 1, ids[i]].item() for i in range(12, 12 + len(c))) for c in conts]
    assert a.score(s, conts) == pytest.approx(want, abs=TOL)
    ext = a.extend(a.fork(s), ids[12:20])  # a multi-token extension of a state
    assert torch.log_softmax(ext.logits, -1)[ids[20]].item() == pytest.approx(
        ref[19, ids[20]].item(), abs=TOL)
    assert a.score(s, conts) == pytest.approx(want, abs=TOL)  # the fork left `s` as it was


def test_reported_bytes_are_the_cache_tensors(family):
    name, _, a = family
    ids = encode(a.tokenizer, TEXT)
    for n in (3, len(ids)):
        s = a.prefill(ids[:n])
        parts = a.state_parts(s)
        assert a.state_bytes(s) == parts.total == sum(t.nbytes for t in a.state_tensors(s)) > 0
        assert parts.kind == KIND[name]
        assert parts == state_at(a.model.config, n, a.dtype)  # the formula, part by part
        assert a.state_bytes_at(n) == parts.total
    if KIND[name] == "recurrent":
        assert a.state_bytes(a.prefill(ids[:3])) == a.state_bytes(a.prefill(ids))


@pytest.mark.parametrize("name", FAMILIES)
def test_formula_equals_a_measured_prefill(name):
    cfg = family_config(name)
    for dtype in (torch.float32, torch.bfloat16):
        assert measured_at(cfg, 37, dtype) == state_at(cfg, 37, dtype)


def test_state_cli_prints_formula_and_measured(tmp_path, capsys):
    from evalkit.cli import main

    folder = build_family("mamba", tmp_path / "mamba")
    assert main(["state", f"hf:{folder}", "--context", "300", "--json"]) == 0
    f = json.loads(capsys.readouterr().out)
    assert f["family"] == "mamba" and f["agree"] and f["measured"] == f["formula"]
    # 2 layers x (conv 64 x 4 in bf16 + recurrent 64 x 8 in fp32)
    assert f["formula"] == {"fixed": 2 * (64 * 4 * 2 + 64 * 8 * 4), "window": 0, "growing": 0,
                            "total": 5120, "kind": "recurrent"}
    assert main(["state", str(folder / "config.json"), "--context", "300"]) == 0
    out = capsys.readouterr().out
    assert "formula      5,120 B (recurrent)" in out and "measured" not in out  # config only


class HandMadeCache:
    """A cache class the walker has never seen."""


class HandMadeLayer:
    keys = torch.zeros(1, 2, 3, 4)


def test_unknown_cache_class_is_one_clear_error():
    from transformers import DynamicCache

    with pytest.raises(UnknownCacheError, match="HandMadeCache"):
        cache_state(HandMadeCache())
    cache = DynamicCache()
    cache.layers = [HandMadeLayer()]
    with pytest.raises(UnknownCacheError, match="HandMadeLayer"):
        cache_state(cache)
    with pytest.raises(UnknownCacheError, match="HandMadeLayer"):
        cache_tensors(cache)


def test_a_tensor_of_unknown_role_is_refused_naming_class_and_attribute():
    """A known layer class holding a tensor in an attribute evalkit has no role for (a future
    transformers field) is refused by name, never counted as nothing."""
    from transformers import DynamicCache, LlamaConfig, RecurrentGemmaConfig
    from transformers.cache_utils import LinearAttentionLayer

    layer = LinearAttentionLayer()
    layer.conv_states[0] = torch.zeros(1, 4, 3)
    layer.delta_history = [torch.zeros(1, 4)]
    cache = DynamicCache()
    cache.layers = [layer]
    with pytest.raises(UnknownCacheError, match=r"LinearAttentionLayer.*'delta_history\[0\]'"):
        cache_state(cache)
    with pytest.raises(UnknownCacheError, match="delta_history"):
        fork_cache(cache)
    # RecurrentGemma keeps its states on its modules: run (ModuleState), no longer refused
    assert state_family(RecurrentGemmaConfig(num_hidden_layers=2, hidden_size=32)) == "recurrent"
    assert state_family(LlamaConfig(num_hidden_layers=2, hidden_size=32)) == "kv"


def test_softmax_only_options_are_refused_by_name(tmp_path):
    folder = build_family("rwkv", tmp_path / "rwkv")
    with pytest.raises(ValueError, match="window.*rwkv"):
        load_model(f"hf:{folder}", window=8)


@pytest.mark.parametrize("name", ["mamba", "falcon_h1"])
def test_memory_matched_baseline_of_a_recurrent_or_hybrid_checkpoint(name, tmp_path):
    from test_softmax_adapter import build_tiny_llama

    from evalkit.model_adapters.softmax import SoftmaxAdapter

    folder = build_family(name, tmp_path / name)
    fixed = measured_at(family_config(name), 8, torch.float32).fixed
    assert fixed == state_at(family_config(name), 8, torch.float32).fixed > 0
    llama = SoftmaxAdapter(build_tiny_llama(tmp_path / "llama"), match_state_of=f"hf:{folder}")
    assert llama.kv_budget_bytes == fixed  # a hybrid: its fixed part, not its growing KV
    assert llama.window == fixed // llama.kv_bytes_per_token
    with pytest.raises(ValueError, match="no fixed state size"):
        SoftmaxAdapter(tmp_path / "llama", match_state_of=f"hf:{tmp_path / 'llama'}")


def test_evalkit_run_records_the_measured_state(tmp_path):
    """Samples of a recurrent and a hybrid checkpoint carry their kind and the bytes of their
    cache's tensors at the question (the formula at the prompt's length)."""
    from runner_support import build_tokenizer, read_samples, run, suite_dict

    models = [{"name": n, "spec": f"hf:{build_family(n, tmp_path / n)}", "options": {}}
              for n in ("mamba2", "bamba")]
    cfg = suite_dict(build_tokenizer(tmp_path / "tok"), models=models, lengths=[64],
                     depths=[0.5], loads=[1], samples=1)
    for m in cfg["models"]:
        m["options"].pop("tokenizer")  # these checkpoints carry their own
    assert run(cfg, tmp_path / "run").failed == 0
    samples = read_samples(tmp_path / "run")
    assert {s["model"] for s in samples} == {"mamba2", "bamba"}
    for s in samples:
        want = state_at(family_config(s["model"]), s["prompt_tokens"], torch.float32)
        assert (s["state_kind"], s["state_bytes"]) == (KIND[s["model"]], want.total), s


def test_hybrids_have_their_own_marker_on_the_board():
    from evalkit.leaderboard.plots import _style

    kinds = {"h": "hybrid", "r": "recurrent", "k": "kv"}
    markers = {m: _style(m, kinds, {"r": 0.0})["marker"] for m in kinds}
    assert len(set(markers.values())) == 3
