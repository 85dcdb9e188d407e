"""The attention equation: softmax(Q Kᵀ / sqrt(d_k)) V.

Two paths with one meaning: :func:`attention` computes the weights explicitly
and returns them; :func:`fused_attention` calls PyTorch's fused
``F.scaled_dot_product_attention`` and returns only the output. The tests
check that they agree.

See also
--------
The chapters :doc:`terminology` (what Q, K and V are, book/terminology.ipynb),
:doc:`equation` (the scale and the axis, book/equation.ipynb) and :doc:`masks` (masks and
NaN, book/masks.ipynb).
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import Tensor

from qkv._validation import (
    require_bool,
    require_causal_sizes,
    require_dropout,
    require_mask,
    require_same_dtype_and_device,
    require_scale,
    require_tensor,
    shape_str,
)
from qkv.masks import causal_mask_unchecked, merge_masks

__all__ = ["attention", "fused_attention"]


def _torch_version() -> tuple[int, int]:
    major, minor = torch.__version__.split(".")[:2]
    return int(major), int(minor)


# From torch 2.5 on, F.scaled_dot_product_attention gives a query with no allowed key a
# zero output and finite gradients (pytorch/pytorch#133882, in the v2.5.0 release notes);
# qkv relies on it on the CPU only. On CUDA the kernel depends on the GPU, dtype and mask:
# on an H100 with torch 2.11, cuDNN's kernel (float16, bfloat16) gave such a row a nonzero
# output for a boolean mask (tests/test_cuda.py). Elsewhere qkv guards such rows itself.
SDPA_ZEROES_EMPTY_ROWS = _torch_version() >= (2, 5)

# torch 2.5 added enable_gqa to F.scaled_dot_product_attention: fewer K/V heads than query
# heads, each shared by a group (the repeat_interleave order). Without it, qkv expands K and V.
SDPA_HAS_GQA = _torch_version() >= (2, 5)


def check_attention_args(
    query: object,
    key: object,
    value: object,
    mask: object | None,
    *,
    is_causal: object = False,
    dropout_p: object = 0.0,
) -> tuple[Tensor, Tensor, Tensor, Tensor | None]:
    """Validate the arguments of :func:`attention` and :func:`fused_attention`."""
    q = require_tensor("query", query, min_ndim=2, layout="(..., T, d_k)")
    k = require_tensor("key", key, min_ndim=2, layout="(..., S, d_k)")
    v = require_tensor("value", value, min_ndim=2, layout="(..., S, d_v)")
    require_same_dtype_and_device({"query": q, "key": k, "value": v})
    if q.shape[-1] != k.shape[-1]:
        raise ValueError(
            f"query has {q.shape[-1]} features per position, but key has {k.shape[-1]}: "
            f"queries and keys must share d_k (query {shape_str(q.shape)}, "
            f"key {shape_str(k.shape)})"
        )
    if k.shape[-2] != v.shape[-2]:
        raise ValueError(
            f"key has {k.shape[-2]} positions, but value has {v.shape[-2]}: keys and values "
            f"come in pairs, so S must agree (key {shape_str(k.shape)}, "
            f"value {shape_str(v.shape)})"
        )
    try:
        lead = torch.broadcast_shapes(q.shape[:-2], k.shape[:-2], v.shape[:-2])
    except RuntimeError:
        raise ValueError(
            "the leading (batch, head) dimensions of query, key and value do not broadcast: "
            f"query {shape_str(q.shape)}, key {shape_str(k.shape)}, "
            f"value {shape_str(v.shape)}"
        ) from None
    m = None
    if mask is not None:
        target = (*lead, q.shape[-2], k.shape[-2])
        m = require_mask(mask, target, "(..., T, S)", q.device, dtype=q.dtype)
    if require_bool("is_causal", is_causal):
        require_causal_sizes(q.shape[-2], k.shape[-2])
    require_dropout("dropout_p", dropout_p)
    return q, k, v, m


def explicit_attention(
    query: Tensor,
    key: Tensor,
    value: Tensor,
    mask: Tensor | None = None,
    scale: float | None = None,
    dropout_p: float = 0.0,
    is_causal: bool = False,
) -> tuple[Tensor, Tensor]:
    """The explicit computation, without argument checks (for qkv's own modules)."""
    if scale is None:
        scale = 1.0 / math.sqrt(query.shape[-1])
    if is_causal and query.shape[-2] > 1:  # one query is the last position: it sees every key
        causal = causal_mask_unchecked(query.shape[-2], key.shape[-2], query.device)  # (T, S)
        mask = merge_masks(mask, causal, query.dtype)
    # Scaling the (T, d_k) queries is cheaper than scaling the (T, S) scores; same maths.
    scores = (query * scale) @ key.transpose(-2, -1)  # (..., T, S)
    if mask is None:
        weights = torch.softmax(scores, dim=-1)  # (..., T, S), rows sum to 1 over keys
    elif mask.dtype == torch.bool:
        # A finite fill (not -inf) keeps a row with no allowed key free of NaN.
        scores = scores.masked_fill(~mask, torch.finfo(scores.dtype).min)  # (..., T, S)
        weights = torch.softmax(scores, dim=-1).masked_fill(~mask, 0.0)  # (..., T, S)
    else:
        # An additive mask: -inf blocks. A row whose every entry is -inf has no allowed
        # key: it is made finite before the softmax (finite gradients) and zeroed after.
        empty = torch.isneginf(mask).all(dim=-1, keepdim=True)  # (..., T, 1)
        scores = (scores + mask).masked_fill(empty, 0.0)  # (..., T, S)
        weights = torch.softmax(scores, dim=-1).masked_fill(empty, 0.0)  # (..., T, S)
    attended = F.dropout(weights, p=dropout_p) if dropout_p > 0 else weights  # (..., T, S)
    output = attended @ value  # (..., T, d_v)
    return output, weights


def fused_attention_unchecked(
    query: Tensor,
    key: Tensor,
    value: Tensor,
    mask: Tensor | None = None,
    scale: float | None = None,
    dropout_p: float = 0.0,
    is_causal: bool = False,
    enable_gqa: bool = False,
) -> Tensor:
    """The fused computation, without argument checks (for qkv's own modules).

    ``enable_gqa`` (only where :data:`SDPA_HAS_GQA`): key and value have fewer heads
    than query, each shared by ``h / h_kv`` consecutive query heads.
    """
    gqa = {"enable_gqa": True} if enable_gqa else {}  # older torch does not know the argument
    if is_causal and query.shape[-2] == 1:
        is_causal = False  # one query, the last position, sees every key: no mask (a decoding step)
    if is_causal and (mask is not None or query.shape[-2] != key.shape[-2]):
        # SDPA's own is_causal aligns to the top left and takes no other mask: build ours.
        causal = causal_mask_unchecked(query.shape[-2], key.shape[-2], query.device)  # (T, S)
        mask, is_causal = merge_masks(mask, causal, query.dtype), False
    if mask is None or (SDPA_ZEROES_EMPTY_ROWS and query.is_cpu and mask.dtype in (torch.bool, query.dtype)):
        # The usual case, kept short: it runs once per layer and token when decoding.
        return F.scaled_dot_product_attention(
            query, key, value, attn_mask=mask, dropout_p=dropout_p, is_causal=is_causal, scale=scale, **gqa
        )  # (..., T, d_v)
    if mask.is_floating_point() and mask.dtype != query.dtype:
        mask = mask.to(query.dtype)  # autocast: the projections ran in a lower precision
    empty = None
    if not (SDPA_ZEROES_EMPTY_ROWS and query.is_cpu):
        # Let a row with no allowed key attend everywhere, so that the kernel computes
        # no NaN (forward or backward), then zero its output: the explicit path's contract.
        if mask.dtype == torch.bool:
            empty = ~mask.any(dim=-1, keepdim=True)  # (..., T, 1)
            mask = mask | empty  # (..., T, S)
        else:
            empty = torch.isneginf(mask).all(dim=-1, keepdim=True)  # (..., T, 1)
            mask = mask.masked_fill(empty, 0.0)  # (..., T, S)
    output = F.scaled_dot_product_attention(
        query, key, value, attn_mask=mask, dropout_p=dropout_p, is_causal=is_causal, scale=scale, **gqa
    )  # (..., T, d_v)
    return output if empty is None else output.masked_fill(empty, 0.0)  # (..., T, d_v)


def attention(
    query: Tensor,
    key: Tensor,
    value: Tensor,
    mask: Tensor | None = None,
    *,
    is_causal: bool = False,
    scale: float | None = None,
    dropout_p: float = 0.0,
) -> tuple[Tensor, Tensor]:
    """Scaled dot-product attention, computed explicitly: softmax(Q Kᵀ / sqrt(d_k)) V.

    Parameters
    ----------
    query : Tensor, shape (..., T, d_k)
        One query per row, for T query positions.
    key : Tensor, shape (..., S, d_k)
        One key per row, for S key positions.
    value : Tensor, shape (..., S, d_v)
        One value per key.
    mask : Tensor, optional, broadcastable to (..., T, S), at least 2-D
        Boolean: **True means "may attend"** (the convention of
        ``torch.nn.functional.scaled_dot_product_attention``). Floating, of the
        query's dtype: added to the scaled scores, ``-inf`` blocking (an
        additive mask, e.g. ALiBi or a learned position bias; gradients flow into
        it). A query row with no allowed key gets zero weights and a zero
        output, never NaN.
    is_causal : bool
        Add a causal mask, **aligned to the bottom right**: query i may see key
        j when ``j <= i + (S - T)``, as :func:`qkv.causal_mask`, so the queries
        are the last T of S positions (cached decoding). Needs ``S >= T``. When
        ``T == S`` this is the usual lower triangle; when ``T != S`` it differs
        from ``F.scaled_dot_product_attention(is_causal=True)``, which aligns to
        the top left. Combined with ``mask`` when both are given.
    scale : float, optional
        The factor applied to the scores; default ``1 / sqrt(d_k)``.
    dropout_p : float
        Dropout probability on the weights before they multiply the values
        (default 0). The returned weights are those before dropout.

    Returns
    -------
    output : Tensor, shape (..., T, d_v)
        For each query, the weighted average of the values.
    weights : Tensor, shape (..., T, S)
        The attention weights; each row (one query) sums to 1 over the keys.

    Raises
    ------
    TypeError
        For non-tensors, non-floating inputs, mixed dtypes, a mask that is
        neither boolean nor floating, or a floating mask of another dtype.
    ValueError
        For mismatched feature sizes or lengths, leading dimensions that do not
        broadcast, a mask with fewer than 2 dimensions or that does not broadcast
        to (..., T, S), ``is_causal`` with ``S < T``, ``dropout_p`` outside [0, 1),
        or a ``scale`` that is not a finite positive number.

    See Also
    --------
    fused_attention : the same computation through PyTorch's fused kernel.
    :doc:`terminology` : what Q, K and V are; :doc:`terminology/walk-through`, step by step.

    Examples
    --------
    >>> import torch, qkv
    >>> q, k, v = torch.randn(4, 8), torch.randn(6, 8), torch.randn(6, 5)
    >>> output, weights = qkv.attention(q, k, v, mask=qkv.causal_mask(4, 6))
    >>> output.shape, weights.shape
    (torch.Size([4, 5]), torch.Size([4, 6]))

    ``is_causal=True`` is the same causal mask, aligned to the bottom right:

    >>> torch.equal(qkv.attention(q, k, v, is_causal=True)[1], weights)
    True

    An additive mask, here a bias that favours nearby keys (as ALiBi does):

    >>> distance = (torch.arange(4)[:, None] + 2 - torch.arange(6)[None, :]).abs()
    >>> output, weights = qkv.attention(q, k, v, mask=-0.5 * distance.float())
    >>> weights.sum(-1).allclose(torch.ones(4))
    True
    """
    q, k, v, m = check_attention_args(query, key, value, mask, is_causal=is_causal, dropout_p=dropout_p)
    return explicit_attention(q, k, v, m, require_scale(scale), float(dropout_p), is_causal)


def fused_attention(
    query: Tensor,
    key: Tensor,
    value: Tensor,
    mask: Tensor | None = None,
    *,
    is_causal: bool = False,
    scale: float | None = None,
    dropout_p: float = 0.0,
) -> Tensor:
    """The fast path: the same maths as :func:`attention`, through the fused kernel.

    Calls ``torch.nn.functional.scaled_dot_product_attention``, which never
    materialises the (T, S) weights on its fast backends, so it returns only
    the output. Arguments, conventions and checks are those of :func:`attention`;
    with ``is_causal=True`` and ``T == S`` (and no other mask) the kernel's own
    causal mode runs, which its fastest backends support.

    Parameters
    ----------
    query : Tensor, shape (..., T, d_k)
    key : Tensor, shape (..., S, d_k)
    value : Tensor, shape (..., S, d_v)
    mask : Tensor, optional, broadcastable to (..., T, S), at least 2-D
        Boolean (True means "may attend") or floating (added to the scores).
    is_causal : bool
        A causal mask aligned to the bottom right (see :func:`attention`).
    scale : float, optional
        Default ``1 / sqrt(d_k)``.
    dropout_p : float
        Dropout probability on the weights (default 0).

    Returns
    -------
    Tensor, shape (..., T, d_v)

    See Also
    --------
    attention : the explicit computation, which also returns the weights.
    :doc:`heads/ladder` : the fused path checked against the others.

    Examples
    --------
    >>> import torch, qkv
    >>> q, k, v = torch.randn(2, 4, 8), torch.randn(2, 6, 8), torch.randn(2, 6, 5)
    >>> output, _ = qkv.attention(q, k, v)
    >>> torch.allclose(qkv.fused_attention(q, k, v), output, atol=1e-6)
    True
    >>> torch.allclose(
    ...     qkv.fused_attention(q, k, v, is_causal=True),
    ...     qkv.attention(q, k, v, is_causal=True)[0], atol=1e-6)
    True

    Dropout on the weights, as during training (here on every call):

    >>> dropped = qkv.fused_attention(q, k, v, dropout_p=0.5)
    >>> torch.allclose(dropped, qkv.fused_attention(q, k, v))
    False
    """
    q, k, v, m = check_attention_args(query, key, value, mask, is_causal=is_causal, dropout_p=dropout_p)
    return fused_attention_unchecked(q, k, v, m, require_scale(scale), float(dropout_p), is_causal)
