"""Attention masks. In qkv, as in ``F.scaled_dot_product_attention``, True means "may attend".

Libraries disagree on this convention: ``torch.nn.MultiheadAttention`` reads
True as *blocked*; Keras and Hugging Face model inputs use 1 for "attend". The
converters below make each convention explicit.

See also
--------
The chapter :doc:`masks` (book/masks.ipynb).
"""

from __future__ import annotations

import numpy as np
import torch
from torch import Tensor

from qkv._validation import (
    as_numpy,
    broadcasts_to,
    require_bool_mask,
    require_not_zero_one,
    require_positive_int,
    require_tensor,
    shape_str,
)

__all__ = ["additive_mask", "causal_mask", "from_torch_mask", "padding_mask"]

#: In an additive mask, this or less blocks a key in qkv's figures and views: e^-10000
#: underflows to 0 in float32, as e^-inf does.
ADDITIVE_BLOCK = -1e4


def causal_mask(T: int, S: int | None = None, *, device: torch.device | str | None = None) -> Tensor:
    """A causal mask: query i may see key j when ``j <= i + (S - T)``.

    With ``S == T`` this is the lower triangle (each position sees itself and
    the past). With ``T < S`` the queries are the *last* T positions of the
    sequence, so the last query sees every key: what cached decoding needs.

    Parameters
    ----------
    T : int
        Number of queries.
    S : int, optional
        Number of keys; defaults to ``T``. Must be at least ``T``.
    device : torch.device or str, optional

    Returns
    -------
    BoolTensor, shape (T, S)
        True where the query may attend to the key.

    See Also
    --------
    padding_mask
    :doc:`masks` : padding and causal masks, and where NaN comes from.

    Examples
    --------
    >>> import qkv
    >>> qkv.causal_mask(3).int()
    tensor([[1, 0, 0],
            [1, 1, 0],
            [1, 1, 1]], dtype=torch.int32)
    """
    require_positive_int("T", T)
    S = T if S is None else require_positive_int("S", S)
    if S < T:
        raise ValueError(
            f"a causal mask needs at least as many keys as queries, got T={T} queries and S={S} keys"
        )
    return causal_mask_unchecked(T, S, device)


def causal_mask_unchecked(T: int, S: int, device: torch.device | str | None = None) -> Tensor:
    """:func:`causal_mask` without argument checks (for qkv's own functions)."""
    queries = torch.arange(T, device=device)[:, None]  # (T, 1)
    keys = torch.arange(S, device=device)[None, :]  # (1, S)
    return keys <= queries + (S - T)  # (T, S)


def padding_mask(
    lengths: Tensor | list[int],
    S: int | None = None,
    *,
    device: torch.device | str | None = None,
) -> Tensor:
    """A key padding mask for a batch of sequences of different lengths.

    Parameters
    ----------
    lengths : IntTensor or list of int, shape (B,)
        The true length of each sequence; positions from ``lengths[b]`` on are padding.
    S : int, optional
        The padded length; defaults to ``max(lengths)``.
    device : torch.device or str, optional

    Returns
    -------
    BoolTensor, shape (B, 1, 1, S)
        True for real keys. The two singleton axes let it broadcast over heads
        and queries, against scores of shape (B, h, T, S); a bare (B, S) mask
        would broadcast along the wrong axes. Pass it as ``mask=``. torch's
        ``key_padding_mask`` is the opposite, (B, S) and True for *padding*:
        ``~padding_mask(lengths)[:, 0, 0]`` (given this mask, the modules refuse it).

    See Also
    --------
    causal_mask
    :doc:`cross_attention/masks` : sources of different lengths, in qkv, PyTorch and Keras.

    Examples
    --------
    >>> import qkv
    >>> qkv.padding_mask([2, 3])[:, 0, 0].int()
    tensor([[1, 1, 0],
            [1, 1, 1]], dtype=torch.int32)
    """
    if not isinstance(lengths, Tensor):
        lengths = torch.as_tensor(lengths, device=device)
    require_tensor("lengths", lengths, ndim=1, layout="(B,)", floating=False)
    if lengths.is_floating_point() or lengths.dtype == torch.bool:
        raise TypeError(f"lengths must hold integers, got dtype {lengths.dtype}")
    if lengths.numel() == 0:
        raise ValueError("lengths must name at least one sequence, got an empty tensor")
    longest = int(lengths.max())
    if int(lengths.min()) < 0:
        raise ValueError(f"lengths must be non-negative, got {lengths.tolist()}")
    S = longest if S is None else require_positive_int("S", S)
    if longest > S:
        raise ValueError(f"lengths go up to {longest}, longer than S={S}")
    positions = torch.arange(S, device=lengths.device)  # (S,)
    return (positions[None, :] < lengths[:, None])[:, None, None, :]  # (B, 1, 1, S)


