"""Shared-prefix plans: one prefill per context, a fork per question, conversations streamed.

The reference test is the naive one: every question's full prompt prefilled on its own.
"""
from __future__ import annotations

import pytest

from evalkit.model_adapters.models import load_model
from evalkit.probe import Probe, ProbeMeta, Question, Segment
from evalkit.render import continuation_ids, prompt_ids, render
from evalkit.runner.execute import ModelRun, execute
from evalkit.runner.plan import Request, build_plan
from evalkit.runner.plugins import import_plugins
from evalkit.scoring import score_sample
from evalkit.taskspec import discover, generate_probes, grid
from evalkit.tokenization import load_tokenizer
from runner_support import PLUGIN, TOY_TASKS, build_tokenizer


@pytest.fixture(scope="module")
def tok_dir(tmp_path_factory):
    return build_tokenizer(tmp_path_factory.mktemp("tok"))


@pytest.fixture(scope="module")
def tok(tok_dir):
    return load_tokenizer(tok_dir)


def toy_probes(tok, task, **kw):
    spec = discover([TOY_TASKS]).get(task)
    return list(generate_probes(spec, tok, grid(spec, **kw)))


def items_of(probes, tok):
    return [Request(p, qi, render(p, tok), (pi, qi))
            for pi, p in enumerate(probes) for qi in range(len(p.questions))]


def run_plan(adapter, items, batch_size=1):
    out = {}
    run = ModelRun(adapter, "m", "h", "memory")
    execute(run, build_plan(items), lambda s: out.setdefault((s.probe_hash, s.question), s),
            batch_size=batch_size)
    assert len(out) == len(items)
    return out


def run_separately(adapter, item):
    """The naive way: prefill the whole prompt, answer. Independent of the runner's code."""
    q = item.question
    state = adapter.prefill(prompt_ids(item.probe, adapter.tokenizer, item.qi))
    pred = adapter.generate(state, q.max_new_tokens, stop=["\n"])
    lps = adapter.score(state, [continuation_ids(adapter.tokenizer, c) for c in q.candidates])
    return pred, lps, score_sample(pred, q.gold, lps), adapter.state_bytes(state)


def probe(pid, segments, afters, chat=False):
    qs = tuple(Question(text=f"Which is {i}?", answer_prefix=f"It is {i}", gold=(str(i),),
                        candidates=(str(i), "x"), after_segment=a) for i, a in enumerate(afters))
    return Probe(id=pid, task="t", task_version="1",
                 context=tuple(Segment(s, "user" if chat else None) for s in segments),
                 questions=qs, chat=chat,
                 meta=ProbeMeta(target_length=1, actual_length=1, tolerance=1, depth=0.5, load=1,
                                seed=0, tokenizer_hash=""))


@pytest.mark.parametrize("model,options", [("oracle", {}), ("forgetful", {"capacity": 48})])
def test_shared_prefix_equals_separate_prompts(tok_dir, tok, model, options):
    adapter = load_model(model, tokenizer=str(tok_dir), **options)
    probes = (toy_probes(tok, "toy_recall", lengths=[96, 160], loads=[4], samples=2)
              + toy_probes(tok, "toy_conv", samples=2))
    items = items_of(probes, tok)
    assert any(len(p.questions) > 1 for p in probes)
    planned = run_plan(adapter, items)
    correct = 0
    for it in items:
        s = planned[(it.probe.hash, it.qi)]
        pred, lps, scores, nbytes = run_separately(adapter, it)
        assert s.error is None
        assert (s.prediction, s.candidate_logprobs, s.scores, s.state_bytes) == (
            pred, lps, scores, nbytes)
        assert s.prompt_tokens == len(prompt_ids(it.probe, tok, it.qi))
        correct += scores["exact_match"]
    # The comparison is not vacuous: the oracle recalls everything, the small memory does not.
    assert (correct == len(items)) == (model == "oracle")


def test_prefill_counts_by_hand(tok):
    hay = probe("hay", ["alpha beta gamma delta"], [1, 1, 1])
    conv = probe("conv", ["one two", "three four five", "six", "seven eight"], [1, 3, 3, 4])
    early = probe("early", ["nine ten"], [0, 1])
    items = items_of([hay, conv, early], tok)
    plan = build_plan(items)
    r = {p.id: render(p, tok) for p in (hay, conv, early)}
    ctx_tokens = sum(len(piece) for rr in r.values() for piece in rr.context)
    q_tokens = sum(len(q) for rr in r.values() for q in rr.questions)
    assert plan.tokens_prefilled == ctx_tokens + q_tokens  # every context token exactly once
    assert plan.prompt_tokens == sum(len(prompt_ids(it.probe, tok, it.qi)) for it in items)
    # Saved: hay's haystack twice (3 questions, one prefill); conv streams context[:4] once,
    # so the prefixes of its questions at 1, 3 and 3 are saved; early saves nothing.
    hay_ctx, c = len(r["hay"].context[0]), r["conv"]
    assert plan.prompt_tokens - plan.tokens_prefilled == (
        2 * hay_ctx + c.prefix_length(1) + 2 * c.prefix_length(3))
    # One prefill per shared context, plus the question asked before any context.
    assert sorted(len(u.prefix) for u in plan.units) == sorted(
        [hay_ctx, len(r["conv"].context[0]), len(r["early"].questions[0]),
         len(r["early"].context[0])])
    assert plan.n_items == 9 and plan.savings_ratio > 1


