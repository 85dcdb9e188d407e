"""Head diagrams: one big W^Q cut into heads, how nn.Linear stores it, the reshape into heads,
the heads merged by W^O, and the two orders of a packed Q/K/V projection.

See also
--------
The chapter :doc:`heads` (book/heads.ipynb).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch

from qkv._validation import require_bool, require_positive_int, require_size, shape_str
from qkv.diagrams._draw import (
    EDGE_COLOUR,
    MIN_POINTS,
    ROLE_COLOURS,
    TEXT_COLOUR,
    Canvas,
    as_matrix,
    batch_first_of,
    head_colour,
    head_weights,
    ink_on,
)

if TYPE_CHECKING:  # pragma: no cover
    from matplotlib.figure import Figure

__all__ = ["heads_from_one_matrix", "multi_head", "packed_layouts", "reshape", "weight_storage", "wide_head"]

# Inches that do not shrink with the cells: between blocks, for a label above a block and a
# shape below it, for the title, and for a line of text.
_GAP, _ABOVE, _BELOW, _TITLE, _LINE = 0.45, 0.3, 0.3, 0.3, 0.4

# What each projection reads, and how its input is described in messages.
_PROJECTIONS: dict[str, tuple[str, str]] = {
    "q": ("(T, d_model)", "the layer's d_model"),
    "k": ("(S, kdim)", "the layer's kdim"),
    "v": ("(S, vdim)", "the layer's vdim"),
}


def _index(i: int) -> str:
    """Head ``i`` (from 0) as a maths subscript, numbered from 1 as in the paper: ``3``, ``{10}``."""
    return str(i + 1) if i < 9 else f"{{{i + 1}}}"


def _em(canvas: Canvas, size: float = 1.0) -> float:
    """One em of text at ``size`` times the canvas's font, in cell units."""
    return canvas.inch(canvas.font * size / 72)


