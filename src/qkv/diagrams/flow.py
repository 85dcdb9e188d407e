"""Data-flow diagrams: X through W^Q, W^K, W^V, and one big W^Q cut into heads.

See also
--------
The chapters "Q, K and V: three letters, three meanings" (book/terminology.ipynb)
and "One big W^Q or one per head?" (book/heads.ipynb).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from qkv._validation import require_size
from qkv.diagrams._draw import EDGE_COLOUR, ROLE_COLOURS, Canvas, as_matrix, head_colour, head_weights

if TYPE_CHECKING:  # pragma: no cover
    from matplotlib.figure import Figure

__all__ = ["projection"]


def projection(x: object, layer: object, *, heads: bool = False) -> Figure:
    """X times W^Q, W^K and W^V gives Q, K and V, every block drawn to scale.

    Three rows, one per projection: ``X (T, d_model) × W^Q (d_model, h·d_k) = Q
    (T, h·d_k)``, and likewise for K and V (self-attention: the same X in all
    three). Each block is labelled with its shape, read from the objects passed.

    Parameters
    ----------
    x : Tensor, shape (T, d_model) or (B, T, d_model)
        The input; of a batch, the first sequence is drawn.
    layer : HeadWeights or a multi-head module
        Where W^Q, W^K and W^V come from (``to_heads()`` is called on a module).
    heads : bool
        Colour the columns of W and of Q, K, V by head (head i's block of d_k
        columns in head i's colour) instead of by role.

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
    weights = head_weights(layer)
    x2 = as_matrix("x", x, layout="(T, d_model)")
    require_size("x", x2, 1, weights.embed_dim, "features", "the layer's d_model")
    T, d_model = x2.shape
    h, h_kv = weights.num_heads, weights.num_kv_heads
    rows = [
        ("Q", "W^Q", "q", h, weights.d_k),
        ("K", "W^K", "k", h_kv, weights.d_k),
        ("V", "W^V", "v", h_kv, weights.d_v),
    ]
    widest = max(n * d for _, _, _, n, d in rows)
    gap, above, below = 0.45, 0.3, 0.3  # inches: between blocks, for labels above and shapes below
    row_units = max(T, d_model)
    canvas = Canvas(
        d_model + 2 * widest, 3 * row_units, extra_width=4 * gap, extra_height=3 * (above + below)
    )
    gap_units = canvas.inch(gap)
    for i, (out_name, w_name, role, n_heads, d) in enumerate(rows):
        top = canvas.inch(above) + i * (row_units + canvas.inch(above + below))
        colours = [head_colour(j // d) for j in range(n_heads * d)] if heads else None
        x_box = canvas.matrix(gap_units / 2, top, T, d_model, ROLE_COLOURS["x"], label="X",
                              shape=(T, d_model), gid=f"X{i}")  # fmt: skip
        canvas.operator(x_box["right"] + gap_units / 2, top + T / 2, "×")
        frame = ROLE_COLOURS[role] if heads else EDGE_COLOUR  # the role stays visible around the heads
        w_box = canvas.matrix(x_box["right"] + gap_units, top, d_model, n_heads * d, ROLE_COLOURS[role],
                              column_colours=colours, label=w_name, shape=(d_model, n_heads * d),
                              frame=frame)  # fmt: skip
        canvas.operator(w_box["right"] + gap_units / 2, top + T / 2, "=")
        canvas.matrix(w_box["right"] + gap_units, top, T, n_heads * d, ROLE_COLOURS[role],
                      column_colours=colours, label=out_name, shape=(T, n_heads * d),
                      frame=frame)  # fmt: skip
    return canvas.figure

