"""The recall stage's copy sequences (evalkit/training/copies.py): pure, exact copies, sources
past the window and outside the sinks, sizes checked, loss weights that sum to one."""
from __future__ import annotations

import pytest
import torch
from pydantic import ValidationError

from evalkit.training.copies import (CopySpec, copy_batch, copy_plan, copy_sequence,
                                     loss_weights)


def test_worked_example():
    c = CopySpec(spans=1, span_len=3, min_distance=8, max_distance=14)
    ids, mask = copy_sequence(torch.arange(24), c, sinks=0, seed=2, index=0)
    assert ids.tolist() == list(range(17)) + [6, 7, 8] + [20, 21, 22, 23]
    assert mask.nonzero().flatten().tolist() == [17, 18]


@pytest.mark.parametrize("seed", range(12))
def test_copies_are_exact_far_and_outside_the_sinks(seed):
    c = CopySpec(spans=4, span_len=16, min_distance=64, max_distance=768)
    row = torch.arange(1000, 2024)
    plan = copy_plan(1024, c, sinks=4, seed=seed, index=seed * 7)
    ids, mask = copy_sequence(row, c, sinks=4, seed=seed, index=seed * 7)
    assert ids.shape == row.shape and int(mask.sum()) == 4 * 15 and len(plan) == 4
    ends = [d + 16 for _, d in plan]
    assert all(e <= d for e, (_, d) in zip(ends, plan[1:]))  # disjoint, in order
    inside = torch.zeros(1024, dtype=torch.bool)
    for s, d in plan:
        assert s >= 4                                   # never from the sinks
        assert d - (s + 16) >= 64                       # ends before the destination's window
        assert d - s <= 768
        assert torch.equal(ids[d:d + 16], ids[s:s + 16])  # the source as it stands, whole
        assert torch.equal(mask[d:d + 16], torch.tensor([True] * 15 + [False]))
        inside[d:d + 16] = True
    assert torch.equal(ids[~inside], row[~inside])      # the rest is the row itself


def test_pure_in_seed_and_index():
    c = CopySpec(spans=3, span_len=8, min_distance=16, max_distance=100)
    row = torch.arange(300)
    a = copy_sequence(row, c, sinks=2, seed=5, index=9)
    assert all(torch.equal(x, y) for x, y in zip(a, copy_sequence(row, c, sinks=2, seed=5, index=9)))
    assert not torch.equal(a[0], copy_sequence(row, c, sinks=2, seed=5, index=10)[0])
    assert not torch.equal(a[0], copy_sequence(row, c, sinks=2, seed=6, index=9)[0])
    rows = torch.stack([row, row + 300])
    ids, mask = copy_batch(rows, c, sinks=2, seed=5, first=9)
    assert torch.equal(ids[0], a[0]) and torch.equal(mask[0], a[1])
    assert torch.equal(ids[1] - 300, copy_sequence(row, c, sinks=2, seed=5, index=10)[0])


def test_sizes_checked():
    with pytest.raises(ValidationError, match="max_distance 20 must be at least min_distance"):
        CopySpec(span_len=16, min_distance=8, max_distance=20)
    with pytest.raises(ValidationError, match="span_len"):
        CopySpec(span_len=1, min_distance=8, max_distance=100)
    c = CopySpec(spans=4, span_len=16, min_distance=64, max_distance=768)
    with pytest.raises(ValueError, match="seq_len 512 is too short for 4 copies of 16 tokens up "
                                         "to 768 tokens back after 4 sinks \\(needs 836\\)"):
        copy_sequence(torch.arange(512), c, sinks=4, seed=0, index=0)


def test_loss_weights_share_and_sum():
    mask = torch.zeros(2, 10, dtype=torch.bool)
    mask[0, 3:5] = True
    mask[1, 6] = True
    w = loss_weights(mask, 0.25)
    assert w.sum().item() == pytest.approx(1.0)
    assert w[mask].sum().item() == pytest.approx(0.25)
    assert (w[:, -1] == 0).all() and (w[mask] == 0.25 / 3).all()
    with pytest.raises(ValueError, match="needs copy and prose positions"):
        loss_weights(torch.zeros(1, 10, dtype=torch.bool), 0.5)
