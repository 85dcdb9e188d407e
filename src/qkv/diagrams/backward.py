"""The backward pass through one attention head: where the loss's gradient reaches W^Q, W^K, W^V.

See also
--------
The page :doc:`training/backward` (book/training/backward.ipynb).
"""

from __future__ import annotations

import math as _math
from typing import TYPE_CHECKING

import torch

from qkv._validation import require_size, require_tensor, shape_str
from qkv.attention import explicit_attention
from qkv.diagrams._draw import ROLE_COLOURS, Canvas, as_matrix, batch_first_of, head_weights
from qkv.gradients import attention_backward, softmax_backward

if TYPE_CHECKING:  # pragma: no cover
    from matplotlib.figure import Figure

    from qkv.heads import HeadWeights

__all__ = ["backward_paths"]


def _shades(values: torch.Tensor, colour: str) -> list[list[str]]:
    """Each cell ``colour`` mixed with white in proportion to its magnitude (the largest: full)."""
    from matplotlib.colors import to_hex, to_rgb

    top = float(values.abs().max())
    scale = values.abs() / top if top > 0 else torch.zeros_like(values)
    red, green, blue = to_rgb(colour)

    def mix(f: float) -> str:
        ink = 0.12 + 0.88 * f  # never pure white: a zero still shows its cell
        return to_hex((1 - ink * (1 - red), 1 - ink * (1 - green), 1 - ink * (1 - blue)))

    return [[mix(float(f)) for f in row] for row in scale]


def require_self_attention_head(weights: HeadWeights, head: object, drawer: str) -> None:
    """Refuse cross-attention sizes and a head outside the layer, naming the drawer."""
    if weights.kdim != weights.embed_dim or weights.vdim != weights.embed_dim:
        raise ValueError(
            f"{drawer} draws self-attention: the layer's kdim ({weights.kdim}) and vdim "
            f"({weights.vdim}) must equal d_model ({weights.embed_dim})"
        )
    if not isinstance(head, int) or isinstance(head, bool) or not 0 <= head < weights.num_heads:
        raise ValueError(f"head must be an int in [0, {weights.num_heads}), got {head!r}")


