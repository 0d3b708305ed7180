"""Conversation task: chat rendering, facts updated later (latest value), look-alike
requests, questions at several turns, exact lengths, golden hashes, clear errors."""
import re

import pytest

from evalkit.render import prompt_ids, render
from evalkit.taskspec import discover
from evalkit.tasks import conversation
from evalkit.tokenization import load_tokenizer

from helpers import TINY_TOKENIZER
from tasks_support import check_measured, gen, smollm2_tokenizer

STATED = re.compile(r"The [a-z ]+ for ([a-z]+ \d+) is (\d+)\.$")


def statements(probe, upto=None):
    """(segment index, key, value) of every fact statement in the first `upto` turns."""
    out = []
    for i, s in enumerate(probe.context[:upto]):
        m = STATED.search(s.text) if s.role == "user" else None
        if m:
            out.append((i, m.group(1), m.group(2)))
    return out


def asked_key(q):
    return re.fullmatch(r"What is the [a-z ]+ for ([a-z]+ \d+)\?", q.text).group(1)


def check_chat(probe):
    assert probe.chat
    roles = [s.role for s in probe.context]
    assert roles == ["user", "assistant"] * (len(roles) // 2)  # alternating, user first


@pytest.mark.parametrize("length", [256, 1024, 4096, 8192])
def test_length_is_exact(tiny_tokenizer, length):
    for load in (1, 3, 12) if length <= 1024 else (12,):
        for depth in (0.0, 0.5, 1.0):
            try:
                p = gen(conversation, tiny_tokenizer, length=length, depth=depth, load=load,
                        seed=load, kinds=("recall", "latest"), updates=min(1, load - 1))
            except ValueError as e:
                assert re.match(rf"load={load} facts need at least \d+ tokens .* but "
                                rf"length={length}$", str(e)), e
                continue
            check_chat(p)
            check_measured(p, tiny_tokenizer)
            assert p.meta.actual_length == length
            assert "<|user|>" in tiny_tokenizer.decode(prompt_ids(p, tiny_tokenizer))
            if length >= 4096 and not (depth == 0.0 and p.questions[-1].kind == "latest"):
                assert abs(p.questions[-1].depth - depth) <= 0.01


def test_latest_value_after_an_update(tiny_tokenizer):
    p = gen(conversation, tiny_tokenizer, length=2048, depth=0.6, load=5, seed=3,
            kinds=("latest",), updates=1)
    check_measured(p, tiny_tokenizer)
    q = p.questions[-1]
    key = asked_key(q)
    said = [(i, v) for i, k, v in statements(p) if k == key]
    assert len(said) == 2 and q.kind == "latest"
    assert q.gold == (said[-1][1],)           # the newest value is the answer
    assert q.candidates[1] == said[0][1]      # the value before the update is the first distractor
    assert p.context[said[-1][0]].text.startswith(("Correction", "Update"))
    # the update restates the fact's wording, so the latest occurrence holds the answer
    assert p.context[said[-1][0]].text.endswith(f"{q.answer_prefix} {q.gold[0]}.")
    assert abs(q.depth - 0.6) <= 0.01


def test_lookalike_requests_name_which_one(tiny_tokenizer):
    p = gen(conversation, tiny_tokenizer, length=2048, depth=0.3, load=6, seed=4,
            kinds=("lookalike",), lookalike=3, updates=0)
    q = p.questions[-1]
    key = asked_key(q)
    stated = {k: v for _, k, v in statements(p)}
    noun, num = key.split()
    alike = [k for k in stated if k != key and k.startswith(noun) and
             (sorted(k.split()[1]) == sorted(num) or abs(len(k.split()[1]) - len(num)) <= 1
              or sum(a != b for a, b in zip(k.split()[1], num)) == 1)]
    assert q.kind == "lookalike" and len(alike) >= 3
    assert q.gold == (stated[key],)
    assert set(q.candidates[1:4]) == {stated[k] for k in alike[:3]} or \
        set(q.candidates[1:4]) <= set(stated.values())


def test_candidates_are_values_seen_in_the_conversation(tiny_tokenizer):
    for seed in range(4):
        p = gen(conversation, tiny_tokenizer, length=1024, load=4, seed=seed, updates=2)
        seen = {v for _, _, v in statements(p)}
        for q in p.questions:
            assert set(q.candidates) <= seen and q.candidates[0] == q.gold[0]


def test_questions_at_several_turns(tiny_tokenizer):
    p = gen(conversation, tiny_tokenizer, length=4096, depth=0.9, load=6, seed=5,
            checkpoints=3, updates=3)
    check_chat(p)
    check_measured(p, tiny_tokenizer)
    qs = p.questions
    assert len(qs) == 4 and qs[-1].after_segment == len(p.context)
    afters = [q.after_segment for q in qs]
    assert afters == sorted(afters) and len(set(afters)) == 4
    for q in qs[:-1]:
        assert p.context[q.after_segment - 1].role == "assistant"
        before = [(k, v) for _, k, v in statements(p, q.after_segment) if k == asked_key(q)]
        assert before and q.gold == (before[-1][1],)  # the value as of that turn
        assert q.kind == ("latest" if len(before) > 1 else "recall")
        r = render(p, tiny_tokenizer)
        assert q.distance == r.prefix_length(q.after_segment) - q.fact_token


def test_without_a_chat_template_turns_render_as_role_lines():
    tok = load_tokenizer(TINY_TOKENIZER)
    tok.chat_template = None
    p = gen(conversation, tok, length=1024, load=3, seed=6)
    check_measured(p, tok)
    assert "user: " in tok.decode(prompt_ids(p, tok))


def test_a_template_that_is_not_turn_local_is_a_clear_error():
    # Turn pieces are rendered from a window of the conversation; a template whose turns depend
    # on their absolute position cannot be split into pieces, and says so instead of measuring
    # a prompt that the model would not see.
    tok = load_tokenizer(TINY_TOKENIZER)
    tok.chat_template = ("{% for m in messages %}[{{ loop.index }}] {{ m['content'] }}\n"
                         "{% endfor %}{% if add_generation_prompt %}>{% endif %}")
    with pytest.raises(ValueError, match="renders a turn differently after other turns"):
        gen(conversation, tok, length=512, load=3, seed=6)


def test_pure_function_of_params_seed_and_tokenizer(tiny_tokenizer):
    a = gen(conversation, tiny_tokenizer, length=1024, depth=0.5, load=4, seed=8, checkpoints=1)
    b = gen(conversation, tiny_tokenizer, length=1024, depth=0.5, load=4, seed=8, checkpoints=1)
    assert a == b and a.hash == b.hash and a.id == "t-L1024-d0.5-n4-s8"
    c = gen(conversation, tiny_tokenizer, length=4096, depth=0.5, load=4, seed=8, checkpoints=1)
    assert a.questions[-1].gold == c.questions[-1].gold




@pytest.mark.parametrize("kwargs, message", [
    (dict(length=20, load=1, kinds=("recall",), updates=0),
     r"length=20 is too short: the fact and question alone take \d+ tokens"),
    (dict(length=256, load=40, updates=0), r"load=40 facts need at least \d+ tokens .* length=256"),
    (dict(depth=1.01, load=3), r"depth=1\.01 outside \[0, 1\]"),
    (dict(load=2, lookalike=2), r"load=2 is too small: kind 'lookalike' with params\.lookalike=2"),
    (dict(load=3, updates=3), r"load=3 is too small: params\.updates=3"),
    (dict(length=128, load=3, checkpoints=5, updates=0, kinds=("recall",)),
     r"params\.checkpoints=5: this conversation has only \d+ assistant turns"),
])
def test_bad_input_is_a_clear_error(tiny_tokenizer, kwargs, message):
    with pytest.raises(ValueError, match=message):
        gen(conversation, tiny_tokenizer, **kwargs)


def test_second_real_tokenizer_with_its_own_template():
    tok = smollm2_tokenizer()
    for length, depth in [(512, 0.0), (4096, 0.5)]:
        p = gen(conversation, tok, length=length, depth=depth, load=4, seed=9, checkpoints=2)
        check_chat(p)
        check_measured(p, tok)
        assert p.meta.actual_length == length
        assert "<|im_start|>user" in tok.decode(prompt_ids(p, tok))
