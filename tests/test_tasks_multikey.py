"""Multi-key task: load sweep separate from length, look-alike keys, multi-value and
multi-query gold, MQAR-like variant, exact lengths, golden hashes, clear errors."""
import re

import pytest

from evalkit.render import render
from evalkit.taskspec import discover
from evalkit.tasks import multikey

from tasks_support import check_measured, gen, smollm2_tokenizer

FACT = re.compile(r"The (?:[a-z ]+) for ([a-z]+ \d+) (?:is|are) ([\d, ]+)\.")
MQAR = re.compile(r"[a-z]{4}: \d+\.")


def facts(probe):
    """key -> values stated in a natural-style probe, in context order."""
    out = {}
    for s in probe.context:
        m = FACT.fullmatch(s.text.strip())
        if m:
            out[m.group(1)] = m.group(2).split(", ")
    return out


@pytest.mark.parametrize("length", [256, 1024, 8192])
@pytest.mark.parametrize("style", ["natural", "mqar"])
def test_length_is_exact_across_loads(tiny_tokenizer, length, style):
    hay = "prose" if style == "natural" else "filler"
    for load in (1, 16, 256):
        for depth in (0.0, 0.5, 1.0):
            try:
                p = gen(multikey, tiny_tokenizer, length=length, depth=depth, load=load, seed=load,
                        style=style, haystack=hay)
            except ValueError as e:  # the load does not fit this length: said so, by name
                assert re.match(rf"load={load} facts need at least \d+ tokens .* but "
                                rf"length={length}$", str(e)), e
                continue
            check_measured(p, tiny_tokenizer)
            fact = FACT if style == "natural" else MQAR
            assert sum(bool(fact.fullmatch(s.text.strip())) for s in p.context) == load


def test_load_1024_at_32k(tiny_tokenizer):
    p = gen(multikey, tiny_tokenizer, length=32768, depth=0.5, load=1024, seed=1, style="mqar",
            haystack="filler", lookalike=1)
    check_measured(p, tiny_tokenizer)
    assert p.meta.actual_length == 32768
    assert abs(p.questions[-1].depth - 0.5) <= 0.01


@pytest.mark.parametrize("load", [1, 8, 32])
def test_asked_fact_depth(tiny_tokenizer, load):
    for depth in (0.0, 0.25, 0.5, 0.75, 1.0):
        p = gen(multikey, tiny_tokenizer, length=4096, depth=depth, load=load, seed=3)
        assert abs(p.questions[-1].depth - depth) <= 0.01


def test_lookalike_keys_and_candidates(tiny_tokenizer):
    p = gen(multikey, tiny_tokenizer, length=2048, load=10, seed=4, lookalike=3)
    check_measured(p, tiny_tokenizer)
    stated = facts(p)
    q = p.questions[0]
    asked = re.fullmatch(r"What is the [a-z ]+ for ([a-z]+ \d+)\?", q.text).group(1)
    assert stated[asked] == list(q.gold) and q.kind == "lookalike"
    noun, num = asked.split()
    alike = [k for k in stated if k != asked and k.split()[0] == noun and
             (sorted(k.split()[1]) == sorted(num) or abs(len(k.split()[1]) - len(num)) <= 1)]
    assert len(alike) >= 3
    # forced choice: gold, then the look-alike keys' values, all from the context
    assert set(q.candidates[1:4]) == {stated[k][0] for k in alike[:3]} or \
        set(q.candidates[1:4]) <= {v[0] for k, v in stated.items() if k != asked}
    assert all(v in {x[0] for x in stated.values()} for v in q.candidates)


def test_multi_value_gold_lists_every_value_in_order(tiny_tokenizer):
    p = gen(multikey, tiny_tokenizer, length=2048, load=6, seed=5, values_per_key=3)
    check_measured(p, tiny_tokenizer)
    q = p.questions[0]
    assert q.kind == "multi" and len(q.gold) == 3
    text = " ".join(s.text for s in p.context)
    assert f"{q.answer_prefix} {', '.join(q.gold)}." in text
    assert q.text.startswith("What are the ")
    assert q.candidates[0] == q.gold[0]


def test_multi_query_separate_questions_share_the_context(tiny_tokenizer):
    p = gen(multikey, tiny_tokenizer, length=4096, depth=0.25, load=16, seed=6, queries=4)
    check_measured(p, tiny_tokenizer)
    stated = facts(p)
    assert len(p.questions) == 4
    assert {q.after_segment for q in p.questions} == {len(p.context)}
    asked = [re.search(r"for ([a-z]+ \d+)\?", q.text).group(1) for q in p.questions]
    assert len(set(asked)) == 4
    for key, q in zip(asked, p.questions):
        assert list(q.gold) == stated[key]
    assert abs(p.questions[-1].depth - 0.25) <= 0.01  # the final question's fact is placed


def test_multi_query_joint_question(tiny_tokenizer):
    p = gen(multikey, tiny_tokenizer, length=2048, load=8, seed=7, queries=3, query_mode="joint")
    check_measured(p, tiny_tokenizer)
    stated = facts(p)
    (q,) = p.questions
    keys = re.findall(r"[a-z]+ \d+", q.text.split(" for ", 1)[1])
    assert len(keys) == 3 and list(q.gold) == [stated[k][0] for k in keys] and q.kind == "multi"