def backward_paths(
    x: object, layer: object, grad_output: object, *, mask: object | None = None, head: int = 0
) -> Figure:
    """The gradient of the loss flowing back from one head's output to W^V, W^Q and W^K.

    Three paths, drawn left to right from ``dO``, every block to scale and each cell
    shaded by the size of its entry (white: zero; the role's full colour: the largest
    entry of that matrix):

    - the value path, ``dV = Pᵀ dO``, then ``dW^V = Xᵀ dV``;
    - the query path, ``dP = dO Vᵀ``, through the softmax to ``dZ``, then
      ``dQ = dZ K / √d_k`` and ``dW^Q = Xᵀ dQ``;
    - the key path, from the same ``dZ``: ``dK = dZᵀ Q / √d_k``, then ``dW^K = Xᵀ dK``.

    ``Z`` is the score matrix ``Q Kᵀ / √d_k`` and ``P`` its row-wise softmax. The
    gradients are computed here with :func:`qkv.gradients.attention_backward`.

    Parameters
    ----------
    x : Tensor, shape (T, d_model) or a batch (B, T, d_model)
        The input of self-attention (the first sequence of a batch is drawn).
    layer : HeadWeights or a multi-head module
        Where W^Q, W^K and W^V come from (``to_heads()`` is called on a module);
        its kdim and vdim must be d_model (self-attention).
    grad_output : Tensor, shape (T, d_v) or (B, T, d_v)
        dO, the gradient of the loss at the head's output ``O = P V`` (before W^O).
    mask : BoolTensor, shape (T, T), optional
        True = may attend.
    head : int
        Which head to draw.

    Returns
    -------
    matplotlib.figure.Figure

    See Also
    --------
    qkv.gradients.attention_backward : the formulas.
    :doc:`training/backward` : the derivation, step by step.

    Examples
    --------
    >>> import torch, qkv
    >>> mha = qkv.MultiHeadAttention(6, 1, bias=False)
    >>> figure = qkv.diagrams.backward_paths(torch.randn(4, 6), mha, torch.randn(4, 6))
    >>> qkv.diagrams.matrix_names(figure)
    ['dO', 'dV', 'dW^V', 'dP', 'dZ', 'dQ', 'dW^Q', 'dK', 'dW^K']
    """
    weights = head_weights(layer)
    first = batch_first_of(layer)
    x2 = as_matrix("x", x, layout="(T, d_model)", batch_first=first)
    require_size("x", x2, 1, weights.embed_dim, "features", "the layer's d_model")
    require_self_attention_head(weights, head, "backward_paths")
    group = weights.num_heads // weights.num_kv_heads
    kv = head // group  # the K/V head this query head reads
    length = x2.shape[0]
    dout = as_matrix("grad_output", grad_output, layout="(T, d_v)", batch_first=first)
    if tuple(dout.shape) != (length, weights.d_v):
        raise ValueError(
            f"grad_output must have the head's output shape (T, d_v) = ({length}, {weights.d_v}), "
            f"got {shape_str(dout.shape)}"
        )
    mask2 = None if mask is None else require_tensor("mask", mask, ndim=2, layout="(T, T)", floating=False)
    x2 = x2.to(weights.w_q.dtype)
    dout = dout.to(weights.w_q.dtype)
    with torch.no_grad():
        q = x2 @ weights.w_q[head]  # (T, d_k)
        k = x2 @ weights.w_k[kv]  # (T, d_k)
        v = x2 @ weights.w_v[kv]  # (T, d_v)
        if weights.b_q is not None:
            q = q + weights.b_q[head]
        if weights.b_k is not None:
            k = k + weights.b_k[kv]
        if weights.b_v is not None:
            v = v + weights.b_v[kv]
        scale = 1.0 / _math.sqrt(q.shape[-1])
        _, p = explicit_attention(q, k, v, mask2, scale)  # (T, T)
        dp = dout @ v.T  # (T, T)
        dz = softmax_backward(p, dp)  # (T, T)
        dq, dk, dv = attention_backward(q, k, v, dout, mask2)  # (T, d_k), (T, d_k), (T, d_v)
        grads = {"dW^Q": x2.T @ dq, "dW^K": x2.T @ dk, "dW^V": x2.T @ dv}  # (d_model, d_·)
    # (name, tensor, role colour, row, column); rows: 0 value path, 1 query path, 2 key path
    blocks = [
        ("dO", dout, ROLE_COLOURS["o"], 1, 0),
        ("dV", dv, ROLE_COLOURS["v"], 0, 1),
        ("dW^V", grads["dW^V"], ROLE_COLOURS["v"], 0, 4),
        ("dP", dp, ROLE_COLOURS["weights"], 1, 1),
        ("dZ", dz, ROLE_COLOURS["weights"], 1, 2),
        ("dQ", dq, ROLE_COLOURS["q"], 1, 3),
        ("dW^Q", grads["dW^Q"], ROLE_COLOURS["q"], 1, 4),
        ("dK", dk, ROLE_COLOURS["k"], 2, 3),
        ("dW^K", grads["dW^K"], ROLE_COLOURS["k"], 2, 4),
    ]
    col_width = [max(t.shape[1] for _, t, _, _, c in blocks if c == col) for col in range(5)]
    row_height = [max(t.shape[0] for _, t, _, r, _ in blocks if r == row) for row in range(3)]
    gap, above, below, title = 1.05, 0.32, 0.3, 0.35  # inches
    canvas = Canvas(sum(col_width), sum(row_height), extra_width=4 * gap + 0.3,
                    extra_height=3 * (above + below) + title)  # fmt: skip
    lefts, at = [], canvas.inch(0.15)
    for width in col_width:
        lefts.append(at)
        at += width + canvas.inch(gap)
    tops, at = [], canvas.inch(title + above)
    for height in row_height:
        tops.append(at)
        at += height + canvas.inch(above + below)
    boxes: dict[str, dict[str, float]] = {}
    for name, tensor, colour, row, col in blocks:
        left = lefts[col] + (col_width[col] - tensor.shape[1]) / 2
        top = tops[row] + (row_height[row] - tensor.shape[0]) / 2
        boxes[name] = canvas.matrix(left, top, tensor.shape[0], tensor.shape[1], colour,
                                    cell_colours=_shades(tensor.cpu(), colour), label=name,
                                    shape=tuple(tensor.shape), alpha=1.0)  # fmt: skip

    def link(start: str, end: str, label: str) -> None:
        a, b = boxes[start], boxes[end]
        canvas.arrow(a["right"], (a["y"] + a["bottom"]) / 2, b["x"], (b["y"] + b["bottom"]) / 2, label=label)

    link("dO", "dV", r"$P^\top dO$")
    link("dV", "dW^V", r"$X^\top dV$")
    link("dO", "dP", r"$dO\,V^\top$")
    link("dP", "dZ", "softmax\nbackward")
    link("dZ", "dQ", r"$dZ\,K/\sqrt{d_k}$")
    link("dQ", "dW^Q", r"$X^\top dQ$")
    link("dZ", "dK", r"$dZ^\top Q/\sqrt{d_k}$")
    link("dK", "dW^K", r"$X^\top dK$")
    canvas.title(r"Three paths from $dO$ to $W^V$, $W^Q$ and $W^K$ (shade: size of each entry)")
    return canvas.fit()
