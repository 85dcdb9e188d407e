"""Gradients: the backward pass of attention, derived by hand.

Autograd computes these gradients for every model; this module writes them out,
so that the chapter can show that nothing about attention's training is special:
the loss's gradient reaches W^Q, W^K, W^V and W^O by the chain rule, through the
softmax's Jacobian, like any other layer's.

With scores ``S = scale · Q Kᵀ``, weights ``P = softmax(S)`` (row by row) and
output ``O = P V``, and ``dO`` the gradient of a scalar loss with respect to ``O``::

    dV = Pᵀ dO
    dP = dO Vᵀ
    dS = P ⊙ (dP − rowsum(dP ⊙ P))      # the softmax's Jacobian, row by row
    dQ = scale · dS K
    dK = scale · dSᵀ Q

and, for a projection ``Q = X W^Q + b^Q``, ``dW^Q = Xᵀ dQ``, ``db^Q = Σ_rows dQ`` and
``dX = dQ (W^Q)ᵀ`` (likewise for K, V and the output projection W^O).

See also
--------
The chapter :doc:`training` (book/training.ipynb).
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING, Any, cast

import torch
from torch import Tensor

from qkv._validation import (
    require_bool_mask,
    require_same_dtype_and_device,
    require_tensor,
    shape_str,
)
from qkv.attention import check_attention_args as _check_attention
from qkv.attention import explicit_attention
from qkv.heads import (
    HeadWeights,
    check_multi_head_args,
    expand_kv_heads,
    multi_head_forward_unchecked,
    split_heads_unchecked,
)

if TYPE_CHECKING:  # pragma: no cover
    from typing_extensions import Unpack

    # A HeadWeights' eight tensors in its field order: w_q, w_k, w_v, w_o, then the biases (or None).
    _WeightTensors = tuple[
        Tensor, Tensor, Tensor, Tensor, Tensor | None, Tensor | None, Tensor | None, Tensor | None
    ]

__all__ = [
    "ManualAttention",
    "ManualMultiHeadAttention",
    "attention_backward",
    "manual_attention",
    "manual_multi_head_attention",
    "multi_head_attention_backward",
    "softmax_backward",
]


def _boolean_mask(mask: Tensor | None) -> Tensor | None:
    """The hand-derived backward returns no gradient for a mask, so only boolean masks are taken."""
    if mask is not None and mask.dtype != torch.bool:
        require_bool_mask("mask", mask)  # raises: for an additive mask use qkv.attention and autograd
    return mask


def _require_grad_shape(grad_output: object, expected: tuple[int, ...], layout: str) -> Tensor:
    """Check that the upstream gradient has the output's shape."""
    grad = require_tensor("grad_output", grad_output, ndim=len(expected), layout=layout)
    if tuple(grad.shape) != expected:
        raise ValueError(
            f"grad_output must have the output's shape {layout} = {shape_str(expected)}, "
            f"got {shape_str(grad.shape)}"
        )
    return grad


def softmax_backward(weights: Tensor, grad_weights: Tensor) -> Tensor:
    """The gradient with respect to the scores, given the one with respect to the softmax's output.

    For one row ``p = softmax(s)`` the Jacobian is ``∂p/∂s = diag(p) − p pᵀ``, so
    ``ds = (diag(p) − p pᵀ) dp = p ⊙ (dp − (dp · p))``, computed without forming
    the (S, S) Jacobian.

    Parameters
    ----------
    weights : Tensor, shape (..., T, S)
        P, the softmax's output (rows sum to 1, or are all 0 for a query that
        may attend to nothing).
    grad_weights : Tensor, shape (..., T, S)
        dP, the gradient of the loss with respect to P.

    Returns
    -------
    Tensor, shape (..., T, S)
        dS, the gradient of the loss with respect to the scores. Each row sums
        to 0: adding a constant to a row of scores changes nothing.

    See Also
    --------
    attention_backward
    :doc:`training/backward` : the softmax's Jacobian, and the diagonal-only mistake.
    """
    p = require_tensor("weights", weights, min_ndim=1, layout="(..., T, S)")
    dp = require_tensor("grad_weights", grad_weights, min_ndim=1, layout="(..., T, S)")
    require_same_dtype_and_device({"weights": p, "grad_weights": dp})
    if p.shape != dp.shape:
        raise ValueError(
            f"grad_weights must have the shape of weights {shape_str(p.shape)}, got {shape_str(dp.shape)}"
        )
    return _softmax_backward(p, dp)


def _softmax_backward(p: Tensor, dp: Tensor) -> Tensor:
    return p * (dp - (dp * p).sum(dim=-1, keepdim=True))  # (..., T, S)