def test_mqar_style_facts_and_prefix(tiny_tokenizer):
    p = gen(multikey, tiny_tokenizer, length=1024, load=12, seed=8, style="mqar",
            haystack="filler", lookalike=2)
    check_measured(p, tiny_tokenizer)
    q = p.questions[0]
    key = q.answer_prefix.removeprefix("Answer: ")[:-1]
    assert re.fullmatch(r"[a-z]{4}", key) and q.text == f"What is the value of {key}?"
    # the prefix ends with the fact's own tokens (" zuvo:"), so a copier can find the fact
    fact_ids = tiny_tokenizer(f" {key}:", add_special_tokens=False)["input_ids"]
    prefix_ids = tiny_tokenizer(q.answer_prefix, add_special_tokens=False)["input_ids"]
    assert prefix_ids[-len(fact_ids):] == fact_ids
    pairs = dict(re.findall(r"\b([a-z]{4}): (\d+)\.", " ".join(s.text for s in p.context)))
    assert len(pairs) == 12 and pairs[key] == q.gold[0]
    near = [k for k in pairs if k != key and sum(a != b for a, b in zip(k, key)) == 1]
    assert len(near) >= 2  # look-alike pseudo-word keys
    assert "The grass is green." in " ".join(s.text for s in p.context)


def test_common_word_mqar_keys_and_values(tiny_tokenizer):
    """mqar_words: keys and values are distinct common words ("said: little."), most of them
    one token each in the tiny tokenizer, none of them a filler word; 256 facts fit 2,048
    tokens; more facts than the word list holds is a clear error, not a loop."""
    from evalkit.probes import common_words

    words = common_words()
    assert len(words) == len(set(words)) == 512
    assert not {"grass", "green", "there", "again"} & set(words)
    single = sum(len(tiny_tokenizer(" " + w, add_special_tokens=False)["input_ids"]) == 1
                 for w in words)
    assert single >= 400
    p = gen(multikey, tiny_tokenizer, length=2048, load=256, seed=3, style="mqar",
            haystack="filler", keys="common", value_kind="common")
    check_measured(p, tiny_tokenizer)
    pairs = dict(re.findall(r"\b([a-z]+): ([a-z]+)\.", " ".join(s.text for s in p.context)))
    assert len(pairs) == 256 and set(pairs) <= set(words) and set(pairs.values()) <= set(words)
    assert not set(pairs) & set(pairs.values())  # a key is never also a value
    q = p.questions[0]
    key = q.answer_prefix.removeprefix("Answer: ")[:-1]
    assert pairs[key] == q.gold[0] and len(set(q.candidates)) == len(q.candidates)
    with pytest.raises(ValueError, match=r"load=257: keys and values drawn from the 512 common"):
        gen(multikey, tiny_tokenizer, length=8192, load=257, seed=3, style="mqar",
            haystack="filler", keys="common", value_kind="common")
    with pytest.raises(ValueError, match="keys='common' needs style='mqar'"):
        multikey.Params(keys="common")


def test_block_placement_keeps_facts_together(tiny_tokenizer):
    p = gen(multikey, tiny_tokenizer, length=2048, depth=0.5, load=8, seed=9, placement="block")
    check_measured(p, tiny_tokenizer)
    idx = [i for i, s in enumerate(p.context) if FACT.fullmatch(s.text.strip())]
    assert idx == list(range(idx[0], idx[0] + 8))
    assert abs(p.questions[-1].depth - 0.5) <= 0.01


def test_depth_independent_content(tiny_tokenizer):
    a = gen(multikey, tiny_tokenizer, length=2048, depth=0.0, load=8, seed=10)
    b = gen(multikey, tiny_tokenizer, length=4096, depth=1.0, load=8, seed=10)
    assert facts(a) == facts(b) and a.questions[0].candidates == b.questions[0].candidates




@pytest.mark.parametrize("kwargs, message", [
    (dict(length=4096, load=1024), r"load=1024 facts need at least \d+ tokens .* but length=4096"),
    (dict(length=16, load=1), r"length=16 is too short: the fact and question alone take"),
    (dict(depth=2.0), r"depth=2\.0 outside \[0, 1\]"),
    (dict(load=0), r"load=0 must be a positive integer"),
    (dict(load=3, queries=2, lookalike=1), r"load=3 is too small: params\.queries=2 .* at least 4"),
    (dict(load=5000, digits=3), r"load=5000: 3-digit numbers are too few"),
])
def test_bad_input_is_a_clear_error(tiny_tokenizer, kwargs, message):
    with pytest.raises(ValueError, match=message):
        gen(multikey, tiny_tokenizer, **kwargs)


def test_params_are_validated_by_name():
    from pydantic import ValidationError

    with pytest.raises(ValidationError, match="style"):
        multikey.Params(style="fancy")
    with pytest.raises(ValidationError, match="colour"):
        multikey.Params(colour="red")


def test_second_real_tokenizer():
    tok = smollm2_tokenizer()
    for length, load in [(1024, 4), (4096, 64)]:
        p = gen(multikey, tok, length=length, depth=0.5, load=load, seed=2, lookalike=1)
        check_measured(p, tok)
        assert abs(p.questions[-1].depth - 0.5) <= 0.01
        assert len(render(p, tok).context) == len(p.context)
