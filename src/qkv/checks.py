"""Checks for attention code: run them on any attention function or module to catch the usual bugs.

Each check states one property that every correct attention has, measures it
on your code, and raises :class:`AttentionCheckError` (an ``AssertionError``)
when it does not hold, with what was expected, what was measured (the numbers
and the worst position) and the bug that usually causes it:

=============================  ============================================================
check                          property
=============================  ============================================================
:func:`check_rows_sum_to_one`  each query's weights over the keys sum to 1
:func:`check_mask_respected`   blocked keys get no weight
:func:`check_permutation_      permuting keys and values together leaves the output
invariant`                     unchanged (and permutes the weights' columns)
:func:`check_causal`           with a causal mask, changing the future does not change
                               the past
:func:`check_heads_            changing one head's inputs or weights changes only that
independent`                   head
:func:`check_matches_          the output and the weights agree with a reference
reference`                     implementation (qkv's, by default)
=============================  ============================================================

:func:`run_checks` runs every check that applies and returns a report.

What can be checked
-------------------
``attend`` is either

* a function ``attend(query, key, value, mask=None) -> (output, weights)``, such as
  :func:`qkv.attention`, with ``query`` (..., T, d_k), ``key`` (..., S, d_k),
  ``value`` (..., S, d_v) and weights (..., T, S); inputs with four or more
  dimensions are read as (..., B, h, T, d), with a head axis third from the end; or
* a module called as ``attend(query, key, value, mask=mask, need_weights=True)``
  returning ``(output, weights)`` with weights (B, h, T, S), such as
  :class:`qkv.MultiHeadAttention` or a copy of it with a bug. A module without a
  ``need_weights`` argument is called like a function.

Masks follow qkv's convention: **True means "may attend"**. Wrap code with
another convention (``torch.nn.MultiheadAttention``'s True = blocked) in a
small function first.

See also
--------
The pages :doc:`equation/bug-zoo` and :doc:`heads/wrong-view` (book/equation/bug-zoo.ipynb,
book/heads/wrong-view.ipynb).
"""

from __future__ import annotations

import copy
import inspect
import math
import re
import textwrap
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any, Protocol, TypeGuard, cast

import numpy as np
import torch
from torch import Tensor, nn

from qkv._validation import (
    require_bool_mask,
    require_mask,
    require_same_dtype_and_device,
    require_size,
    require_tensor,
    shape_str,
)
from qkv.attention import attention
from qkv.heads import HeadWeights, multi_head_attention
from qkv.masks import causal_mask

__all__ = [
    "AttentionCheckError",
    "CheckResult",
    "check_causal",
    "check_heads_independent",
    "check_mask_respected",
    "check_matches_reference",
    "check_permutation_invariant",
    "check_rows_sum_to_one",
    "run_checks",
]

#: An attention function ``(query, key, value, mask=None) -> (output, weights)`` or module.
Attend = Callable[..., Any]

# The width of a failure report's lines: it prints in a notebook or a terminal as it is.
_REPORT_WIDTH = 88
# A short group in parentheses, with none inside it: a shape such as (B, h, T, S), or a
# call's arguments such as (dim=-2). A report does not break a line inside one.
_UNBROKEN = re.compile(r"\([^()]{0,30}\)")


class _ToHeads(Protocol):
    """Has ``to_heads()``, the weights in the paper's per-head form."""

    def to_heads(self) -> HeadWeights: ...


class _PerHeadModule(_ToHeads, Protocol):
    """A module whose heads can be read and written one at a time (qkv's modules, their subclasses)."""

    def __call__(self, *args: Any, **kwargs: Any) -> Any: ...

    def load_heads(self, weights: HeadWeights) -> None: ...


class AttentionCheckError(AssertionError):
    """An attention check failed: what was expected, what was measured, and the usual cause.

    Attributes
    ----------
    check : str
        The check's name, e.g. ``"rows_sum_to_one"``.
    claim : str
        The property that every correct attention has.
    expected, measured : str
        What the check expected, and what it measured on your code (numbers and
        the worst position).
    cause : str
        The bug that usually produces this failure.

    Notes
    -----
    The message gives the claim, then the expected, measured and cause lines, each
    wrapped to 88 columns with its continuation indented, so that it prints as it is
    in a notebook or a terminal; the attributes hold the unwrapped text.
    """

    def __init__(self, check: str, claim: str, expected: str, measured: str, cause: str) -> None:
        self.check = check
        self.claim = claim
        self.expected = expected
        self.measured = measured
        self.cause = cause
        lines = [
            f"{check} failed: {claim}.",
            f"  expected: {expected}",
            f"  measured: {measured}",
            f"  usual cause: {cause}",
        ]
        super().__init__("\n".join(_wrap(line) for line in lines))


def _wrap(line: str) -> str:
    """One line of a report, wrapped to 88 columns, its continuation indented."""
    kept = _UNBROKEN.sub(lambda group: group[0].replace(" ", "\0"), line)  # not split there
    wrapped = textwrap.fill(
        kept,
        width=_REPORT_WIDTH,
        subsequent_indent=" " * 4,
        break_long_words=False,
        break_on_hyphens=False,
    )
    return wrapped.replace("\0", " ")


@dataclass(frozen=True)
class CheckResult:
    """The outcome of one check in :func:`run_checks`.

    Attributes
    ----------
    name : str
        The check's name, e.g. ``"rows_sum_to_one"``.
    passed : bool or None
        True when the property held, False when it did not, None when the check
        does not apply to these inputs (``message`` says why).
    message : str
        What was measured (passed), the :class:`AttentionCheckError`'s message
        (failed), or why the check was not run.
    """

    name: str
    passed: bool | None
    message: str


