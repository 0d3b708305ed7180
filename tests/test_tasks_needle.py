"""Needle task: exact lengths in the model's own tokens, needle depth within 1 %, golden
hashes, clear errors; plus the shipped haystack and the tiny tokenizer build."""
import math
import re
import subprocess
import sys
import time

import pytest

from evalkit.render import probe_length, render
from evalkit.taskspec import discover
from evalkit.tokenization import load_tokenizer
from evalkit.probes import fit, haystack, values
from evalkit.tasks import needle
from evalkit.tokenization import tokenizer_hash

from helpers import REPO, TINY_TOKENIZER
from tasks_support import check_measured, gen, smollm2_tokenizer

DATA = REPO / "evalkit" / "probes" / "data"


def fact_segment(probe, q, tokenizer):
    """The context segment that starts at q.fact_token."""
    starts, acc = {}, 0
    for i, piece in enumerate(render(probe, tokenizer).context):
        starts[acc] = i
        acc += len(piece)
    return probe.context[starts[q.fact_token]]


@pytest.mark.parametrize("length", [256, 512, 1024, 2048, 4096, 8192])
@pytest.mark.parametrize("value_kind,haystack", [("number", "prose"), ("uuid", "prose"),
                                                 ("word", "filler"), ("phrase", "prose")])
def test_length_is_exact_in_model_tokens(tiny_tokenizer, length, value_kind, haystack):
    for depth in (0.0, 0.5, 1.0):
        p = gen(needle, tiny_tokenizer, length=length, depth=depth, seed=length,
                value_kind=value_kind, haystack=haystack)
        check_measured(p, tiny_tokenizer)
        assert p.meta.actual_length == length  # exact in practice; tolerance is the bound


@pytest.mark.parametrize("length", [256, 1024, 4096])
def test_needle_depth_within_one_percent(tiny_tokenizer, length):
    for depth in (0.0, 0.1, 0.25, 0.5, 0.75, 0.9, 1.0):
        for load in (1, 3):
            p = gen(needle, tiny_tokenizer, length=length, depth=depth, load=load, seed=7)
            q = p.questions[-1]
            assert abs(q.depth - depth) <= 0.01, (length, depth, load, q.depth)
            seg = fact_segment(p, q, tiny_tokenizer)
            assert f"{q.answer_prefix} {q.gold[0]}." in seg.text  # the asked needle is there
            if depth == 0.0:
                assert q.fact_token == 0 and seg is p.context[0]
            if depth == 1.0:  # the needle is the last thing before the question
                assert seg is p.context[-1] and q.depth == 1.0


def test_32k_probe_is_exact_and_fast(tiny_tokenizer):
    t0 = time.process_time()
    p = gen(needle, tiny_tokenizer, length=32768, depth=0.3, load=2, seed=1)
    assert time.process_time() - t0 < 5.0
    check_measured(p, tiny_tokenizer)
    assert p.meta.actual_length == 32768
    assert abs(p.questions[-1].depth - 0.3) <= 0.01
    extra = dict(p.meta.extra)
    assert extra["haystack"] == "alice" and isinstance(extra["haystack_wrapped"], bool)


def test_long_haystack_wraps_around_and_says_so(tiny_tokenizer):
    p = gen(needle, tiny_tokenizer, length=60000, depth=0.5, seed=2)  # longer than the book
    assert p.meta.actual_length == 60000 and dict(p.meta.extra)["haystack_wrapped"] is True


def test_several_needles_distractors_and_queries(tiny_tokenizer):
    p = gen(needle, tiny_tokenizer, length=2048, depth=0.5, load=6, seed=3, queries=3)
    check_measured(p, tiny_tokenizer)
    needles = [s.text for s in p.context if "special magic number" in s.text]
    assert len(needles) == 6  # load = needles, the asked ones included
    values = [re.search(r"is (\d+)\.", t).group(1) for t in needles]
    assert len(p.questions) == 3 and len({q.gold for q in p.questions}) == 3
    for q in p.questions:
        assert q.after_segment == len(p.context)
        assert q.gold[0] in values
        assert set(q.candidates[1:5]) <= set(values) - {q.gold[0]}  # in-context distractors
        assert len(q.candidates) == 5
        assert q.max_new_tokens >= len(q.gold[0])  # digits are single tokens here
    assert abs(p.questions[-1].depth - 0.5) <= 0.01


def test_answer_prefix_restates_the_fact(tiny_tokenizer):
    for kind in ("number", "word", "uuid", "phrase"):
        p = gen(needle, tiny_tokenizer, length=512, seed=4, value_kind=kind)
        q = p.questions[0]
        assert q.text == "What is t" + q.answer_prefix[1:-3] + "?"  # "The ... is" -> "What is the ...?"
        assert f" {q.answer_prefix} {q.gold[0]}." in " ".join(s.text for s in p.context)
    word = gen(needle, tiny_tokenizer, length=512, seed=4, value_kind="word").questions[0].gold[0]
    assert word not in (DATA / "alice.txt").read_text().lower()


def test_phrase_values_are_random_sequences_of_distinct_prose_words(tiny_tokenizer):
    p = gen(needle, tiny_tokenizer, length=1024, seed=8, value_kind="phrase", words=12, load=3)
    q = p.questions[-1]
    words = q.gold[0].split(" ")
    assert len(words) == len(set(words)) == 12 and set(words) <= set(values.phrase_words())
    assert len(set(q.candidates)) == len(q.candidates) and q.gold[0] in q.candidates
    assert all(len(c.split(" ")) == 12 for c in q.candidates)


