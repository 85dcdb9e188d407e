"""Rotary position embeddings pictured: a query and a key turned by their positions.

See also
--------
The page :doc:`rotary` (book/rotary.ipynb).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import TYPE_CHECKING

import torch

from qkv._validation import require_tensor, shape_str
from qkv.diagrams._draw import FONT, ROLE_COLOURS, TEXT_COLOUR, require_matplotlib
from qkv.rotary import RotaryEmbedding

if TYPE_CHECKING:  # pragma: no cover
    from matplotlib.figure import Figure

__all__ = ["rotation"]


def _plane(rotary: RotaryEmbedding, pair: int) -> tuple[int, int]:
    """The two dimensions that pair ``pair`` turns together."""
    if rotary.pairing == "half":
        return pair, pair + rotary.rotary_dim // 2
    return 2 * pair, 2 * pair + 1


def rotation(
    query: torch.Tensor,
    key: torch.Tensor,
    rotary: RotaryEmbedding,
    positions: Sequence[tuple[int, int]],
    *,
    pair: int = 0,
) -> Figure:
    """One query and one key turned by their positions, in the plane of one pair of dimensions.

    One panel per ``(t, s)``: the query before rotation (dashed) and after, turned by
    ``t · θ_j``, in Q's blue; the key likewise by ``s · θ_j``, in K's vermillion; and
    the angle left between them, marked and written in the title. The rotations are
    computed by ``rotary`` itself. Pairs with the same ``t - s`` leave the same angle.

    Parameters
    ----------
    query, key : Tensor, shape (d_k,)
        One head's query and key before rotation.
    rotary : RotaryEmbedding
        The rotation, for this d_k.
    positions : sequence of (int, int)
        The query's position t and the key's position s, one panel each.
    pair : int
        Which pair of dimensions j to draw (0, the fastest, by default).

    Returns
    -------
    matplotlib.figure.Figure
        Each arrow has a ``gid``: ``"q-raw"``, ``"k-raw"``, ``"q-rotated-{n}"`` and
        ``"k-rotated-{n}"`` for panel n.

    See Also
    --------
    qkv.RotaryEmbedding
    :doc:`rotary` : where position enters attention.

    Examples
    --------
    >>> import torch, qkv
    >>> rope = qkv.RotaryEmbedding(8, angle_dtype=torch.float64)
    >>> q, k = torch.randn(8, dtype=torch.float64), torch.randn(8, dtype=torch.float64)
    >>> figure = qkv.diagrams.rotation(q, k, rope, [(3, 1), (9, 7)])
    >>> len(figure.axes)
    2
    """
    require_matplotlib()
    from matplotlib.figure import Figure
    from matplotlib.patches import Arc, FancyArrow

    if not isinstance(rotary, RotaryEmbedding):
        raise TypeError(f"rotary must be a qkv.RotaryEmbedding, got {type(rotary).__name__}")
    d_k = rotary.d_k
    vectors = {}
    for name, x in (("query", query), ("key", key)):
        tensor = require_tensor(name, x, ndim=1, layout="(d_k,)")
        if tensor.shape[0] != d_k:
            raise ValueError(f"{name} has shape {shape_str(tensor.shape)}, but rotary is for d_k={d_k}")
        vectors[name] = tensor.detach()
    if not 0 <= pair < rotary.rotary_dim // 2:
        raise ValueError(f"pair must be between 0 and {rotary.rotary_dim // 2 - 1}, got {pair}")
    if not positions:
        raise ValueError("positions must name at least one (t, s)")
    a, b = _plane(rotary, pair)
    theta = rotary.frequencies()[pair].item()

    def point(x: torch.Tensor, position: int | None) -> tuple[float, float]:
        turned = x if position is None else rotary(x[None], torch.tensor([position]))[0]  # (d_k,)
        return turned[a].item(), turned[b].item()

    raw_q, raw_k = point(vectors["query"], None), point(vectors["key"], None)
    reach = 1.25 * max(math.hypot(*raw_q), math.hypot(*raw_k), 1e-12)
    figure = Figure(figsize=(3.3 * len(positions), 3.7), dpi=100, layout="constrained")
    axes = figure.subplots(1, len(positions), squeeze=False)[0]
    for n, ((t, s), ax) in enumerate(zip(positions, axes, strict=True)):
        q, k = point(vectors["query"], t), point(vectors["key"], s)
        for (tip_x, tip_y), colour, style, gid in (
            (raw_q, ROLE_COLOURS["q"], "--", "q-raw"),
            (raw_k, ROLE_COLOURS["k"], "--", "k-raw"),
            (q, ROLE_COLOURS["q"], "-", f"q-rotated-{n}"),
            (k, ROLE_COLOURS["k"], "-", f"k-rotated-{n}"),
        ):
            raw = style == "--"
            ax.add_patch(FancyArrow(
                0, 0, tip_x, tip_y, width=0.012 * reach, head_width=0.07 * reach, length_includes_head=True,
                color=colour, alpha=0.35 if raw else 1.0, linestyle=style, gid=gid,
            ))  # fmt: skip
        angle_q, angle_k = math.degrees(math.atan2(q[1], q[0])), math.degrees(math.atan2(k[1], k[0]))
        between = (angle_k - angle_q + 180) % 360 - 180  # from the query to the key, in (-180, 180]
        start, end = (angle_q, angle_q + between) if between >= 0 else (angle_q + between, angle_q)
        ax.add_patch(Arc((0, 0), 0.6 * reach, 0.6 * reach, theta1=start, theta2=end, color=TEXT_COLOUR))
        ax.annotate(f"q at t={t}", q, color=ROLE_COLOURS["q"], fontsize=FONT - 1)
        ax.annotate(f"k at s={s}", k, color=ROLE_COLOURS["k"], fontsize=FONT - 1)
        ax.set_title(f"t={t}, s={s}, t−s={t - s}:\nangle left {abs(between):.0f}°", fontsize=FONT)
        ax.set_xlim(-reach, reach)
        ax.set_ylim(-reach, reach)
        ax.set_aspect("equal")
        ax.axhline(0, color="#cccccc", linewidth=0.8, zorder=0)
        ax.axvline(0, color="#cccccc", linewidth=0.8, zorder=0)
        ax.set_xlabel(f"dimension {a} of the head", fontsize=FONT - 1)
        ax.set_ylabel(f"dimension {b} of the head", fontsize=FONT - 1)
        ax.tick_params(labelsize=FONT - 3)
    figure.suptitle(
        f"Pair {pair} turns by {theta:.3g} rad per position; dashed: before rotation", fontsize=FONT
    )
    return figure