def test_probes_with_the_same_context_share_one_prefill(tok):
    a = probe("a", ["the same long context here"], [1])
    b = Probe(id="b", task="t", task_version="1", context=a.context,
              questions=(Question(text="Other?", answer_prefix="It is", gold=("z",),
                                  after_segment=1),), meta=a.meta)
    plan = build_plan(items_of([a, b], tok))
    assert len(plan.units) == 1 and plan.n_items == 2


def test_conversation_streams_turn_by_turn(tok_dir, tok):
    import_plugins([str(PLUGIN)], "test")
    adapter = load_model("recording-oracle", tokenizer=str(tok_dir))
    conv = probe("conv", ["turn one is here", "reply one", "turn two now", "reply two",
                          "turn three", "reply three"], [2, 2, 4, 6], chat=True)
    r = render(conv, tok)
    (it0, it1, it2, it3) = items_of([conv], tok)
    run_plan(adapter, [it0, it1, it2, it3])
    ctx = [len(p) for p in r.context]
    q = [len(x) for x in r.questions]
    state_len = lambda n: sum(ctx[:n])
    assert adapter.calls == [
        ("prefill", ctx[0] + ctx[1]),                # context[:2] once
        ("fork", state_len(2)), ("extend", q[0]),    # question 0 on a fork
        ("fork", state_len(2)), ("extend", q[1]),    # question 1 on another fork
        ("extend", ctx[2] + ctx[3]),                 # the same state streams on to turn 4
        ("fork", state_len(4)), ("extend", q[2]),
        ("extend", ctx[4] + ctx[5]),                 # and to turn 6
        ("extend", q[3]),                            # the last question consumes the state
    ]


def test_batch_size_never_changes_samples(tok_dir, tok):
    adapter = load_model("forgetful", tokenizer=str(tok_dir), capacity=64)
    items = items_of(toy_probes(tok, "toy_recall", lengths=[96, 128, 200], samples=2), tok)
    strip = lambda d: {k: (v.prediction, v.candidate_logprobs, v.scores, v.state_bytes)
                       for k, v in d.items()}
    one = strip(run_plan(adapter, items, batch_size=1))
    assert strip(run_plan(adapter, items, batch_size=4)) == one
    assert strip(run_plan(adapter, items, batch_size=3)) == one


def items_of_gla(tok):
    return items_of(toy_probes(tok, "toy_recall", lengths=[96, 128], depths=[0.2, 0.8], samples=1), tok)


def test_padding_in_a_real_batched_adapter_never_changes_samples(tmp_path, tok_dir, tok):
    """GLA pads batched prefills to bucket shapes; the runner's results must not see it."""
    gla = pytest.importorskip("evalkit.model_adapters.gla")
    torch = pytest.importorskip("torch")
    folder = tmp_path / "gla"
    tok.save_pretrained(folder)
    cfg = gla.GLAConfig(vocab_size=len(tok), hidden_size=32, num_heads=2, num_hidden_layers=1,
                        use_short_conv=True, bos_token_id=tok.bos_token_id,
                        eos_token_id=tok.eos_token_id)
    m = gla.GLAForCausalLM(cfg).init_weights(0)
    with torch.no_grad():
        for name, p in m.named_parameters():
            if "norm" not in name:
                p.mul_(10)  # peaked logits: greedy choices are not decided by rounding
    gla.save_checkpoint(m, cfg, folder)
    adapter = load_model(f"gla:{folder}", chunk_size=16)
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # tiny matmuls: thread hand-offs on shared cores cost 50x
    try:
        one, four = run_plan(adapter, items_of_gla(tok), 1), run_plan(adapter, items_of_gla(tok), 4)
    finally:
        torch.set_num_threads(threads)
    for k, s in one.items():
        t = four[k]
        assert s.error is None and t.error is None
        assert (t.prediction, t.scores, t.state_bytes) == (s.prediction, s.scores, s.state_bytes)
        assert t.candidate_logprobs == pytest.approx(s.candidate_logprobs, rel=1e-5, abs=1e-5)
