"""The attention equation's details drawn: the scale, the softmax's axis, and masks that end in NaN.

- :func:`largest_weight_curves`: the average largest weight of a softmax row against
  the head width d_k, one line per scale: saturation climbs to 1, flattening falls to 1/S.
- :func:`softmax_rows`: one row of weights for each width d_k and each scale, as bars,
  so that saturation (one bar near 1) and flattening (every bar near 1/S) show.
- :func:`softmax_axes`: the same scores normalised over the keys and over the
  queries, with every row's and column's sum written beside it.
- :func:`weighted_sum`: the product of the weights and the values, A V, with one
  query's row of weights meeting the values along the keys: its output is their sum.
- :func:`output_hull`: two value features as points, with their convex hull, and the
  outputs that each axis of the softmax makes from them: averages stay inside.
- :func:`causal_leak`: a causal mask's grid, with the scores that a softmax over the
  queries sums into one column, and the last query's row: it enters every column.
- :func:`mask_conventions`: one padded batch's mask written in each library's
  convention, and what a query's weights become when one library's mask is handed
  to another.
- :func:`empty_rows`: combined (T, S) masks side by side, each query row with no
  key left framed: where a padded batch's NaN comes from.
- :func:`mask_routes`: what ``nn.MultiheadAttention`` returns for a query with no
  key, and its gradient, on each of its three code paths, as a decision chart.

See also
--------
The chapters :doc:`equation` (the scale and the axis) and :doc:`masks` (what True
means in each library, and where NaN comes from).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

import torch

from qkv._validation import require_size, require_tensor, shape_str
from qkv.diagrams._draw import (
    EDGE_COLOUR,
    FONT,
    MASKED_COLOUR,
    MASKED_HATCH,
    ROLE_COLOURS,
    TEXT_COLOUR,
    Canvas,
    Cells,
    readable_ink,
    register_cells,
    require_matplotlib,
)

if TYPE_CHECKING:  # pragma: no cover
    from matplotlib.axes import Axes
    from matplotlib.figure import Figure
    from matplotlib.image import AxesImage

__all__ = [
    "causal_leak",
    "empty_rows",
    "largest_weight_curves",
    "mask_conventions",
    "mask_routes",
    "output_hull",
    "softmax_axes",
    "softmax_rows",
    "weighted_sum",
]


def _key_grid(ax: Axes, rows: int, columns: int, row_label: str) -> None:
    """Square cells centred on whole numbers, row 0 at the top, columns the key positions s."""
    ax.set_xlim(-0.5, columns - 0.5)
    ax.set_ylim(rows - 0.5, -0.5)
    ax.set_aspect("equal")
    ax.set_xticks(range(columns))
    ax.set_yticks(range(rows))
    ax.tick_params(labelsize=FONT - 2, length=0)
    ax.set_xlabel("key position s", fontsize=FONT - 2)
    ax.set_ylabel(row_label, fontsize=FONT - 2)


def _boolean_matrix(name: str, value: object, expected: str, *, square: bool = False) -> torch.Tensor:
    """``value`` as a boolean matrix on the CPU, or a ValueError naming ``name``, its shape and dtype."""
    fits = (
        isinstance(value, torch.Tensor)
        and value.dtype == torch.bool
        and value.dim() == 2
        and (not square or value.shape[0] == value.shape[1])
    )
    if not fits:
        got = (
            f"shape {shape_str(value.shape)}, dtype {value.dtype}"
            if isinstance(value, torch.Tensor)
            else type(value).__name__
        )
        raise ValueError(f"{name} must be {expected}, True = may attend; got {got}")
    assert isinstance(value, torch.Tensor)  # for the type checker
    return value.detach().cpu()


#: The colour of a cell that holds NaN: black, never a weight's or a key's colour.
NAN_COLOUR = "#000000"

#: The colour of a key a repair added to a mask (Okabe and Ito's sky blue): not a
#: role's colour, distinct from the key colour for the common colour-vision deficiencies.
ADDED_COLOUR = "#56B4E9"


def _mask_cell(ax: Axes, row: int, column: int, colour: str, *, hatched: bool, gid: str) -> None:
    """One cell of a mask grid: its colour, hatched where the mask blocks it."""
    from matplotlib.patches import Rectangle

    ax.add_patch(
        Rectangle(
            (column - 0.5, row - 0.5), 1, 1, facecolor=colour, edgecolor=EDGE_COLOUR, linewidth=0.6,
            hatch=MASKED_HATCH if hatched else None, gid=gid,
        )
    )  # fmt: skip


def _finish_plot(ax: Axes, xlabel: str, ylabel: str, title: str | None) -> None:
    """Label a line or scatter plot's axes, grid it, and put its legend on the right."""
    ax.set_xlabel(xlabel, fontsize=FONT - 1)
    ax.set_ylabel(ylabel, fontsize=FONT - 1)
    ax.tick_params(labelsize=FONT - 2)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=FONT - 2, loc="center left", bbox_to_anchor=(1.0, 0.5), frameon=False)
    if title:
        ax.set_title(title, fontsize=FONT)


def largest_weight_curves(
    d_ks: Sequence[int],
    largest: Mapping[str, Sequence[float]],
    *,
    uniform: float | None = None,
    title: str | None = None,
) -> Figure:
    """The average largest weight of a softmax row against the head width d_k, one line per scale.

    A row whose largest weight climbs to 1 saturates (one key takes everything); one
    that falls to the uniform weight 1/S flattens (every key the same); a flat line
    keeps the same sharpness at every width.

    Parameters
    ----------
    d_ks : sequence of int
        The head widths d_k measured, in increasing order (drawn on a log-2 axis).
    largest : mapping of str to sequence of float
        For each scale (e.g. ``"no scale"``, ``"÷ √d_k"``, ``"÷ d_k"``), the average
        largest weight at each d_k, one value per entry of ``d_ks``, each in [0, 1].
    uniform : float, optional
        The uniform weight 1/S, drawn as a dotted line.
    title : str, optional
        The figure's title: say what to look at.

    Returns
    -------
    matplotlib.figure.Figure
        Each scale's line has gid ``"curve-{name}"``; its y data are the values given.

    See Also
    --------
    softmax_rows : one row of weights per width and scale, as bars.
    :doc:`equation` : why the scores are divided by √d_k.

    Examples
    --------
    >>> import qkv
    >>> figure = qkv.diagrams.largest_weight_curves([16, 64], {"none": [0.7, 0.9]})
    >>> [line.get_gid() for line in figure.axes[0].lines]
    ['curve-none']
    """
    require_matplotlib()
    from matplotlib.figure import Figure

    widths = [int(d) for d in d_ks]
    if not widths or any(d <= 0 for d in widths) or widths != sorted(set(widths)):
        raise ValueError(f"d_ks must be positive widths in increasing order, got {list(d_ks)}")
    if not isinstance(largest, Mapping) or not largest:
        raise ValueError("largest must map at least one scale name to one value per d_k")
    curves: dict[str, list[float]] = {}
    for name, values in largest.items():
        numbers = [float(v) for v in values]
        if len(numbers) != len(widths):
            raise ValueError(f"largest[{name!r}] has {len(numbers)} values, but d_ks has {len(widths)}")
        if any(not 0.0 <= v <= 1.0 for v in numbers):
            raise ValueError(f"largest[{name!r}] holds a value outside [0, 1]: {numbers}")
        curves[str(name)] = numbers
    figure = Figure(figsize=(6.4, 3.6), dpi=100, layout="constrained")
    ax = figure.subplots()
    markers = "osD^v"
    for n, (name, numbers) in enumerate(curves.items()):
        ax.plot(
            widths, numbers, marker=markers[n % len(markers)], linewidth=2, label=name, gid=f"curve-{name}"
        )
    if uniform is not None:
        ax.axhline(
            uniform, color=TEXT_COLOUR, linestyle=":", linewidth=1, label=f"uniform 1/S = {uniform:.2f}"
        )
    ax.set_xscale("log", base=2)
    ax.set_xticks(widths, [f"{d:,}" for d in widths])
    ax.set_ylim(0, 1)
    _finish_plot(ax, "head width $d_k$ (log scale)", "average largest weight", title)
    return figure


