"""Data-flow diagrams: X through W^Q, W^K, W^V, and one big W^Q cut into heads.

See also
--------
The chapters :doc:`training` (book/training.ipynb) and :doc:`heads`
(book/heads.ipynb).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from qkv._validation import require_bool
from qkv.diagrams._draw import (
    EDGE_COLOUR,
    ROLE_COLOURS,
    Canvas,
    head_colour,
    layer_inputs,
)

if TYPE_CHECKING:  # pragma: no cover
    from matplotlib.figure import Figure

__all__ = ["projection"]


def projection(
    x: object, layer: object, *, heads: bool = False, key: object | None = None, value: object | None = None
) -> Figure:
    """X times W^Q, W^K and W^V gives Q, K and V, every block drawn to scale.

    Three rows, one per projection: ``X (T, d_model) × W^Q (d_model, h·d_k) = Q
    (T, h·d_k)``, and likewise for K and V: in self-attention the same X in all
    three; in cross-attention ``key`` and ``value`` (an encoder's output, say) in
    the K and V rows. Each block is labelled with its shape, read from the objects
    passed.

    Parameters
    ----------
    x : Tensor, shape (T, d_model) or a batch (B, T, d_model)
        The query input; of a batch, the first sequence is drawn ((T, B, d_model)
        for a module built with ``batch_first=False``).
    layer : HeadWeights or a multi-head module
        Where W^Q, W^K and W^V come from (``to_heads()`` is called on a module).
    heads : bool
        Colour the columns of W and of Q, K, V by head instead of by role. With
        grouped-query weights a query head takes the colour of the K/V head it
        reads (query head i reads K/V head ``i // (h / h_kv)``).
    key, value : Tensor, shape (S, kdim) and (S, vdim), optional
        The key and value inputs; default ``x`` (self-attention) and ``key``. A
        layer whose kdim or vdim is not d_model needs them.

    Returns
    -------
    matplotlib.figure.Figure

    Examples
    --------
    >>> import torch, qkv
    >>> mha = qkv.MultiHeadAttention(12, 3)
    >>> figure = qkv.diagrams.projection(torch.randn(5, 12), mha)
    >>> sorted({t for t in qkv.diagrams.texts_of(figure) if t.startswith("(")})
    ['(12, 12)', '(5, 12)']
    """
    heads = require_bool("heads", heads)
    weights, x2, k2, v2 = layer_inputs(layer, x, key, value)
    h, h_kv = weights.num_heads, weights.num_kv_heads
    group = h // h_kv  # query heads per K/V head
    v_name = "X" if key is None and value is None else "X_V"
    # (output, W, role, input, input's name, heads, size per head, heads per colour)
    rows = [
        ("Q", "W^Q", "q", x2, "X", h, weights.d_k, group),  # a group of query heads: its K/V head's colour
        ("K", "W^K", "k", k2, "X" if key is None else "X_K", h_kv, weights.d_k, 1),
        ("V", "W^V", "v", v2, v_name, h_kv, weights.d_v, 1),
    ]
    widest_in = max(inp.shape[1] for _, _, _, inp, _, _, _, _ in rows)
    widest = max(n * d for _, _, _, _, _, n, d, _ in rows)
    gap, above, below = 0.45, 0.3, 0.3  # inches: between blocks, for labels above and shapes below
    row_units = [max(inp.shape[0], inp.shape[1]) for _, _, _, inp, _, _, _, _ in rows]
    canvas = Canvas(
        widest_in + 2 * widest, sum(row_units), extra_width=4 * gap, extra_height=3 * (above + below)
    )
    gap_units = canvas.inch(gap)
    top = canvas.inch(above)
    for i, (out_name, w_name, role, inp, in_name, n_heads, d, per_colour) in enumerate(rows):
        length, width = inp.shape
        colours = [head_colour(j // d // per_colour) for j in range(n_heads * d)] if heads else None
        x_box = canvas.matrix(gap_units / 2, top, length, width, ROLE_COLOURS["x"], label=in_name,
                              shape=(length, width), gid=f"X{i}")  # fmt: skip
        x_right = gap_units / 2 + widest_in  # the W column lines up across rows
        canvas.operator((x_box["right"] + x_right + gap_units) / 2, top + length / 2, "×")
        frame = ROLE_COLOURS[role] if heads else EDGE_COLOUR  # the role stays visible around the heads
        w_box = canvas.matrix(x_right + gap_units, top, width, n_heads * d, ROLE_COLOURS[role],
                              column_colours=colours, label=w_name, shape=(width, n_heads * d),
                              frame=frame)  # fmt: skip
        canvas.operator(w_box["right"] + gap_units / 2, top + length / 2, "=")
        canvas.matrix(w_box["right"] + gap_units, top, length, n_heads * d, ROLE_COLOURS[role],
                      column_colours=colours, label=out_name, shape=(length, n_heads * d),
                      frame=frame)  # fmt: skip
        top += row_units[i] + canvas.inch(above + below)
    return canvas.fit()