# ---------------------------------------------------------------------------
# Calling the code under test, and describing where it went wrong
# ---------------------------------------------------------------------------


def _prepare(
    attend: object, query: object, key: object | None, value: object | None, mask: object | None
) -> tuple[Tensor, Tensor, Tensor, Tensor | None]:
    """Validate the arguments shared by every check; default key to query and value to key."""
    if not callable(attend):
        raise TypeError(f"attend must be an attention function or module, got {type(attend).__name__}")
    q = require_tensor("query", query, min_ndim=2, layout="(..., T, features)")
    k = q if key is None else require_tensor("key", key, min_ndim=2, layout="(..., S, features)")
    v = k if value is None else require_tensor("value", value, min_ndim=2, layout="(..., S, features)")
    require_same_dtype_and_device({"query": q, "key": k, "value": v})
    require_size("value", v, -2, k.shape[-2], "positions", "the key's length S")
    m = None
    if mask is not None:
        # The checks select with the mask, so they take the boolean form (True = may attend).
        m = require_bool_mask("mask", mask)
        m = require_mask(m, (*m.shape[:-2], q.shape[-2], k.shape[-2]), "(..., T, S)")
    return q, k, v, m


def _takes_need_weights(attend: Attend) -> bool:
    if not isinstance(attend, nn.Module):
        return False
    try:
        return "need_weights" in inspect.signature(attend.forward).parameters
    except (TypeError, ValueError):  # pragma: no cover - builtins without a signature
        return False


@contextmanager
def _evaluating(attend: Attend) -> Iterator[None]:
    """Evaluation mode (no dropout) and no gradients while checking; restore the mode after."""
    training_module = attend if isinstance(attend, nn.Module) and attend.training else None
    if training_module is not None:
        training_module.eval()
    try:
        with torch.no_grad():
            yield
    finally:
        if training_module is not None:
            training_module.train()


def _call(
    attend: Attend, query: Tensor, key: Tensor, value: Tensor, mask: Tensor | None
) -> tuple[Tensor, Tensor]:
    """Call ``attend`` under the module or function protocol and check what it returns."""
    with _evaluating(attend):
        if _takes_need_weights(attend):
            result = attend(query, key, value, mask=mask, need_weights=True)
        else:
            result = attend(query, key, value, mask=mask)
    if not (isinstance(result, tuple) and len(result) == 2 and all(isinstance(r, Tensor) for r in result)):
        raise TypeError(
            "attend must return (output, weights), two tensors; got "
            f"{type(result).__name__}. For a module, pass one whose forward accepts "
            "need_weights=True, or wrap it in a function returning (output, weights)"
        )
    output, weights = result
    T, S = query.shape[-2], key.shape[-2]
    if weights.dim() < 2 or tuple(weights.shape[-2:]) != (T, S):
        raise ValueError(
            f"attend returned weights of shape {shape_str(weights.shape)}, but with {T} queries "
            f"and {S} keys they must have shape (..., T, S) = (..., {T}, {S})"
        )
    if output.dim() < 2 or output.shape[-2] != T:
        raise ValueError(
            f"attend returned an output of shape {shape_str(output.shape)}, but with {T} queries "
            f"it must have shape (..., T, features) = (..., {T}, features)"
        )
    return output, weights


def _axis_names(ndim: int, last: tuple[str, str]) -> list[str]:
    """Names for the axes of a weights (…, query, key) or output (…, query, feature) tensor."""
    leading = ndim - 2
    if leading == 2:
        names = ["sequence", "head"]
    elif leading == 1:
        names = ["sequence"]
    else:
        names = [f"axis {i}" for i in range(leading)]
    return [*names, *last]


def _where(index: tuple[int, ...], last: tuple[str, str]) -> str:
    names = _axis_names(len(index), last)
    return ", ".join(f"{name} {i}" for name, i in zip(names, index, strict=True))


def _where_row(index: tuple[int, ...]) -> str:
    """Describe an index into a (..., T) tensor of per-query values."""
    names = _axis_names(len(index) + 1, ("query", "key"))[:-1]
    return ", ".join(f"{name} {i}" for name, i in zip(names, index, strict=True))


def _worst(excess: Tensor) -> tuple[float, tuple[int, ...]]:
    """The largest entry (NaN counts as infinite) and its index."""
    excess = torch.nan_to_num(excess.detach().double(), nan=math.inf)  # same shape
    flat = int(excess.reshape(-1).argmax())
    index = tuple(int(i) for i in np.unravel_index(flat, tuple(excess.shape)))
    return float(excess.reshape(-1)[flat]), index


def _number(x: float) -> str:
    return f"{x:.3g}"


def _allowed(mask: Tensor, weights: Tensor) -> Tensor:
    try:
        return mask.expand(weights.shape)  # (..., T, S)
    except RuntimeError:
        raise ValueError(
            f"mask of shape {shape_str(mask.shape)} does not broadcast to the weights' shape "
            f"{shape_str(weights.shape)} that attend returned"
        ) from None


def _generator(seed: int) -> torch.Generator:
    if isinstance(seed, bool) or not isinstance(seed, int):
        raise TypeError(f"seed must be an int, got {type(seed).__name__}")
    return torch.Generator().manual_seed(seed)


def _noise(like: Tensor, generator: torch.Generator) -> Tensor:
    """Random values of ``like``'s shape, scale, dtype and device."""
    scale = float(like.detach().float().std()) if like.numel() > 1 else 1.0
    noise = torch.randn(like.shape, generator=generator, dtype=torch.float64)  # same shape
    return (noise * (scale or 1.0)).to(dtype=like.dtype, device=like.device)