def softmax_rows(
    rows: Mapping[str, Mapping[str, torch.Tensor]],
    *,
    title: str | None = None,
    uniform_label: str | None = None,
) -> Figure:
    """One softmax row per panel, as bars: a grid of widths (rows) by scales (columns).

    Each panel draws one query's weights over its S keys, on a shared axis from 0 to
    1, with a dotted line at 1/S (the uniform row) and the largest weight in its title.
    A saturated row has one bar near 1; a flattened one has every bar near the line.

    Parameters
    ----------
    rows : mapping of str to mapping of str to Tensor, shape (S,)
        For each row of panels (e.g. ``"d_k = 16"``), the weights under each scale
        (e.g. ``{"no scale": ..., "÷ √d_k": ..., "÷ d_k": ...}``). Every row must name
        the same scales, in the same order, and every tensor must have the same S.
    title : str, optional
        The figure's title: say what to look at.
    uniform_label : str, optional
        A legend entry for the dotted line, below the panels (e.g. ``"uniform
        weight 1/S = 0.20"``); by default the line is drawn without one.

    Returns
    -------
    matplotlib.figure.Figure
        Panel (r, c)'s bars have gid ``"row-{r}-{c}"``; their heights are the weights.

    See Also
    --------
    softmax_axes : the axis a softmax runs over.
    :doc:`equation` : why the scores are divided by √d_k.

    Examples
    --------
    >>> import torch, qkv
    >>> z = torch.randn(10)
    >>> figure = qkv.diagrams.softmax_rows({"d_k = 4": {"raw": z.softmax(-1)}})
    >>> len(qkv.diagrams.patches_by_gid(figure, "row-0-0"))
    10
    """
    require_matplotlib()
    from matplotlib.figure import Figure

    if not isinstance(rows, Mapping) or not rows:
        raise ValueError("rows must map at least one label to a mapping of scale names to (S,) weights")
    scales: list[str] | None = None
    length: int | None = None
    checked: dict[str, dict[str, torch.Tensor]] = {}
    for label, panels in rows.items():
        if not isinstance(panels, Mapping) or not panels:
            raise ValueError(f"rows[{label!r}] must map at least one scale name to (S,) weights")
        if scales is None:
            scales = [str(name) for name in panels]
        elif [str(name) for name in panels] != scales:
            raise ValueError(
                f"rows[{label!r}] names the scales {list(panels)}, but the first row names {scales}"
            )
        checked[str(label)] = {}
        for name, weights in panels.items():
            w = require_tensor(f"rows[{label!r}][{name!r}]", weights, ndim=1, layout="(S,)")
            if length is None:
                length = w.shape[0]
            elif w.shape[0] != length:
                raise ValueError(
                    f"rows[{label!r}][{name!r}] has {w.shape[0]} keys, but the first row has {length}"
                )
            checked[str(label)][str(name)] = w.detach().double().cpu()
    assert scales is not None and length is not None
    figure = Figure(
        figsize=(2.3 * len(scales) + 0.8, 1.7 * len(checked) + 0.7), dpi=100, layout="constrained"
    )
    axes = figure.subplots(len(checked), len(scales), squeeze=False, sharex=True, sharey=True)
    for r, (label, panels) in enumerate(checked.items()):
        for c, (name, w) in enumerate(panels.items()):
            ax = axes[r][c]
            bars = ax.bar(
                range(length), w.numpy(), color=ROLE_COLOURS["weights"], edgecolor=EDGE_COLOUR, linewidth=0.4
            )
            for bar in bars:
                bar.set_gid(f"row-{r}-{c}")
            ax.axhline(1 / length, color=TEXT_COLOUR, linestyle=":", linewidth=1)
            ax.set_ylim(0, 1)
            ax.set_title(f"{name}: largest {float(w.max()):.2f}", fontsize=FONT - 1)
            ax.tick_params(labelsize=FONT - 2)
            if c == 0:
                ax.set_ylabel(f"{label}\nweight", fontsize=FONT - 1)
            if r == len(checked) - 1:
                ax.set_xlabel("key position s", fontsize=FONT - 1)
    if uniform_label is not None:
        from matplotlib.lines import Line2D

        line = Line2D([], [], color=TEXT_COLOUR, linestyle=":", linewidth=1, label=str(uniform_label))
        figure.legend(handles=[line], loc="outside lower center", fontsize=FONT - 2, frameon=False)
    if title:
        figure.suptitle(title, fontsize=FONT)
    return figure


def _grid(ax: Axes, values: torch.Tensor, cmap: str) -> AxesImage:
    image = ax.imshow(values.numpy(), cmap=cmap, vmin=0, vmax=1)
    for t, row in enumerate(values.tolist()):
        for s, value in enumerate(row):
            ink = "white" if value < 0.5 else TEXT_COLOUR
            ax.text(s, t, f"{value:.2f}", ha="center", va="center", fontsize=FONT - 2, color=ink)
    return image


def softmax_axes(scores: torch.Tensor, *, title: str | None = None) -> Figure:
    """The same (T, S) scores normalised over the keys (dim=-1) and over the queries (dim=-2).

    Two maps, one row per query and one column per key, each weight written in its
    cell; each row's sum is written at its right and each column's sum below it, in
    bold where it is 1 (to two decimals). Over the keys every row sums to 1: a query's
    weights are an average. Over the queries the columns do, and the rows do not.

    Parameters
    ----------
    scores : Tensor, shape (T, S)
        One head's scores, e.g. ``q @ k.T / math.sqrt(d_k)``.
    title : str, optional
        The figure's title: say what to look at.

    Returns
    -------
    matplotlib.figure.Figure
        ``qkv.diagrams.cells(figure, "dim=-1")`` and ``"dim=-2"`` read back each map:
        the weights written in the cells, and (as the text of an extra last column
        and an extra last row) the row sums and the column sums.

    See Also
    --------
    softmax_rows : the scale's effect on one row.
    :doc:`equation` : which axis the softmax runs over, and why.

    Examples
    --------
    >>> import torch, qkv
    >>> figure = qkv.diagrams.softmax_axes(torch.randn(3, 5))
    >>> qkv.diagrams.cells(figure, "dim=-1").text[0][-1]  # the first row's sum
    '1.00'
    """
    require_matplotlib()
    from matplotlib.figure import Figure

    grid = require_tensor("scores", scores, ndim=2, layout="(T, S)").detach().double().cpu()
    T, S = grid.shape
    # inches per cell: smaller for many keys, so that the figure nears the column's width
    # (a wider one shows its text smaller), but room for a weight written in each
    cell = max(0.4, min(0.6, 2.0 / S))
    figure = Figure(figsize=(2 * (cell * S + 1.2) + 0.8, cell * T + 2.0), dpi=100, layout="constrained")
    axes = figure.subplots(1, 2)
    image: AxesImage | None = None
    for ax, dim, what in zip(
        axes, (-1, -2), ("over the keys: rows sum to 1", "over the queries: columns do"), strict=True
    ):
        weights = torch.softmax(grid, dim=dim)
        image = _grid(ax, weights, "viridis")
        row_sums, column_sums = weights.sum(dim=-1), weights.sum(dim=-2)
        for t, total in enumerate(row_sums.tolist()):
            bold = "bold" if round(total, 2) == 1 else "normal"
            ax.text(S - 0.3, t, f"{total:.2f}", ha="left", va="center", fontsize=FONT - 2, fontweight=bold)
        for s, total in enumerate(column_sums.tolist()):
            bold = "bold" if round(total, 2) == 1 else "normal"
            ax.text(s, T - 0.3, f"{total:.2f}", ha="center", va="top", fontsize=FONT - 2, fontweight=bold)
        ax.set_xlim(-0.5, S + 0.6)
        ax.set_ylim(T + 0.4, -0.5)
        ax.set_title(f"softmax(dim={dim})\n{what}", fontsize=FONT - 1)
        ax.set_xticks(range(S))
        ax.set_yticks(range(T))
        ax.set_xlabel("key position s\n(below the grid: column sums)", fontsize=FONT - 2)
        ax.set_ylabel("query position t\n(right of the grid: row sums)", fontsize=FONT - 2)
        ax.tick_params(labelsize=FONT - 2)
        text = [
            [f"{float(w):.2f}" for w in row] + [f"{float(r):.2f}"]
            for row, r in zip(weights, row_sums, strict=True)
        ]
        text.append([f"{float(c):.2f}" for c in column_sums] + [""])
        register_cells(
            figure,
            f"dim={dim}",
            Cells(
                colours=[], hatched=[[False] * (S + 1) for _ in range(T + 1)], text=text, corner=(0.0, 0.0)
            ),
        )
    assert image is not None
    figure.colorbar(image, ax=list(axes), label="weight", shrink=0.8)
    if title:
        figure.suptitle(title, fontsize=FONT)
    return figure


