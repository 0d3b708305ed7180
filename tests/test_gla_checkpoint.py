"""fla-format checkpoints: every layout loads with identical logits; a wrong one lists its faults."""
from __future__ import annotations

import hashlib
import json

import pytest
import torch
from safetensors.torch import load_file, save_file

from evalkit.model_adapters.gla import CheckpointError, GLAConfig, GLAForCausalLM
from evalkit.model_adapters.gla.checkpoint import load_checkpoint, save_checkpoint, weight_files
from evalkit.model_adapters.weights import weights_hash


def tiny(**kw) -> GLAConfig:
    base = dict(vocab_size=89, hidden_size=48, num_heads=2, num_hidden_layers=2, expand_k=0.5,
                expand_v=1.0, intermediate_size=80)
    base.update(kw)
    return GLAConfig(**base)


def random_model(cfg: GLAConfig, seed: int = 0) -> GLAForCausalLM:
    m = GLAForCausalLM(cfg).init_weights(seed)
    with torch.no_grad():  # non-trivial norms and biases so that a mix-up would change logits
        for name, p in m.named_parameters():
            if "norm" in name or name.endswith("bias"):
                p.copy_(1 + 0.5 * torch.randn(p.shape, generator=torch.Generator().manual_seed(seed)))
    return m.eval()


IDS = torch.randint(0, 89, (2, 23), generator=torch.Generator().manual_seed(0))


@pytest.mark.parametrize("mlp_layout", ["split", "fused"])
@pytest.mark.parametrize("conv", [False, True])
@pytest.mark.parametrize("tied", [False, True])
def test_fla_layouts_round_trip(tmp_path, mlp_layout, conv, tied):
    cfg = tiny(use_short_conv=conv, tie_word_embeddings=tied)
    m = random_model(cfg)
    save_checkpoint(m, cfg, tmp_path, mlp_layout=mlp_layout)
    names = load_file(str(tmp_path / "model.safetensors"))
    # The file really is in fla's layout.
    assert ("model.layers.0.mlp.up_proj.weight" in names) == (mlp_layout == "split")
    if mlp_layout == "fused":
        assert names["model.layers.0.mlp.gate_proj.weight"].shape == (2 * 80, 48)
    assert ("model.layers.1.attn.q_conv1d.weight" in names) == conv
    assert ("lm_head.weight" in names) == (not tied)
    assert "model.layers.0.attn.gk_proj.1.bias" in names
    assert "model.layers.0.attn.g_norm_swish_gate.weight" in names
    loaded, cfg2 = load_checkpoint(tmp_path)
    assert cfg2 == cfg
    with torch.no_grad():
        assert torch.equal(loaded(IDS), m(IDS))
    if tied:
        assert loaded.lm_head.weight is loaded.model.embeddings.weight


def test_unfused_norm_name_and_bf16_load(tmp_path):
    cfg = tiny(fuse_norm=False)
    m = random_model(cfg)
    save_checkpoint(m, cfg, tmp_path)
    assert "model.layers.0.attn.g_norm.weight" in load_file(str(tmp_path / "model.safetensors"))
    loaded, _ = load_checkpoint(tmp_path, dtype="bf16")
    assert loaded.lm_head.weight.dtype == torch.bfloat16
    with torch.no_grad():
        ref = m(IDS)
        assert (loaded(IDS).float() - ref).abs().max() < 0.05 * ref.abs().max()


def test_either_norm_name_loads(tmp_path):
    cfg = tiny()  # fuse_norm=True: our name is g_norm_swish_gate; a g_norm file must load too
    m = random_model(cfg)
    save_checkpoint(m, cfg, tmp_path, norm_name="g_norm")
    loaded, _ = load_checkpoint(tmp_path)
    with torch.no_grad():
        assert torch.equal(loaded(IDS), m(IDS))


def test_wrong_checkpoint_lists_every_bad_tensor(tmp_path):
    cfg = tiny(use_short_conv=True)
    save_checkpoint(random_model(cfg), cfg, tmp_path)
    path = tmp_path / "model.safetensors"
    t = load_file(str(path))
    del t["model.layers.1.attn.k_proj.weight"]
    del t["model.norm.weight"]
    t["model.layers.0.attn.h_conv1d.weight"] = torch.zeros(48, 1, 4)
    t["model.layers.0.attn.gk_proj.0.weight"] = torch.zeros(8, 48)
    save_file(t, str(path))
    with pytest.raises(CheckpointError) as e:
        load_checkpoint(tmp_path)
    msg = str(e.value)
    for needle in ("missing (2)", "model.layers.1.attn.k_proj.weight", "model.norm.weight",
                   "unexpected (1)", "model.layers.0.attn.h_conv1d.weight",
                   "wrong shape (1)", "model.layers.0.attn.gk_proj.0.weight: (8, 48), expected (16, 48)"):
        assert needle in msg, msg


def test_config_fields(tmp_path):
    d = tiny().to_dict()
    d.pop("norm_eps")
    d.update(rms_norm_eps=1e-5, use_gk=True, fuse_cross_entropy=True, transformers_version="4.0")
    (tmp_path / "config.json").write_text(json.dumps(d))
    cfg = GLAConfig.from_json(tmp_path)
    assert cfg.norm_eps == 1e-5  # the older name is accepted
    assert cfg.extra["transformers_version"] == "4.0"  # extra fields tolerated and kept
    assert GLAConfig.from_dict(cfg.to_dict()) == cfg
    for bad, needle in [(dict(hidden_size="big"), "hidden_size must be int"),
                        (dict(num_hidden_layers=2.5), "num_hidden_layers must be int"),
                        (dict(use_short_conv="yes"), "use_short_conv must be bool"),
                        (dict(model_type="llama"), "expected 'gla'"),
                        (dict(num_heads=5), "divisible by num_heads=5"),
                        (dict(num_kv_heads=3, num_heads=2), "multiple of num_kv_heads=3"),
                        (dict(hidden_act="gelu"), "hidden_act 'gelu' unsupported")]:
        with pytest.raises(ValueError, match=needle):
            GLAConfig.from_dict({**tiny().to_dict(), **bad}, source="cfg")


def test_missing_files_and_shards(tmp_path):
    cfg = tiny()
    m = random_model(cfg)
    cfg.save(tmp_path)
    torch.save({}, tmp_path / "pytorch_model.bin")
    with pytest.raises(CheckpointError, match="pytorch_model.bin: convert it to safetensors"):
        load_checkpoint(tmp_path)
    # Two shards with an index, as transformers writes large checkpoints.
    sd = {k: v.contiguous() for k, v in m.state_dict().items()}
    keys = sorted(sd)
    parts = {"model-00001-of-00002.safetensors": keys[: len(keys) // 2],
             "model-00002-of-00002.safetensors": keys[len(keys) // 2:]}
    for fname, ks in parts.items():
        save_file({k: sd[k] for k in ks}, str(tmp_path / fname))
    (tmp_path / "model.safetensors.index.json").write_text(json.dumps(
        {"metadata": {}, "weight_map": {k: f for f, ks in parts.items() for k in ks}}))
    loaded, _ = load_checkpoint(tmp_path)
    with torch.no_grad():
        assert torch.equal(loaded(IDS), m(IDS))
    # shards: the hash of the sorted "name:sha256" lines of the shard files
    lines = "".join(f"{f}:{hashlib.sha256((tmp_path / f).read_bytes()).hexdigest()}\n"
                    for f in sorted(parts))
    assert weights_hash(weight_files(tmp_path)) == hashlib.sha256(lines.encode()).hexdigest()