def _compare(
    name: str, got: Tensor, expected: Tensor, atol: float, rtol: float, last: tuple[str, str]
) -> tuple[bool, str]:
    """Whether two tensors agree within tolerances, and a phrase on their largest difference."""
    if got.shape != expected.shape:
        return False, f"{name} has shape {shape_str(got.shape)}, expected {shape_str(expected.shape)}"
    if got.numel() == 0:
        return True, f"{name}: nothing to compare"
    difference = (got - expected).abs()  # same shape
    within = bool((difference <= atol + rtol * expected.abs()).all())  # NaN counts as a difference
    largest, index = _worst(difference)
    if within:
        return True, f"{name}: largest difference {_number(largest)}"
    return False, (
        f"{name}: largest difference {_number(largest)}, at {_where(index, last)} "
        f"({_number(float(got[index]))} instead of {_number(float(expected[index]))})"
    )


def _check_tolerance(atol: float, rtol: float = 0.0) -> None:
    for name, value in (("atol", atol), ("rtol", rtol)):
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not value >= 0:
            raise ValueError(f"{name} must be a non-negative number, got {value!r}")


# ---------------------------------------------------------------------------
# The checks
# ---------------------------------------------------------------------------

_SOFTMAX_AXIS = (
    "softmax over the wrong axis (dim=-2, over the queries, instead of dim=-1, over the keys); "
    "or a row whose keys are all blocked, filled with -inf, which gives NaN"
)


def _columns_sum_to_one(weights: Tensor, atol: float = 1e-4) -> bool:
    """Whether every column (one key, over the queries) sums to 1: the mark of a softmax over queries."""
    return weights.shape[-2] > 1 and bool(((weights.sum(dim=-2) - 1.0).abs() <= atol).all())


def check_rows_sum_to_one(
    attend: Attend,
    query: Tensor,
    key: Tensor | None = None,
    value: Tensor | None = None,
    *,
    mask: Tensor | None = None,
    atol: float = 1e-5,
) -> str:
    """Check that each query's weights over the keys sum to 1.

    Rows whose keys are all blocked by ``mask`` are not checked (qkv gives them
    zeros; other libraries NaN).

    Parameters
    ----------
    attend : callable or nn.Module
        The attention under test (see the module docstring for the protocol).
    query : Tensor, shape (..., T, features)
    key : Tensor, shape (..., S, features), optional
        Defaults to ``query``.
    value : Tensor, shape (..., S, features), optional
        Defaults to ``key``.
    mask : BoolTensor, optional, broadcastable to the weights (..., T, S)
        True means "may attend".
    atol : float
        Largest accepted ``|row sum - 1|``.

    Returns
    -------
    str
        What was measured, when the check passes.

    Raises
    ------
    AttentionCheckError
        When a row sums to something else; the message names the worst row.

    See Also
    --------
    run_checks
    :doc:`equation/bug-zoo` : buggy layers and the checks that catch them.

    Examples
    --------
    >>> import torch, qkv
    >>> from qkv.checks import check_rows_sum_to_one
    >>> query, key = torch.randn(4, 8), torch.randn(6, 8)
    >>> check_rows_sum_to_one(qkv.attention, query, key).startswith("every row")
    True
    """
    _check_tolerance(atol)
    q, k, v, m = _prepare(attend, query, key, value, mask)
    _, weights = _call(attend, q, k, v, m)
    sums = weights.sum(dim=-1)  # (..., T)
    deviation = (sums - 1.0).abs()  # (..., T)
    if m is not None:
        has_key = _allowed(m, weights).any(dim=-1)  # (..., T)
        deviation = deviation.masked_fill(~has_key, 0.0)  # (..., T)
    worst, index = _worst(deviation)
    if not worst <= atol:
        finite = sums[torch.isfinite(sums)]  # (n,)
        spread = (
            f"row sums range from {_number(float(finite.min()))} to {_number(float(finite.max()))}"
            if finite.numel()
            else "every row sum is NaN or infinite"
        )
        raise AttentionCheckError(
            "rows_sum_to_one",
            "each query's weights over the keys must sum to 1",
            f"|row sum - 1| <= {atol:g} for every query",
            f"{spread}; the worst is {_number(float(sums[index]))}, at {_where_row(index)}",
            _rows_diagnosis(weights, None if m is None else _allowed(m, weights), atol),
        )
    return f"every row sums to 1 within {worst:.1e}"


def _rows_diagnosis(weights: Tensor, allowed: Tensor | None, atol: float) -> str:
    """Guess why rows do not sum to 1: the softmax's axis, or a mask applied after it."""
    if _columns_sum_to_one(weights):
        return (
            "the columns sum to 1 instead: the softmax is taken over the queries (dim=-2), not "
            "over the keys (dim=-1)"
        )
    if allowed is not None:
        blocked_weight = weights.masked_fill(allowed, 0.0).abs()  # (..., T, S)
        sums = weights.sum(dim=-1)  # (..., T)
        mixed = allowed.any(dim=-1) & ~allowed.all(dim=-1)  # (..., T): rows with some blocked key
        if (
            bool(mixed.any())
            and bool((blocked_weight <= atol).all())
            and bool((sums[mixed] < 1.0 - atol).all())
            and bool(((sums - 1.0).abs() <= atol)[allowed.all(dim=-1)].all())
        ):
            return (
                "only rows with blocked keys fall short of 1, and blocked keys get 0: the mask is "
                "applied after the softmax, so what the blocked keys had is lost; fill the scores "
                "with -inf (or the lowest float) before the softmax instead"
            )
    return _SOFTMAX_AXIS


