"""The cross-attention chapter's task: digits spelled as an abacus reads them."""

from __future__ import annotations

import itertools

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from qkv.data import ABACUS_WORDS, AbacusBeadOrderTask, AbacusSpellingTask


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


def test_exclude_is_never_drawn_and_an_exclude_of_everything_is_named():
    task = AbacusSpellingTask(min_digits=1, max_digits=1)  # ten sources: the digits
    batch = task.batch(40, generator=torch.Generator().manual_seed(0), exclude=[(d,) for d in range(9)])
    assert batch.source.flatten().tolist() == [10] * 40  # only 9 (id 10) is left
    with pytest.raises(ValueError, match=r"exclude holds 10 digit strings.*AbacusSpellingTask\(min_digits=1"):
        task.batch(2, exclude=[(d,) for d in range(10)])


# --- AbacusBeadOrderTask: the same words, rods read fewest one-beads first ---------------------


def test_bead_order_reads_the_rods_fewest_one_beads_first():
    task = AbacusBeadOrderTask()
    words, alignment = task.spell([7, 0, 8])
    assert words == ["zero", "five", "two", "five", "three"]  # 0, then 7 (2 beads), then 8 (3)
    assert alignment == [1, 0, 0, 2, 2]
    batch = task.from_digits([[7, 0, 8], [4, 5]])
    assert [task.target_words(row) for row in batch.target_out] == [words, ["five", "zero", "four"]]
    assert batch.alignment.tolist()[1][:3] == [1, 1, 0]


@settings(max_examples=40, deadline=None)
@given(st.permutations(range(5)), st.lists(st.booleans(), min_size=5, max_size=5), st.integers(1, 5))
def test_bead_order_alignment_is_a_permutation_sorted_by_one_beads(ones, fives, length):
    digits = [count + 5 * five for count, five in zip(ones, fives, strict=True)][:length]
    words, alignment = AbacusBeadOrderTask(min_digits=1).spell(digits)
    assert sorted(words) == sorted(AbacusSpellingTask().spell(digits)[0])  # the same words, reordered
    rods = list(dict.fromkeys(alignment))  # the order the rods are read in
    assert sorted(rods) == list(range(length))
    assert [digits[p] % 5 for p in rods] == sorted(digits[p] % 5 for p in rods)


def test_bead_order_batches_have_distinct_one_beads_and_honour_exclude():
    task = AbacusBeadOrderTask(min_digits=3, max_digits=3)
    every = [
        (a + 5 * x, b + 5 * y, c + 5 * z)
        for a, b, c in itertools.permutations(range(5), 3)
        for x, y, z in itertools.product((0, 1), repeat=3)
    ]
    assert len(every) == 480
    batch = task.batch(64, generator=torch.Generator().manual_seed(1), exclude=every[:470])
    drawn = {tuple((row - 1).tolist()) for row in batch.source}
    assert drawn <= set(every[470:])
    for source in AbacusBeadOrderTask().batch(64, generator=torch.Generator().manual_seed(2)).source:
        digits = [int(d) for d in task.source_words(source)]
        assert 3 <= len(digits) <= 5 and len({d % 5 for d in digits}) == len(digits)


def test_bead_order_names_bad_arguments():
    with pytest.raises(ValueError, match=r"max_digits must be at most 5.*got 6"):
        AbacusBeadOrderTask(max_digits=6)
    with pytest.raises(ValueError, match=r"but 2 and 7 \(positions 0 and 2\) both show 2"):
        AbacusBeadOrderTask().spell([2, 0, 7])
    with pytest.raises(ValueError, match="digits must be ints from 0 to 9, got 10 at position 1"):
        AbacusBeadOrderTask().from_digits([[1, 10]])
    assert repr(AbacusBeadOrderTask()) == "AbacusBeadOrderTask(min_digits=3, max_digits=5)"