#: A row that is not the one followed: pale grey, never a colour of a role.
_OTHER_ROW = "#E4E4E4"


def weighted_sum(
    weights: torch.Tensor,
    values: torch.Tensor,
    *,
    query: int = 0,
    title: str | None = None,
    query_labels: bool = False,
    column_sums: bool = False,
) -> Figure:
    """The product A V drawn as it is computed: row t of the weights meets the values along the keys.

    Three matrices side by side, each entry written in its cell: the attention
    weights A (T, S), one row per query and one column per key, with each row's sum
    at its right; the values V (S, d_v), one row per key; and their product, the
    outputs (T, d_v). The row of ``query`` is drawn in the weights' colour and its
    output row in the output's colour, the other rows in grey: output row t is
    o_t = sum over s of a_ts v_s, so the product runs over A's last axis and V's
    first, the keys (numbered along both). Where row t's weights are at least 0 and
    sum to 1, o_t is a weighted average of V's rows. The drawing does not check the
    sums: weights normalised over another axis are drawn as they are.

    Parameters
    ----------
    weights : Tensor, shape (T, S)
        One head's attention weights, e.g. ``torch.softmax(scores, dim=-1)``.
    values : Tensor, shape (S, d_v)
        The same head's values, one row per key.
    query : int, default 0
        The query position t whose row and output are highlighted, ``0 <= query < T``.
    title : str, optional
        The figure's title: say what to look at.
    query_labels : bool, default False
        Also number A's rows and the outputs' rows (the queries) down their left,
        under the heading "query t", to show that a row of A belongs to one query.
        Off by default, which draws the figure unchanged.
    column_sums : bool, default False
        Also write each column's sum (each key's total weight) under A, headed
        "column sum", to show which axis the weights were normalised over. Off by
        default, which draws the figure unchanged.

    Returns
    -------
    matplotlib.figure.Figure
        ``qkv.diagrams.cells(figure, name)`` reads back ``"A"``, ``"V"`` and
        ``"output"``: each cell's text (two decimals) and colour. The row sums are
        texts with gid ``"row-sum-{t}"``; with ``query_labels``, the query numbers
        are texts with gid ``"query-{t}"``; with ``column_sums``, the column sums are
        texts with gid ``"column-sum-{s}"``.

    See Also
    --------
    softmax_axes : the same scores normalised over each axis.
    output_hull : the outputs inside the values' convex hull, or outside it.
    :doc:`equation` : which axis the softmax runs over, and why.

    Examples
    --------
    >>> import torch, qkv
    >>> weights = torch.tensor([[0.5, 0.5, 0.0], [0.2, 0.3, 0.5]])
    >>> values = torch.tensor([[1.0], [3.0], [5.0]])
    >>> figure = qkv.diagrams.weighted_sum(weights, values, query=1)
    >>> qkv.diagrams.cells(figure, "output").text
    [['2.00'], ['3.60']]
    """
    a = require_tensor("weights", weights, ndim=2, layout="(T, S)").detach().double().cpu()
    v = require_tensor("values", values, ndim=2, layout="(S, d_v)").detach().double().cpu()
    T, S = a.shape
    require_size("values", v, 0, S, "rows", "the number of keys S in weights")
    if isinstance(query, bool) or not isinstance(query, int) or not 0 <= query < T:
        raise ValueError(f"query must be a query position from 0 to {T - 1}, got {query!r}")
    out = a @ v  # (T, d_v)
    d_v = v.shape[1]
    sums, gap, index = 0.62, 0.38, 0.2  # inches: the row sums, a gap with its operator, the numbers
    left = 0.45 if query_labels else 0.0  # inches: the query numbers and their heading
    # inches: room for the column sums under A's key label, where V does not already make it
    below = max(0.0, 0.65 - 0.6 * (max(T, S) - T)) if column_sums else 0.0
    canvas = Canvas(
        S + 2 * d_v, max(T, S), unit=0.6, extra_width=sums + 2 * gap + index + 0.1 + left,
        extra_height=0.35 + 0.42 + 0.45 + below,
    )  # fmt: skip
    top = canvas.inch(0.35 + 0.42)  # the title, then the matrices' labels
    x_a = canvas.inch(0.05 + left)
    x_v = x_a + S + canvas.inch(sums + gap + index)
    x_o = x_v + d_v + canvas.inch(gap)

    def text_of(matrix: torch.Tensor) -> list[list[str]]:
        return [[f"{float(x):.2f}" for x in row] for row in matrix]

    def rows_of(colour: str, rows: int, columns: int) -> list[list[str]]:
        return [[colour if r == query else _OTHER_ROW] * columns for r in range(rows)]

    weight_rows = rows_of(ROLE_COLOURS["weights"], T, S)  # query's row in colour, the others grey
    canvas.matrix(x_a, top, T, S, ROLE_COLOURS["weights"], cell_colours=weight_rows, cell_text=text_of(a),
                  label="A", gid="A")  # fmt: skip
    canvas.text(x_a + S + canvas.inch(0.08), top - canvas.inch(0.06), "row sum", ha="left", va="bottom",
                size=0.75)  # fmt: skip
    for t, total in enumerate(a.sum(dim=-1).tolist()):
        canvas.text(x_a + S + canvas.inch(0.1), top + t + 0.5, f"{total:.2f}", ha="left", size=0.8,
                    fontweight="bold" if t == query else "normal", gid=f"row-sum-{t}")  # fmt: skip
    for s in range(S):  # the keys, numbered along A's columns and V's rows
        canvas.text(x_a + s + 0.5, top + T + canvas.inch(0.05), str(s), va="top", size=0.75)
        canvas.text(x_v - canvas.inch(0.06), top + s + 0.5, str(s), ha="right", size=0.75)
    canvas.text(x_a + S / 2, top + T + canvas.inch(0.24), "key position s", va="top", size=0.8)
    if column_sums:  # each key's total weight, under its column of A
        y_sums = top + T + canvas.inch(0.48)
        for s, total in enumerate(a.sum(dim=0).tolist()):
            canvas.text(x_a + s + 0.5, y_sums, f"{total:.2f}", va="top", size=0.8, gid=f"column-sum-{s}")
        canvas.text(x_a + S + canvas.inch(0.08), y_sums, "column sum", ha="left", va="top", size=0.75)
    if query_labels:  # the queries, numbered down A's rows
        canvas.text(x_a - canvas.inch(0.06), top - canvas.inch(0.06), "query t", ha="right", va="bottom",
                    size=0.8)  # fmt: skip
        for t in range(T):
            canvas.text(x_a - canvas.inch(0.06), top + t + 0.5, str(t), ha="right", size=0.75,
                        fontweight="bold" if t == query else "normal", gid=f"query-{t}")  # fmt: skip
    canvas.text(x_v - canvas.inch(0.06), top - canvas.inch(0.06), "s", ha="right", va="bottom", size=0.8)
    canvas.operator(x_v - canvas.inch(index + gap / 2), top + min(T, S) / 2, "×")
    canvas.matrix(x_v, top, S, d_v, ROLE_COLOURS["v"], cell_text=text_of(v), label="V", gid="V")
    canvas.operator(x_o - canvas.inch(gap / 2), top + min(T, S) / 2, "=")
    canvas.matrix(x_o, top, T, d_v, ROLE_COLOURS["o"], cell_colours=rows_of(ROLE_COLOURS["o"], T, d_v),
                  cell_text=text_of(out), label="A V", gid="output")  # fmt: skip
    formula = (
        f"$o_{{{query}}} = \\sum_s\\, a_{{{query}s}}\\, v_s$: row {query} of $A$ meets each column of $V$"
        " along the keys"
    )
    y_formula = top + max(T, S) + canvas.inch(0.12 + below)
    canvas.text(canvas.width / 2, y_formula, formula, va="top", gid="formula")
    if title:
        canvas.title(title)
    return canvas.fit()


