import dataclasses
import json

import pytest

from evalkit.probe import Probe, ProbeMeta, Question, Segment
from evalkit.registry import Registry, RegistryError


def make_probe(**over) -> Probe:
    q = Question(text="What is the magic number for Lisbon?",
                 answer_prefix="The magic number for Lisbon is", gold=("4821",),
                 candidates=("4821", "9075"), after_segment=1, depth=0.5)
    meta = ProbeMeta(target_length=64, actual_length=60, tolerance=4, depth=0.5, load=1, seed=3,
                     tokenizer_hash="t")
    kw = dict(id="p", task="needle", task_version="1",
              context=(Segment("Some prose. The magic number for Lisbon is 4821. More prose."),),
              questions=(q,), meta=meta)
    kw.update(over)
    return Probe(**kw)


def test_hash_is_content_addressed_and_roundtrips():
    a, b = make_probe(), make_probe()
    assert a.hash == b.hash and len(a.hash) == 64
    c = make_probe(context=(Segment("Other prose. The magic number for Lisbon is 4821."),))
    assert c.hash != a.hash
    back = Probe.from_dict(json.loads(json.dumps(a.to_dict())))
    assert back == a and back.hash == a.hash


def test_tampered_record_is_detected():
    d = make_probe().to_dict()
    d["context"][0]["text"] = "The magic number for Lisbon is 1111."
    with pytest.raises(ValueError, match="does not match its content"):
        Probe.from_dict(d)


def test_probe_is_frozen():
    with pytest.raises(dataclasses.FrozenInstanceError):
        make_probe().id = "x"


@pytest.mark.parametrize("bad, match", [
    (dict(depth=1.5), r"depth must lie in \[0, 1\]"),
    (dict(gold=()), "at least one answer"),
    (dict(candidates=("9075", "4821")), "start with gold"),
])
def test_question_validation(bad, match):
    kw = dict(text="q", answer_prefix="a", gold=("4821",), after_segment=1)
    kw.update(bad)
    with pytest.raises(ValueError, match=match):
        Question(**kw)


def test_question_position_must_be_inside_context():
    q = Question(text="q", answer_prefix="a", gold=("1",), after_segment=2)
    with pytest.raises(ValueError, match=r"after_segment=2 outside \[0, 1\]"):
        make_probe(questions=(q,))


def test_registry_refuses_collisions_and_suggests_typos():
    reg = Registry("model")
    reg.add("oracle", 1, origin="a.py")
    with pytest.raises(RegistryError, match="already registered.*a.py"):
        reg.add("oracle", 2, origin="b.py")
    with pytest.raises(RegistryError, match="did you mean 'oracle'"):
        reg.get("oracel")
