"""Data: small synthetic tasks, made on the fly, that attention must solve.

No downloads: every task is generated from a seed, so a chapter trains the
same way on every machine. Each task documents what a model must attend to.

See also
--------
The chapters :doc:`cross_attention/abacus` (book/cross_attention/abacus.ipynb) and
:doc:`training` (book/training.ipynb).
"""

from __future__ import annotations

from collections.abc import Collection, Sequence
from dataclasses import dataclass
from typing import NamedTuple

import torch
from torch import Tensor

from qkv._validation import require_positive_int, require_tensor

__all__: list[str] = [
    "ABACUS_WORDS",
    "IGNORE_INDEX",
    "AbacusBeadOrderTask",
    "AbacusSpellingTask",
    "AssociativeRecall",
    "PreviousTokenBatch",
    "PreviousTokenTask",
    "RecallBatch",
    "Seq2SeqBatch",
]


#: How many times in a row :meth:`AbacusSpellingTask.batch` may draw only excluded strings.
_MAX_REDRAWS = 1000

#: The target of positions that have no answer; ``F.cross_entropy`` skips it by default.
IGNORE_INDEX = -100


class RecallBatch(NamedTuple):
    """One batch of :class:`AssociativeRecall`.

    Attributes
    ----------
    names : LongTensor, shape (B, num_pairs + 1)
        The pairs' names, then the queried name (one of them) at the last position.
    numbers : LongTensor, shape (B, num_pairs + 1)
        The pairs' numbers, then ``num_numbers`` (the blank) at the last position.
    target : LongTensor, shape (B,)
        The number paired with the queried name: the answer.
    position : LongTensor, shape (B,)
        Where that pair sits: the position the query must attend to.
    """

    names: Tensor
    numbers: Tensor
    target: Tensor
    position: Tensor


@dataclass(frozen=True)
class AssociativeRecall:
    """Associative recall: name-number pairs, then a name; answer its number.

    Each sequence holds ``num_pairs`` pairs with distinct names (drawn from
    ``num_names``) and random numbers (from ``num_numbers``), one pair per
    position, then one query position holding one of the names and a blank
    number. The answer is the number paired with the queried name. It sits at
    one position only, which changes from sequence to sequence, so a model can
    only answer by attending from the query to that position, found by matching
    names. The data says nothing about where to attend.

    The toy's names and numbers are not attention's keys and values: those are
    projections the model learns (K = X W^K, V = X W^V) from both.

    Parameters
    ----------
    num_pairs : int
        Pairs per sequence; the sequence has ``num_pairs + 1`` positions.
    num_names : int
        Size of the name vocabulary; at least ``num_pairs``.
    num_numbers : int
        Size of the number vocabulary (the answers); the id ``num_numbers`` is
        the blank number at the query position.

    See Also
    --------
    qkv.models.RecallModel : a one-layer attention model that solves it.
    :doc:`training/recall` : a model trained on it without attention labels.

    Examples
    --------
    >>> import torch
    >>> from qkv.data import AssociativeRecall
    >>> generator = torch.Generator().manual_seed(0)
    >>> batch = AssociativeRecall(num_pairs=4).sample(2, generator=generator)
    >>> batch.names.shape, batch.target.shape
    (torch.Size([2, 5]), torch.Size([2]))
    """

    num_pairs: int = 8
    num_names: int = 16
    num_numbers: int = 16

    def __post_init__(self) -> None:
        for name in ("num_pairs", "num_names", "num_numbers"):
            require_positive_int(name, getattr(self, name))
        if self.num_pairs > self.num_names:
            raise ValueError(
                f"num_pairs={self.num_pairs} pairs need as many distinct names, "
                f"but num_names={self.num_names}"
            )

    @property
    def length(self) -> int:
        """Positions per sequence: the pairs and the query."""
        return self.num_pairs + 1

    @property
    def blank(self) -> int:
        """The number id at the query position (not an answer)."""
        return self.num_numbers

    def sample(
        self,
        batch_size: int,
        *,
        generator: torch.Generator | None = None,
        device: torch.device | str | None = None,
    ) -> RecallBatch:
        """Draw a batch of sequences.

        Parameters
        ----------
        batch_size : int
            B.
        generator : torch.Generator, optional
            Source of randomness (on the CPU), for reproducible batches.
        device : torch.device or str, optional
            Where the returned tensors live.

        Returns
        -------
        RecallBatch
            names and numbers (B, num_pairs + 1), target and position (B,).
        """
        batch = require_positive_int("batch_size", batch_size)
        n = self.num_pairs
        # float32 whatever torch's default dtype: the same generator gives the same data.
        noise = torch.rand(batch, self.num_names, generator=generator, dtype=torch.float32)  # (B, num_names)
        order = noise.argsort(dim=-1)  # (B, num_names)
        pair_names = order[:, :n]  # (B, n): distinct names in each sequence
        pair_numbers = torch.randint(self.num_numbers, (batch, n), generator=generator)  # (B, n)
        position = torch.randint(n, (batch,), generator=generator)  # (B,)
        query = pair_names.gather(1, position[:, None])  # (B, 1)
        target = pair_numbers.gather(1, position[:, None])[:, 0]  # (B,)
        names = torch.cat([pair_names, query], dim=1)  # (B, n + 1)
        numbers = torch.cat([pair_numbers, torch.full((batch, 1), self.blank)], dim=1)  # (B, n + 1)
        return RecallBatch(*(t.to(device) for t in (names, numbers, target, position)))


