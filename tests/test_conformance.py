"""The adapter protocol, checked the same way for every adapter.

To cover a new adapter, append a `Case` to CASES: an id, a factory `make(tmp_path_factory)`
returning the adapter, and what it needs (a registered model name or an importable module;
the case is skipped with that reason until it exists).

Checks: the optional capabilities are declared (evalkit.model_adapters.protocol.CAPABILITIES; a served model
serves); prefill(a+b) equals extend(prefill(a), b) (and token-by-token extension); forks are
independent both ways; greedy generation is deterministic and leaves the state unchanged;
score agrees with generate (each greedy token outscores alternatives at its position) and is
additive over extension; state_bytes equals the adapter's own accounting (`state_tensors`,
`state_bytes_at` when present) and behaves as its `state_kind` says (kv: linear in length;
kv-window: capped at the window; recurrent: constant).
"""
from __future__ import annotations

import importlib.util
import os
from dataclasses import dataclass
from typing import Any, Callable

os.environ.setdefault("HF_HUB_OFFLINE", "1")

import pytest
import torch

from evalkit.model_adapters.models import load_model, model_names
from evalkit.tokenization import encode

TEXT_A = "the quick brown fox jumps over the lazy dog while a small bird sings in the old oak tree"
TEXT_B = "near the river and the farmer counts seven red apples before the sun goes down"
CONTINUATIONS = [" over the quiet hills", " and a blue ball", " quiet"]


@dataclass(frozen=True)
class Case:
    id: str
    make: Callable[[Any], Any]
    needs_model: str | None = None   # a registered model name
    needs_module: str | None = None  # an importable module


def _tiny_llama(tmp_path_factory, **options):
    from test_softmax_adapter import build_tiny_llama

    from evalkit.model_adapters.softmax import SoftmaxAdapter

    folder = tmp_path_factory.getbasetemp() / "conformance-tiny-llama"
    if not (folder / "config.json").is_file():
        build_tiny_llama(folder)
    return SoftmaxAdapter(str(folder), **options)


def _random_gla(tmp_path_factory):
    """A random 2-layer GLA checkpoint in fla format with the word-level test tokenizer."""
    from test_softmax_adapter import build_tiny_llama

    from evalkit.model_adapters.gla import GLAConfig, GLAForCausalLM
    from evalkit.model_adapters.gla.checkpoint import save_checkpoint

    folder = tmp_path_factory.mktemp("conformance-gla")
    build_tiny_llama(folder)  # for its tokenizer files; the Llama config/weights are replaced
    for f in ("config.json", "model.safetensors", "generation_config.json"):
        (folder / f).unlink(missing_ok=True)
    cfg = GLAConfig(vocab_size=96, hidden_size=48, num_heads=2, num_hidden_layers=2, expand_k=0.5,
                    expand_v=1.0, intermediate_size=80)
    model = GLAForCausalLM(cfg).init_weights(0)
    with torch.no_grad():  # peaky logits (stable greedy choices); specials never greedy
        model.lm_head.weight.mul_(50)
        model.lm_head.weight[:3] = 0
    save_checkpoint(model, cfg, folder)
    return load_model(f"gla:{folder}")


def _hf_family(tmp_path_factory, family: str, **options):
    """A tiny random checkpoint of a transformers recurrent or hybrid family (hf_families)."""
    from hf_families import build_family
    from test_softmax_adapter import build_tiny_llama

    folder = tmp_path_factory.mktemp(f"conformance-{family}")
    build_tiny_llama(folder)  # for its word-level tokenizer (96 ids; 0-2 special)
    for f in ("config.json", "model.safetensors", "generation_config.json"):
        (folder / f).unlink(missing_ok=True)
    build_family(family, folder, tokenizer=folder, vocab=96, specials=3, peak=8.0)
    return load_model(f"hf:{folder}", **options)


