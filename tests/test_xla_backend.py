"""The GLA adapter on XLA (device="xla", here XLA's CPU PJRT client): equal to CPU eager fp32,
one compilation per bucket touched, and the same answers through `evalkit run`.

Runs in the environment `make test-xla` builds (torch 2.9 + torch-xla 2.9, PJRT_DEVICE=CPU);
skipped where torch_xla is not installed."""
from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest
import torch

os.environ.setdefault("PJRT_DEVICE", "CPU")  # no TPU or Neuron here: XLA's CPU client
pytest.importorskip("torch_xla")
pytestmark = pytest.mark.xla

from evalkit.model_adapters.gla import GLAConfig, GLAForCausalLM, xla  # noqa: E402
from evalkit.model_adapters.gla.buckets import BucketedRunner, BucketSpec  # noqa: E402
from evalkit.model_adapters.models import load_model  # noqa: E402

from helpers import TINY_TOKENIZER, save_peaked_gla  # noqa: E402

# fp32 on both sides; XLA's chunked operator takes the log-space path (eager CPU the one-matmul
# fast path) and fuses differently, so the sums round differently: measured max |delta| about
# 1e-5 on logits of magnitude 10-50.
TOL = 1e-4


@pytest.fixture(scope="module")
def random_ckpt(tmp_path_factory):
    """A random fla-format checkpoint with short convolutions and grouped kv heads (4 query
    heads share 2 kv heads), saved with the project's tiny tokenizer."""
    folder = tmp_path_factory.mktemp("gla-gqa-conv")
    cfg = GLAConfig(vocab_size=2048, hidden_size=64, num_heads=4, num_kv_heads=2, num_hidden_layers=2,
                    use_short_conv=True, conv_size=4)
    return save_peaked_gla(cfg, folder, 8)


MODELS = {  # name -> (options for both adapters, bucket options for the xla one)
    # one 128-token bucket: a 200-token prompt streams through two segments of one graph
    "recall-gla-tiny": ({}, dict(length_buckets=(128,), batch_buckets=(1, 2))),
    "random-gqa-conv": (dict(chunk_size=16, tokenizer=str(TINY_TOKENIZER)),
                        dict(length_buckets=(16, 32), batch_buckets=(1, 2))),
}


@pytest.mark.parametrize("which", sorted(MODELS))
def test_xla_equals_cpu_eager(which, random_ckpt):
    name = which if which == "recall-gla-tiny" else f"gla:{random_ckpt}"
    opts, buckets = MODELS[which]
    cpu = load_model(name, **opts)
    dev = load_model(name, device="xla", **opts, **buckets)
    assert not cpu.compiled and dev.compiled and dev.identity()["pjrt_device"] == "CPU"
    g = torch.Generator().manual_seed(1)
    prompts = [torch.randint(3, 2048, (n,), generator=g).tolist() for n in (200, 7, 45)]
    ref = [cpu.prefill(p) for p in prompts]
    got = [dev.prefill(prompts[0])] + dev.prefill_batch(prompts[1:])  # alone, then a batch of 2
    dlogit, dlogp = [], []
    for r, x in zip(ref, got):
        assert all(t.device.type == "xla" for t in x.state.tensors())  # the state stays there
        dlogit.append((x.last_logits.cpu() - r.last_logits).abs().max().item())
        for a, b in zip(x.state.tensors(), r.state.tensors()):
            torch.testing.assert_close(a.cpu(), b, rtol=0, atol=TOL)
    # decode: log-probabilities of continuations token by token, and greedy text
    conts = [prompts[2][:6], prompts[1][:3], [5]]
    for r, x in zip(ref, got):
        for a, b, c in zip(dev.score(x, conts), cpu.score(r, conts), conts):
            dlogp.append(abs(a - b) / len(c))  # per token
        assert dev.generate(x, 6) == cpu.generate(r, 6)
    # extend a carried state, then decode from it
    more = prompts[2][:20]
    xe, re_ = dev.extend(got[0], more), cpu.extend(ref[0], more)
    dlogit.append((xe.last_logits.cpu() - re_.last_logits).abs().max().item())
    assert dev.generate(xe, 4) == cpu.generate(re_, 4)
    print(f"{which}: xla vs cpu eager fp32: max |dlogit| {max(dlogit):.2e}, "
          f"max |dlogprob| per token {max(dlogp):.2e} (tolerance {TOL:g})")
    assert max(dlogit) <= TOL and max(dlogp) <= TOL