class PreviousTokenBatch(NamedTuple):
    """One batch of :class:`PreviousTokenTask`.

    Attributes
    ----------
    tokens : LongTensor, shape (B, T)
    target : LongTensor, shape (B, T)
        ``target[:, t] = tokens[:, t - 1]``; ``IGNORE_INDEX`` at t = 0.
    """

    tokens: Tensor
    target: Tensor


@dataclass(frozen=True)
class PreviousTokenTask:
    """Copy the previous token: at each position, answer the token one step back.

    The tokens are independent and uniform, so the answer at position t is
    found only at position t - 1: each query must attend to the key just
    before it, and not to itself. That "look one step back" relation is not
    symmetric, which is what the chapter uses it for.

    Parameters
    ----------
    length : int
        T, positions per sequence (at least 2).
    vocab_size : int
        Number of distinct tokens.

    See Also
    --------
    qkv.models.PreviousTokenModel
    :doc:`training/tying` : what tying W^Q = W^K costs on it, and two matrices started equal.
    """

    length: int = 64
    vocab_size: int = 16

    def __post_init__(self) -> None:
        require_positive_int("length", self.length)
        require_positive_int("vocab_size", self.vocab_size)
        if self.length < 2:
            raise ValueError(f"length must be at least 2 (a previous token is needed), got {self.length}")

    def sample(
        self,
        batch_size: int,
        *,
        generator: torch.Generator | None = None,
        device: torch.device | str | None = None,
    ) -> PreviousTokenBatch:
        """Draw a batch: tokens (B, T) and targets (B, T), IGNORE_INDEX at position 0.

        Parameters
        ----------
        batch_size : int
            B.
        generator : torch.Generator, optional
            Source of randomness (on the CPU).
        device : torch.device or str, optional
            Where the returned tensors live.

        Returns
        -------
        PreviousTokenBatch
        """
        batch = require_positive_int("batch_size", batch_size)
        tokens = torch.randint(self.vocab_size, (batch, self.length), generator=generator)  # (B, T)
        target = torch.full_like(tokens, IGNORE_INDEX)  # (B, T)
        target[:, 1:] = tokens[:, :-1]  # the answer at t is the token at t - 1
        return PreviousTokenBatch(tokens.to(device), target.to(device))


# --- Spelling digits as words: a sequence-to-sequence task with a known alignment ---

#: How :class:`AbacusSpellingTask` spells each digit, as an abacus shows it: a five-bead, then one-beads.
ABACUS_WORDS: tuple[tuple[str, ...], ...] = (
    ("zero",),
    ("one",),
    ("two",),
    ("three",),
    ("four",),
    ("five", "zero"),
    ("five", "one"),
    ("five", "two"),
    ("five", "three"),
    ("five", "four"),
)


