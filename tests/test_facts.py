"""One reader of a model's facts (model_adapters/facts.py), per family, on the configs shipped
in the repository: trained length and positional range by the documented key order, parameters
against the real model, state and KV bytes and mixer FLOPs against the arithmetic written out
by hand; the served adapter reads the same; a missing or bad trained length names the file."""
from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")

import pytest
import torch
from transformers import AutoModelForCausalLM, GPT2Config, PretrainedConfig

from evalkit.model_adapters.facts import (TRAINED_LENGTH_KEYS, config_facts, hf_facts,
                                          read_config)
from evalkit.model_adapters.gla.config import GLAConfig
from evalkit.model_adapters.gla.model import GLAForCausalLM

ROOT = Path(__file__).resolve().parents[1]
MQAR = ROOT / "model_adapters" / "mqar"
TINY = ROOT / "model_adapters" / "tiny"
LAPLACE = ROOT / "configs" / "models" / "laplace-3b.json"


def _meta_gla_parameters(path: Path) -> int:
    with torch.device("meta"):
        return GLAForCausalLM(GLAConfig.from_json(path)).num_parameters()


# -- GLA configs ------------------------------------------------------------------------------
def test_gla_twin_state_flops_and_lengths_by_hand():
    f = config_facts(MQAR / "mqar-gla-d64")
    # a gated conv layer (64 channels x kernel 3), then a GLA layer: 2 heads of d_k 16 x d_v 32
    per_seq = 64 * 3 + 2 * 16 * 32
    for T in (1, 256, 8192):  # fixed: the same at every length
        s = f.state_at(T, "fp32")
        assert (s.fixed, s.window, s.growing, s.kind) == (per_seq * 4, 0, 0, "recurrent")
    assert f.state_at(8192, torch.bfloat16).total == per_seq * 2
    assert f.mixer_flops(0) == f.mixer_flops(8191) == 4 * 2 * 16 * 32
    assert (f.family, f.trained_length, f.max_length) == ("gla", 256, None)
    assert f.parameters() == _meta_gla_parameters(MQAR / "mqar-gla-d64" / "config.json")
    assert f.softmax_kv_bytes(1024, "fp32") == 2 * 2 * 64 * 1024 * 4


def test_gla_attention_twin_grows_a_kv_cache_by_hand():
    f = config_facts(MQAR / "mqar-attn-d64" / "config.json")
    for T in (1, 300, 8192):  # one attention layer (1 head of 64, no window) + the gated conv
        s = f.state_at(T, "fp32")
        assert (s.fixed, s.growing, s.kind) == (64 * 3 * 4, 2 * 64 * T * 4, "kv")
    assert [f.mixer_flops(t) for t in (0, 9)] == [4 * 64 * 1, 4 * 64 * 10]
    # max_position_embeddings=256 is in the file too: a GLA config reads trained_length alone
    assert (f.trained_length, f.max_length) == (256, None)


def test_laplace_published_figures_and_fla_default_is_no_trained_length():
    f = config_facts(LAPLACE)
    assert f.state_at(8192, "bf16").total == 29_491_200  # the README's 29.5 MB
    assert f.softmax_kv_bytes(8192, "bf16") == 2 * 24 * 3072 * 8192 * 2
    assert f.parameters() == _meta_gla_parameters(LAPLACE) == 3_029_243_904
    assert json.loads(LAPLACE.read_text())["max_position_embeddings"] == 8192
    assert (f.trained_length, f.max_length) == (None, None)


# -- transformers configs --------------------------------------------------------------------
def test_softmax_config_by_hand_and_parameters_of_the_real_model():
    folder = TINY / "recall-softmax-tiny"
    f = config_facts(folder)
    # Llama: 4 layers x (K and V of 4 kv heads x 32) a token, fp32
    for T in (1, 1152, 8192):
        s = f.state_at(T, "fp32")
        assert (s.growing, s.fixed, s.window, s.kind) == (4 * 2 * 4 * 32 * T * 4, 0, 0, "kv")
    assert f.mixer_flops(5) == 4 * 4.0 * 4 * 32 * 6
    # no trained_length key: the positional range is both
    assert (f.family, f.trained_length, f.max_length) == ("llama", 1152, 1152)
    model = AutoModelForCausalLM.from_pretrained(str(folder), local_files_only=True)
    assert f.parameters() == model.num_parameters() == 1_328_256