def _mask_diagnosis(weights: Tensor, allowed: Tensor, atol: float) -> str:
    """Guess the bug from the pattern of the weights on allowed and blocked keys."""
    has_key = allowed.any(dim=-1)  # (..., T)
    mixed = has_key & ~allowed.all(dim=-1)  # (..., T): rows with allowed and blocked keys
    on_allowed = weights.masked_fill(~allowed, 0.0).sum(dim=-1)  # (..., T)
    if mixed.any() and bool((on_allowed[mixed] <= atol).all()):
        return (
            "the mask is inverted: all the weight falls on blocked keys. qkv and "
            "F.scaled_dot_product_attention read True as 'may attend'; torch.nn.MultiheadAttention "
            "reads True as 'blocked' (convert with qkv.from_torch_mask)"
        )
    sums = weights.sum(dim=-1)  # (..., T)
    if not bool(((sums - 1.0).abs() <= 1e-4)[has_key].all()):
        if _columns_sum_to_one(weights):
            return (
                "the rows do not sum to 1 but the columns do: the softmax is taken over the "
                "queries (dim=-2), which gives weight even to a blocked key's column"
            )
        return "the rows do not sum to 1 (see rows_sum_to_one): the weights are not normalised over the keys"
    swapped = _obeys_another_sequence(weights, allowed, atol)
    if swapped is not None:
        b, i, other = swapped
        return (
            f"sequence {b}, head {i} obeys the mask of sequence {other}: a per-sequence mask "
            "repeated in the wrong order when batch and heads were flattened together "
            "(mask.repeat(h, 1, 1) orders the rows head by head; scores flattened from "
            "(B, h, T, S) need mask.repeat_interleave(h, dim=0))"
        )
    return (
        "blocked keys get weight, yet every row still sums to 1: blocked scores set to 0 "
        "(or a 0/1 mask added as floats) instead of -inf or the lowest float; or a padding "
        "mask broadcast along the wrong axes (it must be (B, 1, 1, S), not (B, S))"
    )


def _obeys_another_sequence(weights: Tensor, allowed: Tensor, atol: float) -> tuple[int, int, int] | None:
    """Find a (sequence, head) whose weights follow another sequence's mask instead of its own.

    Evidence needs keys that the head's own mask allows and the other mask blocks: a head
    that puts no weight on any of them (where it has some) follows the other mask. A bug
    that only leaks weight onto blocked keys never zeroes an allowed one, so it is not
    mistaken for this.
    """
    if weights.dim() != 4 or allowed.shape[0] < 2:
        return None
    for b in range(allowed.shape[0]):
        for other in range(allowed.shape[0]):
            if other == b:
                continue
            telling = allowed[b] & ~allowed[other]  # (h, T, S): allowed here, blocked there
            rows = telling.any(dim=-1)  # (h, T): rows that can tell the masks apart
            follows = (weights[b].masked_fill(allowed[other], 0.0).abs() <= atol).all(dim=-1)  # (h, T)
            for i in range(allowed.shape[1]):
                if bool(rows[i].any()) and bool(follows[i][rows[i]].all()):
                    return b, i, other
    return None


def check_mask_respected(
    attend: Attend,
    query: Tensor,
    key: Tensor | None = None,
    value: Tensor | None = None,
    *,
    mask: Tensor,
    atol: float = 1e-6,
) -> str:
    """Check that keys blocked by ``mask`` get no weight.

    Parameters
    ----------
    attend : callable or nn.Module
        The attention under test.
    query : Tensor, shape (..., T, features)
    key, value : Tensor, shape (..., S, features), optional
        Default ``query`` and ``key``.
    mask : BoolTensor, broadcastable to the weights (..., T, S)
        True means "may attend". Use a mask that differs between sequences
        (e.g. :func:`qkv.padding_mask` with different lengths) to catch masks
        applied to the wrong sequence.
    atol : float
        Largest accepted weight on a blocked key.

    Returns
    -------
    str
        What was measured, when the check passes.

    Raises
    ------
    AttentionCheckError
        When a blocked key gets weight; the message guesses the bug from the pattern.

    See Also
    --------
    run_checks
    :doc:`equation/bug-zoo` : buggy layers and the checks that catch them.
    """
    _check_tolerance(atol)
    if mask is None:
        raise ValueError("check_mask_respected needs a mask (True = may attend), got None")
    q, k, v, m = _prepare(attend, query, key, value, mask)
    assert m is not None  # mask is not None, so neither is its checked copy
    _, weights = _call(attend, q, k, v, m)
    allowed = _allowed(m, weights)  # (..., T, S)
    leaked = weights.masked_fill(allowed, 0.0).abs()  # (..., T, S): weight on blocked keys
    has_key = allowed.any(dim=-1, keepdim=True)  # (..., T, 1): fully blocked rows are not checked
    leaked = leaked.masked_fill(~has_key, 0.0)  # (..., T, S)
    worst, index = _worst(leaked)
    if not worst <= atol:
        raise AttentionCheckError(
            "mask_respected",
            "keys blocked by the mask (False) must get zero weight",
            f"weight <= {atol:g} on every blocked key",
            f"weight {_number(worst)} on a blocked key, at {_where(index, ('query', 'key'))}",
            _mask_diagnosis(weights, allowed, atol),
        )
    return f"blocked keys get at most {worst:.1e}"