class Seq2SeqBatch(NamedTuple):
    """A padded batch of (source, target) pairs, with the true alignment.

    Attributes
    ----------
    source : LongTensor, shape (B, S)
        Source token ids, padded with ``pad_id`` after ``source_lengths``.
    source_lengths : LongTensor, shape (B,)
        The number of real source tokens in each row.
    target_in : LongTensor, shape (B, T)
        What the decoder reads: ``bos_id`` then the target, padded.
    target_out : LongTensor, shape (B, T)
        What the decoder must predict at each position: the target then
        ``eos_id``, padded with ``pad_id``.
    alignment : LongTensor, shape (B, T)
        For each position of ``target_out``, the source position its token
        spells; -1 for the end-of-sequence token and for padding.
    """

    source: Tensor
    source_lengths: Tensor
    target_in: Tensor
    target_out: Tensor
    alignment: Tensor


class AbacusSpellingTask:
    """Spell digits the way an abacus shows them: ``7 0 3 -> five two zero three``.

    On an abacus (a soroban) each rod shows one digit with a five-bead and up
    to four one-beads. The target reads each digit of the source that way
    (:data:`qkv.data.ABACUS_WORDS`): 0 to 4 as one word, 5 to 9 as "five" then the
    number of one-beads, so 7 is "five two" and 5 is "five zero". The target
    is longer than the source by a varying amount, every target word comes
    from one known source position (the *alignment*, which cross-attention
    should find), and no word can be predicted without reading its digit.

    Token ids: the source has ``pad_id = 0`` then the digits 0-9 as ids 1-10;
    the target has ``pad_id = 0``, ``bos_id = 1``, ``eos_id = 2``, then the
    words zero to five.

    Parameters
    ----------
    min_digits, max_digits : int
        The range of source lengths (inclusive).

    See Also
    --------
    qkv.data.AbacusBeadOrderTask : the same words, rods read fewest one-beads first (the chapter's task).

    Examples
    --------
    >>> from qkv.data import AbacusSpellingTask
    >>> task = AbacusSpellingTask()
    >>> task.spell([7, 0, 3])
    (['five', 'two', 'zero', 'three'], [0, 0, 1, 2])
    """

    pad_id = 0
    bos_id = 1
    eos_id = 2

    def __init__(self, min_digits: int = 3, max_digits: int = 8) -> None:
        self.min_digits = require_positive_int("min_digits", min_digits)
        self.max_digits = require_positive_int("max_digits", max_digits)
        if max_digits < min_digits:
            raise ValueError(f"max_digits={max_digits} is smaller than min_digits={min_digits}")
        self.source_tokens: list[str] = ["<pad>", *(str(digit) for digit in range(10))]
        words = list(dict.fromkeys(word for spelling in ABACUS_WORDS for word in spelling))
        self.target_tokens: list[str] = ["<pad>", "<bos>", "<eos>", *words]
        self._target_id = {token: i for i, token in enumerate(self.target_tokens)}

    @property
    def source_vocab_size(self) -> int:
        """Number of source token ids, padding included."""
        return len(self.source_tokens)

    @property
    def target_vocab_size(self) -> int:
        """Number of target token ids, padding, start and end included."""
        return len(self.target_tokens)

    @property
    def max_target_length(self) -> int:
        """The longest ``target_out`` a batch can hold: two words per digit, plus the end."""
        return 2 * self.max_digits + 1

    def __repr__(self) -> str:
        return f"AbacusSpellingTask(min_digits={self.min_digits}, max_digits={self.max_digits})"

    def spell(self, digits: Sequence[int]) -> tuple[list[str], list[int]]:
        """The words that spell ``digits``, and the source position of each word.

        Parameters
        ----------
        digits : sequence of int
            Digits 0-9.

        Returns
        -------
        words : list of str
        alignment : list of int
            ``alignment[t]`` is the position in ``digits`` that ``words[t]`` spells.
        """
        words: list[str] = []
        alignment: list[int] = []
        for position, digit in enumerate(digits):
            if isinstance(digit, bool) or not isinstance(digit, int) or not 0 <= digit <= 9:
                raise ValueError(f"digits must be ints from 0 to 9, got {digit!r} at position {position}")
            words.extend(ABACUS_WORDS[digit])
            alignment.extend([position] * len(ABACUS_WORDS[digit]))
        return words, alignment

    def batch(
        self,
        batch_size: int,
        *,
        generator: torch.Generator | None = None,
        device: torch.device | str | None = None,
        exclude: Collection[tuple[int, ...]] = (),
    ) -> Seq2SeqBatch:
        """Draw a batch of random digit strings and their spellings.

        Parameters
        ----------
        batch_size : int
            B.
        generator : torch.Generator, optional
            The source of randomness (on the CPU); default torch's global one.
        device : torch.device or str, optional
            Where to put the tensors.
        exclude : collection of tuples of int, optional
            Digit strings never to draw, such as a held-out set: a row that
            comes out as one of them is drawn again.

        Returns
        -------
        Seq2SeqBatch
            ``source`` (B, S) with S the longest source drawn, and
            ``target_in``, ``target_out``, ``alignment`` (B, T) with T the
            longest target plus one.
        """
        batch_size = require_positive_int("batch_size", batch_size)
        excluded = set(exclude)
        rows = self._draw(batch_size, generator)
        for _ in range(_MAX_REDRAWS + 1):  # a first check, then up to _MAX_REDRAWS redraws
            again = [i for i, row in enumerate(rows) if row in excluded]
            if not again:
                return self.from_digits(rows, device=device)
            for i, row in zip(again, self._draw(len(again), generator), strict=True):
                rows[i] = row
        raise ValueError(
            f"exclude holds {len(excluded)} digit strings, and {_MAX_REDRAWS} draws in a row "
            f"kept drawing them: it leaves (almost) nothing of {self!r} to draw"
        )

    def _draw(self, n: int, generator: torch.Generator | None) -> list[tuple[int, ...]]:
        """``n`` random digit strings, uniform over the lengths, then over the digits."""
        lengths = torch.randint(self.min_digits, self.max_digits + 1, (n,), generator=generator)  # (n,)
        digits = torch.randint(0, 10, (n, int(lengths.max())), generator=generator)  # (n, S)
        return [tuple(row[:k]) for row, k in zip(digits.tolist(), lengths.tolist(), strict=True)]

    def from_digits(
        self, digits: Sequence[Sequence[int]], *, device: torch.device | str | None = None
    ) -> Seq2SeqBatch:
        """A padded batch from given digit strings, e.g. to look at one example.

        Parameters
        ----------
        digits : sequence of B sequences of int
            Each a string of digits 0-9, of any positive length.
        device : torch.device or str, optional
            Where to put the tensors.

        Returns
        -------
        Seq2SeqBatch
            As :meth:`batch` returns.

        Examples
        --------
        >>> batch = AbacusSpellingTask().from_digits([[7, 0], [3]])
        >>> batch.target_out
        tensor([[8, 5, 3, 2],
                [6, 2, 0, 0]])
        """
        if not digits or any(len(row) == 0 for row in digits):
            raise ValueError("digits must hold at least one digit string, each with at least one digit")
        spelled = [self.spell(list(row)) for row in digits]
        B, S = len(digits), max(len(row) for row in digits)
        T = max(len(words) for words, _ in spelled) + 1  # room for the end token
        source = torch.full((B, S), self.pad_id)  # (B, S)
        target_out = torch.full((B, T), self.pad_id)  # (B, T)
        alignment = torch.full((B, T), -1)  # (B, T)
        for row, (words, positions) in enumerate(spelled):
            source[row, : len(digits[row])] = torch.tensor(list(digits[row])) + 1  # digit d has id d + 1
            ids = [self._target_id[word] for word in words] + [self.eos_id]
            target_out[row, : len(ids)] = torch.tensor(ids)
            alignment[row, : len(positions)] = torch.tensor(positions)
        lengths = torch.tensor([len(row) for row in digits])  # (B,)
        target_in = torch.cat([torch.full((B, 1), self.bos_id), target_out[:, :-1]], dim=1)  # (B, T)
        target_in = target_in.masked_fill(target_in == self.eos_id, self.pad_id)  # (B, T)
        return Seq2SeqBatch(*(x.to(device) for x in (source, lengths, target_in, target_out, alignment)))

    def source_words(self, source: Tensor) -> list[str]:
        """One row of source ids as tokens, padding left out.

        Parameters
        ----------
        source : LongTensor, shape (S,)

        Returns
        -------
        list of str
        """
        ids = require_tensor("source", source, ndim=1, layout="(S,)", floating=False)
        return [self.source_tokens[i] for i in ids.tolist() if i != self.pad_id]

    def target_words(self, target: Tensor) -> list[str]:
        """One row of target ids as tokens, up to (without) the end or the padding.

        Parameters
        ----------
        target : LongTensor, shape (T,)

        Returns
        -------
        list of str
        """
        ids = require_tensor("target", target, ndim=1, layout="(T,)", floating=False)
        words = []
        for i in ids.tolist():
            if i in (self.eos_id, self.pad_id):
                break
            if i != self.bos_id:
                words.append(self.target_tokens[i])
        return words


