"""Static-shape buckets: padding never changes real rows; one compilation per bucket touched."""
from __future__ import annotations

import dataclasses
import importlib.util

import pytest
import torch

from evalkit.model_adapters.gla.buckets import BucketedRunner, BucketSpec, counting_backend
from evalkit.model_adapters.gla.config import GLAConfig
from evalkit.model_adapters.gla.model import GLAForCausalLM

V = 97


@pytest.fixture(scope="module")
def model():
    cfg = GLAConfig(vocab_size=V, hidden_size=64, num_heads=4, num_kv_heads=2, num_hidden_layers=2,
                    use_short_conv=True, conv_size=4)
    m = GLAForCausalLM(cfg).init_weights(0)
    with torch.no_grad():
        for name, p in m.named_parameters():
            if "norm" not in name:
                p.mul_(8)
    m.set_ops(chunk_size=16)
    return m.eval()


def prompts(*lengths, seed=0):
    g = torch.Generator().manual_seed(seed)
    return [torch.randint(0, V, (n,), generator=g).tolist() for n in lengths]


SPEC = BucketSpec(batch_sizes=(1, 2, 4), lengths=(16, 32, 64))


def test_bucket_choice():
    assert SPEC.segments(5) == [16] and SPEC.segments(17) == [32] and SPEC.segments(64) == [64]
    assert SPEC.segments(150) == [64, 64, 32]
    assert SPEC.batch_bucket(3) == 4 and SPEC.batch_bucket(1) == 1
    with pytest.raises(ValueError, match="exceeds the largest batch bucket 4"):
        SPEC.batch_bucket(5)


def test_padding_leaves_real_rows_unchanged(model):
    rows = prompts(3, 20, 41)  # batch 3 -> width 4 (one padded row); 41 -> segments 64: right pad
    ref = [model.prefill(torch.tensor([p])) for p in rows]  # unpadded, one at a time
    runs = {}
    for pad_id in (0, 55):  # different padding contents, same shapes
        runs[pad_id] = BucketedRunner(model, SPEC, pad_id=pad_id).run([(None, None, p) for p in rows])
    for (l_ref, s_ref), (l0, s0), (l1, s1) in zip(ref, runs[0], runs[55]):
        torch.testing.assert_close(l0, l_ref[0], rtol=1e-5, atol=1e-5)
        for a, b in zip(s0.tensors(), s_ref.tensors()):
            torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-5)
        # Same shapes, different pads: real rows are bit-identical.
        assert torch.equal(l0, l1)
        assert all(torch.equal(a, b) for a, b in zip(s0.tensors(), s1.tensors()))


def test_padding_with_carried_state_and_decode(model):
    a, b = prompts(9, 30, seed=1)
    runner = BucketedRunner(model, SPEC)
    [(la, sa)] = runner.run([(None, None, a)])
    [(lab, sab)] = runner.run([(sa, la, b)])  # extend a carried state by a padded segment
    l_ref, s_ref = model.prefill(torch.tensor([a + b]))
    torch.testing.assert_close(lab, l_ref[0], rtol=1e-5, atol=1e-5)
    for x, y in zip(sab.tensors(), s_ref.tensors()):
        torch.testing.assert_close(x, y, rtol=1e-5, atol=1e-5)
    # Decode at width 2 for 1 + a padded row equals the eager single step.
    [(ld, sd)] = runner.decode([5], [sab])
    l_eager, s_eager = model.decode_step(torch.tensor([5]), s_ref)
    torch.testing.assert_close(ld, l_eager[0], rtol=1e-5, atol=1e-5)
    for x, y in zip(sd.tensors(), s_eager.tensors()):
        torch.testing.assert_close(x, y, rtol=1e-5, atol=1e-5)


def test_one_compilation_per_bucket(model):
    one_layer = GLAForCausalLM(dataclasses.replace(model.config, num_hidden_layers=1))
    one_layer.set_ops(chunk_size=16)  # one layer: dynamo traces faster, same code paths
    backend = counting_backend()  # dynamo traces for real; the graph then runs eagerly
    runner = BucketedRunner(one_layer.eval(), BucketSpec(batch_sizes=(1, 4), lengths=(16, 64)),
                            compile=True, backend=backend)
    batches = [prompts(3), prompts(5), prompts(9), prompts(14),       # -> (1, 16)
               prompts(2, 7), prompts(3, 4, 5), prompts(8, 9, 10, 11),  # -> (4, 16)
               prompts(20), prompts(40), prompts(63),                 # -> (1, 64)
               prompts(17, 30), prompts(50, 60, 61)]                  # -> (4, 64)
    for rows in batches:
        runner.run([(None, None, p) for p in rows])
    empty = one_layer.empty_state(1)
    for n in (1, 2, 3):                                               # -> widths 1, 4
        runner.decode(list(range(n)), [empty] * n)
    assert len(runner.shapes_seen) == 15
    assert len(runner.buckets_touched) == 6
    assert backend.count == 6  # compilations = buckets touched, not shapes seen
    runner.run([(None, None, p) for p in prompts(4, 10)])  # a new shape in a known bucket
    assert backend.count == 6


def test_neuron_alignment():
    SPEC.check(16, "cpu")  # any chunk on cpu
    with pytest.raises(ValueError, match="multiple of 128"):
        BucketSpec(lengths=(128, 256)).check(64, "neuron")
    with pytest.raises(ValueError, match=r"\[192\] are not multiples of chunk_size 128"):
        BucketSpec(lengths=(128, 192)).check(128, "neuron")
    BucketSpec(lengths=(128, 512, 2048)).check(128, "neuron")


@pytest.mark.skipif(importlib.util.find_spec("torch_neuronx") is None,
                    reason="torch-neuronx is not installable here (the public package is a placeholder)")
def test_neuron_device_runs(model):  # pragma: no cover - needs Trainium
    from evalkit.model_adapters.gla import xla
    m = GLAForCausalLM(model.config).to(xla.xla_device("neuron"))
    m.load_state_dict(model.state_dict())
    m.set_ops(chunk_size=128)
    runner = BucketedRunner(m, BucketSpec(lengths=(128,)), device="neuron", sync=xla.sync)
    [(logits, _)] = runner.run([(None, None, prompts(50)[0])])
    ref, _ = model.prefill(torch.tensor(prompts(50)))
    torch.testing.assert_close(logits.cpu(), ref[0], rtol=1e-2, atol=1e-2)
