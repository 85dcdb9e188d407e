"""The training chapter's synthetic tasks: associative recall and copying the previous token."""

from __future__ import annotations

import pytest
import torch

from qkv.data import IGNORE_INDEX, AssociativeRecall, PreviousTokenTask


def test_recall_batch_answers_are_at_the_stated_position():
    task = AssociativeRecall(num_pairs=6, num_names=10, num_numbers=7)
    batch = task.sample(200, generator=torch.Generator().manual_seed(0))
    assert batch.names.shape == batch.numbers.shape == (200, 7)
    assert batch.target.shape == batch.position.shape == (200,)
    rows = torch.arange(200)
    pair_names = batch.names[:, :-1]  # (B, n)
    # Names are distinct within a sequence, so the query matches exactly one pair.
    assert all(len(set(row.tolist())) == 6 for row in pair_names)
    matches = pair_names == batch.names[:, -1:]  # (B, n)
    assert torch.equal(matches.sum(1), torch.ones(200, dtype=torch.long))
    assert torch.equal(matches.float().argmax(1), batch.position)
    assert torch.equal(batch.numbers[rows, batch.position], batch.target)
    assert torch.equal(batch.numbers[:, -1], torch.full((200,), task.blank))
    assert int(batch.numbers[:, :-1].max()) < 7 and int(batch.names.max()) < 10
    # The answer's position varies: nothing but the names say where to look.
    assert len(set(batch.position.tolist())) == 6


def test_recall_is_reproducible_from_a_generator():
    task = AssociativeRecall()
    a = task.sample(5, generator=torch.Generator().manual_seed(3))
    b = task.sample(5, generator=torch.Generator().manual_seed(3))
    assert all(torch.equal(x, y) for x, y in zip(a, b, strict=True))
    assert task.length == 9


def test_previous_token_targets():
    task = PreviousTokenTask(length=5, vocab_size=3)
    tokens, target = task.sample(4, generator=torch.Generator().manual_seed(0))
    assert tokens.shape == target.shape == (4, 5)
    assert torch.equal(target[:, 1:], tokens[:, :-1])
    assert bool((target[:, 0] == IGNORE_INDEX).all())


def test_errors():
    with pytest.raises(ValueError, match="num_pairs=5 pairs need as many distinct names, but num_names=4"):
        AssociativeRecall(num_pairs=5, num_names=4)
    with pytest.raises(ValueError, match="num_numbers must be positive, got 0"):
        AssociativeRecall(num_numbers=0)
    # The toy's old names (keys, values) fail loudly, naming the argument.
    with pytest.raises(TypeError, match="unexpected keyword argument 'num_keys'"):
        AssociativeRecall(num_keys=10)  # type: ignore[call-arg]
    with pytest.raises(ValueError, match="length must be at least 2"):
        PreviousTokenTask(length=1)
    with pytest.raises(TypeError, match="batch_size must be an int"):
        AssociativeRecall().sample(2.0)


def test_recall_data_does_not_depend_on_the_default_dtype():
    """A chapter that trains in float64 (torch.set_default_dtype) sees the same sequences."""
    task = AssociativeRecall(num_pairs=6, num_names=10, num_numbers=7)
    before = task.sample(50, generator=torch.Generator().manual_seed(3))
    default = torch.get_default_dtype()
    try:
        torch.set_default_dtype(torch.float64)
        after = task.sample(50, generator=torch.Generator().manual_seed(3))
    finally:
        torch.set_default_dtype(default)
    assert torch.equal(before.names, after.names) and torch.equal(before.numbers, after.numbers)