class AbacusBeadOrderTask(AbacusSpellingTask):
    """Read an abacus's rods fewest one-beads first: ``7 0 8 -> zero five two five three``.

    The words are those of :class:`AbacusSpellingTask`, but the target reads
    the rods from the one with the fewest one-beads (``digit % 5``) to the one
    with the most. No two rods of a source show the same number of one-beads,
    so at most one digit of each pair (0, 5), (1, 6), (2, 7), (3, 8), (4, 9)
    appears, the order is strict, and a source has at most five digits. The
    alignment is then a permutation of the source positions, not a staircase:
    to write each word, the decoder must find its digit by what the digit is,
    not by where it sits.

    Parameters
    ----------
    min_digits, max_digits : int
        The range of source lengths (inclusive); ``max_digits`` at most 5.

    See Also
    --------
    qkv.models.TinyEncoderDecoder : the model the chapter trains on it.
    :doc:`cross_attention/abacus` : the task, and where a trained cross-attention looks.

    Examples
    --------
    >>> from qkv.data import AbacusBeadOrderTask
    >>> task = AbacusBeadOrderTask()
    >>> task.spell([7, 0, 8])
    (['zero', 'five', 'two', 'five', 'three'], [1, 0, 0, 2, 2])
    """

    def __init__(self, min_digits: int = 3, max_digits: int = 5) -> None:
        super().__init__(min_digits, max_digits)
        if max_digits > 5:
            raise ValueError(
                f"max_digits must be at most 5 (one rod per number of one-beads, 0 to 4), got {max_digits}"
            )

    def __repr__(self) -> str:
        return f"AbacusBeadOrderTask(min_digits={self.min_digits}, max_digits={self.max_digits})"

    def spell(self, digits: Sequence[int]) -> tuple[list[str], list[int]]:
        """The words that read ``digits`` fewest one-beads first, and the source position of each word.

        Parameters
        ----------
        digits : sequence of int
            Digits 0-9, no two with the same number of one-beads (``digit % 5``).

        Returns
        -------
        words : list of str
        alignment : list of int
            ``alignment[t]`` is the position in ``digits`` that ``words[t]`` spells.
        """
        in_source_order, positions = super().spell(digits)  # checks each digit
        beads = [digit % 5 for digit in digits]
        for position, count in enumerate(beads):
            if count in beads[:position]:
                raise ValueError(
                    f"digits must show different numbers of one-beads, but {digits[beads.index(count)]} and "
                    f"{digits[position]} (positions {beads.index(count)} and {position}) both show {count}"
                )
        order = sorted(range(len(positions)), key=lambda t: beads[positions[t]])  # stable: "five" first
        return [in_source_order[t] for t in order], [positions[t] for t in order]

    def _draw(self, n: int, generator: torch.Generator | None) -> list[tuple[int, ...]]:
        """``n`` random sources: uniform over the lengths, then over the rods' one-beads and five-beads."""
        lengths = torch.randint(self.min_digits, self.max_digits + 1, (n,), generator=generator)  # (n,)
        noise = torch.rand(n, 5, generator=generator, dtype=torch.float32)  # (n, 5); float32 as above
        ones = noise.argsort(dim=-1)  # (n, 5): the counts 0-4, shuffled
        fives = torch.randint(0, 2, (n, 5), generator=generator)  # (n, 5): a five-bead or not
        digits = ones + 5 * fives  # (n, 5)
        return [tuple(row[:k]) for row, k in zip(digits.tolist(), lengths.tolist(), strict=True)]