CASES = [
    Case("oracle", lambda tp: load_model("oracle"), needs_model="oracle"),
    Case("forgetful", lambda tp: load_model("forgetful"), needs_model="forgetful"),
    Case("tiny-llama", lambda tp: _tiny_llama(tp, prefill_chunk=7)),
    Case("tiny-llama-window", lambda tp: _tiny_llama(tp, window=12, prefill_chunk=5)),
    Case("tiny-llama-window-sink", lambda tp: _tiny_llama(tp, window=12, sink=3, prefill_chunk=4)),
    Case("gla-random", _random_gla, needs_module="evalkit.model_adapters.gla.adapter"),
    Case("hf-mamba", lambda tp: _hf_family(tp, "mamba")),
    Case("hf-mamba2", lambda tp: _hf_family(tp, "mamba2", prefill_chunk=7)),
    Case("hf-rwkv", lambda tp: _hf_family(tp, "rwkv", prefill_chunk=7)),
    Case("hf-falcon-h1", lambda tp: _hf_family(tp, "falcon_h1", prefill_chunk=7)),
    Case("smollm2-135m", lambda tp: load_model("smollm2-135m")),
    Case("smollm2-135m-window", lambda tp: load_model("smollm2-135m", window=16, prefill_chunk=24)),
    Case("recall-gla-tiny", lambda tp: load_model("recall-gla-tiny"), needs_model="recall-gla-tiny"),
    Case("recall-softmax-tiny", lambda tp: load_model("recall-softmax-tiny"),
         needs_model="recall-softmax-tiny"),
]


@pytest.fixture(scope="session", params=CASES, ids=[c.id for c in CASES])
def adapter(request, tmp_path_factory):
    case: Case = request.param
    if case.needs_module and importlib.util.find_spec(case.needs_module) is None:
        pytest.skip(f"{case.needs_module} is not built yet")
    if case.needs_model and case.needs_model not in model_names():
        pytest.skip(f"model {case.needs_model!r} is not registered yet")
    return case.make(tmp_path_factory)


def close(x: list[float], y: list[float]) -> bool:
    return x == pytest.approx(y, rel=1e-4, abs=1e-3)


def pieces(adapter) -> tuple[list[int], list[int], list[list[int]]]:
    tok = adapter.tokenizer
    a, b = encode(tok, TEXT_A), encode(tok, " " + TEXT_B)
    conts = [encode(tok, c) for c in CONTINUATIONS]
    assert len(a) > 8 and len(b) > 4 and all(conts)
    return a, b, conts


def test_capabilities_are_declared(adapter):
    """Every family declares its optional capabilities (None where absent): the runner asks
    the attribute and never probes. None of these families is served."""
    from evalkit.model_adapters.protocol import CAPABILITIES, check_capabilities

    assert check_capabilities(adapter, adapter.name) is adapter
    assert adapter.serving is None
    for name in CAPABILITIES[1:]:
        assert getattr(adapter, name) is None or callable(getattr(adapter, name)), name
    if adapter.state_kind != "memory":  # a model's weights are counted
        assert adapter.num_parameters is not None and adapter.num_parameters() > 0


def test_prefill_then_extend_equals_one_pass(adapter):
    a, b, conts = pieces(adapter)
    one = adapter.prefill(a + b)
    two = adapter.extend(adapter.prefill(a), b)
    many = adapter.prefill(a + b[:-3])  # then token by token (decode steps)
    for t in b[-3:]:
        many = adapter.extend(many, [t])
    ref = adapter.score(one, conts)
    assert close(adapter.score(two, conts), ref)
    assert close(adapter.score(many, conts), ref)
    assert adapter.generate(two, 6) == adapter.generate(one, 6) == adapter.generate(many, 6)
    assert adapter.state_bytes(two) == adapter.state_bytes(one) == adapter.state_bytes(many)
    assert close(adapter.score(adapter.extend(adapter.fork(one), []), conts), ref)  # empty extension