def check_permutation_invariant(
    attend: Attend,
    query: Tensor,
    key: Tensor | None = None,
    value: Tensor | None = None,
    *,
    mask: Tensor | None = None,
    atol: float = 1e-5,
    rtol: float = 1e-4,
    seed: int = 0,
) -> str:
    """Check that permuting keys and values together leaves the output unchanged.

    Attention is a weighted average over (key, value) pairs: their order does
    not matter. With the pairs shuffled by one random permutation (and the
    mask's key axis with them), the output must be the same and the weights'
    columns must be shuffled the same way.

    Parameters
    ----------
    attend : callable or nn.Module
        The attention under test.
    query : Tensor, shape (..., T, features)
    key, value : Tensor, shape (..., S, features), optional
        Default ``query`` and ``key``. S must be at least 2.
    mask : BoolTensor, optional, broadcastable to the weights (..., T, S)
    atol, rtol : float
        Tolerances of the comparisons.
    seed : int
        Seed of the permutation.

    Returns
    -------
    str
        What was measured, when the check passes.

    Raises
    ------
    AttentionCheckError
        When the output or the weights do not follow the permutation.

    See Also
    --------
    run_checks
    :doc:`equation/bug-zoo` : buggy layers and the checks that catch them.
    """
    _check_tolerance(atol, rtol)
    q, k, v, m = _prepare(attend, query, key, value, mask)
    S = k.shape[-2]
    if S < 2:
        raise ValueError(f"check_permutation_invariant needs at least 2 keys, got S={S}")
    permutation = torch.randperm(S, generator=_generator(seed))  # (S,)
    if torch.equal(permutation, torch.arange(S)):
        permutation = permutation.flip(0)  # (S,)
    permutation = permutation.to(k.device)
    output, weights = _call(attend, q, k, v, m)
    k_shuffled = k.index_select(-2, permutation)  # (..., S, features)
    v_shuffled = v.index_select(-2, permutation)  # (..., S, features)
    m_shuffled = m
    if m is not None and m.dim() >= 1 and m.shape[-1] == S:
        m_shuffled = m.index_select(-1, permutation)  # (..., T, S)
    output_shuffled, weights_shuffled = _call(attend, q, k_shuffled, v_shuffled, m_shuffled)
    same_output, said_output = _compare("output", output_shuffled, output, atol, rtol, ("query", "feature"))
    expected_weights = weights.index_select(-1, permutation)  # (..., T, S)
    same_weights, said_weights = _compare(
        "weights", weights_shuffled, expected_weights, atol, rtol, ("query", "key")
    )
    if not (same_output and same_weights):
        raise AttentionCheckError(
            "permutation_invariant",
            "shuffling the (key, value) pairs must not change the output, and must shuffle "
            "the weights' columns the same way",
            f"the same output and permuted weights, within atol={atol:g}, rtol={rtol:g}",
            f"{said_output}; {said_weights}",
            "positions mixed into heads by a reshape without its transpose "
            "(view(B, h, S, d) instead of view(B, S, h, d).transpose(1, 2)); keys and values "
            "indexed differently; or something that depends on where a key sits",
        )
    return f"{said_output}; {said_weights}"


def check_causal(
    attend: Attend,
    query: Tensor,
    key: Tensor | None = None,
    value: Tensor | None = None,
    *,
    atol: float = 1e-5,
    rtol: float = 1e-4,
    seed: int = 0,
) -> str:
    """Check that, under a causal mask, changing the future does not change the past.

    The check passes ``qkv.causal_mask(T, S)`` (True = may attend) and
    replaces the second half of the queries, and the keys and values those
    queries alone may see, with random values. The outputs and weights of the
    first half must not change. (Any mask of your own is not used here.)

    Parameters
    ----------
    attend : callable or nn.Module
        The attention under test; it must accept a (T, S) mask.
    query : Tensor, shape (..., T, features)
    key, value : Tensor, shape (..., S, features), optional
        Default ``query`` and ``key``. Needs S >= T and T >= 2.
    atol, rtol : float
        Tolerances of the comparisons.
    seed : int
        Seed of the random future.

    Returns
    -------
    str
        What was measured, when the check passes.

    Raises
    ------
    AttentionCheckError
        When an early query's output or weights change with the future.

    See Also
    --------
    qkv.causal_mask
    :doc:`equation/bug-zoo` : buggy layers and the checks that catch them.
    """
    _check_tolerance(atol, rtol)
    q, k, v, _ = _prepare(attend, query, key, value, None)
    T, S = q.shape[-2], k.shape[-2]
    if T < 2 or S < T:
        raise ValueError(
            f"check_causal needs at least 2 queries and at least as many keys as queries, got T={T}, S={S}"
        )
    mask = causal_mask(T, S, device=q.device)  # (T, S)
    cut = T // 2  # queries [0, cut) are the past; the rest, and the keys only they see, the future
    generator = _generator(seed)

    def new_future(x: Tensor, start: int) -> Tensor:
        changed = x.clone()
        changed[..., start:, :] = _noise(changed[..., start:, :], generator)  # (..., L - start, features)
        return changed

    output, weights = _call(attend, q, k, v, mask)
    q_future = new_future(q, cut)  # (..., T, features)
    k_future = q_future if k is q else new_future(k, cut + S - T)  # (..., S, features)
    v_future = k_future if v is k else new_future(v, cut + S - T)  # (..., S, features)
    output_future, weights_future = _call(attend, q_future, k_future, v_future, mask)
    same_output, said_output = _compare(
        "past output", output_future[..., :cut, :], output[..., :cut, :], atol, rtol, ("query", "feature")
    )
    same_weights, said_weights = _compare(
        "past weights", weights_future[..., :cut, :], weights[..., :cut, :], atol, rtol, ("query", "key")
    )
    if not (same_output and same_weights):
        future = weights.masked_fill(_allowed(mask, weights), 0.0).abs()  # (..., T, S)
        peeked, _ = _worst(future)
        if peeked > atol:
            cause = (
                f"a query puts weight {_number(peeked)} on a future key: the mask is not applied, "
                "or read with the opposite convention (True = blocked)"
            )
        elif _columns_sum_to_one(weights):
            cause = (
                "no weight falls on future keys, yet the past changes: the softmax normalises "
                "over the queries (dim=-2) instead of the keys, so later queries rescale earlier rows"
            )
        else:
            cause = (
                "no weight falls on future keys, yet the past changes: positions are mixed "
                "before the mask is applied, e.g. by a reshape without its transpose "
                "(view(B, h, T, d_k) instead of view(B, T, h, d_k).transpose(1, 2))"
            )
        raise AttentionCheckError(
            "causal",
            f"with a causal mask, queries 0..{cut - 1} must not depend on later positions",
            f"outputs and weights of queries 0..{cut - 1} unchanged when later positions change",
            f"{said_output}; {said_weights}",
            cause,
        )
    return f"{said_output}; {said_weights}"


