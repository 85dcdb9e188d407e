"""Rotary position embeddings pictured: where position enters a layer, which dimensions turn
together, a query and a key turned by their positions, the scores that depend only on
how far apart they are, and what a shift of the whole sequence does to the outputs.

See also
--------
The page :doc:`rotary` (book/rotary.ipynb).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from typing import TYPE_CHECKING

import torch

from qkv._validation import require_positive_int, require_tensor, shape_str
from qkv.attention import attention
from qkv.diagrams._draw import (
    EDGE_COLOUR,
    FONT,
    HEAD_COLOURS,
    ROLE_COLOURS,
    TEXT_COLOUR,
    ink_on,
    layer_inputs,
    require_matplotlib,
)
from qkv.rotary import RotaryEmbedding, interleaved_to_half

if TYPE_CHECKING:  # pragma: no cover
    from matplotlib.axes import Axes
    from matplotlib.figure import Figure

__all__ = ["pairings", "position_flow", "position_gaps", "position_scores", "rotation", "value_shift"]


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
    causal: bool = False,
    before: bool = False,
) -> Figure:
    """One query and one key turned by their positions, in the plane of one pair of dimensions.

    One panel per ``(t, s)``: the query before rotation (thin, pale) and after, turned by
    ``t · θ_j``, in Q's blue; the key likewise by ``s · θ_j``, in K's vermillion; and
    the signed angle from the turned query to the turned key (counter-clockwise
    positive, in (-180°, 180°]), marked by an arc and written in the title. At position
    0 a vector is not turned, and its two arrows coincide: a note says so. A legend
    below the panels names the arrows, the pair and the sign convention. The rotations
    are computed by ``rotary`` itself. Pairs with the same ``t - s`` leave the same
    angle. With ``causal``, a panel whose key comes after its query (s > t) says in its
    title that a causal model masks that score. With ``before``, the figure reads as a
    turn: each title gives the angle from q to k before and after rotation
    (``q to k: +146° → +31°``), so that the turn by ``(s - t) · θ_j`` reads off the two
    numbers, and the arrows before rotation are thin and full-coloured, under turned
    arrows six times as wide (thin beside thick reads in print and on a dark page
    alike), as the legend draws them.

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
    causal : bool
        Whether to mark the panels with s > t as masked in a causal model.
    before : bool
        Whether each panel's title gives the angle from q to k before rotation too, and
        the arrows before rotation are thin and full-coloured, the turned ones thick
        (False by default: the title gives the angle after rotation only, the arrows
        before rotation are thin and pale, and the turned ones half as thick).

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
        vectors[name] = tensor.detach().cpu()
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
    raw_turn = math.degrees(math.atan2(raw_k[1], raw_k[0]) - math.atan2(raw_q[1], raw_q[0]))
    raw_between = (raw_turn + 180) % 360 - 180  # from q to k before rotation, as `between` below
    reach = 1.25 * max(math.hypot(*raw_q), math.hypot(*raw_k), 1e-12)
    # Panels no wider than three to the column: a wider figure would show its text smaller.
    panel = min(3.1, 7.2 / len(positions))  # inches
    figure = Figure(figsize=(panel * len(positions), 3.9), dpi=100, layout="constrained")
    axes = figure.subplots(1, len(positions), squeeze=False)[0]
    for n, ((t, s), ax) in enumerate(zip(positions, axes, strict=True)):
        q, k = point(vectors["query"], t), point(vectors["key"], s)
        for (tip_x, tip_y), colour, raw, gid in (
            (raw_q, ROLE_COLOURS["q"], True, "q-raw"),
            (raw_k, ROLE_COLOURS["k"], True, "k-raw"),
            (q, ROLE_COLOURS["q"], False, f"q-rotated-{n}"),
            (k, ROLE_COLOURS["k"], False, f"k-rotated-{n}"),
        ):  # turned: full. Before: thin and pale (a dashed outline renders jagged), or with
            # `before` thin and full-coloured under turned arrows six times as wide, which
            # reads in print and on a dark page alike, and as the legend draws them
            width = (0.004 if raw else 0.024 if before else 0.012) * reach
            ax.add_patch(FancyArrow(
                0, 0, tip_x, tip_y, width=width, head_width=(0.05 if raw and before else 0.07) * reach,
                length_includes_head=True, facecolor=colour, linewidth=0,
                alpha=0.4 if raw and not before else None, gid=gid,
            ))  # fmt: skip
        angle_q, angle_k = math.degrees(math.atan2(q[1], q[0])), math.degrees(math.atan2(k[1], k[0]))
        between = (angle_k - angle_q + 180) % 360 - 180  # from the query to the key, in (-180, 180]
        start, end = (angle_q, angle_q + between) if between >= 0 else (angle_q + between, angle_q)
        ax.add_patch(Arc((0, 0), 0.6 * reach, 0.6 * reach, theta1=start, theta2=end, color=TEXT_COLOUR))
        for position, name in ((t, "q"), (s, "k")):
            if position == 0:  # not turned: the "before" arrow lies under the turned one
                corner = 0.97 if name == "q" else 0.88  # top left, one line apart
                ax.text(0.03, corner, f"{name} before = {name} rotated (position 0)", transform=ax.transAxes,
                        ha="left", va="top", fontsize=FONT - 2, color=ROLE_COLOURS[name],
                        gid=f"{name}-unturned-{n}")  # fmt: skip
        title = f"t = {t}, s = {s}  (t − s = {t - s})\nangle from q to k: {between:+.0f}°"
        if before:  # the angle before rotation (the outlines), then after it
            title = f"t = {t}, s = {s}  (t − s = {t - s})\nq to k: {raw_between:+.0f}° → {between:+.0f}°"
        title = title.replace("-", "−")
        if causal and s > t:  # a key after its query: a causal mask hides this score
            title += "\nmasked in a causal model"
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
    handles: list[Line2D] = [
        Line2D([], [], color=ROLE_COLOURS["q"], linewidth=3.5 if before else 2.5, label="q rotated by t·θ"),
        Line2D([], [], color=ROLE_COLOURS["k"], linewidth=3.5 if before else 2.5, label="k rotated by s·θ"),
    ]
    for name in ("q", "k"):  # the arrows before rotation: thin, and with `before` full-coloured
        alpha = None if before else 0.4
        handles.append(Line2D([], [], color=ROLE_COLOURS[name], alpha=alpha, linewidth=1,
                              label=f"{name} before"))
    # two lines, and the key in two columns: one long line made the figure wider than the
    # book's column, and every text smaller
    caption = f"Pair {pair} (θ = {theta:.3g} rad per position);\nangles counter-clockwise from q to k"
    if before:
        caption += ", before → after rotation"
    figure.legend(handles=handles, loc="outside lower center", ncols=2, fontsize=FONT - 1, frameon=False,
                  title=caption, title_fontsize=FONT - 1)  # fmt: skip
    return figure