def test_forks_are_independent(adapter):
    a, b, conts = pieces(adapter)
    s = adapter.prefill(a)
    before, gen_before = adapter.score(s, conts), adapter.generate(s, 4)
    f = adapter.extend(adapter.fork(s), b)  # extending the fork leaves the original alone
    assert adapter.score(s, conts) == before and adapter.generate(s, 4) == gen_before
    fork_scores = adapter.score(f, conts)
    assert close(fork_scores, adapter.score(adapter.prefill(a + b), conts))
    g = adapter.fork(f)
    adapter.extend(s, a)  # extending the original leaves its forks alone
    adapter.extend(f, a)  # ... and a fork of a fork is independent of it
    assert adapter.score(g, conts) == fork_scores


def test_greedy_generation_is_deterministic_and_pure(adapter):
    a, b, conts = pieces(adapter)
    s = adapter.prefill(a + b + a[:4])
    scores, nbytes = adapter.score(s, conts), adapter.state_bytes(s)
    g1 = adapter.generate(s, 8)
    g2 = adapter.generate(s, 8)
    assert g1 == g2 and g1.strip(), f"{adapter.name}: greedy text {g1!r} vs {g2!r}"
    assert adapter.score(s, conts) == scores and adapter.state_bytes(s) == nbytes
    stop = g1.strip()[-2:]  # cut at a stop string: the text before its first occurrence
    assert adapter.generate(s, 8, stop=[stop]) == g1[: g1.find(stop)]
    assert adapter.generate(s, 0) == ""


def test_score_agrees_with_generate(adapter):
    a, b, _ = pieces(adapter)
    tok = adapter.tokenizer
    s = adapter.prefill(a + b + a[:4])
    greedy_text = adapter.generate(s, 4)
    greedy = encode(tok, greedy_text)
    assert greedy and tok.decode(greedy) == greedy_text, (
        f"{adapter.name}: greedy text {greedy_text!r} does not re-encode to itself; pick another prompt")
    vocab = len(tok)
    alternatives = sorted({(17 + 37 * i) % vocab for i in range(12)} | set(a[:6]))
    for j, tok_j in enumerate(greedy):
        cands = [greedy[: j + 1]] + [greedy[:j] + [x] for x in alternatives if x != tok_j]
        sc = adapter.score(s, cands)
        assert sc[0] >= max(sc[1:]) - 1e-5, f"{adapter.name}: greedy token {j} is not the best scored"
    # scoring x+y equals scoring x, then y after extending by x
    x, y = greedy[:2], a[:3]
    joint = adapter.score(s, [x + y])[0]
    split = adapter.score(s, [x])[0] + adapter.score(adapter.extend(adapter.fork(s), x), [y])[0]
    assert joint == pytest.approx(split, rel=1e-4, abs=1e-3)


def test_state_bytes(adapter):
    a, b, _ = pieces(adapter)
    short, long_ = adapter.prefill(a), adapter.prefill(a + b + a)
    n_short, n_long = len(a), len(a) * 2 + len(b)
    sizes = {n_short: adapter.state_bytes(short), n_long: adapter.state_bytes(long_)}
    assert all(isinstance(v, int) and v > 0 for v in sizes.values())
    if hasattr(adapter, "state_tensors"):
        for n, st in ((n_short, short), (n_long, long_)):
            assert sizes[n] == sum(t.nbytes for t in adapter.state_tensors(st))
    if hasattr(adapter, "state_bytes_at"):
        for n, v in sizes.items():
            assert adapter.state_bytes_at(n) == v
    kind = getattr(adapter, "state_kind", None)
    if kind == "kv":
        assert sizes[n_long] * n_short == sizes[n_short] * n_long  # linear in length
    elif kind == "kv-window":
        w = adapter.window
        assert n_long > w, "the long prompt must exceed the window"
        assert sizes[n_long] == w * adapter.kv_bytes_per_token  # capped
        assert sizes[n_short] == min(n_short, w) * adapter.kv_bytes_per_token
    elif kind == "recurrent":
        assert sizes[n_long] == sizes[n_short]  # fixed size