def _has_heads(attend: Attend) -> TypeGuard[_PerHeadModule]:
    """Whether ``attend`` is a module with ``to_heads`` and ``load_heads``."""
    return hasattr(attend, "to_heads") and hasattr(attend, "load_heads") and isinstance(attend, nn.Module)


def _head_axis_size(attend: Attend, query: Tensor) -> int:
    """The number of heads that can be perturbed one at a time (0 when none)."""
    if _has_heads(attend):
        return int(attend.to_heads().num_heads)
    if not isinstance(attend, nn.Module) and query.dim() >= 4:
        return query.shape[-3]
    return 0


def check_heads_independent(
    attend: Attend,
    query: Tensor,
    key: Tensor | None = None,
    value: Tensor | None = None,
    *,
    mask: Tensor | None = None,
    atol: float = 1e-5,
    rtol: float = 1e-4,
    seed: int = 0,
) -> str:
    """Check that changing one head changes only that head.

    For a module with ``to_heads``/``load_heads`` (qkv's modules and their
    subclasses), each head's W_i^Q and W_i^K in turn are perturbed in a copy of
    the module; the other heads' weights (B, h, T, S) must not change. (The
    outputs are mixed by W^O, so they cannot be compared head by head.) For a
    function on inputs with a head axis, (..., B, h, T, d) (four dimensions or
    more), each head's query, key
    and value in turn are perturbed; the other heads' outputs and weights must
    not change.

    Parameters
    ----------
    attend : callable or nn.Module
        The attention under test.
    query : Tensor, shape (B, T, embed_dim) for a module, (..., h, T, d_k) for a function
    key, value : Tensor, optional
        Default ``query`` and ``key``.
    mask : BoolTensor, optional, broadcastable to the weights
    atol, rtol : float
        Tolerances of the comparisons.
    seed : int
        Seed of the perturbations.

    Returns
    -------
    str
        What was measured, when the check passes.

    Raises
    ------
    AttentionCheckError
        When a perturbation of one head reaches another.

    See Also
    --------
    qkv.split_heads
    :doc:`equation/bug-zoo` : buggy layers and the checks that catch them.
    """
    _check_tolerance(atol, rtol)
    q, k, v, m = _prepare(attend, query, key, value, mask)
    heads = _head_axis_size(attend, q)
    if heads < 2:
        raise ValueError(
            "check_heads_independent needs at least 2 heads: a module with to_heads/load_heads, "
            "or a function on inputs of shape (..., B, h, T, d) with h >= 2 "
            f"(query has shape {shape_str(q.shape)})"
        )
    generator = _generator(seed)
    output, weights = _call(attend, q, k, v, m)
    module = attend if _has_heads(attend) else None  # heads >= 2: a module has to_heads/load_heads
    leaked, largest, worst_sentence = False, -math.inf, ""
    for head in range(heads):
        if module is not None:
            changed_module = copy.deepcopy(module)
            per_head = changed_module.to_heads()
            per_head.w_q[head] += _noise(per_head.w_q[head], generator)  # (d_model, d_k)
            if per_head.num_kv_heads == per_head.num_heads:  # a shared K/V head belongs to its whole group
                per_head.w_k[head] += _noise(per_head.w_k[head], generator)  # (kdim, d_k)
            changed_module.load_heads(per_head)
            changed_output, changed_weights = _call(changed_module, q, k, v, m)
            pairs = [("the other heads' weights", changed_weights, weights, ("query", "key"))]
        else:
            q2, k2, v2 = q.clone(), k.clone(), v.clone()
            for x in (q2, k2, v2):
                if x.dim() >= 3 and x.shape[-3] == heads:
                    x[..., head, :, :] += _noise(x[..., head, :, :], generator)  # (..., T or S, d)
            changed_output, changed_weights = _call(attend, q2, k2, v2, m)
            pairs = [
                ("the other heads' outputs", changed_output, output, ("query", "feature")),
                ("the other heads' weights", changed_weights, weights, ("query", "key")),
            ]
        others = [j for j in range(heads) if j != head]
        for name, got, expected, last in pairs:
            if got.dim() < 3 or got.shape[-3] != heads:
                raise ValueError(
                    f"attend returned a tensor of shape {shape_str(got.shape)}, with no head axis of "
                    f"size {heads} third from the end"
                )
            index = torch.tensor(others, device=got.device)  # (h - 1,)
            got_others = got.index_select(-3, index)  # (..., h - 1, T, features)
            expected_others = expected.index_select(-3, index)  # (..., h - 1, T, features)
            difference = (got_others - expected_others).abs()  # (..., h - 1, T, features)
            leaked |= not bool((difference <= atol + rtol * expected_others.abs()).all())
            change, where = _worst(difference)
            if change > largest:
                where = (*where[:-3], others[where[-3]], *where[-2:])
                largest = change
                worst_sentence = (
                    f"changing head {head} changed {name} by up to {_number(change)}, "
                    f"at {_where(where, last)}"
                )
    if leaked:
        raise AttentionCheckError(
            "heads_independent",
            "changing one head's weights or inputs must change only that head",
            f"the other heads unchanged, within atol={atol:g}, rtol={rtol:g}",
            worst_sentence,
            "heads mixed by a reshape: view(B, h, T, d_k) without the transpose puts "
            "several positions' features into one head (split with view(B, T, h, d_k).transpose(1, 2), "
            "merge with transpose(1, 2).reshape(B, T, h·d_k))",
        )
    return f"each of {heads} heads perturbed in turn; the others unchanged"