def _attention_backward(
    q: Tensor, k: Tensor, v: Tensor, grad: Tensor, mask: Tensor | None, scale: float
) -> tuple[Tensor, Tensor, Tensor]:
    """The backward pass, without checks; returns gradients of the broadcast shapes."""
    _, p = explicit_attention(q, k, v, mask, scale)  # (..., T, S); 0 where masked
    grad_v = p.transpose(-2, -1) @ grad  # (..., S, d_v)
    grad_p = grad @ v.transpose(-2, -1)  # (..., T, S)
    grad_s = _softmax_backward(p, grad_p)  # (..., T, S); 0 where masked
    grad_q = scale * grad_s @ k  # (..., T, d_k)
    grad_k = scale * grad_s.transpose(-2, -1) @ q  # (..., S, d_k)
    # A query, key or value broadcast over (batch, head) gets the sum over the copies.
    return grad_q.sum_to_size(q.shape), grad_k.sum_to_size(k.shape), grad_v.sum_to_size(v.shape)


def attention_backward(
    query: Tensor,
    key: Tensor,
    value: Tensor,
    grad_output: Tensor,
    mask: Tensor | None = None,
    *,
    scale: float | None = None,
) -> tuple[Tensor, Tensor, Tensor]:
    """Gradients of a loss with respect to Q, K and V, derived by hand.

    Recomputes the forward pass of :func:`qkv.attention` (the weights P), then
    applies ``dV = Pᵀ dO``, ``dP = dO Vᵀ``, ``dS = P ⊙ (dP − rowsum(dP ⊙ P))``,
    ``dQ = scale · dS K`` and ``dK = scale · dSᵀ Q``.

    Parameters
    ----------
    query : Tensor, shape (..., T, d_k)
    key : Tensor, shape (..., S, d_k)
    value : Tensor, shape (..., S, d_v)
    grad_output : Tensor, shape (..., T, d_v)
        dO, the gradient of the loss with respect to the output of
        ``qkv.attention(query, key, value, mask, scale=scale)`` (leading
        dimensions: those of query, key and value broadcast together).
    mask : BoolTensor, optional, broadcastable to (..., T, S)
        True means "may attend". Masked weights are 0, so their scores get no gradient.
    scale : float, optional
        The factor applied to the scores; default ``1 / sqrt(d_k)``.

    Returns
    -------
    grad_query : Tensor, shape of query
    grad_key : Tensor, shape of key
    grad_value : Tensor, shape of value

    See Also
    --------
    softmax_backward : the step through the softmax.
    manual_attention : the same formulas as an autograd function, for ``gradcheck``.
    :doc:`training/backward` : the derivation, step by step.

    Examples
    --------
    >>> import torch, qkv.gradients
    >>> q, k, v = torch.randn(4, 8), torch.randn(6, 8), torch.randn(6, 5)
    >>> dq, dk, dv = qkv.gradients.attention_backward(q, k, v, torch.ones(4, 5))
    >>> dq.shape, dk.shape, dv.shape
    (torch.Size([4, 8]), torch.Size([6, 8]), torch.Size([6, 5]))
    """
    q, k, v, m = _check_attention(query, key, value, mask)
    m = _boolean_mask(m)
    lead = torch.broadcast_shapes(q.shape[:-2], k.shape[:-2], v.shape[:-2])
    grad = _require_grad_shape(grad_output, (*lead, q.shape[-2], v.shape[-1]), "(..., T, d_v)")
    require_same_dtype_and_device({"query": q, "grad_output": grad})
    if scale is None:
        scale = 1.0 / math.sqrt(q.shape[-1])
    return _attention_backward(q, k, v, grad, m, scale)


def _project_backward(x: Tensor, w: Tensor, grad: Tensor) -> tuple[Tensor, Tensor, Tensor]:
    """Backward of :func:`qkv.heads.project_heads`: gradients for x, w and b from grad (B, h, L, d)."""
    grad_x = torch.einsum("bhld,hmd->blm", grad, w)  # (B, L, m): dX = Σ_i dQ_i W_iᵀ
    grad_w = torch.einsum("blm,bhld->hmd", x, grad)  # (h, m, d): dW_i = Xᵀ dQ_i
    grad_b = grad.sum(dim=(0, 2))  # (h, d)
    return grad_x, grad_w, grad_b