def heads_from_one_matrix(
    x: object, layer: object, *, projection: str = "q", cut: bool = False, beside: bool = False
) -> Figure:
    """One big W^Q is h small W_i^Q side by side, and Q = X W^Q is the h products X W_i^Q side by side.

    The top row is the fused projection ``X (T, d_model) × W^Q (d_model, h·d_k) =
    Q (T, h·d_k)``, with W^Q's column block i (W_i^Q) and Q's column block i
    (Q_i) in head i's colour. Below it, one row per head computes that head
    alone, ``X × W_i^Q = Q_i``, each small block drawn under the block of the big
    matrix it is (so the rows step to the right). Heads are numbered from 1 in
    the labels, as in the paper; every block is drawn to scale and labelled with
    its shape, read from the objects passed. Biases are left out. The figure
    grows one row per head: it reads best with a few heads.

    Parameters
    ----------
    x : Tensor, shape (T, d_in) or (B, T, d_in)
        The input of the projection, d_in being d_model for Q, kdim for K and
        vdim for V; of a batch, the first sequence is drawn.
    layer : HeadWeights or a multi-head module
        Where the weights come from (``to_heads()`` is called on a module).
    projection : {"q", "k", "v"}
        Which projection to draw. K and V have h_kv heads (fewer than h for
        grouped-query weights), so W^K is cut into h_kv blocks.
    cut : bool
        Draw one row instead of one per head: the fused product, then its cut
        into heads, ``.view(B, T, h, d_k).transpose(1, 2)``, each head's block
        stacked and labelled as the product it equals, ``Q_i = X W_i^Q`` (the
        matrices ``"Q_1"``, ... keep their names; no ``"X_i"`` or ``"W_i^Q"``).
    beside : bool
        Draw the two methods side by side instead: on the left, Method 3, one
        row per head computing ``X × W_i^Q = Q_i`` alone; on the right, Method 1,
        the one product ``X × W^Q = Q``, and below it Method 2's cut of Q into the
        same blocks, pulled apart. The left's matrices are named ``"X_1"``,
        ``"W_1^Q"``, ``"Q_1"``, ...; the right's ``"X"``, ``"W^Q"``, ``"Q"`` and
        ``"cut Q_1"``, .... Takes precedence over ``cut``.

    Returns
    -------
    matplotlib.figure.Figure
        The matrices are named ``"X"``, ``"W^Q"``, ``"Q"`` and, per head,
        ``"X_1"``, ``"W_1^Q"``, ``"Q_1"``, ... (for :func:`qkv.diagrams.cells`).

    See Also
    --------
    qkv.diagrams.projection : X through W^Q, W^K and W^V at once.
    :doc:`heads` : the per-head and fused methods compared.

    Examples
    --------
    >>> import torch, qkv
    >>> from qkv.diagrams.heads import heads_from_one_matrix
    >>> mha = qkv.MultiHeadAttention(12, 3)
    >>> figure = heads_from_one_matrix(torch.randn(5, 12), mha)
    >>> texts = qkv.diagrams.texts_of(figure)
    >>> labels = ["$W^Q$", "$W_3^Q$", "$Q_3$", "(12, 12)", "(12, 4)", "(5, 4)"]
    >>> [label for label in labels if label not in texts]  # every one is drawn
    []
    """
    weights = head_weights(layer)
    if not isinstance(projection, str):
        raise TypeError(f'projection must be "q", "k" or "v", got {type(projection).__name__}')
    if projection not in _PROJECTIONS:
        raise ValueError(f'projection must be "q", "k" or "v", got {projection!r}')
    layout, against = _PROJECTIONS[projection]
    per_head = {"q": weights.w_q, "k": weights.w_k, "v": weights.w_v}[projection]  # (n, d_in, d)
    x2 = as_matrix("x", x, layout=layout, batch_first=batch_first_of(layer))  # (T, d_in)
    require_size("x", x2, 1, per_head.shape[1], "features", against)
    n, d_in, d = per_head.shape
    fused = per_head.permute(1, 0, 2).reshape(d_in, n * d)  # (d_in, n·d): the heads' blocks side by side
    T, width_out = x2.shape[0], fused.shape[1]  # Q = X W^Q is (T, n·d)
    letter, role = projection.upper(), ROLE_COLOURS[projection]
    colours = [head_colour(j // d) for j in range(width_out)]
    kind = "head" if projection == "q" or n == weights.num_heads else "K/V head"

    if require_bool("beside", beside):
        return _methods_beside(x2, fused, per_head, colours, letter, role, kind)
    if require_bool("cut", cut):
        return _one_matrix_cut(x2, fused, per_head, colours, letter, role, kind)
    block_height = max(T, d_in)
    label_room = _ABOVE + _BELOW
    canvas = Canvas(
        d_in + 2 * width_out,
        (n + 1) * block_height,
        extra_width=3 * _GAP,
        extra_height=_TITLE + _LINE + (n + 1) * label_room + 0.1 * n,
    )
    gap = canvas.inch(_GAP)
    x_w = gap / 2 + d_in + gap  # where W^Q starts, in every row
    x_out = x_w + width_out + gap  # where Q starts, in every row
    top = canvas.inch(_TITLE + _ABOVE)
    canvas.title(f"One big $W^{letter}$ = {n} small $W_i^{letter}$ side by side, one per {kind}")
    # The fused product, each head's block in its colour.
    _one_product(canvas, x2, fused, colours, letter, role, (gap / 2, x_w, x_out), top)
    if 2.2 * _em(canvas) < d:  # each block's name inside it, where it fits
        for i in range(n):
            ink = ink_on(head_colour(i))
            w_name, out_name = f"$W_{_index(i)}^{letter}$", f"${letter}_{_index(i)}$"
            canvas.text(x_w + i * d + d / 2, top + d_in / 2, w_name, colour=ink, gid=f"{w_name}:inside")
            canvas.text(x_out + i * d + d / 2, top + T / 2, out_name, colour=ink, gid=f"{out_name}:inside")
    sentence = top + block_height + canvas.inch(_BELOW + _LINE / 2)
    equation = f"$X\\,W_i^{letter} = {letter}_i$"
    alone = f"each {kind} alone: {equation}, the same numbers as block $i$ above"
    canvas.text(canvas.width / 2, sentence, alone)
    # One row per head: the same X times that head's block alone, under the block it is.
    heads_top = top + block_height + canvas.inch(_BELOW + _LINE + _ABOVE)
    for i in range(n):
        y = heads_top + i * (block_height + canvas.inch(label_room + 0.1))
        canvas.matrix(gap / 2, y, T, d_in, ROLE_COLOURS["x"], label="X", gid=f"X_{i + 1}")
        w_box = canvas.matrix(x_w + i * d, y, d_in, d, head_colour(i), label=f"W_{_index(i)}^{letter}",
                              shape=tuple(per_head[i].shape), frame=role)  # fmt: skip
        out_box = canvas.matrix(x_out + i * d, y, T, d, head_colour(i), label=f"{letter}_{_index(i)}",
                                shape=(T, d), frame=role)  # fmt: skip
        canvas.operator((gap / 2 + d_in + w_box["x"]) / 2, y + T / 2, "×")
        canvas.operator((w_box["right"] + out_box["x"]) / 2, y + T / 2, "=")
    return canvas.fit()


def _one_product(
    canvas: Canvas,
    x2: torch.Tensor,
    fused: torch.Tensor,
    colours: list[str],
    letter: str,
    role: str,
    xs: tuple[float, float, float],
    top: float,
) -> None:
    """Draw ``X × W = Q`` in one row, the heads' blocks of W and Q in their colours."""
    x_x, x_w, x_out = xs
    T, d_in, width_out = x2.shape[0], x2.shape[1], fused.shape[1]
    canvas.matrix(x_x, top, T, d_in, ROLE_COLOURS["x"], label="X", shape=tuple(x2.shape))
    canvas.operator(x_w - (x_w - x_x - d_in) / 2, top + T / 2, "×")
    canvas.matrix(x_w, top, d_in, width_out, role, column_colours=colours, label=f"W^{letter}",
                  shape=tuple(fused.shape), frame=role)  # fmt: skip
    canvas.operator(x_out - (x_out - x_w - width_out) / 2, top + T / 2, "=")
    canvas.matrix(x_out, top, T, width_out, role, column_colours=colours, label=letter,
                  shape=(T, width_out), frame=role)  # fmt: skip


def _block_names(canvas: Canvas, x_w: float, y: float, n: int, d: int, letter: str) -> None:
    """Write each head's name, W_i, inside its block of the big W drawn at ``x_w``."""
    from matplotlib import patheffects

    halo = [patheffects.withStroke(linewidth=2.5, foreground="white")]  # readable on any colour
    # a name is about 2.2 em wide: fit its block, but no smaller than 0.8 em, which reads at
    # 11 px even when the figure is a little wider than the book's column
    name_size = max(0.8, min(0.85, d / (2.6 * _em(canvas))))
    for i in range(n):
        w_name = f"$W_{_index(i)}^{letter}$"
        canvas.text(x_w + i * d + d / 2, y, w_name, size=name_size, path_effects=halo, gid=f"{w_name}:inside")


def _one_matrix_cut(
    x2: torch.Tensor,
    fused: torch.Tensor,
    per_head: torch.Tensor,
    colours: list[str],
    letter: str,
    role: str,
    kind: str,
) -> Figure:
    """The one-row form of :func:`heads_from_one_matrix`: X W = Q, then Q cut into its heads."""
    n, d_in, d = per_head.shape
    T, width_out = x2.shape[0], fused.shape[1]
    arrow, names = 1.6, 1.2  # inches: the arrow with its code, the names right of the heads
    head_gap = 0.25  # inches between two heads' blocks
    stacked = n * T  # the heads' blocks, one under the other
    canvas = Canvas(
        d_in + 2 * width_out + d,
        max(d_in, stacked),
        extra_width=3 * _GAP + arrow + names,
        extra_height=_TITLE + _ABOVE + _BELOW + max((n - 1) * head_gap, _LINE),
    )
    gap = canvas.inch(_GAP)
    top = canvas.inch(_TITLE + _ABOVE)
    x_w = gap / 2 + d_in + gap
    x_out = x_w + width_out + gap
    x_heads = x_out + width_out + canvas.inch(arrow)
    canvas.title(f"One big $W^{letter}$ = {n} small $W_i^{letter}$ side by side; "
                 f"cut into {kind}s, ${letter}$ gives each $X\\,W_i^{letter}$")  # fmt: skip
    _one_product(canvas, x2, fused, colours, letter, role, (gap / 2, x_w, x_out), top)
    _block_names(canvas, x_w, top + d_in / 2, n, d, letter)
    cut_code = "Method 2: the cut\n.view(B, T, h, d_k)\n.transpose(1, 2)"
    above_arrow = top + T / 2 - canvas.inch(0.04)
    canvas.text((x_out + width_out + x_heads) / 2, above_arrow, cut_code, va="bottom", size=0.85,
                linespacing=1.35)  # fmt: skip  # the underscore of d_k clear of the line below
    for i in range(n):  # Q's cut: one arrow to each head's block
        y = top + i * (T + canvas.inch(head_gap)) + T / 2
        canvas.arrow(x_out + width_out, top + T / 2, x_heads, y)
    methods = top + max(T, d_in) + canvas.inch(_BELOW + 0.05)  # under the shapes: which method is which
    canvas.text((gap / 2 + x_out + width_out) / 2, methods, "Method 1: one product", va="top", size=0.85)
    heads_note = "each is Method 3's product:"
    canvas.text(x_heads + d + canvas.inch(0.1), top - canvas.inch(0.06), heads_note, ha="left",
                va="bottom", size=0.85)  # fmt: skip
    for i in range(n):
        y = top + i * (T + canvas.inch(head_gap))
        canvas.matrix(x_heads, y, T, d, head_colour(i), label=None, gid=f"{letter}_{_index(i)}", frame=role)
        product = f"${letter}_{_index(i)} = X\\,W_{_index(i)}^{letter}$"
        name_x = x_heads + d + canvas.inch(0.1)
        canvas.text(name_x, y + T / 2, product, ha="left", gid=f"{letter}_{_index(i)}:name")
    bottom = top + n * T + (n - 1) * canvas.inch(head_gap) + canvas.inch(0.05)
    canvas.text(x_heads + d / 2, bottom, f"each ({T}, {d})", va="top", size=0.85)
    return canvas.fit()


def _methods_beside(
    x2: torch.Tensor,
    fused: torch.Tensor,
    per_head: torch.Tensor,
    colours: list[str],
    letter: str,
    role: str,
    kind: str,
) -> Figure:
    """The ``beside`` form of :func:`heads_from_one_matrix`: Method 3's rows left, Methods 1 and 2 right."""
    n, d_in, d = per_head.shape
    T, width_out = x2.shape[0], fused.shape[1]
    block_height = max(T, d_in)
    row_room = _ABOVE + _BELOW + 0.1  # inches under and over each of Method 3's rows
    separator, arrow, piece_gap = 0.7, 0.75, 0.12  # inches: between the sides, the cut's arrows, its pieces
    left_height = n * block_height  # cells, plus n · row_room inches
    right_height = block_height + T  # cells, plus the labels, the arrows and the pieces' labels
    right_inches = _ABOVE + _BELOW + arrow + _BELOW
    canvas = Canvas(
        2 * d_in + 2 * d + 2 * width_out,
        max(left_height, right_height),
        extra_width=6 * _GAP + separator + (n - 1) * piece_gap / 2,
        extra_height=_TITLE + _LINE + max(n * row_room, right_inches) + 0.1,
    )
    gap = canvas.inch(_GAP)
    heading_y = canvas.inch(_TITLE + 0.12)
    top = canvas.inch(_TITLE + _LINE + _ABOVE)
    canvas.title(f"Per {kind} or all at once: the same ${letter}_i = X\\,W_i^{letter}$")
    # Left: Method 3, each head's product alone.
    x_w = gap / 2 + d_in + gap
    x_out = x_w + d + gap
    left_right = x_out + d
    canvas.text(left_right / 2, heading_y, f"Method 3: each {kind} alone", va="top", weight="bold",
                size=0.9)  # fmt: skip
    for i in range(n):
        y = top + i * (block_height + canvas.inch(row_room))
        x_shape = tuple(x2.shape)
        canvas.matrix(gap / 2, y, T, d_in, ROLE_COLOURS["x"], label="X", shape=x_shape, gid=f"X_{i + 1}")
        canvas.matrix(x_w, y, d_in, d, head_colour(i), label=f"W_{_index(i)}^{letter}",
                      shape=tuple(per_head[i].shape), frame=role)  # fmt: skip
        canvas.matrix(x_out, y, T, d, head_colour(i), label=f"{letter}_{_index(i)}", shape=(T, d), frame=role)
        canvas.operator((gap / 2 + d_in + x_w) / 2, y + T / 2, "×")
        canvas.operator((x_w + d + x_out) / 2, y + T / 2, "=")
    # Between the sides, a thin rule.
    x_rule = left_right + gap / 2 + canvas.inch(separator) / 2
    rule_bottom = top + left_height + canvas.inch(n * row_room - _ABOVE)
    canvas.ax.plot([x_rule, x_rule], [heading_y, rule_bottom], color=EDGE_COLOUR, linewidth=0.6, alpha=0.4)
    # Right: Method 1, one product, then Method 2's cut into the same blocks.
    x_x = left_right + gap + canvas.inch(separator)
    x_big_w = x_x + d_in + gap
    x_big_out = x_big_w + width_out + gap
    right_end = x_big_out + width_out
    canvas.text((x_x + right_end) / 2, heading_y, "Method 1: one product, then Method 2's cut", va="top",
                weight="bold", size=0.9)  # fmt: skip
    _one_product(canvas, x2, fused, colours, letter, role, (x_x, x_big_w, x_big_out), top)
    _block_names(canvas, x_big_w, top + d_in / 2, n, d, letter)
    pieces_width = width_out + (n - 1) * canvas.inch(piece_gap)
    x_pieces = x_big_out + width_out / 2 - pieces_width / 2
    y_pieces = top + block_height + canvas.inch(_BELOW + arrow)
    arrow_top = top + T + canvas.inch(_BELOW)
    for i in range(n):
        x_piece = x_pieces + i * (d + canvas.inch(piece_gap))
        canvas.arrow(x_big_out + i * d + d / 2, arrow_top, x_piece + d / 2, y_pieces - canvas.inch(0.04))
        canvas.matrix(x_piece, y_pieces, T, d, head_colour(i), gid=f"cut {letter}_{_index(i)}", frame=role)
        canvas.text(x_piece + d / 2, y_pieces + T + canvas.inch(0.05), f"${letter}_{_index(i)}$", va="top",
                    gid=f"cut {letter}_{_index(i)}:name")  # fmt: skip
    cut_code = ".view(B, T, h, d_k)\n.transpose(1, 2)"
    canvas.text(x_pieces - canvas.inch(0.15), (arrow_top + y_pieces) / 2 + canvas.inch(0.2), cut_code,
                ha="right", size=0.85, linespacing=1.35)  # fmt: skip
    return canvas.fit()


def reshape(
    num_heads: int, length: int, d_k: int, *, batch: int = 1, wrong: bool = True, right: bool = True
) -> Figure:
    """Splitting into heads: ``view(B, T, h, d_k).transpose(1, 2)``, and the bare ``view`` that mixes them.

    Every entry of a (B, T, h·d_k) tensor is drawn as a cell coloured by the head
    its feature belongs to and numbered with its position t. The right split,
    ``x.view(B, T, h, d_k).transpose(1, 2)``, gives (B, h, T, d_k): head i's
    block holds positions 0, ..., T-1 of head i's features, one colour. The
    wrong one, ``x.view(B, h, T, d_k)``, has the right shape but fills each
    "head" with consecutive entries of memory: features of several heads, and a
    few positions. The cells are computed by applying both reshapes to a tensor
    of codes (position · h + head), so the picture is what torch does. A 3-D
    tensor is drawn as its slices along the first axis after the batch,
    stacked; of the batch, the first sequence is drawn, labelled with its own
    shape, (T, h·d_k) and so on, while the code on the arrows names the batch's axes.

    Parameters
    ----------
    num_heads : int
        h.
    length : int
        T, the number of positions.
    d_k : int
        The features per head.
    batch : int
        B (every sequence of the batch is split alike).
    wrong : bool
        Also draw the wrong ``view(B, h, T, d_k)``, titled "Wrong:" under the
        right split's "Right:". With ``wrong=False`` the right split's title
        starts "Correct:" instead, which a lone title cannot read as a side.
    right : bool
        Draw the right split (the default). ``right=False`` draws the wrong
        ``view`` alone, for a page that has already shown the right one; at
        least one of ``right`` and ``wrong`` must be True.

    Returns
    -------
    matplotlib.figure.Figure
        The grids are named ``"right.input"``, ``"right.position1"``, ...,
        ``"right.head1"``, ... and ``"wrong.input"``, ``"wrong.head1"``, ...
        (for :func:`qkv.diagrams.cells`: colours and numbers, cell by cell).

    See Also
    --------
    qkv.split_heads : the right split.
    :doc:`heads` : which entries land in which head, "Mistake 2".

    Examples
    --------
    >>> import qkv
    >>> from qkv.diagrams.heads import reshape
    >>> figure = reshape(3, 5, 4)
    >>> # head 1 of the right split holds every position:
    >>> [row[0] for row in qkv.diagrams.cells(figure, "right.head1").text]
    ['0', '1', '2', '3', '4']
    >>> # "head 1" of the bare view holds positions 0 and 1:
    >>> [row[0] for row in qkv.diagrams.cells(figure, "wrong.head1").text]
    ['0', '0', '0', '1', '1']
    """
    h = require_positive_int("num_heads", num_heads)
    T = require_positive_int("length", length)
    d = require_positive_int("d_k", d_k)
    B = require_positive_int("batch", batch)
    wrong = require_bool("wrong", wrong)
    right_row = require_bool("right", right)
    if not (right_row or wrong):
        raise ValueError("reshape draws nothing with right=False and wrong=False: pass one of them as True")
    if T * h * d > MAX_RESHAPE_ENTRIES:
        raise ValueError(
            f"reshape draws and numbers every entry: num_heads · length · d_k = {h} · {T} · {d} = "
            f"{h * T * d} entries is more than {MAX_RESHAPE_ENTRIES}, too many to read; pass smaller "
            "sizes (the reshape does the same at any size)"
        )
    # Each entry holds its position and head, as position · h + head; then the reshapes, by torch.
    positions = torch.arange(T)[:, None].expand(T, h * d)  # (T, h·d)
    heads = (torch.arange(h * d) // d)[None, :].expand(T, h * d)  # (T, h·d)
    codes = (positions * h + heads).expand(B, T, h * d).contiguous()  # (B, T, h·d)
    split = codes.view(B, T, h, d)  # (B, T, h, d)
    right_split = split.transpose(1, 2)  # (B, h, T, d)
    jumbled = codes.view(B, h, T, d)  # (B, h, T, d): the right shape, the wrong entries

    arrow, margin, names = 1.35, 0.15, 0.8  # inches: an arrow and its code, the edges, "head 1"
    slice_gap, head_gap = 0.06, 0.12  # inches between the slices of a stack
    drawn = [name for name, shown in (("right", right_row), ("wrong", wrong)) if shown]
    rows = len(drawn)
    stack_inches = max((T - 1) * slice_gap, (h - 1) * head_gap)
    heading = 0.35
    canvas = Canvas(
        h * d + 2 * d,
        rows * T * h,
        extra_width=2 * margin + 2 * arrow + names,
        extra_height=_TITLE + rows * (heading + _ABOVE + stack_inches + _BELOW) + (rows - 1) * 0.15 + 0.1,
    )
    stack_height = T * h + canvas.inch(stack_inches)  # every stack, in cell units
    x_input = canvas.inch(margin)
    x_middle = x_input + h * d + canvas.inch(arrow)
    x_heads = x_middle + d + canvas.inch(arrow)
    canvas.title("Splitting features into heads: colour = the feature's head, number = its position")

    def grid(x: float, y: float, cells: torch.Tensor, gid: str) -> None:
        """A (rows, cols) slice of codes: each cell in its head's colour, numbered with its position."""
        colours = [[head_colour(int(code) % h) for code in row] for row in cells]
        numbers = [[str(int(code) // h) for code in row] for row in cells]
        canvas.matrix(x, y, cells.shape[0], cells.shape[1], EDGE_COLOUR, cell_colours=colours,
                      cell_text=numbers, gid=gid)  # fmt: skip

    def stack(x: float, y: float, tensor: torch.Tensor, gap: float, gid: str, name: str | None) -> None:
        """The slices of a 3-D tensor along its first axis, stacked downwards, centred in the row."""
        count, rows_each = tensor.shape[0], tensor.shape[1]
        step = rows_each + canvas.inch(gap)
        y0 = y + (stack_height - count * step + canvas.inch(gap)) / 2
        for k in range(count):
            grid(x, y0 + k * step, tensor[k], f"{gid}{k + 1}")
            if name is not None:
                middle = y0 + k * step + rows_each / 2
                canvas.text(x + d + canvas.inch(0.06), middle, f"{name} {k + 1}", ha="left", size=0.85)

    def axes(x: float, y: float, cols: float, height: float, names: str, shape: torch.Size) -> None:
        """The axes' names above a drawn tensor, its sizes below."""
        canvas.text(x + cols / 2, y - canvas.inch(0.06), names, va="bottom", size=0.85)
        canvas.text(x + cols / 2, y + height + canvas.inch(0.05), shape_str(shape), va="top", size=0.85)

    same = torch.equal(right_split, jumbled)  # with one position or one head the two reshapes agree
    headings = {
        "right": ("Right" if wrong else "Correct")  # alone, "Right:" would read as a side
        + ": .view(B, T, h, d_k).transpose(1, 2): each head holds every position",
        "wrong": "Wrong: .view(B, h, T, d_k): each “head” mixes heads and positions"
        if not same
        else "Wrong: .view(B, h, T, d_k): the same here, with one position or one head",
    }
    row_step = stack_height + canvas.inch(heading + _ABOVE + _BELOW + 0.15)
    for r, name in enumerate(drawn):
        top = canvas.inch(_TITLE + heading + _ABOVE) + r * row_step
        canvas.text(x_input, top - canvas.inch(_ABOVE + 0.08), headings[name], ha="left", va="bottom",
                    weight="bold")  # fmt: skip
        middle = top + stack_height / 2
        grid(x_input, middle - T / 2, codes[0], f"{name}.input")
        axes(x_input, middle - T / 2, h * d, T, "(T, h·d_k)", codes.shape[1:])  # one sequence
        arrow_gap = canvas.inch(0.05)
        if name == "right":
            canvas.arrow(x_input + h * d + arrow_gap, middle, x_middle - arrow_gap, middle,
                         label=".view(B, T, h, d_k)")  # fmt: skip
            stack(x_middle, top, split[0], slice_gap, "right.position", None)
            axes(x_middle, top, d, stack_height, "(T, h, d_k)", split.shape[1:])
            canvas.arrow(x_middle + d + arrow_gap, middle, x_heads - arrow_gap, middle,
                         label=".transpose(1, 2)")  # fmt: skip
            stack(x_heads, top, right_split[0], head_gap, "right.head", "head")
            axes(x_heads, top, d, stack_height, "(h, T, d_k)", right_split.shape[1:])
        else:
            canvas.arrow(x_input + h * d + arrow_gap, middle, x_heads - arrow_gap, middle,
                         label=".view(B, h, T, d_k)")  # fmt: skip
            stack(x_heads, top, jumbled[0], head_gap, "wrong.head", "“head”")
            axes(x_heads, top, d, stack_height, "(h, T, d_k)", jumbled.shape[1:])
    return canvas.fit()


#: The most entries :func:`reshape` draws (each is numbered: more would not be readable).
MAX_RESHAPE_ENTRIES = 1024


def multi_head(layer: object, x: object, *, head_rows: bool = False) -> Figure:
    """Concat(head_1, ..., head_h) W^O: the heads' outputs side by side, then mixed by W^O.

    The top row is the h heads' outputs, head_i = Attention(Q_i, K_i, V_i) of
    shape (T, d_v), each in its head's colour; below, they are concatenated
    along the features into (T, h·d_v), whose column block i is head i, and
    multiplied by W^O (h·d_v, d_model) into the output (T, d_model). Every block
    is drawn to scale and labelled with its shape, read from the objects
    passed; the bias b^O is left out.

    Parameters
    ----------
    layer : HeadWeights or a multi-head module
        Where h, d_v and W^O come from (``to_heads()`` is called on a module).
    x : Tensor, shape (T, d_model) or (B, T, d_model)
        The query input, which gives T; of a batch, the first sequence.
    head_rows : bool
        Colour W^O's row blocks by head and name each W_i^O inside it: head i's
        output meets only rows (i-1)·d_v to i·d_v of W^O, so the output is the
        sum over heads of head_i W_i^O, which the title then writes. By default
        W^O is drawn in one colour.

    Returns
    -------
    matplotlib.figure.Figure
        The matrices are named ``"head_1"``, ..., ``"concat"``, ``"W^O"`` and
        ``"output"`` (for :func:`qkv.diagrams.cells`).

    See Also
    --------
    qkv.merge_heads : the concatenation.
    :doc:`heads/merge` : how the output projection mixes the heads, one row block per head.

    Examples
    --------
    >>> import torch, qkv
    >>> from qkv.diagrams.heads import multi_head
    >>> mha = qkv.MultiHeadAttention(12, 3, d_v=2)
    >>> figure = multi_head(mha, torch.randn(5, 12))
    >>> sorted({t for t in qkv.diagrams.texts_of(figure) if t.startswith("(")})
    ['(5, 12)', '(5, 2)', '(5, 6)', '(6, 12)']
    """
    weights = head_weights(layer)
    x2 = as_matrix("x", x, layout="(T, d_model)", batch_first=batch_first_of(layer))  # (T, d_model)
    require_size("x", x2, 1, weights.embed_dim, "features", "the layer's d_model")
    T = x2.shape[0]
    h, d_v = weights.num_heads, weights.d_v
    w_o = weights.w_o  # (h·d_v, d_model)
    concat_width, d_model = w_o.shape
    colours = [head_colour(j // d_v) for j in range(concat_width)]

    down = 0.55  # inches: the arrow from the heads down to their concatenation
    canvas = Canvas(
        concat_width + 2 * d_model,
        T + max(T, concat_width),
        extra_width=3 * _GAP,
        extra_height=_TITLE + 2 * (_ABOVE + _BELOW) + down,
    )
    gap = canvas.inch(_GAP)
    x_w = gap / 2 + concat_width + gap
    x_out = x_w + d_model + gap
    # The heads over their concatenation, spread so that their labels head_i fit.
    head_gap = max(canvas.inch(0.12), 3.8 * _em(canvas, 1.15) - d_v)
    if h > 1:
        head_gap = min(head_gap, (x_w - gap / 2 - h * d_v) / (h - 1))  # within the canvas
    heads_width = h * d_v + (h - 1) * head_gap
    centre = gap / 2 + concat_width / 2
    x_heads = max(gap / 2, centre - heads_width / 2)
    top = canvas.inch(_TITLE + _ABOVE)
    concat_top = top + T + canvas.inch(_BELOW + down + _ABOVE)
    title = "Multi-head attention: $\\mathrm{Concat}(\\mathrm{head}_1, …, \\mathrm{head}_h)\\,W^O$"
    if head_rows:  # the row blocks make the sum visible: say it
        title += " = $\\sum_i \\mathrm{head}_i\\,W_i^O$"
    canvas.title(title)
    crowded = (d_v + head_gap) * canvas.unit < 0.6  # inches per head: too narrow for every label
    for i in range(h):
        labelled = not crowded or i in (0, h - 1)  # when crowded, the first and the last head only
        canvas.matrix(x_heads + i * (d_v + head_gap), top, T, d_v, head_colour(i),
                      label=f"\\mathrm{{head}}_{_index(i)}" if labelled else None,
                      shape=(T, d_v) if not crowded or i == 0 else None, gid=f"head_{i + 1}")  # fmt: skip
    arrow_top, arrow_bottom = top + T + canvas.inch(_BELOW), concat_top - canvas.inch(_ABOVE)
    canvas.arrow(centre, arrow_top, centre, arrow_bottom)
    canvas.text(centre + canvas.inch(0.1), (arrow_top + arrow_bottom) / 2, "concatenate the features",
                ha="left", size=0.85)  # fmt: skip
    canvas.matrix(gap / 2, concat_top, T, concat_width, EDGE_COLOUR, column_colours=colours,
                  label="\\mathrm{Concat}", shape=(T, concat_width), gid="concat")  # fmt: skip
    canvas.operator(x_w - gap / 2, concat_top + T / 2, "×")
    canvas.matrix(x_w, concat_top, concat_width, d_model, ROLE_COLOURS["o"], label="W^O",
                  shape=tuple(w_o.shape), row_colours=colours if head_rows else None)  # fmt: skip
    if head_rows:  # each row block's name inside it: W_i^O, met by head_i alone
        from matplotlib import patheffects

        halo = [patheffects.withStroke(linewidth=2.5, foreground="white")]  # readable on any colour
        name_size = min(1.0, d_v / (1.4 * _em(canvas)))  # fit the block's height
        for i in range(h):
            w_name = f"$W_{_index(i)}^O$"
            canvas.text(x_w + d_model / 2, concat_top + i * d_v + d_v / 2, w_name, size=name_size,
                        path_effects=halo, gid=f"{w_name}:inside")  # fmt: skip
    canvas.operator(x_out - gap / 2, concat_top + T / 2, "=")
    canvas.matrix(x_out, concat_top, T, d_model, ROLE_COLOURS["o"], label="\\mathrm{output}",
                  shape=(T, d_model), gid="output")  # fmt: skip
    return canvas.fit()


#: The most output features :func:`packed_layouts` draws (each is numbered).
MAX_PACKED_FEATURES = 96


def packed_layouts(num_heads: int, d_k: int) -> Figure:
    """The output features of a packed Q/K/V projection, stacked and interleaved per head.

    A packed ``nn.Linear(d_in, 3·h·d_k)`` makes Q, K and V in one product. Each
    of its 3·h·d_k output features (a row of its weight) is drawn as a cell
    coloured by its role (Q blue, K vermillion, V green) and numbered with its
    head, from 1, in memory order, row after row like text. The top grid is the
    *stacked* order of PyTorch's ``in_proj_weight`` and nanoGPT's ``c_attn``,
    one row per block that ``chunk(3, dim=-1)`` cuts (all of Q, then K, then
    V); the bottom grid the *interleaved* order of code that reshapes to
    ``(B, T, h, 3·d_k)`` before chunking, one row per head (its q, k, v
    together). The bottom grid is computed from the top one by
    :func:`qkv.interop.stacked_to_interleaved`, so the picture is what the
    conversion does.

    Parameters
    ----------
    num_heads : int
        h.
    d_k : int
        The features per head (of each of q, k and v).

    Returns
    -------
    matplotlib.figure.Figure
        The grids are named ``"stacked"``, (3, h·d_k), and ``"interleaved"``,
        (h, 3·d_k) (for :func:`qkv.diagrams.cells`: colours and numbers, cell by cell).

    See Also
    --------
    qkv.interop.stacked_to_interleaved : the conversion drawn.
    :doc:`heads/packed-layouts` : the silent bug of loading one order into the other.

    Examples
    --------
    >>> import qkv
    >>> from qkv.diagrams.heads import packed_layouts
    >>> figure = packed_layouts(2, 1)
    >>> qkv.diagrams.cells(figure, "stacked").text  # rows: Q, K, V
    [['1', '2'], ['1', '2'], ['1', '2']]
    >>> qkv.diagrams.cells(figure, "interleaved").text  # rows: head 1, head 2
    [['1', '1', '1'], ['2', '2', '2']]
    """
    from qkv.interop import stacked_to_interleaved

    h = require_positive_int("num_heads", num_heads)
    d = require_positive_int("d_k", d_k)
    if 3 * h * d > MAX_PACKED_FEATURES:
        raise ValueError(
            f"packed_layouts draws and numbers every feature: 3 · num_heads · d_k = 3 · {h} · {d} = "
            f"{3 * h * d} is more than {MAX_PACKED_FEATURES}; pass smaller sizes (the order is the same "
            "at any size)"
        )
    # Each feature holds its role and head, as role · h + head; the interleaved order by the conversion.
    stacked = torch.arange(3 * h).repeat_interleave(d)  # (3·h·d,): role · h + head
    interleaved = stacked_to_interleaved(stacked.double(), h).long()  # (3·h·d,)
    role_colours = [ROLE_COLOURS[r] for r in ("q", "k", "v")]
    grids = {
        "stacked": ("Stacked (PyTorch in_proj_weight, nanoGPT c_attn)", stacked.view(3, h * d),
                    ["Q", "K", "V"]),
        "interleaved": ("Interleaved per head: view(B, T, h, 3·d_k)", interleaved.view(h, 3 * d),
                        [f"head {i + 1}" for i in range(h)]),
    }  # fmt: skip

    cols = max(h * d, 3 * d)
    heading, gap, names = 0.34, 0.3, 0.75  # inches: a grid's heading, between grids, row names
    canvas = Canvas(
        cols, 3 + h, unit=0.36, extra_width=0.3 + names, extra_height=_TITLE + 2 * heading + gap + 0.1
    )
    x = canvas.inch(0.15)
    canvas.title("A packed Q/K/V projection: colour = role, number = head")
    top = canvas.inch(_TITLE + heading)
    for name, (title, codes, row_names) in grids.items():
        canvas.text(x, top - canvas.inch(0.08), title, ha="left", va="bottom", weight="bold", size=0.9)
        colours = [[role_colours[int(c) // h] for c in row] for row in codes]
        numbers = [[str(int(c) % h + 1) for c in row] for row in codes]
        rows, width = codes.shape
        canvas.matrix(x, top, rows, width, EDGE_COLOUR, cell_colours=colours, cell_text=numbers, gid=name)
        for r, row_name in enumerate(row_names):  # what each row is, to its right
            canvas.text(x + width + canvas.inch(0.1), top + r + 0.5, row_name, ha="left", size=0.9)
        top += rows + canvas.inch(gap + heading)
    return canvas.fit()


def weight_storage(linear: object, num_heads: int, *, projection: str = "q") -> Figure:
    """The paper's W^Q (in, out) beside ``nn.Linear``'s ``.weight`` (out, in): head i is columns, then rows.

    A fused projection ``nn.Linear(d_in, h·d_k)`` holds the paper's
    W^Q (d_in, h·d_k) transposed: its ``.weight`` is (h·d_k, d_in), and
    ``W^Q = .weight.T``. On the left, W^Q with column block i (W_i^Q) in head
    i's colour; on the right, ``.weight`` with row block i, (W_i^Q)^T, in the
    same colour, and the slice that takes it, ``[(i-1)·d_k : i·d_k]`` (code
    counts from 0). The shapes are read from the weight passed; its values are
    not drawn. Heads are numbered from 1, as in the paper.

    Parameters
    ----------
    linear : torch.nn.Linear, or a module whose ``.weight`` is stored (out, in)
        The fused projection; its out_features must be a multiple of ``num_heads``.
    num_heads : int
        h: the weight's rows are cut into h blocks of d_k = out_features / h.
    projection : {"q", "k", "v"}
        Which projection it is, for the names (W^Q, W^K, W^V) and the frame's colour.

    Returns
    -------
    matplotlib.figure.Figure
        The matrices are named ``"W"``, (d_in, h·d_k), and ``"weight"``,
        (h·d_k, d_in) (for :func:`qkv.diagrams.cells`: colours, cell by cell).

    See Also
    --------
    qkv.diagrams.heads_from_one_matrix : W^Q's column blocks times X, head by head.
    :doc:`heads` : Method 1's ``nn.Linear`` holds the heads' weights one after another.

    Examples
    --------
    >>> import torch, qkv
    >>> from qkv.diagrams.heads import weight_storage
    >>> figure = weight_storage(torch.nn.Linear(12, 15), 3)
    >>> [t for t in qkv.diagrams.texts_of(figure) if t.startswith("(")]
    ['(12, 15)', '(15, 12)']
    >>> "[5:10]" in qkv.diagrams.texts_of(figure)  # head 2's rows of .weight
    True
    """
    from matplotlib import patheffects

    h = require_positive_int("num_heads", num_heads)
    if not isinstance(projection, str) or projection not in _PROJECTIONS:
        raise ValueError(f'projection must be "q", "k" or "v", got {projection!r}')
    weight = getattr(linear, "weight", None)
    if not isinstance(weight, torch.Tensor) or weight.dim() != 2:
        raise TypeError(
            "linear must be an nn.Linear or a module with a 2-D .weight (out, in), "
            f"got {type(linear).__name__}"
        )
    out_features, in_features = weight.shape
    if out_features % h:
        raise ValueError(
            f"the weight's {out_features} output features do not split into num_heads = {h} equal blocks"
        )
    d = out_features // h
    letter, role = projection.upper(), ROLE_COLOURS[projection]
    colours = [head_colour(j // d) for j in range(out_features)]

    arrow, slices, caption = 1.5, 0.75, 0.3  # inches: the arrow and its words, the slices, a caption
    canvas = Canvas(
        out_features + in_features,
        max(in_features, out_features),
        extra_width=2 * 0.15 + arrow + slices,
        extra_height=_TITLE + _ABOVE + 0.05 + 0.24 + caption,
    )
    top = canvas.inch(_TITLE + _ABOVE)
    x_paper = canvas.inch(0.15)
    x_stored = x_paper + out_features + canvas.inch(arrow)
    canvas.title(f"nn.Linear stores $W^{letter}$ transposed: "
                 f"head $i$ is columns of $W^{letter}$, rows of .weight")  # fmt: skip
    halo = [patheffects.withStroke(linewidth=2.5, foreground="white")]  # readable on any colour
    canvas.matrix(x_paper, top, in_features, out_features, role, column_colours=colours,
                  label=f"W^{letter}", shape=(in_features, out_features), frame=role, gid="W")  # fmt: skip
    canvas.matrix(x_stored, top, out_features, in_features, role, row_colours=colours, label=None,
                  shape=(out_features, in_features), frame=role, gid="weight")  # fmt: skip
    canvas.text(x_stored + in_features / 2, top - canvas.inch(0.06), ".weight", va="bottom", size=1.15,
                gid="weight:label")  # fmt: skip
    em = _em(canvas)
    column_size = min(1.0, d / (1.8 * em))  # W_i^Q, about 1.6 em wide, in a block d cells wide
    row_size = min(1.0, d / (1.5 * em), in_features / (3.4 * em))  # (W_i^Q)^T: d cells tall
    for i in range(h):
        w_name = f"$W_{_index(i)}^{letter}$"
        if column_size >= MIN_POINTS / canvas.font:  # each block's name inside it, where it fits
            canvas.text(x_paper + i * d + d / 2, top + in_features / 2, w_name, size=column_size,
                        path_effects=halo, gid=f"{w_name}:inside")  # fmt: skip
        middle = top + i * d + d / 2
        t_name = f"$(W_{_index(i)}^{letter})^\\top$"
        if row_size >= MIN_POINTS / canvas.font:
            canvas.text(x_stored + in_features / 2, middle, t_name, size=row_size, path_effects=halo,
                        gid=f"{t_name}:inside")  # fmt: skip
        canvas.text(x_stored + in_features + canvas.inch(0.08), middle, f"[{i * d}:{(i + 1) * d}]",
                    ha="left", size=0.85, gid=f"slice{i + 1}")  # fmt: skip
    arrow_y = top + min(in_features, out_features) / 2
    canvas.arrow(x_paper + out_features + canvas.inch(0.08), arrow_y, x_stored - canvas.inch(0.08), arrow_y)
    canvas.text((x_paper + out_features + x_stored) / 2, arrow_y + canvas.inch(0.06), "stored as\n(out, in)",
                va="top", size=0.85)  # fmt: skip
    under_shape = canvas.inch(0.05 + 0.24)  # a caption under each shape
    canvas.text(x_paper + out_features / 2, top + in_features + under_shape, "the paper's: (in, out)",
                va="top", size=0.85)  # fmt: skip
    canvas.text(x_stored + in_features / 2, top + out_features + under_shape, "nn.Linear's: (out, in)",
                va="top", size=0.85)  # fmt: skip
    return canvas.fit()


WEIGHT_LEVELS = 12  # colours in wide_head's map, all kept by a palette PNG


def wide_head(q: object, k: object, *, sequence: int = 0) -> Figure:
    """Why the cut comes before the scores: each head's own softmax, against one of the scores summed.

    With the cut (Method 2's ``view`` and ``transpose``), head i takes its own
    softmax of Q_i K_iᵀ / √d_k. Without it, Method 1's product is one head
    h·d_k wide: its scores Q Kᵀ are the heads' scores summed, Σ_i Q_i K_iᵀ, and
    one softmax of them, scaled by 1/√(h·d_k), is all the layer gets. The figure
    draws the h heads' attention maps and, last, the wide head's, one row per
    query and one column per key, on one colour scale.

    Parameters
    ----------
    q, k : Tensor, shape (B, h, T, d_k) and (B, h, S, d_k)
        The queries and keys after the cut, heads before positions (h ≥ 2).
    sequence : int
        Which sequence of the batch to draw.

    Returns
    -------
    matplotlib.figure.Figure
        One axes per map (h + 1, heads first), then the colour bar; each map's
        values are its axes' image array (``figure.axes[i].images[0].get_array()``).

    See Also
    --------
    :doc:`heads/wide-head` : what skipping the cut gives.

    Examples
    --------
    >>> import torch, qkv
    >>> q, k = torch.randn(2, 3, 7, 5), torch.randn(2, 3, 7, 5)
    >>> figure = qkv.diagrams.wide_head(q, k)
    >>> [ax.get_title() for ax in figure.axes[:4]]
    ['head 1', 'head 2', 'head 3', 'no cut: one wide head']
    """
    from matplotlib import colormaps
    from matplotlib.figure import Figure

    if not isinstance(q, torch.Tensor) or not isinstance(k, torch.Tensor):
        raise TypeError(f"q and k must be tensors, got {type(q).__name__} and {type(k).__name__}")
    if q.dim() != 4 or k.dim() != 4:
        raise ValueError(
            f"q and k must be (B, h, T, d_k) and (B, h, S, d_k), heads before positions; got shapes "
            f"{shape_str(q.shape)} and {shape_str(k.shape)}"
        )
    B, h, T, d_k = q.shape
    if k.shape[:2] != (B, h) or k.shape[3] != d_k:
        raise ValueError(
            f"k {shape_str(k.shape)} must share q's batch, heads and d_k: q is {shape_str(q.shape)}"
        )
    if h < 2:
        raise ValueError(f"q has {h} head: with one head the cut changes nothing; pass h >= 2")
    if isinstance(sequence, bool) or not isinstance(sequence, int) or not 0 <= sequence < B:
        raise ValueError(f"sequence must be an int from 0 to {B - 1}, got {sequence!r}")
    q_s, k_s = q[sequence].detach().double().cpu(), k[sequence].detach().double().cpu()
    scores = q_s @ k_s.mT  # (h, T, S)
    wide = (scores.sum(0) / (h * d_k) ** 0.5).softmax(-1)  # one softmax of the summed scores
    maps = [*(scores / d_k**0.5).softmax(-1), wide]  # each head's, then the wide head's
    titles = [*(f"head {i + 1}" for i in range(h)), "no cut: one wide head"]
    S = k.shape[2]
    # inches per map, narrow enough that the figure fits the column (wider, its text would shrink)
    side = max(1.2, min(2.2, 0.32 * max(T, S), 6.2 / (h + 1) - 0.35))
    figure = Figure(figsize=((h + 1) * (side + 0.35) + 1.0, side + 1.3), layout="constrained")
    axes = figure.subplots(1, h + 1, sharey=True)
    top = max(float(m.max()) for m in maps)
    # Discrete levels: the book stores figures as 256-colour palette PNGs, which would band a
    # continuous colour bar with colours off the map.
    cmap = colormaps["viridis"].resampled(WEIGHT_LEVELS)
    for i, (ax, weights, title) in enumerate(zip(axes, maps, titles, strict=True)):
        image = ax.imshow(weights.numpy(), cmap=cmap, vmin=0.0, vmax=top, interpolation="nearest")
        colour = head_colour(i) if i < h else EDGE_COLOUR
        ax.set_title(title, fontsize=10, color=TEXT_COLOUR, fontweight="bold")
        for spine in ax.spines.values():  # the head's colour as a frame: light colours stay legible
            spine.set(visible=True, edgecolor=colour, linewidth=2.5)
        ax.set_xlabel("key position s (from 0)")
        ax.set_xticks(range(S))
        ax.set_yticks(range(T))
        ax.tick_params(labelsize=9)
    axes[0].set_ylabel("query position t (from 0)")
    bar = figure.colorbar(image, ax=list(axes), label="attention weight", shrink=0.9)
    bar.set_ticks([top * n / WEIGHT_LEVELS for n in range(0, WEIGHT_LEVELS + 1, 2)])  # on the bands' edges
    bar.ax.yaxis.set_major_formatter("{x:.2f}")
    figure.suptitle(
        "With the cut, each head has its own softmax over the keys;\nwithout it, one softmax runs over "
        "the heads' scores summed",
        fontsize=11,
    )
    return figure