def _default_reference(attend: Attend) -> Attend | None:
    """qkv's own computation with the module's weights, or :func:`qkv.attention` for a function."""
    if isinstance(attend, nn.Module):
        if not hasattr(attend, "to_heads"):
            return None

        def reference(query: Tensor, key: Tensor, value: Tensor, mask: Tensor | None = None) -> Any:
            return multi_head_attention(query, key, value, cast(_ToHeads, attend).to_heads(), mask)

        return reference
    return attention


def _score_scale(weights: Tensor, expected: Tensor) -> float | None:
    """The factor c such that ``weights`` are ``expected`` with every score times c, if there is one.

    A wrong scale multiplies the scores by c, so each row's log-weights are c times
    the reference's plus a constant; fit c by least squares over rows centred on
    their mean, and accept it only when the fit is exact.
    """
    support = weights > 1e-12  # (..., T, S)
    if not torch.equal(support, expected > 1e-12):
        return None
    count = support.sum(dim=-1, keepdim=True).clamp_min(1)  # (..., T, 1)

    def centred_log(w: Tensor) -> Tensor:
        log = w.detach().double().clamp_min(1e-300).log().masked_fill(~support, 0.0)  # (..., T, S)
        return (log - log.sum(dim=-1, keepdim=True) / count).masked_fill(~support, 0.0)  # (..., T, S)

    mine, theirs = centred_log(weights), centred_log(expected)  # (..., T, S)
    spread = float((theirs**2).sum())
    if spread <= 0:
        return None
    factor = float((mine * theirs).sum()) / spread
    residual = float((mine - factor * theirs).abs().max())
    return factor if residual <= 1e-3 * max(1.0, float(theirs.abs().max())) else None


def _scale_cause(attend: Attend, factor: float) -> str:
    said = f"your weights are the reference's with every score multiplied by {factor:.3f}"
    d_k, d_model = getattr(attend, "d_k", None), getattr(attend, "embed_dim", None)
    if isinstance(d_k, int) and isinstance(d_model, int):
        if abs(factor - math.sqrt(d_k / d_model)) < 1e-3:
            return (
                f"{said}, which is sqrt(d_k / d_model) = sqrt({d_k} / {d_model}): the scores were "
                "divided by sqrt(d_model) instead of sqrt(d_k)"
            )
        if abs(factor - math.sqrt(d_k)) < 1e-3:
            return f"{said}, which is sqrt(d_k) = sqrt({d_k}): the scores were not divided by sqrt(d_k)"
    return (
        f"{said}: a wrong scale, e.g. 1/sqrt(d_model) instead of 1/sqrt(d_k) (a factor "
        "sqrt(d_k / d_model)), or no 1/sqrt(d_k) at all (a factor sqrt(d_k))"
    )


def check_matches_reference(
    attend: Attend,
    query: Tensor,
    key: Tensor | None = None,
    value: Tensor | None = None,
    *,
    mask: Tensor | None = None,
    reference: Attend | None = None,
    atol: float = 1e-5,
    rtol: float = 1e-4,
) -> str:
    """Check that the output and the weights agree with a reference implementation.

    Parameters
    ----------
    attend : callable or nn.Module
        The attention under test.
    query : Tensor, shape (..., T, features)
    key, value : Tensor, shape (..., S, features), optional
        Default ``query`` and ``key``.
    mask : BoolTensor, optional
        True means "may attend".
    reference : callable or nn.Module, optional
        Called with the same protocol. Default: for a module with ``to_heads``,
        :func:`qkv.multi_head_attention` with the module's own weights (the
        paper's equations); for a function, :func:`qkv.attention`.
    atol, rtol : float
        Tolerances of the comparisons.

    Returns
    -------
    str
        What was measured, when the check passes.

    Raises
    ------
    AttentionCheckError
        When the output or the weights differ; the message compares how peaked
        the two sets of weights are, which points at a wrong scale.

    See Also
    --------
    qkv.multi_head_attention, qkv.attention
    :doc:`equation/bug-zoo` : buggy layers and the checks that catch them.
    """
    _check_tolerance(atol, rtol)
    q, k, v, m = _prepare(attend, query, key, value, mask)
    if reference is None:
        reference = _default_reference(attend)
        if reference is None:
            raise ValueError(
                f"no reference for a {type(attend).__name__} without to_heads(): pass reference="
            )
    elif not callable(reference):
        raise TypeError(f"reference must be an attention function or module, got {type(reference).__name__}")
    output, weights = _call(attend, q, k, v, m)
    expected_output, expected_weights = _call(reference, q, k, v, m)
    same_output, said_output = _compare("output", output, expected_output, atol, rtol, ("query", "feature"))
    same_weights, said_weights = _compare("weights", weights, expected_weights, atol, rtol, ("query", "key"))
    if not (same_output and same_weights):
        cause = (
            "a wrong scale, softmax axis, mask or head split (the other checks test these one "
            "by one), or weights copied in the wrong layout (nn.Linear stores W transposed)"
        )
        factor = _score_scale(weights, expected_weights) if weights.shape == expected_weights.shape else None
        if factor is not None and abs(factor - 1.0) > 1e-3:
            cause = _scale_cause(attend, factor)
        raise AttentionCheckError(
            "matches_reference",
            "the output and the weights must agree with the reference implementation",
            f"equal within atol={atol:g}, rtol={rtol:g}",
            f"{said_output}; {said_weights}",
            cause,
        )
    return f"{said_output}; {said_weights}"