def _convex_hull(points: list[tuple[float, float]]) -> list[tuple[float, float]]:
    """The convex hull's corners, anticlockwise (Andrew's monotone chain)."""
    ordered = sorted(set(points))
    if len(ordered) <= 2:
        return ordered

    def turn(o: tuple[float, float], a: tuple[float, float], b: tuple[float, float]) -> float:
        return (a[0] - o[0]) * (b[1] - o[1]) - (a[1] - o[1]) * (b[0] - o[0])

    lower: list[tuple[float, float]] = []
    upper: list[tuple[float, float]] = []
    for chain, sequence in ((lower, ordered), (upper, ordered[::-1])):
        for point in sequence:
            while len(chain) >= 2 and turn(chain[-2], chain[-1], point) <= 0:
                chain.pop()
            chain.append(point)
    return lower[:-1] + upper[:-1]


def output_hull(
    values: torch.Tensor,
    outputs: Mapping[str, torch.Tensor],
    *,
    numbered: Sequence[str] = (),
    title: str | None = None,
) -> Figure:
    """Values with two features as points, their convex hull, and the outputs made from them.

    A softmax over the keys makes each output a weighted average of the values, so
    every output lies inside the values' convex hull (the shaded polygon); a softmax
    over the queries gives weights whose rows need not sum to 1, and its outputs can
    land outside it.

    Parameters
    ----------
    values : Tensor, shape (S, 2)
        One head's values, with d_v = 2 features (x and y).
    outputs : mapping of str to Tensor, shape (T, 2)
        For each name (e.g. ``"dim=-1"``, ``"dim=-2"``), the outputs ``weights @ values``.
    numbered : sequence of str, optional
        The names whose outputs are labelled with their query's position t (0, 1, ...).
    title : str, optional
        The figure's title: say what to look at.

    Returns
    -------
    matplotlib.figure.Figure
        The values' points have gid ``"values"``, the hull's polygon ``"hull"``, and
        each name's outputs ``"outputs-{name}"``; their offsets are the points given.
        A numbered output's label is a text with gid ``"query-{name}-{t}"``.

    See Also
    --------
    softmax_axes : the same scores normalised along each axis.
    :doc:`equation` : which axis the softmax runs over, and why.

    Examples
    --------
    >>> import torch, qkv
    >>> values = torch.tensor([[0.0, 0.0], [1.0, 0.0], [0.0, 1.0]])
    >>> average = values.mean(dim=0, keepdim=True)  # (1, 2): weights 1/3 each
    >>> figure = qkv.diagrams.output_hull(values, {"dim=-1": average})
    >>> sorted(c.get_gid() for c in figure.axes[0].collections)
    ['outputs-dim=-1', 'values']
    """
    require_matplotlib()
    from matplotlib.figure import Figure
    from matplotlib.patches import Polygon

    points = require_tensor("values", values, ndim=2, layout="(S, 2)").detach().double().cpu()
    if points.shape[1] != 2:
        raise ValueError(f"values must have 2 features to draw, got shape {shape_str(tuple(points.shape))}")
    if not isinstance(outputs, Mapping) or not outputs:
        raise ValueError("outputs must map at least one name to a (T, 2) tensor")
    drawn: dict[str, torch.Tensor] = {}
    for name, output in outputs.items():
        made = require_tensor(f"outputs[{name!r}]", output, ndim=2, layout="(T, 2)").detach().double().cpu()
        if made.shape[1] != 2:
            shape = shape_str(tuple(made.shape))
            raise ValueError(f"outputs[{name!r}] must have 2 features, got shape {shape}")
        drawn[str(name)] = made
    unknown = [str(name) for name in numbered if str(name) not in drawn]
    if unknown:
        raise ValueError(f"numbered names {unknown}, but outputs has only {list(drawn)}")
    figure = Figure(figsize=(5.6, 4.2), dpi=100, layout="constrained")
    ax = figure.subplots()
    corners = _convex_hull([(float(x), float(y)) for x, y in points.tolist()])
    ax.add_patch(
        Polygon(
            corners,
            closed=True,
            facecolor=ROLE_COLOURS["v"],
            alpha=0.15,
            edgecolor=ROLE_COLOURS["v"],
            gid="hull",
            label="the values' hull",
        )
    )
    ax.scatter(
        points[:, 0], points[:, 1], s=60, color=ROLE_COLOURS["v"], label="values", gid="values", zorder=3
    )
    styles = (("o", ROLE_COLOURS["o"]), ("X", ROLE_COLOURS["weights"]), ("s", ROLE_COLOURS["q"]))
    for n, (name, made) in enumerate(drawn.items()):
        marker, colour = styles[n % len(styles)]
        ax.scatter(
            made[:, 0], made[:, 1], s=70, marker=marker, color=colour, label=f"outputs, {name}",
            gid=f"outputs-{name}", zorder=4,
        )  # fmt: skip
        if name in [str(n) for n in numbered]:
            for t, (x, y) in enumerate(made.tolist()):
                ax.annotate(
                    str(t), (x, y), xytext=(6, 4), textcoords="offset points", fontsize=9,
                    color=colour, fontweight="bold", gid=f"query-{name}-{t}", zorder=5,
                )  # fmt: skip
    _finish_plot(ax, "value feature 1", "value feature 2", title)
    return figure