SCORE_LEVELS = 21  # colours in position_scores' map: an odd number puts 0 in the middle of one


def _diagonal_spread(scores: torch.Tensor) -> float:
    """The largest range (max - min) of the scores along any diagonal t - s = constant."""
    rows, cols = scores.shape
    diagonals = (scores.diagonal(offset) for offset in range(-rows + 1, cols))
    spreads = [float(d.max() - d.min()) for d in diagonals if d.numel() > 1]
    return max(spreads, default=0.0)


def position_scores(
    panels: Mapping[str, torch.Tensor],
    *,
    title: str | None = None,
    label: str = "score q·k",
    causal: bool = False,
) -> Figure:
    """Scores by position: one heat map per way of encoding position, row t a query position.

    Each panel is the score of one query content placed at position t (row) against
    one key content placed at position s (column). A score that depends on the
    positions only through t - s is constant along every diagonal: the map is drawn
    in stripes parallel to the diagonal. Each panel's title gives the largest range
    of its scores along any one diagonal, read from the scores (0.00 for stripes).
    The colour scale is shared, centred at 0, in 21 discrete levels (``SCORE_LEVELS``).
    With ``causal``, the cells a causal mask hides (key after query, s > t) are hatched
    and labelled "masked (s > t)"; their scores are still drawn beneath.

    Parameters
    ----------
    panels : mapping of str to Tensor, shape (T, S)
        A title for each panel and its scores, e.g. ``{"RoPE": ..., "added": ...}``.
    title : str, optional
        The figure's title: say what to look at.
    label : str
        The colour bar's label: say what was computed (``q·k``, or ``q·k/√d_k``).
    causal : bool
        Whether to hatch the cells s > t, which a causal mask hides.

    Returns
    -------
    matplotlib.figure.Figure
        Panel n's image has ``gid`` ``"scores-{n}"``; its array is the scores drawn.
        With ``causal``, panel n's hatched region is a patch with ``gid`` ``"masked-{n}"``.

    See Also
    --------
    rotation : a query and a key turned, in the plane of one pair.
    :doc:`rotary` : where position enters attention.

    Examples
    --------
    >>> import torch, qkv
    >>> rope = qkv.RotaryEmbedding(8, angle_dtype=torch.float64)
    >>> q = torch.randn(1, 8, dtype=torch.float64)
    >>> k = torch.randn(1, 8, dtype=torch.float64)
    >>> t = torch.arange(10)
    >>> scores = rope(q.expand(10, 8), t) @ rope(k.expand(10, 8), t).T  # (T, S)
    >>> figure = qkv.diagrams.position_scores({"RoPE": scores})
    >>> figure.axes[0].get_title().splitlines()[-1]
    'largest range along a diagonal: 0.00'
    """
    require_matplotlib()
    from matplotlib import colormaps
    from matplotlib.figure import Figure
    from matplotlib.patches import Polygon
    from matplotlib.ticker import MaxNLocator

    if not isinstance(panels, Mapping) or not panels:
        raise ValueError("panels must map at least one title to a (T, S) tensor of scores")
    grids = {}
    for name, scores in panels.items():
        grid = require_tensor(f"panels[{name!r}]", scores, ndim=2, layout="(T, S)")
        grids[str(name)] = grid.detach().double().cpu()
    vmax = max(float(g.abs().max()) for g in grids.values()) or 1.0
    # A few discrete levels: the book stores figures as 256-colour palette PNGs, and a
    # continuous map's rarest colours (the colour bar's ends) would be merged into others.
    cmap = colormaps["RdBu_r"].resampled(SCORE_LEVELS)
    figure = Figure(figsize=(3.2 * len(grids) + 0.9, 3.5), dpi=100, layout="constrained")
    axes = figure.subplots(1, len(grids), squeeze=False)[0]
    images = []
    for n, ((name, grid), ax) in enumerate(zip(grids.items(), axes, strict=True)):
        images.append(ax.imshow(grid.numpy(), cmap=cmap, vmin=-vmax, vmax=vmax, gid=f"scores-{n}"))
        ax.set_title(f"{name}\nlargest range along a diagonal: {_diagonal_spread(grid):.2f}", fontsize=FONT)
        ax.set_xlabel("key position s", fontsize=FONT - 1)
        ax.xaxis.set_major_locator(MaxNLocator(integer=True))
        ax.yaxis.set_major_locator(MaxNLocator(integer=True))
        ax.tick_params(labelsize=FONT - 2)
        rows, cols = grid.shape
        last = min(rows, cols - 1) - 1  # the last row t with a key after it, s > t
        if causal and last >= 0:  # a staircase around the cells s > t, in pixel coordinates
            stairs = [(u + 0.5, v) for t in range(last, -1, -1) for u, v in ((t, t + 0.5), (t, t - 0.5))]
            outline = [(cols - 0.5, -0.5), (cols - 0.5, last + 0.5), *stairs]
            ax.add_patch(Polygon(outline, closed=True, fill=False, hatch="///", edgecolor=TEXT_COLOUR,
                                 linewidth=0.8, alpha=0.6, gid=f"masked-{n}"))  # fmt: skip
            ax.text(0.97, 0.97, "masked (s > t)", transform=ax.transAxes, ha="right", va="top",
                    fontsize=FONT - 2, color=TEXT_COLOUR, bbox={"facecolor": "white", "edgecolor": "none",
                    "pad": 1.5})  # fmt: skip
    axes[0].set_ylabel("query position t", fontsize=FONT - 1)
    figure.colorbar(images[0], ax=list(axes), label=label, shrink=0.9)
    if title:
        figure.suptitle(title, fontsize=FONT)
    return figure