def _multi_head_backward(
    q: Tensor, k: Tensor, v: Tensor, w: HeadWeights, grad: Tensor, mask: Tensor | None
) -> tuple[Tensor, Tensor, Tensor, HeadWeights]:
    _, _, q_heads, k_heads, v_heads, concat = multi_head_forward_unchecked(q, k, v, w, mask)
    grad_w_o = torch.einsum("btf,btm->fm", concat, grad)  # (h·d_v, d_model): concatᵀ dO
    grad_concat = grad @ w.w_o.T  # (B, T, h·d_v)
    grad_heads = split_heads_unchecked(grad_concat, w.num_heads)  # (B, h, T, d_v)
    scale = 1.0 / math.sqrt(w.d_k)
    h, h_kv = w.num_heads, w.num_kv_heads
    grad_qh, grad_kh, grad_vh = _attention_backward(
        q_heads, expand_kv_heads(k_heads, h), expand_kv_heads(v_heads, h), grad_heads, mask, scale
    )  # (B, h, T, d_k), (B, h, S, d_k), (B, h, S, d_v)
    if h_kv != h:
        # Gradients add where a value is used twice: each K/V head serves its group of query heads.
        batch, _, source, _ = grad_kh.shape
        grad_kh = grad_kh.view(batch, h_kv, h // h_kv, source, -1).sum(dim=2)  # (B, h_kv, S, d_k)
        grad_vh = grad_vh.view(batch, h_kv, h // h_kv, source, -1).sum(dim=2)  # (B, h_kv, S, d_v)
    grad_query, grad_w_q, grad_b_q = _project_backward(q, w.w_q, grad_qh)
    grad_key, grad_w_k, grad_b_k = _project_backward(k, w.w_k, grad_kh)
    grad_value, grad_w_v, grad_b_v = _project_backward(v, w.w_v, grad_vh)
    bias = w.bias
    grads = HeadWeights(
        w_q=grad_w_q,
        w_k=grad_w_k,
        w_v=grad_w_v,
        w_o=grad_w_o,
        b_q=grad_b_q if bias else None,
        b_k=grad_b_k if bias else None,
        b_v=grad_b_v if bias else None,
        b_o=grad.sum(dim=(0, 1)) if bias else None,  # (d_model,)
    )
    return grad_query, grad_key, grad_value, grads


def multi_head_attention_backward(
    query: Tensor,
    key: Tensor,
    value: Tensor,
    weights: HeadWeights,
    grad_output: Tensor,
    mask: Tensor | None = None,
) -> tuple[Tensor, Tensor, Tensor, HeadWeights]:
    """Gradients of a loss through a multi-head attention layer, derived by hand.

    The layer is :func:`qkv.multi_head_attention`: ``Q_i = query W_i^Q + b_i^Q``
    (likewise K_i, V_i), ``head_i = softmax(Q_i K_iᵀ / sqrt(d_k)) V_i``,
    ``output = Concat(head_1, ..., head_h) W^O + b^O``. A single head is the case
    ``num_heads = 1``. Backward: ``dW^O = Concatᵀ dO``; the heads' gradient is
    ``dO (W^O)ᵀ`` cut into heads; :func:`attention_backward` gives dQ_i, dK_i,
    dV_i; then ``dW_i^Q = queryᵀ dQ_i``, ``db_i^Q = Σ dQ_i`` and
    ``d query = Σ_i dQ_i (W_i^Q)ᵀ`` (likewise for keys and values).

    Parameters
    ----------
    query : Tensor, shape (B, T, d_model)
    key : Tensor, shape (B, S, kdim)
    value : Tensor, shape (B, S, vdim)
    weights : HeadWeights
        The layer's weights, row-vector orientation (``Q = X W^Q``).
    grad_output : Tensor, shape (B, T, d_model)
        dO, the gradient of the loss with respect to the layer's output.
    mask : BoolTensor, optional, broadcastable to (B, h, T, S)
        True means "may attend".

    Returns
    -------
    grad_query : Tensor, shape (B, T, d_model)
    grad_key : Tensor, shape (B, S, kdim)
    grad_value : Tensor, shape (B, S, vdim)
        In self-attention (query, key and value all X) the gradient with
        respect to X is the sum of the three.
    grad_weights : HeadWeights
        The gradient of every weight, each with its weight's shape; biases'
        gradients are None when the layer has no biases.

    See Also
    --------
    attention_backward : the step through one head's attention.
    manual_multi_head_attention : the same formulas as an autograd function.
    :doc:`training/multi-head` : the derivation extended to many heads and the output projection.

    Examples
    --------
    >>> import torch, qkv, qkv.gradients
    >>> hw = qkv.HeadWeights.random(12, 3, kdim=10, vdim=7)
    >>> x, memory = torch.randn(2, 4, 12), torch.randn(2, 6, 10)
    >>> v = torch.randn(2, 6, 7)
    >>> upstream = torch.ones(2, 4, 12)
    >>> dx, dm, dv, grads = qkv.gradients.multi_head_attention_backward(
    ...     x, memory, v, hw, upstream
    ... )
    >>> grads.w_q.shape == hw.w_q.shape, grads.w_o.shape == hw.w_o.shape
    (True, True)
    """
    q, k, v, m = check_multi_head_args(query, key, value, weights, mask)
    m = _boolean_mask(m)
    w = weights
    grad = _require_grad_shape(grad_output, (q.shape[0], q.shape[1], w.embed_dim), "(B, T, d_model)")
    require_same_dtype_and_device({"query": q, "grad_output": grad})
    return _multi_head_backward(q, k, v, w, grad, m)


class ManualAttention(torch.autograd.Function):
    """:func:`qkv.attention`'s output, with :func:`attention_backward` as its backward pass.

    Use through :func:`manual_attention`; ``torch.autograd.gradcheck`` on it
    checks the hand-derived gradients against finite differences.
    """

    @staticmethod
    def forward(
        ctx: Any, query: Tensor, key: Tensor, value: Tensor, mask: Tensor | None, scale: float
    ) -> Tensor:
        ctx.save_for_backward(query, key, value)
        ctx.mask, ctx.scale = mask, scale
        output, _ = explicit_attention(query, key, value, mask, scale)  # (..., T, d_v)
        return output

    @staticmethod
    def backward(ctx: Any, grad_output: Tensor) -> tuple[Tensor | None, ...]:
        query, key, value = ctx.saved_tensors
        grads = _attention_backward(query, key, value, grad_output, ctx.mask, ctx.scale)
        return (*grads, None, None)


def manual_attention(
    query: Tensor,
    key: Tensor,
    value: Tensor,
    mask: Tensor | None = None,
    *,
    scale: float | None = None,
) -> Tensor:
    """Attention whose backward pass is the hand-derived one.

    The same output as ``qkv.attention(query, key, value, mask, scale=scale)[0]``,
    but autograd calls :func:`attention_backward`'s formulas instead of its own.

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
    attention_backward
    :doc:`training/multi-head` : its multi-head version tested by ``gradcheck``.
    """
    q, k, v, m = _check_attention(query, key, value, mask)
    m = _boolean_mask(m)
    if scale is None:
        scale = 1.0 / math.sqrt(q.shape[-1])
    return cast(Tensor, ManualAttention.apply(q, k, v, m, scale))  # type: ignore[no-untyped-call]


class ManualMultiHeadAttention(torch.autograd.Function):
    """:func:`qkv.multi_head_attention`'s output, with :func:`multi_head_attention_backward`.

    Takes the inputs and the eight weights as separate tensors (biases may be
    None), so that ``torch.autograd.gradcheck`` can perturb each of them. Use
    through :func:`manual_multi_head_attention`.
    """

    @staticmethod
    def forward(
        ctx: Any,
        query: Tensor,
        key: Tensor,
        value: Tensor,
        mask: Tensor | None,
        *weights: Unpack[_WeightTensors],
    ) -> Tensor:
        ctx.save_for_backward(query, key, value, *(t for t in weights if t is not None))
        ctx.mask, ctx.bias = mask, weights[4] is not None
        w = HeadWeights(*weights)
        return multi_head_forward_unchecked(query, key, value, w, mask).output  # (B, T, d_model)

    @staticmethod
    def backward(ctx: Any, grad_output: Tensor) -> tuple[Tensor | None, ...]:
        query, key, value, *weights = ctx.saved_tensors
        w = HeadWeights(*weights) if ctx.bias else HeadWeights(*weights[:4])
        grad_query, grad_key, grad_value, g = _multi_head_backward(
            query, key, value, w, grad_output, ctx.mask
        )
        return grad_query, grad_key, grad_value, None, g.w_q, g.w_k, g.w_v, g.w_o, g.b_q, g.b_k, g.b_v, g.b_o


def manual_multi_head_attention(
    query: Tensor,
    key: Tensor,
    value: Tensor,
    weights: HeadWeights,
    mask: Tensor | None = None,
) -> Tensor:
    """Multi-head attention whose backward pass is the hand-derived one.

    The same output as ``qkv.multi_head_attention(query, key, value, weights, mask)[0]``;
    gradients reach the inputs and every tensor of ``weights`` that requires
    them, through :func:`multi_head_attention_backward`'s formulas.

    Parameters
    ----------
    query : Tensor, shape (B, T, d_model)
    key : Tensor, shape (B, S, kdim)
    value : Tensor, shape (B, S, vdim)
    weights : HeadWeights
    mask : BoolTensor, optional, broadcastable to (B, h, T, S)
        True means "may attend".

    Returns
    -------
    Tensor, shape (B, T, d_model)

    See Also
    --------
    multi_head_attention_backward
    :doc:`training/multi-head` : the derivation tested against finite differences by ``gradcheck``.
    """
    q, k, v, m = check_multi_head_args(query, key, value, weights, mask)
    m = _boolean_mask(m)
    w = weights
    tensors = (w.w_q, w.w_k, w.w_v, w.w_o, w.b_q, w.b_k, w.b_v, w.b_o)
    return cast(Tensor, ManualMultiHeadAttention.apply(q, k, v, m, *tensors))  # type: ignore[no-untyped-call]
