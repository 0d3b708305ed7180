"""Property: any (task, length, depth, load, seed) grid point of a built-in task, with either of
two real tokenizers, gives a probe that is exactly what was asked (recorded length/depth/load/
seed equal the request, prompt within the recorded tolerance, asked fact at the requested
depth), or a ValueError naming the field - never another exception and never a silent clamp."""
from __future__ import annotations

import math
import re

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from evalkit.render import prompt_length
from evalkit.taskspec import discover

from tasks_support import smollm2_tokenizer

TASKS = sorted(discover().names())
FIELD = re.compile(r"^(length|depth|load|tokenizer|params\.\w+)=")  # names the field it rejects
# (tokenizer=: a task bound to its own tokenizer, mqar, refuses any other)
PROPS = settings(max_examples=40, deadline=None, derandomize=True,
                 suppress_health_check=[HealthCheck.function_scoped_fixture])


def depth_tolerance(probe) -> float:
    """Facts sit between whole sentences (prose) or whole turns (chat), so the asked fact can
    land at most one such unit from the exact spot: 1 % of the context, or the largest
    segment's share of a short prompt, whichever is larger."""
    longest = max(len(s.text) for s in probe.context) / max(1, sum(len(s.text) for s in probe.context))
    return max(0.01, longest)


def _grid(lengths, depths, loads):
    return st.tuples(st.sampled_from(TASKS), lengths, depths, loads, st.integers(0, 2**31 - 1))


# the valid region, where most examples must build a probe; and the bad values, each an error
grid = _grid(st.integers(256, 2048), st.one_of(st.sampled_from([0.0, 1.0]), st.floats(0, 1)),
             st.integers(4, 12))
bad_grid = _grid(st.one_of(st.integers(-5, 2048), st.just(2**40)),  # 2**40: the length limit
                 st.one_of(st.floats(0, 1), st.sampled_from([-0.01, 1.01, math.nan, math.inf])),
                 st.integers(-2, 1100))


def check(tokenizer, case) -> None:
    name, length, depth, load, seed = case
    spec = discover().get(name)
    try:
        p = spec.generator(spec.params, task=name, version=spec.version, tokenizer=tokenizer,
                           length=length, depth=depth, load=load, seed=seed)
    except ValueError as e:
        assert FIELD.match(str(e)), f"{case}: error names no field: {e}"
        return
    m = p.meta
    assert (m.target_length, m.depth, m.load, m.seed) == (length, depth, load, seed), case
    assert m.actual_length == prompt_length(p, tokenizer), case
    assert abs(m.actual_length - length) <= m.tolerance, case
    q = p.questions[-1]
    if q.kind != "latest":  # a "latest" fact is its update, placed after the first statement
        assert abs(q.depth - depth) <= depth_tolerance(p), (case, q.depth)


@PROPS
@given(case=grid)
def test_grid_points_tiny_tokenizer(tiny_tokenizer, case):
    check(tiny_tokenizer, case)


@settings(PROPS, max_examples=25)
@given(case=grid)
def test_grid_points_smollm2_tokenizer(case):
    check(_smol(), case)


_SMOL: list = []


@settings(PROPS, max_examples=30)
@given(case=bad_grid)
def test_any_grid_point_is_a_probe_or_a_field_error(tiny_tokenizer, case):
    check(tiny_tokenizer, case)


def _smol():
    if not _SMOL:
        _SMOL.append(smollm2_tokenizer())
    return _SMOL[0]


def test_conversation_load_beyond_its_keys_is_an_error_not_a_hang(tiny_tokenizer):
    # found by the property above: load > 999 drew distinct keys from 1-999 forever
    spec = discover().get("conversation_checkpoints")
    with pytest.raises(ValueError, match=r"^load=1013: at most 999 facts"):
        spec.generator(spec.params, task=spec.name, version=spec.version,
                       tokenizer=tiny_tokenizer, length=1716, depth=0.9, load=1013,
                       seed=1684936873)


@pytest.mark.parametrize("name", TASKS)
def test_absurd_length_is_refused_before_building(tiny_tokenizer, name):
    """No model bounds a recurrent model's length: the probe builder does, before any work
    (2**40 tokens used to grow until the process was killed)."""
    spec = discover().get(name)
    with pytest.raises(ValueError, match=r"^length=1099511627776 must be a positive integer "
                                         r"number of tokens up to 1,048,576"):
        spec.generator(spec.params, task=name, version=spec.version, tokenizer=tiny_tokenizer,
                       length=2**40, depth=0.5, load=4, seed=0)