def from_torch_mask(blocked: Tensor) -> Tensor:
    """Convert a ``torch.nn.MultiheadAttention`` boolean mask (True = blocked) to qkv's.

    ``nn.MultiheadAttention``'s ``attn_mask`` and ``key_padding_mask`` use True
    for positions that may *not* be attended; qkv and
    ``F.scaled_dot_product_attention`` use True for positions that may. The
    modules' ``forward`` also takes both of torch's masks as they are, under
    torch's names (``attn_mask=``, ``key_padding_mask=``).

    Parameters
    ----------
    blocked : BoolTensor, any shape
        True where attention is forbidden.

    Returns
    -------
    BoolTensor, same shape
        True where attention is allowed.

    See Also
    --------
    additive_mask : the other common convention, a float mask added to the scores.
    :doc:`masks` : each library's convention, and an inverted mask that fails silently.

    Examples
    --------
    >>> import torch, qkv
    >>> # nn.MultiheadAttention's attn_mask, True meaning blocked:
    >>> blocked = torch.tensor([[False, True], [False, False]])
    >>> qkv.from_torch_mask(blocked)
    tensor([[ True, False],
            [ True,  True]])
    """
    return ~require_bool_mask("blocked", blocked)


def additive_mask(mask: Tensor, dtype: torch.dtype = torch.float32) -> Tensor:
    """Turn a boolean mask (True = may attend) into an additive one (0 or -inf).

    Many codebases add a float mask to the scores instead of selecting with a
    boolean one; this is the bridge.

    Parameters
    ----------
    mask : BoolTensor, any shape
        True where attention is allowed.
    dtype : torch.dtype
        Floating dtype of the result.

    Returns
    -------
    Tensor, same shape
        0 where allowed, ``-inf`` where blocked.

    See Also
    --------
    from_torch_mask
    :doc:`masks` : a mask of 1s and 0s that blocks nothing, and the fix.

    Examples
    --------
    >>> import qkv
    >>> qkv.additive_mask(qkv.causal_mask(2))
    tensor([[0., -inf],
            [0., 0.]])
    """
    require_bool_mask("mask", mask)
    if not dtype.is_floating_point:
        raise TypeError(f"dtype must be a floating dtype, got {dtype}")
    return as_additive(mask, dtype)


def merge_masks(first: Tensor | None, second: Tensor | None, dtype: torch.dtype) -> Tensor | None:
    """One mask that allows what both allow: boolean AND, or the sum of additive masks.

    Either may be None, boolean (True = may attend) or floating (added to the
    scores); when one is floating the boolean one becomes 0/-inf of ``dtype``.
    """
    if first is None or second is None:
        return second if first is None else first
    if first.dtype == torch.bool and second.dtype == torch.bool:
        return first & second
    return as_additive(first, dtype) + as_additive(second, dtype)


def as_additive(mask: Tensor, dtype: torch.dtype) -> Tensor:
    """A mask as a float to add to the scores: a boolean one becomes 0 / -inf."""
    if mask.dtype != torch.bool:
        return mask
    return torch.zeros(mask.shape, dtype=dtype, device=mask.device).masked_fill(~mask, float("-inf"))


def key_padding_to_mask(key_padding_mask: Tensor) -> Tensor:
    """torch's key padding mask (B, S), True = padding, as a qkv mask (B, 1, 1, S).

    A boolean one is inverted (qkv's True means "may attend"); a floating one is
    additive in both conventions and only gains its two broadcast axes.
    """
    padding = key_padding_mask[:, None, None, :]  # (B, 1, 1, S)
    return ~padding if padding.dtype == torch.bool else padding


def allowed_cells(mask: object, shape: tuple[int, ...], layout: str) -> np.ndarray:
    """Where attention may go, as a boolean array of ``shape``, for qkv's figures and views.

    True in a boolean mask (qkv's convention). In a floating (additive) mask, a key
    is blocked by ``-inf`` or by any value of ``ADDITIVE_BLOCK`` or below, such as
    Hugging Face's ``torch.finfo(dtype).min``: e^-10000 is 0 in float32. A floating
    mask of only 0 and 1 is refused: it reads as "1 = may attend", but added to the
    scores it would block nothing. Leading axes of size 1 may go beyond ``shape`` (a
    (1, 1, T, S) mask for (T, S) weights); a 1-D mask is one per key. ``layout``
    names the weights' axes in the error message.
    """
    array = as_numpy("mask", mask)
    if array.dtype == np.bool_:
        allowed = array
    elif np.issubdtype(array.dtype, np.floating):
        require_not_zero_one("mask", array)  # the check the attention functions and modules make
        allowed = array > ADDITIVE_BLOCK  # -inf, finfo.min and the like block
    else:
        raise TypeError(
            f"mask must be boolean (True = may attend) or floating (added to the scores, -inf blocks), "
            f"got dtype {array.dtype}; for a 0/1 mask use mask.bool()"
        )
    mask_shape = tuple(array.shape)
    while len(mask_shape) > len(shape) and mask_shape[0] == 1:  # (1, 1, T, S) for a single map
        mask_shape = mask_shape[1:]
    if array.ndim < 1 or not broadcasts_to(mask_shape, shape):
        raise ValueError(
            f"mask of shape {shape_str(array.shape)} does not broadcast to the weights' shape "
            f"{layout} = {shape_str(shape)}; a causal mask has shape (T, S), a padding mask "
            "(B, 1, 1, S) (take mask[b] for one sequence's weights) or (S,)"
        )
    return np.broadcast_to(allowed.reshape(mask_shape), shape)
