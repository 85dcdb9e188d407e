"""The attention equation: softmax(Q Kᵀ / sqrt(d_k)) V.

Two paths with one meaning: :func:`attention` computes the weights explicitly
and returns them; :func:`fused_attention` calls PyTorch's fused
``F.scaled_dot_product_attention`` and returns only the output. The tests
check that they agree.

See also
--------
The chapter "Q, K and V: three letters, three meanings" (book/terminology.ipynb).
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import Tensor

from qkv._validation import (
    require_mask,
    require_same_dtype_and_device,
    require_tensor,
    shape_str,
)

__all__ = ["attention", "fused_attention"]


def check_attention_args(
    query: object, key: object, value: object, mask: object | None
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
        m = require_mask(mask, target, "(..., T, S)", q.device)
    return q, k, v, m


def explicit_attention(
    query: Tensor,
    key: Tensor,
    value: Tensor,
    mask: Tensor | None = None,
    scale: float | None = None,
    dropout_p: float = 0.0,
) -> tuple[Tensor, Tensor]:
    """The explicit computation, without argument checks (for qkv's own modules)."""
    if scale is None:
        scale = 1.0 / math.sqrt(query.shape[-1])
    # Scaling the (T, d_k) queries is cheaper than scaling the (T, S) scores; same maths.
    scores = (query * scale) @ key.transpose(-2, -1)  # (..., T, S)
    if mask is not None:
        # A finite fill (not -inf) keeps a row with no allowed key free of NaN.
        scores = scores.masked_fill(~mask, torch.finfo(scores.dtype).min)  # (..., T, S)
    weights = torch.softmax(scores, dim=-1)  # (..., T, S), rows sum to 1 over keys
    if mask is not None:
        weights = weights.masked_fill(~mask, 0.0)  # a fully masked row becomes all zeros
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
) -> Tensor:
    """The fused computation, without argument checks (for qkv's own modules)."""
    output = F.scaled_dot_product_attention(
        query, key, value, attn_mask=mask, dropout_p=dropout_p, scale=scale
    )  # (..., T, d_v)
    if mask is not None:
        # Same contract as the explicit path on every torch version: a query with no
        # allowed key gets a zero output (some versions return NaN there).
        output = output.masked_fill(~mask.any(dim=-1, keepdim=True), 0.0)  # (..., T, d_v)
    return output


def attention(
    query: Tensor,
    key: Tensor,
    value: Tensor,
    mask: Tensor | None = None,
    *,
    scale: float | None = None,
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
    mask : BoolTensor, optional, broadcastable to (..., T, S)
        **True means "may attend"** (the convention of
        ``torch.nn.functional.scaled_dot_product_attention``). A query row with
        no allowed key gets zero weights and a zero output, never NaN.
    scale : float, optional
        The factor applied to the scores; default ``1 / sqrt(d_k)``.

    Returns
    -------
    output : Tensor, shape (..., T, d_v)
        For each query, the weighted average of the values.
    weights : Tensor, shape (..., T, S)
        The attention weights; each row (one query) sums to 1 over the keys.

    Raises
    ------
    TypeError
        For non-tensors, non-floating inputs, mixed dtypes, or a non-boolean mask.
    ValueError
        For mismatched feature sizes or lengths, leading dimensions that do not
        broadcast, or a mask that does not broadcast to (..., T, S).

    See Also
    --------
    fused_attention : the same computation through PyTorch's fused kernel.
    :doc:`terminology` : the chapter "Q, K and V: three letters, three meanings".

    Examples
    --------
    >>> import torch, qkv
    >>> q, k, v = torch.randn(4, 8), torch.randn(6, 8), torch.randn(6, 5)
    >>> output, weights = qkv.attention(q, k, v, mask=qkv.causal_mask(4, 6))
    >>> output.shape, weights.shape
    (torch.Size([4, 5]), torch.Size([4, 6]))
    """
    q, k, v, m = check_attention_args(query, key, value, mask)
    return explicit_attention(q, k, v, m, scale)


def fused_attention(
    query: Tensor,
    key: Tensor,
    value: Tensor,
    mask: Tensor | None = None,
    *,
    scale: float | None = None,
) -> Tensor:
    """The fast path: the same maths as :func:`attention`, through the fused kernel.

    Calls ``torch.nn.functional.scaled_dot_product_attention``, which never
    materialises the (T, S) weights on its fast backends, so it returns only
    the output. Arguments, conventions and checks are those of :func:`attention`.

    Parameters
    ----------
    query : Tensor, shape (..., T, d_k)
    key : Tensor, shape (..., S, d_k)
    value : Tensor, shape (..., S, d_v)
    mask : BoolTensor, optional, broadcastable to (..., T, S)
        True means "may attend".
    scale : float, optional
        Default ``1 / sqrt(d_k)``.

    Returns
    -------
    Tensor, shape (..., T, d_v)

    See Also
    --------
    attention : the explicit computation, which also returns the weights.
    :doc:`heads` : the chapter "One big W^Q or one per head?".

    Examples
    --------
    >>> import torch, qkv
    >>> q, k, v = torch.randn(2, 4, 8), torch.randn(2, 6, 8), torch.randn(2, 6, 5)
    >>> torch.allclose(qkv.fused_attention(q, k, v), qkv.attention(q, k, v)[0], atol=1e-6)
    True
    """
    q, k, v, m = check_attention_args(query, key, value, mask)
    return fused_attention_unchecked(q, k, v, m, scale)