def test_recurrent_config_by_hand():
    folder = TINY / "recall-mamba2-tiny"
    f = config_facts(folder)
    # Mamba-2, 7 layers: conv tail (inner 256 + 2 x 1 group x d_state 64) x kernel 4 in the
    # model's dtype, SSM state 4 heads x 64 x 64 always fp32
    conv, ssm = (256 + 2 * 64) * 4, 4 * 64 * 64
    assert f.state_at(8192, "fp32").total == 7 * (conv + ssm) * 4 == 501_760
    assert f.state_at(1, "bf16").total == 7 * (conv * 2 + ssm * 4) == 480_256
    assert f.state_at(1, "fp32").kind == "recurrent"
    # its own trained_length; a recurrent config has no positional range
    assert (f.family, f.trained_length, f.max_length) == ("mamba2", 1152, None)
    log = json.loads((folder / "train_log.json").read_text())
    assert f.parameters() == log["params"]


def test_trained_length_key_order(tmp_path):
    """trained_length first, then the positional keys in TRAINED_LENGTH_KEYS' order; a
    transformers key holding no positive number counts as unset."""
    assert TRAINED_LENGTH_KEYS == ("trained_length", "max_position_embeddings", "n_positions",
                                   "max_sequence_length", "seq_length")
    src = TINY / "recall-softmax-tiny" / "config.json"
    cfg = tmp_path / "config.json"
    cfg.write_text(json.dumps({**json.loads(src.read_text()), "trained_length": 1000}))
    f = config_facts(tmp_path)
    assert (f.trained_length, f.max_length) == (1000, 1152)
    gpt2 = hf_facts(GPT2Config(n_positions=512, n_layer=1, n_embd=8, n_head=2, vocab_size=10))
    assert (gpt2.trained_length, gpt2.max_length) == (512, 512)
    remote = hf_facts(PretrainedConfig(max_position_embeddings=0, max_sequence_length=None,
                                       seq_length=300))
    assert (remote.trained_length, remote.max_length) == (300, 300)


def test_the_served_adapter_reads_the_same_facts():
    from test_served_client import Fake
    from test_served_client_adapter import served, vllm_like

    folder = TINY / "recall-mamba2-tiny"
    with Fake(vllm_like) as srv:
        m = served(srv.url, config=str(folder))
        f = config_facts(folder)
        assert m.trained_length == f.trained_length == 1152
        state = m.prefill([1, 2, 3])
        assert m.state_parts(state) == f.state_at(3, "fp32")
        assert m.state_kind == "recurrent"


# -- errors ----------------------------------------------------------------------------------
def _copy_without(tmp_path: Path, folder: Path, key: str) -> Path:
    out = tmp_path / folder.name
    shutil.copytree(folder, out, ignore=shutil.ignore_patterns("*.safetensors"))
    cfg = out / "config.json"
    raw = json.loads(cfg.read_text())
    raw.pop(key)
    cfg.write_text(json.dumps(raw))
    return cfg


def test_no_trained_length_where_one_is_required_names_the_file_and_the_keys(tmp_path):
    gla = _copy_without(tmp_path, MQAR / "mqar-gla-d64", "trained_length")
    f = config_facts(gla)
    assert f.trained_length is None
    with pytest.raises(ValueError) as e:
        f.required_trained_length()
    assert str(e.value).startswith(f"{gla}: no trained length: none of trained_length is set")
    hf = _copy_without(tmp_path, TINY / "recall-mamba2-tiny", "trained_length")
    with pytest.raises(ValueError, match="none of trained_length, max_position_embeddings, "
                                         "n_positions, max_sequence_length, seq_length is set"
                       ) as e:
        config_facts(hf).required_trained_length()
    assert str(hf) in str(e.value)


def test_a_bad_trained_length_names_the_file(tmp_path):
    cfg = _copy_without(tmp_path, TINY / "recall-mamba2-tiny", "trained_length")
    cfg.write_text(json.dumps({**json.loads(cfg.read_text()), "trained_length": "abc"}))
    with pytest.raises(ValueError, match="trained_length must be a positive integer") as e:
        config_facts(cfg.parent)
    assert str(cfg) in str(e.value)
    cfg.write_text("{not json")
    with pytest.raises(ValueError, match=f"{cfg}: not valid JSON"):
        read_config(cfg)
