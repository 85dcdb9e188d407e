"""The cross-attention chapter's task: digits spelled as an abacus reads them."""

from __future__ import annotations

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from qkv.data import ABACUS_WORDS, AbacusSpellingTask


def test_spell_reads_each_digit_as_an_abacus_shows_it():
    task = AbacusSpellingTask()
    words, alignment = task.spell([7, 0, 5, 3])
    assert words == ["five", "two", "zero", "five", "zero", "three"]
    assert alignment == [0, 0, 1, 2, 2, 3]
    for digit, spelling in enumerate(ABACUS_WORDS):
        assert len(spelling) == (2 if digit >= 5 else 1)


def test_batch_shapes_padding_and_shift():
    task = AbacusSpellingTask(min_digits=2, max_digits=6)
    batch = task.batch(16, generator=torch.Generator().manual_seed(0))
    B, S = batch.source.shape
    T = batch.target_out.shape[1]
    assert B == 16 and S == int(batch.source_lengths.max()) and S <= 6
    assert batch.target_in.shape == batch.target_out.shape == batch.alignment.shape == (B, T)
    assert int(batch.source_lengths.min()) >= 2
    # Source padding starts exactly at each row's length.
    real = torch.arange(S)[None, :] < batch.source_lengths[:, None]
    assert torch.equal(batch.source != task.pad_id, real)
    # The decoder reads <bos> then the target: target_in is target_out shifted right by one.
    assert (batch.target_in[:, 0] == task.bos_id).all()
    ends = (batch.target_out == task.eos_id).int().argmax(dim=1)  # (B,)
    for row in range(B):
        n = int(ends[row])
        assert torch.equal(batch.target_in[row, 1 : n + 1], batch.target_out[row, :n])
        assert (batch.target_in[row, n + 1 :] == task.pad_id).all()
        assert (batch.target_out[row, n + 1 :] == task.pad_id).all()
        assert (batch.alignment[row, n:] == -1).all()
    assert T == int(ends.max()) + 1


def test_batch_agrees_with_spell_and_alignment_points_to_the_spelled_digit():
    task = AbacusSpellingTask()
    batch = task.batch(32, generator=torch.Generator().manual_seed(1))
    for row in range(32):
        digits = [int(t) for t in task.source_words(batch.source[row])]
        words, alignment = task.spell(digits)
        assert task.target_words(batch.target_out[row]) == words
        assert task.target_words(batch.target_in[row]) == words
        assert batch.alignment[row, : len(words)].tolist() == alignment


def test_batch_is_reproducible_from_a_seed():
    task = AbacusSpellingTask()
    first = task.batch(8, generator=torch.Generator().manual_seed(3))
    second = task.batch(8, generator=torch.Generator().manual_seed(3))
    for a, b in zip(first, second, strict=True):
        assert torch.equal(a, b)


@settings(max_examples=30, deadline=None)
@given(st.lists(st.integers(0, 9), min_size=1, max_size=12))
def test_alignment_is_monotonic_and_covers_every_digit(digits):
    words, alignment = AbacusSpellingTask().spell(digits)
    assert len(words) == len(alignment) == sum(len(ABACUS_WORDS[d]) for d in digits)
    assert alignment == sorted(alignment)
    assert set(alignment) == set(range(len(digits)))


def test_bad_arguments_are_named():
    with pytest.raises(ValueError, match="max_digits=2 is smaller than min_digits=3"):
        AbacusSpellingTask(min_digits=3, max_digits=2)
    with pytest.raises(ValueError, match="digits must be ints from 0 to 9, got 12 at position 1"):
        AbacusSpellingTask().spell([1, 12])
    with pytest.raises(TypeError, match="batch_size must be an int"):
        AbacusSpellingTask().batch(2.0)


def test_from_digits_pads_and_aligns_given_strings():
    task = AbacusSpellingTask()
    batch = task.from_digits([[7, 0], [3]])
    assert batch.source.tolist() == [[8, 1], [4, 0]]
    assert batch.source_lengths.tolist() == [2, 1]
    assert [task.target_words(row) for row in batch.target_out] == [["five", "two", "zero"], ["three"]]
    assert batch.alignment.tolist() == [[0, 0, 1, -1], [0, -1, -1, -1]]
    with pytest.raises(ValueError, match="at least one digit"):
        task.from_digits([[1], []])