def test_pure_function_of_params_seed_and_tokenizer(tiny_tokenizer):
    a = gen(needle, tiny_tokenizer, length=1024, depth=0.25, load=2, seed=9)
    b = gen(needle, tiny_tokenizer, length=1024, depth=0.25, load=2, seed=9)
    assert a == b and a.hash == b.hash
    assert gen(needle, tiny_tokenizer, length=1024, depth=0.25, load=2, seed=10).hash != a.hash
    # The seed fixes the facts; length and depth only move the haystack around them.
    c = gen(needle, tiny_tokenizer, length=4096, depth=0.75, load=2, seed=9)
    assert [q.gold for q in c.questions] == [q.gold for q in a.questions]
    assert a.id == "t-L1024-d0.25-n2-s9"



@pytest.mark.parametrize("kwargs, message", [
    (dict(length=20), r"length=20 is too short: the fact and question alone take \d+ tokens"),
    (dict(length=60, load=3), r"load=3 facts need at least \d+ tokens .* but length=60"),
    (dict(depth=1.5), r"depth=1\.5 outside \[0, 1\]"),
    (dict(depth=-0.01), r"depth=-0\.01 outside \[0, 1\]"),
    (dict(depth=math.nan), r"depth=nan outside \[0, 1\]"),
    (dict(length=0), r"length=0 must be a positive integer"),
    (dict(length=512.5), r"length=512\.5 must be a positive integer"),
    (dict(load=0), r"load=0 must be a positive integer"),
    (dict(load=2, queries=3), r"load=2 is too small: params\.queries=3"),
    (dict(load=1000), r"load=1000: at most \d+ needles"),
])
def test_bad_input_is_a_clear_error(tiny_tokenizer, kwargs, message):
    with pytest.raises(ValueError, match=message):
        gen(needle, tiny_tokenizer, **kwargs)


def test_second_real_tokenizer(tiny_tokenizer):
    tok = smollm2_tokenizer()
    for length, depth in [(256, 0.0), (1024, 0.5), (4096, 1.0)]:
        p = gen(needle, tok, length=length, depth=depth, load=2, seed=5)
        check_measured(p, tok)
        assert abs(p.questions[-1].depth - depth) <= 0.01
    # same seed, other tokenizer: same needles, a different prompt
    q = gen(needle, tiny_tokenizer, length=1024, depth=0.5, load=2, seed=5).questions[-1]
    assert p.questions[-1].gold == q.gold
    assert p.meta.tokenizer_hash != tokenizer_hash(tiny_tokenizer)


def test_builtin_task_files_load_and_generate(tiny_tokenizer):
    reg = discover()
    builtin = [n for n in reg.names() if reg.get(n).source.parent == REPO / "tasks"]
    assert {"needle", "needle_uuid", "needle_phrase", "needle_words", "needle_filler", "needle_multi",
            "multikey", "multikey_mqar", "multikey_multivalue", "multikey_multiquery",
            "conversation", "conversation_recall", "conversation_checkpoints"} <= set(builtin)
    # mqar is defined on its own word-level tokenizer (one token per symbol) and refuses others
    mqar_tokenizer = load_tokenizer(REPO / "model_adapters" / "mqar" / "tokenizer")
    for name in builtin:
        spec = reg.get(name)
        d = spec.defaults
        tok = mqar_tokenizer if name == "mqar" else tiny_tokenizer
        p = spec.generator(spec.params, task=name, version=spec.version, tokenizer=tok,
                           length=min(d.lengths), depth=d.depths[-1], load=max(d.loads), seed=1)
        if name == "mqar":  # exact lengths, no tolerance (tests/test_tasks_mqar.py checks the rest)
            assert p.meta.actual_length == p.meta.target_length == probe_length(p, tok)
        else:
            check_measured(p, tok)
        assert p.task == name and p.id.startswith(f"{name}-L{min(d.lengths)}-")
    spec = reg.get("mqar")
    with pytest.raises(ValueError, match="task mqar needs the MQAR word-level tokenizer"):
        spec.generator(spec.params, task="mqar", version=spec.version, tokenizer=tiny_tokenizer,
                       length=64, depth=0.0, load=4, seed=1)


def test_haystack_text_is_the_public_domain_book_without_boilerplate():
    text = (DATA / "alice.txt").read_text()
    assert text.startswith("CHAPTER I. Down the Rabbit-Hole") and text.rstrip().endswith("THE END")
    assert "gutenberg" not in text.lower() and "license" not in text.lower()
    assert "public domain" in (DATA / "LICENSE.md").read_text()
    hay = haystack.builtin_haystack("prose")
    assert len(hay.words) > 25000 and hay.sentence_starts[0] == 0
    assert haystack.builtin_haystack("filler").words[:4] == ("The", "grass", "is", "green.")


def test_tiny_tokenizer_build_is_reproducible():
    # A fresh process, as a user would run it: the rebuild must match the committed files.
    out = subprocess.run([sys.executable, "-m", "evalkit.model_adapters.build_tokenizer", "--check",
                          "--out", str(TINY_TOKENIZER)], capture_output=True, text=True,
                         timeout=120)
    assert out.returncode == 0, out.stderr
    assert "reproducible" in out.stdout


def test_fitting_without_token_offsets(tiny_tokenizer, monkeypatch):
    # Slow (non-fast) tokenizers give no offsets and no backend: fitting then uses real counts
    # only, and must be just as exact.
    real_init = fit.Meter.__init__

    def no_backend(self, tokenizer, chat):
        real_init(self, tokenizer, chat)
        self._backend = None

    monkeypatch.setattr(fit.Meter, "__init__", no_backend)
    for length, depth in [(300, 0.0), (2000, 0.4), (3000, 1.0)]:
        p = gen(needle, tiny_tokenizer, length=length, depth=depth, load=2, seed=6)
        check_measured(p, tiny_tokenizer)
        assert abs(p.meta.actual_length - length) <= 1
        assert abs(p.questions[-1].depth - depth) <= 0.01