def pairings(
    d_k: int = 8, *, matrices: bool = False, entries: tuple[str, str] = ("c", "s"), rows: bool = False
) -> Figure:
    """Which dimensions of a head turn together, in each pairing, and the renumbering between them.

    Two rows of ``d_k`` cells, one per dimension, numbered: interleaved (Meta's
    reference: 2j with 2j + 1) above, half-split (Hugging Face's Llama: j with
    j + d_k/2) below. Cells of one colour form pair j, turned together by t·θ_j;
    the partners are read from each pairing's rotation matrix. Grey arrows, pointing
    down (Meta's order to Hugging Face's), join each dimension to where
    :func:`qkv.interleaved_to_half` moves its row of ``q_proj.weight`` and
    ``k_proj.weight`` (nn.Linear's (out, in) layout, so a head's dimension is a row there
    and a column of W^Q); read upwards, they are :func:`qkv.half_to_interleaved`, the
    fix for a model with Meta's pairing.

    Parameters
    ----------
    d_k : int
        The head size, even.
    matrices : bool
        Also draw, under the rows, each pairing's rotation R_t as a ``d_k`` × ``d_k``
        grid (it acts on a column, ``R_t @ q``, as :meth:`qkv.RotaryEmbedding.matrix`
        gives it): its nonzero entries in their pair's colour, ``c`` (cos tθ_j) on
        the diagonal, ``-s`` and ``s`` (∓sin tθ_j) where a dimension meets its
        partner, zeros blank. Default False: the rows and arrows alone.
    entries : tuple of two str
        The names written in R_t's entries for cos tθ_j and sin tθ_j, with ``matrices``.
        Default ``("c", "s")``; a page that uses s for a key position, or c for
        something else, can pass ``("cos", "sin")``.
    rows : bool
        With ``matrices``, write each rotation in the row form, for a page whose
        vectors are rows (``q_t R_t^T``): draw R_t^T, which acts on a row
        (``q @ R_t.T``), its rows the input dimensions and its columns the output
        dimensions, titled and explained as R_t^T. Default False: R_t, acting on a
        column (``R_t q``). The rotation is the same either way.

    Returns
    -------
    matplotlib.figure.Figure
        Cell m of each row is a rectangle with ``gid`` ``"{pairing}-{m}"``, coloured by
        its pair; the lines have ``gid`` ``"move-{m}"`` (m: the interleaved row). With
        ``matrices``, the entry (m, n) of each R_t is a rectangle with ``gid``
        ``"R-{pairing}-{m}-{n}"`` and its text ``c``, ``-s`` or ``s``, on the axes
        labelled ``"R-{pairing}"`` (with ``rows``, the entry (m, n) of R_t^T).

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
    if not isinstance(matrices, bool):
        raise TypeError(f"matrices must be a bool, got {type(matrices).__name__}")
    if not isinstance(rows, bool):
        raise TypeError(f"rows must be a bool, got {type(rows).__name__}")
    ok = isinstance(entries, tuple) and len(entries) == 2 and all(isinstance(x, str) and x for x in entries)
    if not ok:
        raise TypeError(f"entries must be two non-empty strings, for cos and sin, got {entries!r}")
    cos_name, sin_name = entries
    layouts = {
        "interleaved": (1.0, "interleaved: 2j with 2j + 1\n(Meta's code; GPT-J style)"),
        "half": (0.0, "half-split: j with j + $d_k/2$\n(HF's Llama; GPT-NeoX style)"),
    }
    turnings = {  # R_1, (d_k, d_k) each: every pair's sine is positive at t = 1 (θ_j ≤ 1 rad)
        pairing: RotaryEmbedding(d_k, pairing=pairing, angle_dtype=torch.float64).matrix(1)
        for pairing in layouts
    }

    def pair_colour(pairing: str, m: int) -> str:  # dimension m turns with the other nonzero entry of row m
        turning = turnings[pairing]
        partner = next(n for n in range(d_k) if n != m and turning[m, n] != 0)
        j = min(m, partner) // (2 if pairing == "interleaved" else 1)  # its pair
        return HEAD_COLOURS[j % len(HEAD_COLOURS)]

    width = 2.6 + 0.6 * d_k
    figure = Figure(figsize=(width, 1.9 + (0.45 * width if matrices else 0.0)), dpi=100, layout="constrained")
    if matrices:
        axes = figure.subplot_mosaic("RR;IH", height_ratios=[1.9, 0.45 * width])  # the rows; each R_t
        ax = axes["R"]
        for pairing, place in (("interleaved", "I"), ("half", "H")):
            drawn = turnings[pairing].T if rows else turnings[pairing]  # R_t^T acts on a row
            _rotation_grid(axes[place], drawn, pairing, pair_colour, entries, rows=rows)
    else:
        ax = figure.subplots()
    for pairing, (y, label) in layouts.items():
        for m in range(d_k):
            colour = pair_colour(pairing, m)
            ax.add_patch(Rectangle((m, y), 0.9, 0.5, color=colour, alpha=0.85, gid=f"{pairing}-{m}"))
            ink = ink_on(colour)
            ax.text(m + 0.45, y + 0.25, str(m), ha="center", va="center", color=ink, fontsize=FONT - 1)
        ax.text(-0.25, y + 0.25, label, ha="right", va="center", fontsize=FONT - 1, color=TEXT_COLOUR)
    numbers = torch.arange(float(d_k))[:, None]  # (d_k, 1): one head, each row its number
    moved = interleaved_to_half(numbers, 1, head_dim=d_k)[:, 0].long()  # row m_half holds m_inter
    for m_half, m_inter in enumerate(moved.tolist()):
        xs = [m_inter + 0.45, m_half + 0.45]
        ax.plot(xs, [1.0, 0.5], color="#999999", linewidth=0.8, gid=f"move-{m_inter}")
        head_from = (xs[1] - 0.12 * (xs[1] - xs[0]), 0.56)  # the last stretch of the line, to its end
        ax.annotate("", xy=(xs[1], 0.5), xytext=head_from, arrowprops={
            "arrowstyle": "-|>", "color": "#999999", "linewidth": 0.8, "shrinkA": 0, "shrinkB": 0,
            "mutation_scale": 9})  # fmt: skip
    moves = (
        "rows of q_proj.weight and\nk_proj.weight, per head:\n↓ Meta's to Hugging Face's (conversion)\n"
        "undone by the inverse permute"
    )
    ax.text(-0.25, 0.75, moves, ha="right", va="center", fontsize=FONT - 2, color="#777777")
    ax.set_xlim(-4.6, d_k)  # room on the left for the rows' names
    ax.set_ylim(-0.05, 1.55)
    ax.set_title(r"Dimensions of one colour rotate together (pair $j$, by $t\theta_j$)", fontsize=FONT)
    ax.axis("off")
    if matrices:
        names = (
            rf"{cos_name} = cos $t\theta_j$, {sin_name} = sin $t\theta_j$"
            if entries != ("cos", "sin")
            else r"cos and sin of $t\theta_j$"
        )
        acts = r"$R_t^\top$ acts on a row ($q R_t^\top$)" if rows else r"$R_t$ acts on a column ($R_t q$)"
        figure.supxlabel(
            rf"{acts}: {names} for pair $j$ (its colour); blank: 0",
            fontsize=FONT - 2,
            color=TEXT_COLOUR,
        )
    return figure


def _rotation_grid(
    ax: Axes,
    turning: torch.Tensor,
    pairing: str,
    colour_of: Callable[[str, int], str],
    entries: tuple[str, str] = ("c", "s"),
    *,
    rows: bool = False,
) -> None:
    """Draw R_t (d_k, d_k) on ``ax``: entries in their pair's colour, labelled c, -s or s (``entries``).

    With ``rows``, ``turning`` is R_t^T, which acts on a row: its rows are the input
    dimensions, its columns the output dimensions, and its title says R_t^T.
    """
    from matplotlib.patches import Rectangle

    d_k = turning.shape[0]
    titles = {"interleaved": "interleaved: 2×2 blocks", "half": "half-split: partners $d_k/2$ apart"}
    for m in range(d_k):
        for n in range(d_k):
            entry = float(turning[m, n])
            if entry == 0:
                ax.add_patch(Rectangle((n, m), 1, 1, facecolor="none", edgecolor="#DDDDDD", linewidth=0.5))
                continue
            colour = colour_of(pairing, m)  # row m's pair
            ax.add_patch(Rectangle((n, m), 1, 1, color=colour, alpha=0.85, gid=f"R-{pairing}-{m}-{n}"))
            label = entries[0] if m == n else (f"-{entries[1]}" if entry < 0 else entries[1])
            ax.text(n + 0.5, m + 0.5, label.replace("-", "−"), ha="center", va="center", fontsize=FONT - 2,
                    color=ink_on(colour), gid=f"R-{pairing}-{m}-{n}:text")  # fmt: skip
    ax.set_xlim(0, d_k)
    ax.set_ylim(d_k, 0)  # row 0 at the top, as a matrix is written
    ax.set_aspect("equal")
    ticks = [m + 0.5 for m in range(d_k)]
    ax.set_xticks(ticks, [str(m) for m in range(d_k)], fontsize=FONT - 2)
    ax.set_yticks(ticks, [str(m) for m in range(d_k)], fontsize=FONT - 2)
    ax.tick_params(length=0)
    across, down = ("output", "input") if rows else ("input", "output")
    ax.set_xlabel(f"{across} dimension", fontsize=FONT - 2)
    ax.set_ylabel(f"{down} dimension", fontsize=FONT - 2)
    name = r"$R_t^\top$" if rows else "$R_t$"
    ax.set_title(f"{name}, {titles[pairing]}", fontsize=FONT - 1)
    ax.set_label(f"R-{pairing}")
    for side in ax.spines.values():
        side.set_visible(False)


def position_flow(
    x: object, layer: object, rotary: RotaryEmbedding, *, causal: bool = True, rows: bool = False
) -> Figure:
    """Where position enters a rotary layer: R_t after W^Q and R_s after W^K meet in the score; V unturned.

    Three rows, one per role, for one head: the input X, the parameters, the rotation,
    the product, then the attention. The query row turns ``q_t`` by ``R_t`` (the
    angles ``t · θ_j`` of its position t) into ``q̃_t``, the key row ``k_s`` by ``R_s``
    into ``k̃_s``; the two meet in the score ``q̃_tᵀ k̃_s / √d_k``, whose softmax
    weights ``a_ts`` (over the keys s ≤ t under a causal mask, the second place
    position enters, drawn in the position column too) average the value row, which
    has no rotation box (a dashed gap instead). Then ``W^O``, whose box also gives the
    layer's output shape (T, d_model).
    Every vector is a column (``R_t q_t``), or with ``rows`` a row (``q_t R_t^T``); shapes
    are read from the objects passed.

    Parameters
    ----------
    x : Tensor, shape (T, d_model) or a batch (B, T, d_model)
        The layer's input (of a batch, the first sequence's shape is drawn).
    layer : HeadWeights or a multi-head module
        Where W^Q, W^K and W^V come from (``to_heads()`` is called on a module).
    rotary : RotaryEmbedding
        The rotation, for the layer's head size d_k.
    causal : bool
        Whether the softmax runs over the keys s ≤ t only (a causal mask, the default).
    rows : bool
        Label the vectors as rows, for a page that writes X W^Q: ``q̃_t = q_t R_t^T``,
        ``k̃_s = k_s R_s^T``, the rotation boxes ``R_t^T`` and ``R_s^T``, the score
        ``q̃_t k̃_s^T / √d_k``. Default False: columns, ``q̃_t = R_t q_t`` and
        ``q̃_t^T k̃_s``. Only the labels change.

    Returns
    -------
    matplotlib.figure.Figure
        Each box has a ``gid``: ``"X"``, ``"W^Q"``, ``"W^K"``, ``"W^V"``, ``"R_t"``,
        ``"R_s"``, ``"no-rotation"``, ``"q"``, ``"k"``, ``"v"``, ``"score"``,
        ``"sum"`` and ``"output"``, and when ``causal`` ``"mask"``, the mask's box in
        the position column (its line into the score: ``"mask-line"``). Each weight's box
        says "split: h heads" (``h_kv`` for W^K and W^V), and one header, "per head: head 1
        of h", spans the rotation and q, k, v: the heads are split, then each is rotated.

    See Also
    --------
    position_scores : the scores by position, constant along each diagonal.
    :doc:`rotary` : where position enters attention.

    Examples
    --------
    >>> import torch, qkv
    >>> mha = qkv.MultiHeadAttention(16, 2)
    >>> rope = qkv.RotaryEmbedding(8)
    >>> figure = qkv.diagrams.position_flow(torch.randn(6, 16), mha, rope)
    >>> gids = [p.get_gid() for p in figure.axes[0].patches]
    >>> sorted(gid for gid in gids if gid.startswith("R_"))
    ['R_s', 'R_t']
    """
    require_matplotlib()
    from matplotlib.colors import to_rgba
    from matplotlib.figure import Figure
    from matplotlib.patches import FancyBboxPatch

    if not isinstance(rotary, RotaryEmbedding):
        raise TypeError(f"rotary must be a qkv.RotaryEmbedding, got {type(rotary).__name__}")
    weights, x2, _, _ = layer_inputs(layer, x, None, None)
    if weights.d_k != rotary.d_k:
        raise ValueError(f"the layer's heads have d_k={weights.d_k}, but rotary is for d_k={rotary.d_k}")
    T, d_model, h, d_k, d_v = x2.shape[0], x2.shape[1], weights.num_heads, weights.d_k, weights.d_v
    h_kv = weights.num_kv_heads

    box_w, box_h, gap, row = 0.98, 0.62, 0.2, 0.8  # inches
    width, height = 7.0, 0.35 + (4 if causal else 3) * row + 0.1  # a fourth row: the mask
    figure = Figure(figsize=(width, height), dpi=100)
    ax = figure.add_axes((0.0, 0.0, 1.0, 1.0))
    ax.set_xlim(0, width)
    ax.set_ylim(height, 0)  # y grows downwards: the query row on top
    ax.axis("off")
    left = (width - 6 * box_w - 5 * gap) / 2
    column = [left + i * (box_w + gap) for i in range(6)]
    top = [0.35 + i * row + (row - box_h) / 2 for i in range(4)]
    middle = [t + box_h / 2 for t in top]

    def box(
        c: int, y0: float, y1: float, colour: str, lines: list[str], gid: str, dashed: bool = False
    ) -> None:
        ax.add_patch(FancyBboxPatch(
            (column[c], y0), box_w, y1 - y0, boxstyle="round,pad=0,rounding_size=0.05",
            facecolor="none" if dashed else to_rgba(colour, 0.18), edgecolor=colour, linewidth=1.3,
            linestyle="--" if dashed else "-", gid=gid,
        ))  # fmt: skip
        offsets = {1: [0.0], 2: [-0.1, 0.13], 3: [-0.2, 0.06, 0.26], 4: [-0.3, -0.04, 0.14, 0.36]}[len(lines)]
        for n, (text, offset) in enumerate(zip(lines, offsets, strict=True)):
            ax.text(column[c] + box_w / 2, (y0 + y1) / 2 + offset, text, ha="center", va="center",
                    fontsize=FONT if n == 0 else FONT * 0.8, color=TEXT_COLOUR)  # fmt: skip

    def arrow(x0: float, y0: float, x1: float, y1: float) -> None:
        style = {"arrowstyle": "-|>", "color": EDGE_COLOUR, "linewidth": 1.0, "shrinkA": 0, "shrinkB": 0}
        ax.annotate("", xy=(x1, y1), xytext=(x0, y0), arrowprops=style)

    # Split into heads, then rotate each: one header, "head 1 of h", spans the rotation and its product.
    headers = {0: "input", 1: "parameters", 4: "attention", 5: "projection"}
    for c, header in headers.items():
        ax.text(column[c] + box_w / 2, 0.17, header, ha="center", va="center", fontsize=FONT * 0.8,
                weight="bold", color=TEXT_COLOUR)  # fmt: skip
    span = (column[2] + column[3] + box_w) / 2  # the middle of columns 2 and 3
    ax.text(span, 0.17, f"per head: head 1 of {h}", ha="center", va="center",
            fontsize=FONT * 0.8, weight="bold", color=TEXT_COLOUR, gid="head-header")  # fmt: skip
    ax.plot([column[2], column[3] + box_w], [0.3, 0.3], color=TEXT_COLOUR, linewidth=0.8, gid="head-span")
    box(0, top[1], top[1] + box_h, ROLE_COLOURS["x"], ["$X$", f"({T}, {d_model})"], "X")
    if not isinstance(rows, bool):
        raise TypeError(f"rows must be a bool, got {type(rows).__name__}")
    if rows:  # row vectors, as X W^Q: q_t R_t^T, and the score q̃_t k̃_s^T
        r_t, r_s = r"$R_t^\top$", r"$R_s^\top$"
        q_t, k_s = r"$\tilde q_t = q_t R_t^\top$", r"$\tilde k_s = k_s R_s^\top$"
        product = r"$\tilde q_t \tilde k_s^\top\,/\sqrt{d_k}$"
    else:  # columns: R_t q_t, and the score q̃_t^T k̃_s
        r_t, r_s, q_t, k_s = "$R_t$", "$R_s$", r"$\tilde q_t = R_t q_t$", r"$\tilde k_s = R_s k_s$"
        product = r"$\tilde q_t^\top \tilde k_s\,/\sqrt{d_k}$"
    rows_drawn = [  # role, weight, its output width, rotation box, product
        ("q", "W^Q", f"{h}×{d_k}", ("R_t", [r_t, r"rotate by $t\theta_j$"]),
         [q_t, f"t = 0…{T - 1}, size {d_k}"]),
        ("k", "W^K", f"{h_kv}×{d_k}", ("R_s", [r_s, r"rotate by $s\theta_j$"]),
         [k_s, f"s = 0…{T - 1}, size {d_k}"]),
        ("v", "W^V", f"{h_kv}×{d_v}", ("no-rotation", ["no rotation"]),
         ["$v_s$", f"s = 0…{T - 1}, size {d_v}"]),
    ]  # fmt: skip
    for i, (role, w_name, out, (r_gid, r_lines), made) in enumerate(rows_drawn):
        colour = ROLE_COLOURS[role]
        arrow(column[0] + box_w, middle[1], column[1], middle[i])
        heads = h if role == "q" else h_kv  # split before R_t: each head is rotated alone
        split = f"split: {heads} head" + ("s" if heads > 1 else "")
        box(1, top[i], top[i] + box_h, colour, [f"${w_name}$", f"({d_model}, {out})", split], w_name)
        arrow(column[1] + box_w, middle[i], column[2], middle[i])
        unturned = role == "v"
        box(2, top[i], top[i] + box_h, "#999999" if unturned else colour, r_lines, r_gid, dashed=unturned)
        arrow(column[2] + box_w, middle[i], column[3], middle[i])
        box(3, top[i], top[i] + box_h, colour, made, role)
    weights_colour = ROLE_COLOURS["weights"]
    score = [r"$a_{ts}$", "softmax over s of", product]
    score += ["mask: s ≤ t"] if causal else []  # the second place position enters
    box(4, top[0], top[1] + box_h, weights_colour, score, "score")
    if causal:  # the mask's own box in the position column, its line into the score's softmax
        mask_colour = ROLE_COLOURS["weights"]
        box(2, top[3], top[3] + box_h, mask_colour, ["causal mask", "key s ≤ query t"], "mask")
        bend, enter = column[4] - gap / 2, top[1] + box_h - 0.1
        ax.plot([column[2] + box_w, bend, bend], [top[3] + box_h / 2, top[3] + box_h / 2, enter],
                color=EDGE_COLOUR, linewidth=1.0, gid="mask-line")  # fmt: skip
        arrow(bend, enter, column[4], enter)
    for i in (0, 1):
        arrow(column[3] + box_w, middle[i], column[4], middle[i])
    box(4, top[2], top[2] + box_h, weights_colour, [r"$o_t$", r"$\Sigma_s\, a_{ts} v_s$"], "sum")
    arrow(column[3] + box_w, middle[2], column[4], middle[2])
    arrow(column[4] + box_w / 2, top[1] + box_h, column[4] + box_w / 2, top[2])
    arrow(column[4] + box_w, middle[2], column[5], middle[2])
    out_lines = ["$W^O$", f"({h}×{d_v}, {d_model})", f"output ({T}, {d_model})"]  # heads joined, then W^O
    box(5, top[2], top[2] + box_h, ROLE_COLOURS["o"], out_lines, "output")
    return figure


def _place_labels(
    ax: Axes,
    labels: Mapping[str, tuple[str, tuple[float, float]]],
    markers: list[tuple[float, float]],
    lines: list[tuple[float, float]],
) -> None:
    """Write each label beside its point, where it covers no marker, no other label and little line.

    ``labels`` maps a ``gid`` to the text and the point it names. Measured on the drawn
    figure, in pixels: spots at growing distances in 16 directions around the point
    are tried, and the first that stays inside the axes, clear of every marker and
    every label already placed and crossing the fewest points of ``lines``, is kept; a
    label placed far from its point gets a thin leader line to it.
    """
    from matplotlib.transforms import Bbox

    figure = ax.get_figure()
    assert figure is not None
    renderer = figure.canvas.get_renderer()  # type: ignore[attr-defined]
    inside = ax.get_window_extent(renderer)
    hard = [Bbox.from_bounds(x - 6, y - 6, 12, 12) for x, y in ax.transData.transform(markers)]
    soft = [Bbox.from_bounds(x - 1.5, y - 1.5, 3, 3) for x, y in ax.transData.transform(lines)]
    points = 72 / figure.dpi  # per pixel
    for gid, (text, point) in labels.items():
        label = ax.annotate(text, point, xytext=(0, 0), textcoords="offset points", ha="center", va="center",
                            fontsize=FONT - 1, color=TEXT_COLOUR, gid=gid)  # fmt: skip
        label.set_in_layout(False)
        best: tuple[int, int, tuple[float, float]] | None = None
        for ring, radius in enumerate((13, 18, 24, 32, 42)):  # px
            for n in range(16):
                angle = n * math.pi / 8
                offset = (radius * 1.5 * math.cos(angle) * points, radius * math.sin(angle) * points)  # wide
                label.set_position(offset)
                box = label.get_window_extent(renderer).padded(2)
                outside = not (inside.contains(box.x0, box.y0) and inside.contains(box.x1, box.y1))
                crowding = 1000 * outside + 100 * sum(box.overlaps(other) for other in hard)
                crowding += sum(box.overlaps(other) for other in soft)
                if best is None or (crowding, ring) < best[:2]:
                    best = (crowding, ring, offset)
        assert best is not None
        label.set_position(best[2])
        if best[1] >= 2:  # far from its point: a thin leader line says which point it names
            leader = {"arrowstyle": "-", "color": "#777777", "linewidth": 0.6, "shrinkA": 8, "shrinkB": 4}
            ax.annotate("", point, xytext=best[2], textcoords="offset points", arrowprops=leader)
        hard.append(label.get_window_extent(renderer))


def _listed(drawn: list[int], T: int) -> str:
    """Which outputs are drawn, for the legend: '' for all T, else ' (t = 0, 1, 2, 5 drawn)'."""
    return "" if drawn == list(range(T)) else f" (t = {', '.join(map(str, drawn))} drawn)"


def value_shift(
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    rotary: RotaryEmbedding,
    shift: int,
    *,
    pair: int = 0,
    shown: Sequence[int] | None = None,
    by_token: bool = False,
) -> Figure:
    """What shifting the whole sequence does to one head's outputs, with raw and with rotated values.

    The sequence (rows t = 0, ..., T-1 of ``query``, ``key`` and ``value``) is placed at
    positions 0 to T-1 and again at ``shift`` to ``shift`` + T-1; each placement's
    causal attention outputs o_t are computed here, with ``rotary`` turning the
    queries and keys by their positions. Left panel: raw values, where the two
    placements' outputs coincide. Right panel: values turned by their positions too,
    ``R_s v_s``, where every o_t turns by ``shift · θ_j`` (an arrow along an arc from each
    circle to its cross). Both panels show the plane of one pair j of output dimensions, on the same
    scale, with the origin marked; each o_t is labelled by t at a spot clear of the
    markers and the other labels.

    Parameters
    ----------
    query, key, value : Tensor, shape (T, d_k)
        One head's queries, keys and values before rotation.
    rotary : RotaryEmbedding
        The rotation, for this d_k.
    shift : int
        How far the whole sequence moves, c.
    pair : int
        Which pair of dimensions j to draw (0, the fastest, by default).
    shown : sequence of int, optional
        Which outputs t to draw (all by default): fewer, where outputs crowd together.
    by_token : bool
        Name each output by its token, the row of the inputs (``token 2``), not by
        ``t`` (``t=2``), and say "output" for ``o_t`` in the titles and the legend: t
        is a position, and a shifted token's output sits at position t + shift.
        Default False: labelled by t.

    Returns
    -------
    matplotlib.figure.Figure
        In panel n (0: raw values, 1: rotated), the markers are lines with ``gid``
        ``"before-{n}"`` (circles, the sequence at 0) and ``"after-{n}"`` (crosses,
        shifted); their data are the outputs drawn. Label t has ``gid`` ``"t-{n}-{t}"``
        (its text ``t=2``, or ``token 2`` with ``by_token``).

    See Also
    --------
    position_flow : where position enters a rotary layer.
    :doc:`rotary` : why RoPE leaves the values alone.

    Examples
    --------
    >>> import torch, qkv
    >>> rope = qkv.RotaryEmbedding(8, angle_dtype=torch.float64)
    >>> q, k, v = torch.randn(3, 5, 8, dtype=torch.float64)
    >>> figure = qkv.diagrams.value_shift(q, k, v, rope, 100)
    >>> [line.get_gid() for line in figure.axes[1].lines if line.get_gid()]
    ['before-1', 'after-1']
    """
    require_matplotlib()
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    if not isinstance(rotary, RotaryEmbedding):
        raise TypeError(f"rotary must be a qkv.RotaryEmbedding, got {type(rotary).__name__}")
    d_k = rotary.d_k
    rows = {}
    for name, x in (("query", query), ("key", key), ("value", value)):
        tensor = require_tensor(name, x, ndim=2, layout="(T, d_k)")
        if tensor.shape[1] != d_k:
            raise ValueError(f"{name} has shape {shape_str(tensor.shape)}, but rotary is for d_k={d_k}")
        rows[name] = tensor.detach().cpu()
    T = rows["query"].shape[0]
    if rows["key"].shape[0] != T or rows["value"].shape[0] != T:
        raise ValueError(
            f"query, key and value must have the same number of rows (T), got "
            f"{T}, {rows['key'].shape[0]} and {rows['value'].shape[0]}"
        )
    if not 0 <= pair < rotary.rotary_dim // 2:
        raise ValueError(f"pair must be between 0 and {rotary.rotary_dim // 2 - 1}, got {pair}")
    shift = int(shift)
    a, b = _plane(rotary, pair)
    drawn = list(range(T)) if shown is None else [int(t) for t in shown]
    if not drawn or any(not 0 <= t < T for t in drawn):
        raise ValueError(f"shown must name outputs t between 0 and {T - 1}, got {list(shown or [])}")
    if not isinstance(by_token, bool):
        raise TypeError(f"by_token must be a bool, got {type(by_token).__name__}")
    if by_token:
        tokens = "the tokens" if drawn == list(range(T)) else f"tokens {', '.join(map(str, drawn))}"
        legend = (f"outputs of {tokens} at positions 0 to {T - 1}",
                  f"the same tokens' outputs at positions {shift} to {shift + T - 1}")  # fmt: skip
        output, rotated_output, label_of = "output", "output", "token {}".format
    else:
        # o'_t: the output with rotated values (the rotary chapter's answer (1))
        legend = (f"$o_t$ (left), $o'_t$ (right): the sequence at positions 0 to {T - 1}"
                  f"{_listed(drawn, T)}", f"the same, shifted to {shift} to {shift + T - 1}")  # fmt: skip
        output, rotated_output, label_of = "$o_t$", "$o'_t$", "t={}".format

    def outputs(first: int, rotate_values: bool) -> torch.Tensor:  # (T, 2): o_t in the pair's plane
        positions = torch.arange(first, first + T)
        values = rotary(rows["value"], positions) if rotate_values else rows["value"]  # (T, d_k)
        q, k = rotary(rows["query"], positions), rotary(rows["key"], positions)  # (T, d_k) each
        return attention(q, k, values, is_causal=True)[0][:, [a, b]].double()  # (T, 2)

    placed = {(n, first): outputs(first, bool(n))[drawn] for n in (0, 1) for first in (0, shift)}
    turn = math.degrees(shift * rotary.frequencies()[pair].item())
    turn = (turn + 180) % 360 - 180  # c·θ_j, in [-180, 180)
    everything = torch.cat([*placed.values(), torch.zeros(1, 2, dtype=torch.float64)])  # (4T + 1, 2)
    span = float((everything.max(0).values - everything.min(0).values).max()) or 1.0
    low = everything.min(0).values - 0.16 * span  # room for the labels on every side
    high = everything.max(0).values + 0.16 * span
    before_colour, after_colour = TEXT_COLOUR, ROLE_COLOURS["v"]

    figure = Figure(figsize=(8.4, 4.6), dpi=100, layout="constrained")
    axes = figure.subplots(1, 2)
    arcs_of: dict[int, list[tuple[float, float]]] = {}
    for n, ax in enumerate(axes):
        before, after = placed[(n, 0)], placed[(n, shift)]  # (T, 2) each
        arcs: list[tuple[float, float]] = []
        for x, y in before.tolist():
            start, radius = math.atan2(y, x), math.hypot(x, y)
            arc = torch.linspace(start, start + math.radians(turn) * n, 30, dtype=torch.float64)
            arc_x, arc_y = (radius * arc.cos()).tolist(), (radius * arc.sin()).tolist()
            arcs += list(zip(arc_x, arc_y, strict=True))
            ax.plot(arc_x, arc_y, color="#999999", linewidth=1)
            if n:  # an arrowhead on the arc's last stretch: from o_t at 0 to the same t shifted
                ax.annotate("", xy=(arc_x[-1], arc_y[-1]), xytext=(arc_x[-4], arc_y[-4]), arrowprops={
                    "arrowstyle": "-|>", "color": "#999999", "linewidth": 1, "shrinkA": 0, "shrinkB": 7,
                    "mutation_scale": 10})  # fmt: skip
        arcs_of[n] = arcs
        ax.plot(before[:, 0], before[:, 1], "o", color=before_colour, markersize=6, gid=f"before-{n}",
                label=legend[0])  # fmt: skip
        ax.plot(after[:, 0], after[:, 1], "x", color=after_colour, markersize=9, mew=2, gid=f"after-{n}",
                label=legend[1])  # fmt: skip
        ax.plot(0, 0, "+", color="#777777", markersize=10, zorder=1.5)  # the origin
        ax.set(xlim=(low[0], high[0]), ylim=(low[1], high[1]), aspect="equal")
        ax.set_xlabel(f"output dimension {a}", fontsize=FONT - 1)
        ax.set_ylabel(f"output dimension {b}", fontsize=FONT - 1)
        ax.tick_params(labelsize=FONT - 1)
    turned_by = f"{turn:+.0f}°".replace("-", "−")
    radians = f"{shift * rotary.frequencies()[pair].item():.3g}".replace("-", "−")  # c·θ_j, unreduced
    axes[0].set_title(f"raw values: every {output} stays put", fontsize=FONT)
    axes[1].set_title(
        f"rotated values: in pair {pair}'s plane, every {rotated_output}\n"
        f"rotates by $c\\theta_{pair}$ = {radians} rad ≡ {turned_by}",
        fontsize=FONT,
    )
    handles, labels = axes[1].get_legend_handles_labels()
    figure.legend(handles, labels, loc="outside lower center", ncols=2, fontsize=FONT - 1, frameon=False)
    FigureCanvasAgg(figure)  # to measure the labels: placed once the layout is settled
    figure.draw_without_rendering()
    figure.set_layout_engine("none")  # keep the axes where the labels were measured
    for n, ax in enumerate(axes):
        before, after = placed[(n, 0)], placed[(n, shift)]  # (T, 2) each
        markers = [*map(tuple, before.tolist()), *map(tuple, after.tolist()), (0.0, 0.0)]
        labels = {
            f"t-{n}-{t}": (label_of(t), tuple(xy)) for t, xy in zip(drawn, before.tolist(), strict=True)
        }
        _place_labels(ax, labels, markers, arcs_of[n])
    return figure


def position_gaps(
    gaps: Mapping[str, object],
    *,
    floor: float | None = None,
    reference: str = "the reference",
    join_zeros: bool = True,
) -> Figure:
    """How far each setup's output is from a reference, position by position: exact at 0, or not?

    One line per setup, over the positions t (x axis), of the largest absolute gap at
    t (y axis, log scale). A gap of exactly 0 cannot sit on a log axis: it is drawn as
    a hollow marker on a dotted line at ``floor``, below the axis's last power of ten
    and labelled "0" (not a value of the scale); where several setups are 0 at one t,
    their markers stand side by side around t, none hidden. The picture
    sorts a from-scratch model's mistakes by where they start. Under a causal mask
    position 0 sees one key, which gets weight 1 whatever its score, so a mistake that
    leaves what position 0 reads and returns unchanged leaves it exact: a finite change
    to the scores with the mask kept (the rotations' pairing or base, the scale), or one
    that is the identity at position 0 (rotated values). One that changes what it reads
    (no mask) or returns (a norm, the MLP, the value or output weights) does not.

    Parameters
    ----------
    gaps : mapping of str to Tensor, shape (T,)
        Each setup's name (the legend) and its largest gap at each position, all of one
        length T, none negative.
    floor : float, optional
        Where zeros are drawn, below every nonzero gap; by default two powers of ten
        below the smallest nonzero gap's (1e-3 if every gap is 0).
    reference : str, optional
        What the gaps are measured from, for the y axis's label ("largest gap from
        {reference}").
    join_zeros : bool, optional
        Whether a setup's line runs through its zeros at ``floor`` (True, the default)
        or breaks there (False): "0" is no value of the log scale, so a segment from a
        zero to a gap has no meaning as a slope; with False only the markers show them.

    Returns
    -------
    matplotlib.figure.Figure
        Each setup's line has ``gid`` ``"gap-{i}"`` (i: its place in ``gaps``), drawn
        through its gaps with zeros at ``floor`` (with ``join_zeros=False``, NaN there:
        no segment reaches a zero).

    See Also
    --------
    :doc:`rotary` : a mistake in the scores, or not, from the symptom.

    Examples
    --------
    >>> import torch, qkv
    >>> figure = qkv.diagrams.position_gaps({"no mask": torch.tensor([0.5, 0.25, 0.0])})
    >>> figure.axes[0].get_lines()[0].get_ydata().tolist()
    [0.5, 0.25, 0.001]
    """
    require_matplotlib()
    from matplotlib.figure import Figure

    if not isinstance(gaps, Mapping) or not gaps:
        raise TypeError(f"gaps must be a non-empty mapping of names to tensors, got {type(gaps).__name__}")
    rows = {
        name: require_tensor(f"gaps[{name!r}]", gap, min_ndim=1, layout="(T,)") for name, gap in gaps.items()
    }
    lengths = {tuple(row.shape) for row in rows.values()}
    if len(lengths) != 1 or len(next(iter(lengths))) != 1:
        shapes = ", ".join(f"{name!r}: {shape_str(row.shape)}" for name, row in rows.items())
        raise ValueError(f"every gap must have one shape (T,), got {shapes}")
    for name, row in rows.items():
        if (row < 0).any() or not torch.isfinite(row).all():
            raise ValueError(f"gaps[{name!r}] must be finite and not negative, got {row.tolist()}")
    nonzero_gaps = torch.cat([row[row > 0].double() for row in rows.values()])  # every gap > 0
    lowest = math.floor(math.log10(nonzero_gaps.min().item())) if len(nonzero_gaps) else -1
    floor = 10.0 ** (lowest - 2) if floor is None else floor
    for name, row in rows.items():
        if ((row > 0) & (row <= floor)).any():
            raise ValueError(
                f"floor={floor} must be below every nonzero gap; gaps[{name!r}] has {row.tolist()}"
            )
    figure = Figure(figsize=(7.0, 3.3), dpi=100, layout="constrained")
    ax = figure.subplots()
    from matplotlib.lines import Line2D

    markers = "osD^v<>"
    length = next(iter(lengths))[0]
    zero_at = {t: [i for i, row in enumerate(rows.values()) if row[t] == 0] for t in range(length)}
    for i, (name, row) in enumerate(rows.items()):
        values = row.detach().double().clamp(min=floor)  # (T,): zeros at the floor
        if not join_zeros:  # the line breaks at each zero; its hollow marker stays
            values = values.masked_fill(row.detach() == 0, math.nan)
        colour = HEAD_COLOURS[i % len(HEAD_COLOURS)]
        positions = list(range(values.shape[0]))
        nonzero = [t for t in positions if row[t] != 0]  # filled markers; zeros hollow, below
        ax.plot(positions, values.tolist(), color=colour, marker=markers[i % len(markers)], markersize=6,
                linewidth=1.4, label=name, gid=f"gap-{i}", markevery=nonzero)  # fmt: skip
        zeros = [t for t in positions if row[t] == 0]
        spread = [t + 0.2 * (zero_at[t].index(i) - (len(zero_at[t]) - 1) / 2) for t in zeros]  # side by side
        ax.scatter(spread, [floor] * len(zeros), s=40, marker=markers[i % len(markers)], facecolors="white",
                   edgecolors=colour, linewidths=1.3, zorder=3 + i, gid=f"zeros-{i}")  # fmt: skip
    ax.set_yscale("log")
    ax.axhline(floor, color="#999999", linestyle=":", linewidth=1.0)
    largest = nonzero_gaps.max().item() if len(nonzero_gaps) else 1.0
    top = math.ceil(math.log10(max(largest, 10.0 ** (lowest + 1))))  # the scale's last power
    decades = [10.0**e for e in range(lowest, top + 1)]  # the scale starts at the smallest gap's power
    step = max(1, math.ceil(len(decades) / 6))
    ticks = [floor, *decades[::-1][::step][::-1]]
    ax.set_yticks(ticks, ["0", *(f"$10^{{{round(math.log10(d))}}}$" for d in ticks[1:])])
    ax.minorticks_off()
    ax.set_ylim(floor / 3, 10.0 ** top * 1.5)
    break_at = (math.log10(floor) + lowest) / 2  # the axis break, between 0 and the scale
    ax.text(0, 10.0**break_at, "≈", transform=ax.get_yaxis_transform(), ha="center", va="center",
            fontsize=FONT + 2, rotation=90, backgroundcolor="white", gid="axis-break")  # fmt: skip
    exact_label = 'hollow, at "0" (below\nthe scale): exactly 0'
    exact = Line2D([], [], color="#999999", linestyle=":", marker="o", markerfacecolor="white",
                   markeredgecolor="#777777", label=exact_label)  # fmt: skip
    ax.set_xlabel("position t")
    ax.set_ylabel(f"largest gap from {reference}")
    ax.set_xticks(range(next(iter(lengths))[0]))
    title = (  # position 0 under a causal mask: one key, weight 1
        "Exact at t = 0: what position 0 reads (one key, weight 1) and returns is unchanged\n"
        "Wrong at t = 0 too: no mask (position 0 then reads later keys)"
    )
    ax.set_title(title, fontsize=FONT)
    handles = [*ax.get_legend_handles_labels()[0], exact]
    ax.legend(
        handles=handles, fontsize=FONT - 2, loc="center left", bbox_to_anchor=(1.01, 0.5), frameon=False
    )
    return figure