def mask_conventions(
    may_attend: torch.Tensor,
    weights: torch.Tensor | None = None,
    *,
    title: str | None = None,
    hugging_face: bool = True,
    mark_padding: bool = False,
) -> Figure:
    """One padded batch's key mask in each library's convention, and a query's weights when it is inverted.

    One row per sequence, one cell per key. Three panels write the same mask three
    ways, in two conventions: ``F.scaled_dot_product_attention`` and ``qkv``
    (``True`` = may attend), ``nn.MultiheadAttention``'s ``key_padding_mask``
    (``True`` = blocked), and Hugging Face's ``attention_mask`` (1 = a real token:
    SDPA's convention written as 1 and 0). A cell the mask blocks is white and
    hatched; a cell a query may use is coloured as a key. With ``weights``, a fourth
    panel draws one query's weights after Hugging Face's mask, as ``.bool()`` (True =
    a real token), was handed as it is to ``nn.MultiheadAttention`` as its
    ``key_padding_mask``: the blocks fall on the real tokens, and a sequence with no
    padding has no key left, which the panel writes as NaN. A legend
    under the panels names the three fills: a key a query may use, blocked, NaN.
    With ``hugging_face=False`` the Hugging Face panel, SDPA's pattern written as 1
    and 0, is left out and SDPA's heading names Hugging Face's ``.bool()`` instead:
    the two conventions side by side, and the mistake's panel centred under them.
    With ``mark_padding=True`` each padding key's cell (False in ``may_attend``) also
    reads "pad" under its label, in every panel, so a reader sees that the mistake's
    weights land on the padding.

    Parameters
    ----------
    may_attend : Tensor of bool, shape (B, S)
        qkv's convention: True where a key is a real token (``qkv.padding_mask(lengths,
        S)[:, 0, 0]``).
    weights : Tensor, shape (B, S), optional
        One query's weights per sequence with ``may_attend`` passed as it is as the
        module's ``key_padding_mask``, as the page computed them (NaN where the softmax had no key left).
    title : str, optional
        The figure's title: say what to look at.
    hugging_face : bool, default True
        Draw Hugging Face's ``attention_mask`` as a panel of its own. False leaves it
        out, since it repeats SDPA's panel as 1 and 0, and says so in SDPA's heading.
    mark_padding : bool, default False
        Write "pad" in each padding key's cell, under its label, in every panel. The
        default leaves the cells as they were.

    Returns
    -------
    matplotlib.figure.Figure
        ``qkv.diagrams.cells(figure, name)`` reads each panel back, with ``name`` one of
        ``"sdpa"``, ``"torch"``, ``"hugging face"`` (unless ``hugging_face=False``) and
        ``"inverted"``: the text in each cell and whether it is hatched (blocked).

    See Also
    --------
    attention_map : a whole map, masked cells hatched.
    :doc:`masks` : what True means in each library, and where NaN comes from.

    Examples
    --------
    >>> import torch, qkv
    >>> mask = qkv.padding_mask([3, 5], 5)[:, 0, 0]  # (B, S), True = may attend
    >>> figure = qkv.diagrams.mask_conventions(mask)
    >>> qkv.diagrams.cells(figure, "torch").text[0]
    ['F', 'F', 'F', 'T', 'T']
    """
    require_matplotlib()
    from matplotlib.figure import Figure
    from matplotlib.patches import Rectangle

    allowed = _boolean_matrix("may_attend", may_attend, "a boolean tensor (B, S)")
    B, S = allowed.shape
    sdpa_heading = (
        "F.scaled_dot_product_attention (SDPA):\nTrue = may attend\n(passed as mask[:, None, None, :])"
        if hugging_face
        else "SDPA, and Hugging Face's attention_mask\nas .bool(): True = may attend\n"
        "(SDPA takes it as mask[:, None, None, :])"
    )
    panels: list[tuple[str, str, list[list[str]], torch.Tensor]] = [
        (
            "sdpa",
            sdpa_heading,
            [["T" if a else "F" for a in row] for row in allowed.tolist()],
            allowed,
        ),
        (
            "torch",
            "nn.MultiheadAttention's\nkey_padding_mask: True = blocked",
            [["F" if a else "T" for a in row] for row in allowed.tolist()],
            allowed,
        ),
    ]
    if hugging_face:
        panels.append(
            (
                "hugging face",
                "Hugging Face attention_mask:\n1 = real token\n(SDPA's rule as 0/1; pass .bool())",
                [["1" if a else "0" for a in row] for row in allowed.tolist()],
                allowed,
            )
        )
    if weights is not None:
        w = require_tensor("weights", weights, ndim=2, layout="(B, S)").detach().double().cpu()
        if tuple(w.shape) != (B, S):
            raise ValueError(
                f"weights must have the mask's shape {shape_str((B, S))}, got {shape_str(w.shape)}"
            )
        text = [["NaN" if v != v else f"{v:.2f}" for v in row] for row in w.tolist()]
        panels.append(
            (
                "inverted",
                "Unflipped: Hugging Face's mask as .bool()\n"
                "(True = real token) as key_padding_mask\n"
                "(query 0's weights)",
                text,
                ~allowed,
            )
        )
    columns = 2 if len(panels) > 2 else len(panels)
    grid_rows = -(-len(panels) // columns)
    # inches per cell: smaller where the panels would be wider than the book's column (a
    # wider figure shows its text smaller), but room for "pad" under a cell
    cell = max(0.38, min(0.5, (6.6 / columns - 0.9) / S))
    figure = Figure(
        figsize=(columns * (cell * S + 0.9), grid_rows * (cell * B + 1.3)), dpi=100, layout="constrained"
    )
    if not hugging_face and len(panels) == 3:  # two conventions above, the mistake centred
        grid = figure.add_gridspec(2, 4)
        axes = [figure.add_subplot(grid[0, 0:2]), figure.add_subplot(grid[0, 2:4])]
        axes.append(figure.add_subplot(grid[1, 1:3]))
    else:
        axes = list(figure.subplots(grid_rows, columns, squeeze=False).flat)
    for ax in axes[len(panels) :]:
        ax.set_axis_off()
    for ax, (name, heading, text, open_cells) in zip(axes[: len(panels)], panels, strict=True):
        colours: list[list[str]] = []
        hatched: list[list[bool]] = []
        for b in range(B):
            colours.append([])
            hatched.append([])
            for s in range(S):
                is_open = bool(open_cells[b, s])
                is_nan = text[b][s] == "NaN"
                colour = NAN_COLOUR if is_nan else (ROLE_COLOURS["k"] if is_open else MASKED_COLOUR)
                _mask_cell(ax, b, s, colour, hatched=not (is_open or is_nan), gid=f"{name}:{b}:{s}")
                ink = readable_ink(colour) if is_open or is_nan else TEXT_COLOUR  # >= 4.5:1
                box = None if is_open or is_nan else {"facecolor": "white", "edgecolor": "none", "pad": 3}
                is_pad = mark_padding and not bool(allowed[b, s])  # a padding key, in any convention
                label_y = b - 0.12 if is_pad else b  # room for "pad" under the label
                style: dict[str, Any] = {"ha": "center", "va": "center", "color": ink, "bbox": box}
                ax.text(s, label_y, text[b][s], fontsize=FONT - 2, **style)
                if is_pad:
                    ax.text(s, b + 0.3, "pad", fontsize=FONT - 3, gid=f"{name}:pad:{b}:{s}", **style)
                colours[-1].append(colour)
                hatched[-1].append(not is_open and not is_nan)
        register_cells(figure, name, Cells(colours=colours, hatched=hatched, text=text, corner=(0.0, 0.0)))
        # the weights panel shows one query of each sequence (its heading says which)
        _key_grid(ax, B, S, "query 0 of sequence" if name == "inverted" else "sequence")
        ax.set_title(heading, fontsize=FONT - 2)
    legend = [
        Rectangle((0, 0), 1, 1, facecolor=ROLE_COLOURS["k"], edgecolor=EDGE_COLOUR, label="a key it may use"),
        Rectangle(
            (0, 0), 1, 1, facecolor=MASKED_COLOUR, edgecolor=EDGE_COLOUR, hatch=MASKED_HATCH, label="blocked"
        ),
    ]
    if weights is not None:
        legend.append(Rectangle((0, 0), 1, 1, facecolor=NAN_COLOUR, edgecolor=EDGE_COLOUR, label="NaN"))
    figure.legend(
        handles=legend, loc="outside lower center", ncols=len(legend), fontsize=FONT - 2, frameon=False
    )
    if title:
        figure.suptitle(title, fontsize=FONT)
    return figure


def causal_leak(allowed: torch.Tensor, column: int, *, title: str | None = None) -> Figure:
    """Why a softmax over the queries leaks the future under a causal mask.

    One row per query t, one column per key s. A cell the mask allows (s <= t) is grey;
    one it blocks (s > t) is white and hatched. Over the queries (``dim=-2``) column s
    is normalised by a sum over every query that may use key s, t >= s: those cells of
    ``column`` are marked "Σ". The last query's row is drawn in the query colour: its
    scores fall in every column's sum, so changing the last query changes every earlier
    output.

    Parameters
    ----------
    allowed : Tensor of bool, shape (T, T)
        The mask, True = may attend (``qkv.causal_mask(T)``).
    column : int
        The key position s whose sum is marked, ``0 <= column < T``.
    title : str, optional
        The figure's title: say what to look at.

    Returns
    -------
    matplotlib.figure.Figure
        ``qkv.diagrams.cells(figure, "leak")`` reads the grid back: the text of each
        cell ("Σ" or ""), its colour and whether it is hatched (blocked).

    See Also
    --------
    softmax_axes : the same scores normalised along each axis.
    :doc:`equation` : which axis the softmax runs over, and why.

    Examples
    --------
    >>> import qkv
    >>> figure = qkv.diagrams.causal_leak(qkv.causal_mask(4), column=1)
    >>> [row[1] for row in qkv.diagrams.cells(figure, "leak").text]
    ['', 'Σ', 'Σ', 'Σ']
    """
    require_matplotlib()
    from matplotlib.figure import Figure
    from matplotlib.patches import Rectangle

    grid = _boolean_matrix("allowed", allowed, "a square boolean tensor (T, T)", square=True)
    T = grid.shape[0]
    if not 0 <= column < T:
        raise ValueError(f"column must be a key position from 0 to {T - 1}, got {column}")
    figure = Figure(figsize=(0.55 * T + 2.4, 0.55 * T + 1.6), dpi=100, layout="constrained")
    ax = figure.subplots()
    colours: list[list[str]] = []
    hatched: list[list[bool]] = []
    text: list[list[str]] = []
    for t in range(T):
        colours.append([])
        hatched.append([])
        text.append([])
        for s in range(T):
            is_open = bool(grid[t, s])
            in_sum = is_open and s == column
            colour = (
                MASKED_COLOUR if not is_open else (ROLE_COLOURS["q"] if t == T - 1 else ROLE_COLOURS["x"])
            )
            ax.add_patch(
                Rectangle(
                    (s - 0.5, t - 0.5),
                    1,
                    1,
                    facecolor=colour,
                    edgecolor=ROLE_COLOURS["weights"] if in_sum else EDGE_COLOUR,
                    linewidth=2.5 if in_sum else 0.6,
                    hatch=None if is_open else MASKED_HATCH,
                    gid=f"leak:{t}:{s}",
                )
            )
            mark = "Σ" if in_sum else ""
            if mark:
                ink = "white" if t == T - 1 else TEXT_COLOUR  # white on the query colour
                ax.text(s, t, mark, ha="center", va="center", fontsize=FONT - 1, color=ink)
            colours[-1].append(colour)
            hatched[-1].append(not is_open)
            text[-1].append(mark)
    register_cells(figure, "leak", Cells(colours=colours, hatched=hatched, text=text, corner=(0.0, 0.0)))
    _key_grid(ax, T, T, "query position t")
    legend = [
        Rectangle((0, 0), 1, 1, facecolor=ROLE_COLOURS["x"], edgecolor=EDGE_COLOUR, label="allowed: s ≤ t"),
        Rectangle(
            (0, 0),
            1,
            1,
            facecolor=MASKED_COLOUR,
            edgecolor=EDGE_COLOUR,
            hatch=MASKED_HATCH,
            label="blocked: s > t",
        ),
        Rectangle(
            (0, 0),
            1,
            1,
            facecolor=ROLE_COLOURS["x"],
            edgecolor=ROLE_COLOURS["weights"],
            linewidth=2.5,
            label=f"Σ: in column {column}'s sum over the queries",
        ),
        Rectangle(
            (0, 0), 1, 1, facecolor=ROLE_COLOURS["q"], edgecolor=EDGE_COLOUR, label="the last query's scores"
        ),
    ]
    figure.legend(handles=legend, loc="outside lower center", ncols=1, fontsize=FONT - 2, frameon=False)
    if title:
        figure.suptitle(title, fontsize=FONT)
    return figure


def _padding_flags(
    argument: str,
    flags_by_panel: Mapping[str, object] | None,
    grids: Mapping[str, object],
    length: int,
    layout: str,
) -> dict[str, list[bool]]:
    """Each panel's padding flags as a list, checked: a named panel, booleans, ``length`` of them."""
    flags: dict[str, list[bool]] = {}
    for name, given in (flags_by_panel or {}).items():
        if name not in grids:
            raise ValueError(f"{argument} names a panel {name!r} that masks does not have")
        pad = require_tensor(f"{argument}[{name!r}]", given, ndim=1, layout=layout, floating=False)
        if pad.dtype != torch.bool or tuple(pad.shape) != (length,):
            raise ValueError(
                f"{argument}[{name!r}] must be a boolean tensor of shape ({length},), "
                f"got shape {shape_str(pad.shape)}, dtype {pad.dtype}"
            )
        flags[name] = pad.tolist()
    return flags


def empty_rows(
    masks: Mapping[str, torch.Tensor],
    *,
    title: str | None = None,
    padding: Mapping[str, torch.Tensor] | None = None,
    key_padding: Mapping[str, torch.Tensor] | None = None,
    added: Mapping[str, torch.Tensor] | None = None,
) -> Figure:
    """Combined (T, S) masks side by side, each query row that has no key left framed.

    One panel per mask, one row per query t, one column per key s. A cell the mask
    lets the query use is coloured as a key; a blocked cell is white and hatched. A
    row with no key left (the softmax's 0/0, NaN in a hand-written softmax) is framed
    in black and marked "no key" at its right. Draw the masks a batch really ends
    up with (padding combined with a causal mask, or padding on both axes), and a
    repaired mask beside them to show that no row is empty. Up to three panels sit
    in one row; four or more fill rows of two, in the mapping's order.

    Parameters
    ----------
    masks : mapping of str to Tensor of bool, shape (T, S)
        Each panel's heading and its mask, True = may attend. All of one shape.
    title : str, optional
        The figure's title: say what to look at.
    padding : mapping of str to Tensor of bool, shape (T,), optional
        For the panels it names, True where query t is a padding token: its row's
        label on the y axis reads ``"t pad"``, so a reader sees whose rows are empty.
    key_padding : mapping of str to Tensor of bool, shape (S,), optional
        For the panels it names, True where key s is a padding token: its column's
        label on the x axis reads ``"s"`` over ``"pad"``, so a reader sees which keys a
        row reads (an inverted mask lets real queries read padding only).
    added : mapping of str to Tensor of bool, shape (T, S), optional
        For the panels it names, True where a repair let a query use a key its
        original mask blocked: those cells are drawn in a third colour, so a reader
        sees what the repair added and which rows it left alone. Each must lie within
        its panel's mask.

    Returns
    -------
    matplotlib.figure.Figure
        ``qkv.diagrams.cells(figure, heading)`` reads each panel back: whether each
        cell is hatched (blocked), and its text ("" everywhere). Each framed row is a
        patch with gid ``"{heading}:empty:{t}"``; the y tick labels carry the padding
        queries, the x tick labels the padding keys.

    See Also
    --------
    mask_conventions : one (B, S) mask in each library's convention.
    :doc:`masks` : why a row with no key left gives NaN, and how to repair the mask.

    Examples
    --------
    >>> import torch, qkv
    >>> left = torch.tensor([False, True, True])  # one pad on the left
    >>> figure = qkv.diagrams.empty_rows({"causal": left & qkv.causal_mask(3)})
    >>> qkv.diagrams.cells(figure, "causal").hatched[0]
    [True, True, True]
    """
    require_matplotlib()
    from matplotlib.figure import Figure
    from matplotlib.patches import Rectangle

    if not masks:
        raise ValueError("masks must name at least one (T, S) mask")
    grids = {
        name: _boolean_matrix(f"masks[{name!r}]", m, "a boolean tensor (T, S)") for name, m in masks.items()
    }
    shapes = {tuple(g.shape) for g in grids.values()}
    if len(shapes) > 1:
        raise ValueError(f"masks must share one shape (T, S), got {sorted(shapes)}")
    T, S = next(iter(grids.values())).shape
    pads = _padding_flags("padding", padding, grids, T, "(T,)")
    key_pads = _padding_flags("key_padding", key_padding, grids, S, "(S,)")
    additions: dict[str, torch.Tensor] = {}
    for name, given in (added or {}).items():
        if name not in grids:
            raise ValueError(f"added names a panel {name!r} that masks does not have")
        extra = _boolean_matrix(f"added[{name!r}]", given, "a boolean tensor (T, S)")
        if tuple(extra.shape) != (T, S):
            raise ValueError(f"added[{name!r}] must have shape ({T}, {S}), got {shape_str(extra.shape)}")
        if (extra & ~grids[name]).any():
            raise ValueError(f"added[{name!r}] marks cells that masks[{name!r}] blocks")
        additions[name] = extra
    columns = 2 if len(grids) > 3 else len(grids)  # four panels: two rows of two
    if columns > 2 and columns * (0.5 * S + 1.9) > 7.2:  # wider than the column: two a row
        columns = 2
    grid_rows = -(-len(grids) // columns)
    # inches per cell: smaller where the panels would be wider than the book's column (a
    # wider figure shows its text smaller), down to what a "0 pad" tick label needs
    cell = max(0.3, min(0.5, (7.0 / columns - 1.9) / S))
    width, height = columns * (cell * S + 1.9), grid_rows * (cell * T + 1.1) + 0.9
    figure = Figure(figsize=(width, height), dpi=100, layout="constrained")
    axes = list(figure.subplots(grid_rows, columns, squeeze=False).flat)
    for ax in axes[len(grids) :]:
        ax.set_axis_off()
    for ax, (name, grid) in zip(axes[: len(grids)], grids.items(), strict=True):
        colours: list[list[str]] = []
        for t in range(T):
            colours.append([])
            for s in range(S):
                is_open = bool(grid[t, s])
                colour = ROLE_COLOURS["k"] if is_open else MASKED_COLOUR
                if name in additions and bool(additions[name][t, s]):
                    colour = ADDED_COLOUR  # a key the repair let this query use
                _mask_cell(ax, t, s, colour, hatched=not is_open, gid=f"{name}:{t}:{s}")
                colours[-1].append(colour)
            if not grid[t].any():
                ax.add_patch(
                    Rectangle(
                        (-0.5, t - 0.5),
                        S,
                        1,
                        facecolor="none",
                        edgecolor=NAN_COLOUR,
                        linewidth=2.5,
                        gid=f"{name}:empty:{t}",
                    )
                )
                ax.text(S - 0.3, t, "no key", ha="left", va="center", fontsize=FONT, color=TEXT_COLOUR)
        text = [[""] * S for _ in range(T)]
        register_cells(
            figure, name, Cells(colours=colours, hatched=(~grid).tolist(), text=text, corner=(0.0, 0.0))
        )
        _key_grid(ax, T, S, "query position t")
        if name in pads:  # the padding's own queries, marked on the y axis
            ax.set_yticklabels([f"{t} pad" if pad else str(t) for t, pad in enumerate(pads[name])])
        ax.set_xlim(-0.5, S + 1.9)
        ax.set_xticks(range(S))
        if name in key_pads:  # the padding's own keys, marked on the x axis
            ax.set_xticklabels([f"{s}\npad" if pad else str(s) for s, pad in enumerate(key_pads[name])])
        ax.spines[["top", "right"]].set_visible(False)
        ax.spines["bottom"].set_bounds(-0.5, S - 0.5)  # the grid's width, not the note's
        # centred over the grid, not over the grid and its "no key" notes
        ax.set_title(name, fontsize=FONT - 2, x=(S / 2) / (S + 2.4))
    legend = [
        Rectangle((0, 0), 1, 1, facecolor=ROLE_COLOURS["k"], edgecolor=EDGE_COLOUR, label="a key it may use"),
        Rectangle(
            (0, 0), 1, 1, facecolor=MASKED_COLOUR, edgecolor=EDGE_COLOUR, hatch=MASKED_HATCH, label="blocked"
        ),
        Rectangle(
            (0, 0), 1, 1, facecolor="none", edgecolor=NAN_COLOUR, linewidth=2.5, label="a row with no key"
        ),
    ]
    if any(extra.any() for extra in additions.values()):
        repair = Rectangle(
            (0, 0), 1, 1, facecolor=ADDED_COLOUR, edgecolor=EDGE_COLOUR, label="added by the repair"
        )
        legend.insert(1, repair)
    ncols = 2 if len(legend) > 3 else 3  # four entries: two rows of two
    figure.legend(handles=legend, loc="outside lower center", ncols=ncols, fontsize=FONT - 2, frameon=False)
    if title:
        figure.suptitle(title, fontsize=FONT)
    return figure


#: nn.MultiheadAttention's three routes, in the order the module tries them.
ROUTES = ("fast path", "explicit softmax", "SDPA")


def _route_tensors(argument: str, given: object, names: Sequence[str]) -> dict[str, torch.Tensor]:
    """``given`` as a dict of tensors with exactly the keys ``names``, or an error naming what differs."""
    if not isinstance(given, Mapping):
        raise TypeError(f"{argument} must be a mapping from route name to tensor, got {type(given).__name__}")
    if set(given) != set(names):
        raise ValueError(f"{argument} must have the routes {list(names)}, got {list(given)}")
    return {
        name: require_tensor(f"{argument}[{name!r}]", given[name], min_ndim=1).detach().cpu()
        for name in names
    }


def _empty_row_outcome(output: torch.Tensor, bias: torch.Tensor) -> str:
    """What an empty query row came out as: NaN, out_proj.bias, zeros, or finite."""
    if output.isnan().all():
        return "NaN"
    if output.isnan().any():
        return "some NaN"
    if (output == bias).all():
        return "out_proj.bias"
    return "zeros" if (output == 0).all() else "finite"


def mask_routes(
    outputs: Mapping[str, torch.Tensor],
    gradients: Mapping[str, torch.Tensor],
    bias: torch.Tensor,
    *,
    title: str | None = None,
    frozen: bool = False,
) -> Figure:
    """What ``nn.MultiheadAttention`` returns for a query with no key, route by route, as a chart.

    Two questions, in the order the module asks them, pick its code path: are the
    fast path's conditions met (eval mode, ``torch.no_grad()``, ``mha(x, x, x)`` with
    one tensor, ``batch_first=True``, even heads, no float mask, …)? Then route 1,
    one native function. Otherwise ``need_weights=True`` (the default) takes route 2,
    the explicit softmax, and ``need_weights=False`` route 3,
    ``F.scaled_dot_product_attention`` (SDPA). Each route's box writes what the
    measured empty row is (NaN, ``out_proj.bias``, zeros or finite) and what the
    gradient is after a loss that leaves that row out (NaN or finite; the fast path
    has none). NaN is black, as in :func:`mask_conventions`; ``out_proj.bias`` takes
    the output's colour.

    Parameters
    ----------
    outputs : mapping of str to Tensor, shape (..., d_model)
        For each route, ``"fast path"``, ``"explicit softmax"`` and ``"SDPA"``, the
        module's output on the query rows with no key, as the page measured it.
    gradients : mapping of str to Tensor
        For ``"explicit softmax"`` and ``"SDPA"``, a parameter's gradient after a
        loss that leaves the rows with no key out (``in_proj_weight.grad``, say).
    bias : Tensor, shape (d_model,)
        The module's ``out_proj.bias``: an empty row equal to it is written so.
    title : str, optional
        The figure's title: say what to look at.
    frozen : bool, default False
        Also name, in the first question, the other way to need no gradient: nothing
        requires one (no input, projection weight or bias; frozen weights alone are not
        enough when an input requires grad), as an alternative to ``torch.no_grad()``.
        The outcomes drawn are unchanged.

    Returns
    -------
    matplotlib.figure.Figure
        ``qkv.diagrams.cells(figure, "routes")`` reads the outcomes back: one row per
        route, in order, with the text of its output and of its gradient.

    See Also
    --------
    mask_conventions : the mistake that leaves a row with no key.
    :doc:`masks` : where NaN comes from, and each route's outcome.

    Examples
    --------
    >>> import torch, qkv
    >>> nan, bias = torch.full((4,), float("nan")), torch.ones(4)
    >>> figure = qkv.diagrams.mask_routes(
    ...     {"fast path": nan, "explicit softmax": nan, "SDPA": bias},
    ...     {"explicit softmax": nan, "SDPA": torch.zeros(3)},
    ...     bias,
    ... )
    >>> qkv.diagrams.cells(figure, "routes").text
    [['NaN', 'none'], ['NaN', 'NaN'], ['out_proj.bias', 'finite']]
    """
    require_matplotlib()
    from matplotlib.figure import Figure
    from matplotlib.patches import FancyBboxPatch

    out_proj_bias = require_tensor("bias", bias, ndim=1, layout="(d_model,)").detach().cpu()
    rows = _route_tensors("outputs", outputs, ROUTES)
    if isinstance(gradients, Mapping) and "fast path" in gradients:
        raise ValueError(
            "gradients has a 'fast path' entry, but the fast path runs only when no gradient "
            "is needed (torch.no_grad()): it has none"
        )
    grads = _route_tensors("gradients", gradients, ROUTES[1:])
    for name, output in rows.items():
        if output.shape[-1] != out_proj_bias.shape[0]:
            raise ValueError(
                f"outputs[{name!r}] has {output.shape[-1]} features, but bias has "
                f"{out_proj_bias.shape[0]}: both are (..., d_model)"
            )
    text = [[_empty_row_outcome(rows[name], out_proj_bias), "none"] for name in ROUTES]
    for row, name in zip(text[1:], ROUTES[1:], strict=True):
        row[1] = "NaN" if grads[name].isnan().any() else "finite" if grads[name].isfinite().all() else "inf"

    def fill(outcome: str) -> str:
        if "NaN" in outcome:
            return NAN_COLOUR
        return ROLE_COLOURS["o"] if outcome == "out_proj.bias" else MASKED_COLOUR

    width, top = 4.7, 0.45 if title else 0.1  # inches; y grows downwards
    height = top + 4.55
    figure = Figure(figsize=(width, height), dpi=100)
    ax = figure.add_axes((0.0, 0.0, 1.0, 1.0))
    ax.set_xlim(0, width)
    ax.set_ylim(height, 0)
    ax.axis("off")
    small = FONT - 2

    def box(x: float, y: float, w: float, h: float, face: str, gid: str) -> None:
        ax.add_patch(
            FancyBboxPatch(
                (x, y), w, h, boxstyle="round,pad=0,rounding_size=0.08", facecolor=face,
                edgecolor=EDGE_COLOUR, linewidth=0.9, gid=gid,
            )
        )  # fmt: skip

    def arrow(x0: float, y0: float, x1: float, y1: float, label: str) -> None:
        """An arrow from (x0, y0) to (x1, y1), across or down, labelled at its start."""
        ax.annotate(
            "", xy=(x1, y1), xytext=(x0, y0),
            arrowprops={"arrowstyle": "-|>", "color": EDGE_COLOUR, "linewidth": 1.0, "shrinkA": 0,
                        "shrinkB": 0},
        )  # fmt: skip
        across = y0 == y1
        at = ((x0 + x1) / 2, y0 - 0.03) if across else (x0 + 0.06, (y0 + y1) / 2)
        ax.text(*at, label, ha="center" if across else "left", va="bottom" if across else "center",
                fontsize=small, color=TEXT_COLOUR)  # fmt: skip

    left, column, right, route_w = 0.08, 2.0, 2.5, 2.12  # the questions' column, the routes'
    q_heights = (1.55, 0.75)
    q_tops = (top, top + 2.0)
    questions = (
        "Fast path conditions met?\neval() and torch.no_grad()"
        + ("\n(or nothing requires grad)," if frozen else ",")
        + "\nmha(x, x, x): one tensor\n"
        "(not equal copies),\nbatch_first=True,\neven heads, no float mask, …\n"
        "whatever need_weights is",
        "need_weights=True?\n(the default)",
    )
    for i, (y, h, question) in enumerate(zip(q_tops, q_heights, questions, strict=True)):
        box(left, y, column, h, "#F2F2F2", f"routes:question:{i}")
        ax.text(left + 0.1, y + h / 2, question, ha="left", va="center", fontsize=small,
                color=TEXT_COLOUR, linespacing=1.3)  # fmt: skip
    route_h = 1.05
    tops = [q_tops[0] + (q_heights[0] - route_h) / 2, q_tops[1] + (q_heights[1] - route_h) / 2,
            top + 3.3]  # fmt: skip
    headings = ["1  fast path:\n   one native function", "2  explicit softmax\n   (returns weights)",
                "3  SDPA (zeros on CPU),\n   then out_proj"]  # fmt: skip
    for i, (y, heading) in enumerate(zip(tops, headings, strict=True)):
        box(right, y, route_w, route_h, "#FFFFFF", f"routes:route:{i}")
        ax.text(right + 0.08, y + 0.06, heading, ha="left", va="top", fontsize=small,
                color=TEXT_COLOUR, fontweight="bold", linespacing=1.15)  # fmt: skip
        for j, (what, outcome) in enumerate(zip(("output", "gradient"), text[i], strict=True)):
            cy = y + route_h - 0.42 + 0.22 * j
            ax.text(right + 0.08, cy, what, ha="left", va="center", fontsize=small, color=TEXT_COLOUR)
            face = fill(outcome)
            box(right + 0.8, cy - 0.09, route_w - 0.88, 0.18, face, f"routes:{i}:{what}")
            ink = "#FFFFFF" if face == NAN_COLOUR else TEXT_COLOUR
            ax.text(right + 0.8 + (route_w - 0.88) / 2, cy, outcome, ha="center", va="center",
                    fontsize=small, color=ink)  # fmt: skip
    for y, h in zip(q_tops, q_heights, strict=True):  # yes: across to the route beside it
        arrow(left + column, y + h / 2, right, y + h / 2, "yes")
    down = left + column / 2  # no: down the questions' column
    arrow(down, q_tops[0] + q_heights[0], down, q_tops[1], "no")
    route_3 = tops[2] + route_h / 2
    ax.plot([down, down], [q_tops[1] + q_heights[1], route_3], color=EDGE_COLOUR, linewidth=1.0)
    ax.text(down + 0.06, (q_tops[1] + q_heights[1] + route_3) / 2, "no", ha="left", va="center",
            fontsize=small, color=TEXT_COLOUR)  # fmt: skip
    arrow(down, route_3, right, route_3, "")
    colours = [[fill(outcome) for outcome in row] for row in text]
    register_cells(figure, "routes", Cells(colours, [[False, False]] * 3, text, (right, tops[0])))
    if title:
        figure.text(0.5, 1 - 0.08 / height, title, ha="center", va="top", fontsize=FONT, color=TEXT_COLOUR)
    return figure