def test_bf16_on_xla(random_ckpt):
    opts = dict(chunk_size=16, tokenizer=str(TINY_TOKENIZER), dtype="bf16")
    cpu = load_model(f"gla:{random_ckpt}", **opts)
    dev = load_model(f"gla:{random_ckpt}", device="xla", length_buckets=(16,), batch_buckets=(1,), **opts)
    p = list(range(3, 30))
    a, b = dev.prefill(p).last_logits.cpu(), cpu.prefill(p).last_logits
    assert dev.identity()["dtype"] == "bf16"
    assert (a - b).abs().max() < 0.05 * b.abs().max()  # bf16 rounds differently per backend


def test_one_compilation_per_bucket_then_none():
    # A config no other test uses: none of its graphs can already be in XLA's cache.
    cfg = GLAConfig(vocab_size=61, hidden_size=32, num_heads=2, num_kv_heads=1, num_hidden_layers=1,
                    use_short_conv=True, conv_size=3)
    m = GLAForCausalLM(cfg).init_weights(3).eval()
    m.set_ops(chunk_size=8)
    m = m.to(xla.xla_device("xla"))
    runner = BucketedRunner(m, BucketSpec(batch_sizes=(1, 2), lengths=(8, 16)), sync=xla.sync)
    g = torch.Generator().manual_seed(0)
    lengths = [[3], [11], [2, 6], [15, 9], [5], [40], [7, 16], [1]]  # 40 -> segments 16, 16, 8

    def workload():
        states = []
        for batch in lengths:
            rows = runner.run([(None, None, torch.randint(0, 61, (n,), generator=g).tolist())
                               for n in batch])
            states += [s for _, s in rows]
        for width in (1, 2, 1):
            runner.decode([4] * width, states[:width])

    before, _ = xla.compilations()
    workload()
    first, _ = xla.compilations()
    assert runner.buckets_touched == {("prefill", 1, 8), ("prefill", 1, 16), ("prefill", 2, 8),
                                      ("prefill", 2, 16), ("decode", 1, 1), ("decode", 2, 1)}
    assert len(runner.shapes_seen) > len(runner.buckets_touched)
    assert first - before == len(runner.buckets_touched)  # 4 prefill buckets + 2 decode widths
    workload()
    assert xla.compilations()[0] == first  # the same workload again: all cache hits


def _needle_run(out, *model_args):
    cmd = [sys.executable, "-m", "evalkit", "run", "--models", "recall-gla-tiny", "--tasks", "needle",
           "--lengths", "100", "--depths", "0.2,0.8", "--samples", "1", "--output", str(out),
           "--no-progress", *model_args]
    r = subprocess.run(cmd, capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stderr[-2000:]
    rows = [json.loads(line) for line in (out / "samples.jsonl").read_text().splitlines()]
    return sorted(rows, key=lambda s: s["probe_id"])


def test_cli_needle_on_xla_matches_cpu(tmp_path):
    cpu = _needle_run(tmp_path / "cpu")
    dev = _needle_run(tmp_path / "xla", "--model-args", "device=xla")
    assert len(cpu) == len(dev) == 2
    for a, b in zip(cpu, dev):
        assert a["probe_hash"] == b["probe_hash"] and a["prediction"] == b["prediction"]
        assert a["scores"] == b["scores"]
        assert max(abs(x - y) for x, y in zip(a["candidate_logprobs"], b["candidate_logprobs"])) <= TOL * 10
    assert cpu[0]["scores"]["exact_match"] == 1.0  # the model finds these needles: a real comparison
