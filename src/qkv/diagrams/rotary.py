"""Rotary position embeddings pictured: which dimensions turn together, a query and a key
turned by their positions, and the scores that depend only on how far apart they are.

See also
--------
The page :doc:`rotary` (book/rotary.ipynb).
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING

import torch

from qkv._validation import require_positive_int, require_tensor, shape_str
from qkv.diagrams._draw import FONT, HEAD_COLOURS, ROLE_COLOURS, TEXT_COLOUR, ink_on, require_matplotlib
from qkv.rotary import RotaryEmbedding, interleaved_to_half

if TYPE_CHECKING:  # pragma: no cover
    from matplotlib.figure import Figure

__all__ = ["pairings", "position_scores", "rotation"]


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
    the angle between the turned query and the turned key, marked by an arc and
    written in the title. A legend below the panels names the arrows. The rotations
    are computed by ``rotary`` itself. Pairs with the same ``t - s`` leave the same
    angle.

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
    from matplotlib.lines import Line2D
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
    figure = Figure(figsize=(3.1 * len(positions), 3.9), dpi=100, layout="constrained")
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
        title = f"t = {t}, s = {s}  (t − s = {t - s})\nangle from q to k: {abs(between):.0f}°"
        ax.set_title(title, fontsize=FONT)
        ax.set_xlim(-reach, reach)
        ax.set_ylim(-reach, reach)
        ax.set_aspect("equal")
        ax.axhline(0, color="#cccccc", linewidth=0.8, zorder=0)
        ax.axvline(0, color="#cccccc", linewidth=0.8, zorder=0)
        ax.set_xlabel(f"dimension {a} of the head", fontsize=FONT - 1)
        ax.set_ylabel(f"dimension {b} of the head", fontsize=FONT - 1)
        ax.set_xticks([])
        ax.set_yticks([])
    handles = [
        Line2D([], [], color=ROLE_COLOURS["q"], linewidth=2.5, label="q turned by t·θ"),
        Line2D([], [], color=ROLE_COLOURS["k"], linewidth=2.5, label="k turned by s·θ"),
        Line2D([], [], color=ROLE_COLOURS["q"], alpha=0.35, linestyle="--", label="q before"),
        Line2D([], [], color=ROLE_COLOURS["k"], alpha=0.35, linestyle="--", label="k before"),
    ]
    figure.legend(handles=handles, loc="outside lower center", ncols=4, fontsize=FONT - 1, frameon=False)
    figure.suptitle(f"Pair {pair}: θ = {theta:.3g} rad per position", fontsize=FONT)
    return figure


def _diagonal_spread(scores: torch.Tensor) -> float:
    """The largest range (max - min) of the scores along any diagonal t - s = constant."""
    rows, cols = scores.shape
    diagonals = (scores.diagonal(offset) for offset in range(-rows + 1, cols))
    spreads = [float(d.max() - d.min()) for d in diagonals if d.numel() > 1]
    return max(spreads, default=0.0)


def position_scores(panels: Mapping[str, torch.Tensor], *, title: str | None = None) -> Figure:
    """Scores by position: one heat map per way of encoding position, row t a query position.

    Each panel is the score of one query content placed at position t (row) against
    one key content placed at position s (column). A score that depends on the
    positions only through t - s is constant along every diagonal: the map is drawn
    in stripes parallel to the diagonal. Each panel's title gives the largest range
    of its scores along any one diagonal, read from the scores (0.00 for stripes).
    The colour scale is shared and centred at 0.

    Parameters
    ----------
    panels : mapping of str to Tensor, shape (T, S)
        A title for each panel and its scores, e.g. ``{"RoPE": ..., "added": ...}``.
    title : str, optional
        The figure's title: say what to look at.

    Returns
    -------
    matplotlib.figure.Figure
        Panel n's image has ``gid`` ``"scores-{n}"``; its array is the scores drawn.

    See Also
    --------
    rotation : a query and a key turned, in the plane of one pair.
    :doc:`rotary` : where position enters attention.

    Examples
    --------
    >>> import torch, qkv
    >>> rope = qkv.RotaryEmbedding(8, angle_dtype=torch.float64)
    >>> q, k = torch.randn(1, 8, dtype=torch.float64), torch.randn(1, 8, dtype=torch.float64)
    >>> t = torch.arange(10)
    >>> scores = rope(q.expand(10, 8), t) @ rope(k.expand(10, 8), t).T  # (T, S)
    >>> figure = qkv.diagrams.position_scores({"RoPE": scores})
    >>> figure.axes[0].get_title().splitlines()[-1]
    'range along a diagonal: 0.00'
    """
    require_matplotlib()
    from matplotlib.figure import Figure
    from matplotlib.ticker import MaxNLocator

    if not isinstance(panels, Mapping) or not panels:
        raise ValueError("panels must map at least one title to a (T, S) tensor of scores")
    grids = {}
    for name, scores in panels.items():
        grid = require_tensor(f"panels[{name!r}]", scores, ndim=2, layout="(T, S)")
        grids[str(name)] = grid.detach().double().cpu()
    vmax = max(float(g.abs().max()) for g in grids.values()) or 1.0
    figure = Figure(figsize=(3.2 * len(grids) + 0.9, 3.5), dpi=100, layout="constrained")
    axes = figure.subplots(1, len(grids), squeeze=False)[0]
    images = []
    for n, ((name, grid), ax) in enumerate(zip(grids.items(), axes, strict=True)):
        images.append(ax.imshow(grid.numpy(), cmap="RdBu_r", vmin=-vmax, vmax=vmax, gid=f"scores-{n}"))
        ax.set_title(f"{name}\nrange along a diagonal: {_diagonal_spread(grid):.2f}", fontsize=FONT)
        ax.set_xlabel("key position s", fontsize=FONT - 1)
        ax.xaxis.set_major_locator(MaxNLocator(integer=True))
        ax.yaxis.set_major_locator(MaxNLocator(integer=True))
        ax.tick_params(labelsize=FONT - 3)
    axes[0].set_ylabel("query position t", fontsize=FONT - 1)
    figure.colorbar(images[0], ax=list(axes), label="score q·k", shrink=0.9)
    if title:
        figure.suptitle(title, fontsize=FONT)
    return figure


def pairings(d_k: int = 8) -> Figure:
    """Which dimensions of a head turn together, in each pairing, and the renumbering between them.

    Two rows of ``d_k`` cells, one per dimension, numbered: interleaved (Meta's
    reference: 2j with 2j + 1) above, half-split (Hugging Face's Llama: j with
    j + d_k/2) below. Cells of one colour form pair j, turned together by t·θ_j;
    the partners are read from each pairing's rotation matrix. Grey lines join each
    dimension to where :func:`qkv.interleaved_to_half` moves its row of W^Q and W^K.

    Parameters
    ----------
    d_k : int
        The head size, even.

    Returns
    -------
    matplotlib.figure.Figure
        Cell m of each row is a rectangle with ``gid`` ``"{pairing}-{m}"``, coloured by
        its pair; the lines have ``gid`` ``"move-{m}"`` (m: the interleaved row).

    See Also
    --------
    qkv.interleaved_to_half
    :doc:`rotary/pairings` : the two pairings, and converting weights between them.

    Examples
    --------
    >>> import qkv
    >>> figure = qkv.diagrams.pairings(8)
    >>> len([p for p in figure.axes[0].patches if p.get_gid().startswith("half-")])
    8
    """
    require_matplotlib()
    from matplotlib.figure import Figure
    from matplotlib.patches import Rectangle

    d_k = require_positive_int("d_k", d_k)
    if d_k % 2:
        raise ValueError(f"d_k must be even to pair its dimensions, got {d_k}")
    rows = {
        "interleaved": (1.0, "interleaved: 2j with 2j + 1\n(Meta's reference code)"),
        "half": (0.0, "half-split: j with j + $d_k/2$\n(Hugging Face's Llama)"),
    }
    figure = Figure(figsize=(2.6 + 0.6 * d_k, 1.9), dpi=100, layout="constrained")
    ax = figure.subplots()
    for pairing, (y, label) in rows.items():
        turning = RotaryEmbedding(d_k, pairing=pairing, angle_dtype=torch.float64).matrix(1)  # (d_k, d_k)
        for m in range(d_k):  # dimension m turns with the other nonzero entry of row m
            partner = next(n for n in range(d_k) if n != m and turning[m, n] != 0)
            j = min(m, partner) // (2 if pairing == "interleaved" else 1)  # its pair
            colour = HEAD_COLOURS[j % len(HEAD_COLOURS)]
            ax.add_patch(Rectangle((m, y), 0.9, 0.5, color=colour, alpha=0.85, gid=f"{pairing}-{m}"))
            ink = ink_on(colour)
            ax.text(m + 0.45, y + 0.25, str(m), ha="center", va="center", color=ink, fontsize=FONT - 1)
        ax.text(-0.25, y + 0.25, label, ha="right", va="center", fontsize=FONT - 1, color=TEXT_COLOUR)
    moved = interleaved_to_half(torch.arange(float(d_k))[:, None], 1)[:, 0].long()  # row m_half holds m_inter
    for m_half, m_inter in enumerate(moved.tolist()):
        xs = [m_inter + 0.45, m_half + 0.45]
        ax.plot(xs, [1.0, 0.5], color="#999999", linewidth=0.8, gid=f"move-{m_inter}")
    ax.set_xlim(-4.6, d_k)  # room on the left for the rows' names
    ax.set_ylim(-0.05, 1.55)
    ax.set_title(r"Dimensions of one colour turn together (pair $j$, by $t\theta_j$)", fontsize=FONT)
    ax.axis("off")
    return figure