# ---------------------------------------------------------------------------
# All of them
# ---------------------------------------------------------------------------

#: The checks :func:`run_checks` runs, in order.
CHECKS: tuple[str, ...] = (
    "rows_sum_to_one",
    "mask_respected",
    "permutation_invariant",
    "causal",
    "heads_independent",
    "matches_reference",
)


def run_checks(
    attend: Attend,
    query: Tensor,
    key: Tensor | None = None,
    value: Tensor | None = None,
    *,
    mask: Tensor | None = None,
    reference: Attend | None = None,
    atol: float = 1e-5,
    rtol: float = 1e-4,
    seed: int = 0,
) -> list[CheckResult]:
    """Run every check that applies to ``attend`` on these inputs; return a report.

    A failed check does not stop the others. Errors that are not check
    failures (a crash inside ``attend``, invalid arguments) propagate.

    Parameters
    ----------
    attend : callable or nn.Module
        ``attend(query, key, value, mask=None) -> (output, weights)``, or a module
        called with ``need_weights=True`` (see the module docstring).
    query : Tensor, shape (..., T, features)
    key, value : Tensor, shape (..., S, features), optional
        Default ``query`` and ``key``.
    mask : BoolTensor, optional, broadcastable to the weights (..., T, S)
        True means "may attend"; enables ``mask_respected``. A mask that
        differs between sequences catches more bugs.
    reference : callable or nn.Module, optional
        For ``matches_reference`` (see :func:`check_matches_reference`).
    atol, rtol : float
        Tolerances.
    seed : int
        Seed of the random permutations and perturbations.

    Returns
    -------
    list of CheckResult
        One per name in ``qkv.checks.CHECKS``, in that order; ``passed`` is None for a
        check that does not apply (no mask; fewer than 2 keys, queries or heads;
        fewer keys than queries; no reference).

    See Also
    --------
    check_rows_sum_to_one, check_mask_respected, check_permutation_invariant,
    check_causal, check_heads_independent, check_matches_reference
    :doc:`equation/bug-zoo` : buggy layers and the checks that catch them.

    Examples
    --------
    >>> import torch, qkv
    >>> from qkv.checks import run_checks
    >>> mha = qkv.MultiHeadAttention(12, 3)
    >>> report = run_checks(mha, torch.randn(2, 5, 12), mask=qkv.padding_mask([5, 3]))
    >>> [(r.name, r.passed) for r in report][:2]
    [('rows_sum_to_one', True), ('mask_respected', True)]
    """
    _check_tolerance(atol, rtol)
    q, k, v, m = _prepare(attend, query, key, value, mask)
    if reference is not None and not callable(reference):
        raise TypeError(f"reference must be an attention function or module, got {type(reference).__name__}")
    T, S = q.shape[-2], k.shape[-2]
    heads = _head_axis_size(attend, q)
    no_reference = reference is None and _default_reference(attend) is None
    skip = {
        "mask_respected": "no mask given" if m is None else None,
        "permutation_invariant": f"needs at least 2 keys, got S={S}" if S < 2 else None,
        "causal": f"needs 2 <= T <= S, got T={T}, S={S}" if T < 2 or S < T else None,
        "heads_independent": (
            f"needs at least 2 heads that can be changed one at a time, found {heads}" if heads < 2 else None
        ),
        "matches_reference": "no reference given, and no to_heads() to build one" if no_reference else None,
    }
    calls: dict[str, Callable[[], str]] = {
        "rows_sum_to_one": lambda: check_rows_sum_to_one(attend, q, k, v, mask=m, atol=atol),
        # Run only when there is a mask (see skip).
        "mask_respected": lambda: check_mask_respected(attend, q, k, v, mask=cast(Tensor, m), atol=atol),
        "permutation_invariant": lambda: check_permutation_invariant(
            attend, q, k, v, mask=m, atol=atol, rtol=rtol, seed=seed
        ),
        "causal": lambda: check_causal(attend, q, k, v, atol=atol, rtol=rtol, seed=seed),
        "heads_independent": lambda: check_heads_independent(
            attend, q, k, v, mask=m, atol=atol, rtol=rtol, seed=seed
        ),
        "matches_reference": lambda: check_matches_reference(
            attend, q, k, v, mask=m, reference=reference, atol=atol, rtol=rtol
        ),
    }
    report = []
    for name in CHECKS:
        reason = skip.get(name)
        if reason is not None:
            report.append(CheckResult(name, None, f"not run: {reason}"))
            continue
        try:
            report.append(CheckResult(name, True, calls[name]()))
        except AttentionCheckError as error:
            report.append(CheckResult(name, False, str(error)))
    return report
