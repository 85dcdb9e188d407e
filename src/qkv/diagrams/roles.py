"""The three meanings of Q, K and V in one picture: inputs, learned weights, products.

- :func:`data_flow`: X, the learned weights and the products, drawn to scale.
- :func:`tied_preference`: with one matrix for queries and keys, a token prefers
  another to itself only where a longer query reaches (the circle picture).

See also
--------
The chapter :doc:`terminology` (book/terminology.ipynb), which draws the attention weights too.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import TYPE_CHECKING

from qkv.diagrams._draw import (
    EDGE_COLOUR,
    FONT,
    HEAD_COLOURS,
    ROLE_COLOURS,
    TEXT_COLOUR,
    layer_inputs,
    math,
    readable_ink,
    require_matplotlib,
)

if TYPE_CHECKING:  # pragma: no cover
    import torch
    from matplotlib.axes import Axes
    from matplotlib.figure import Figure

__all__ = ["data_flow", "tied_preference"]

#: The names ``code`` may give a library name to; ``op^Q`` (and K, V) is the operation
#: that applies W^Q and its bias, the node on the arrow from X to Q that W^Q enters.
NAMES = ("X", "X_K", "X_V", "W^Q", "W^K", "W^V", "op^Q", "op^K", "op^V", "Q", "K", "V", "A", "output")

# Inches: the figure's width, a column's width and the gap between columns (four
# columns; five, with the attention weights, are narrower).
_WIDTH, _BOX, _GAP = 7.0, 1.45, 0.28
_BOX5, _GAP5 = 1.18, 0.26
_BOX_OP, _GAP_OP = 1.08, 0.2  # five columns with the operations named: a wider gap W -> product
_OP_GAP = 0.8
_ROW, _BOX_HEIGHT = 1.12, 0.94  # a row's height and a box's
_PARAM_HEIGHT, _NODE_HEIGHT = 0.42, 0.36  # W^O's box (one line) and an operation's node
_WEIGHT_TITLE, _WEIGHT_NAME, _WEIGHT_STRIP = 0.28, 0.16, 0.28  # W^Q's box: its title, a name, its strip
_INTO_NODE, _ROW_NODE = 0.1, 0.3  # from W^Q's box down to its operation, and that node's height
_STRIP_ALPHA = 0.85  # the heads' colours as the book's other head figures draw them
_OUT_GAP = 0.3  # from W^O's operation down to the layer's output
_PAPER_BAND = 0.9  # paper=True: a header and three lines of notes under the columns
_NOTE_LINE = 0.17  # inches from one line of those notes to the next
_NOTE_SIZE = FONT * 0.8  # their text size, in points


def _wrapped(line: str, width: float, size: float) -> list[str]:
    """``line`` broken at spaces (never inside ``$...$``) into pieces no wider than ``width`` inches."""
    from matplotlib.font_manager import FontProperties
    from matplotlib.textpath import text_to_path

    def inches(text: str) -> float:
        points = text_to_path.get_text_width_height_descent(text, FontProperties(size=size), "$" in text)[0]
        return float(points) / 72

    words: list[str] = []
    for word in line.split(" "):  # a space inside maths joins the words around it again
        if words and words[-1].count("$") % 2:
            words[-1] += " " + word
        else:
            words.append(word)
    pieces = [words[0]]
    for word in words[1:]:
        if inches(f"{pieces[-1]} {word}") <= width:
            pieces[-1] += " " + word
        else:
            pieces.append(word)
    return pieces


def _shape(*sizes: int | str) -> str:
    return "(" + ", ".join(str(s) for s in sizes) + ")"


def data_flow(
    x: object,
    layer: object,
    *,
    key: object | None = None,
    value: object | None = None,
    code: Mapping[str, str] | None = None,
    attention_weights: bool = False,
    output_projection: bool = False,
    paper: bool = False,
    weights_note: Sequence[str] | None = None,
    head_colours: Sequence[str] | None = None,
) -> Figure:
    """Input, learned weights and products: X → (X W^Q + b^Q, W^Q entering from the side) → Q → attention.

    Not to scale: each object is a box with its name, its shape read from the
    objects passed, and (optionally) what a library calls it. The columns say
    which objects are computed for every input (the inputs and the products) and
    which are the operations, each with its learned weights (the model's
    parameters). The arrows run from the
    input to the products, through a node for the operation (a library's name for
    it, or what it does: × W^Q, with + b^Q where the layer has biases; the product's
    box names the product); each weight matrix enters its operation from the
    side, a parameter, not something made from the input. The products are cut into
    their heads' column blocks, drawn as a strip of h cells and labelled as heads;
    each weight matrix carries the same strip, its column blocks W_1^Q ... W_h^Q
    (gid ``"heads:W^Q"``), block i in head i's colour, named where the name fits
    and numbered where only a digit does. In self-attention one
    input X feeds all three operations; pass ``key`` (and ``value``) for
    cross-attention. With ``attention_weights=True`` a fifth column draws the
    attention weights, (h, T, S): only Q and K reach them ("where to look"), and V
    goes past them to the output ("what to hand over"). The heads' outputs are joined
    (Concat) in one box. With ``output_projection=True`` that box carries the heads'
    strip, as Q, K and V do, and the figure goes on below it: the joined outputs are
    multiplied by the output projection W^O (the operation × W^O), which enters from
    the side as the other weights do, to the layer's output,
    (T, d_model); without it, the figure stops at the joined outputs, before W^O.

    Parameters
    ----------
    x : Tensor, shape (T, d_model) or a batch (B, T, d_model)
        The query input (of a batch, the first sequence's shape is drawn).
    layer : HeadWeights or a multi-head module
        Where W^Q, W^K and W^V come from (``to_heads()`` is called on a module).
    key, value : Tensor, shape (S, kdim) and (S, vdim), optional
        The key and value inputs; default ``x`` (self-attention) and ``key``.
    code : mapping of str to str, optional
        A library's name for some of the objects, written under their boxes: keys
        among ``"X"``, ``"X_K"``, ``"X_V"``, ``"W^Q"``, ``"W^K"``, ``"W^V"``,
        ``"Q"``, ``"K"``, ``"V"``, ``"A"`` (the attention weights) and ``"output"``;
        ``"op^Q"``, ``"op^K"``, ``"op^V"`` name the operation that applies W^Q and
        its bias (W^K, W^V), written in its node on the arrow from the input, with
        X W^Q + b^Q on the arrow to the product (BERT's ``self.query``).
    attention_weights : bool, default False
        Draw the attention weights, head i's softmax(Q_i K_iᵀ / √d_k), between the
        products and the output.
    output_projection : bool, default False
        Carry the picture past the joined heads' outputs: W^O, of shape
        (h·d_v, d_model) read from the layer, enters the operation × W^O (gid
        ``"op^O"``) from the side: the box above it is already the joined heads, with
        their strip (gid ``"heads:output"``). Its product is the layer's output,
        (T, d_model), a box with gid ``"layer output"``.
    paper : bool, default False
        Write what texts call Q, K and V under the columns, in a band below the
        strips (gid ``"paper:X"``, ``"paper:W"``, ``"paper:Q"`` for the three
        notes): under the input, the paper's MultiHead(Q, K, V), whose Q, K, V are
        the layer's inputs (all X in self-attention); under the weights, that some
        texts loosely call them Q, K, V; under the products, the paper's
        Attention(Q, K, V) (its equation 1) inside head i, whose Q, K, V are strip i
        of each product. The figure grows by the band; without it, nothing changes.
    weights_note : sequence of three str, optional
        With ``paper=True``, the three lines written under the weights (gid
        ``"paper:W"``) instead of the default, that some texts loosely call them Q, K,
        V: a page that cites no such text can say what the weights are instead.
    head_colours : sequence of str, optional
        The strips' colours, one per head, in order (at least as many as the most
        heads a strip has), so that no two heads share a colour; default the book's
        ``HEAD_COLOURS``, repeating after nine heads (the strips' label says so).

    Returns
    -------
    matplotlib.figure.Figure

    Examples
    --------
    >>> import torch, qkv
    >>> mha = qkv.MultiHeadAttention(12, 3)
    >>> figure = qkv.diagrams.data_flow(torch.randn(5, 12), mha)
    >>> [t for t in qkv.diagrams.texts_of(figure) if "(" in t][:3]
    ['(5, 12)', '$W^Q$ (12, 3·4)', '(5, 3·4)']

    W^Q is the heads' blocks side by side, and its operation says what it does:

    >>> texts = qkv.diagrams.texts_of(figure)
    >>> [t for t in texts if t.startswith("$W_")][:3], r"$\\times\\,W^Q + b^Q$" in texts
    (['$W_{1}^Q$', '$W_{2}^Q$', '$W_{3}^Q$'], True)

    Through the output projection, to the layer's output:

    >>> figure = qkv.diagrams.data_flow(torch.randn(5, 12), mha, output_projection=True)
    >>> texts = qkv.diagrams.texts_of(figure)
    >>> "$W^O$ (3·4, 12)" in texts, "layer's output" in texts, "(5, 12)" in texts
    (True, True, True)

    With what texts call Q, K and V written under the columns:

    >>> figure = qkv.diagrams.data_flow(torch.randn(5, 12), mha, paper=True)
    >>> # a note wider than its column is broken in two
    >>> [t for t in qkv.diagrams.texts_of(figure) if t.startswith("self-attention")]
    ['self-attention:\\n$Q = K = V = X$']

    With its own three lines under the weights:

    >>> note = ("the weights", "$W^Q$, $W^K$, $W^V$", "no row per token")
    >>> x = torch.randn(5, 12)
    >>> figure = qkv.diagrams.data_flow(x, mha, paper=True, weights_note=note)
    >>> "no row per token" in qkv.diagrams.texts_of(figure)
    True
    """
    require_matplotlib()
    from matplotlib.figure import Figure

    weights, x2, k2, v2 = layer_inputs(layer, x, key, value)
    loose_use = ("some texts: $Q$, $K$, $V$", "are these weights", "(a loose use)")
    weights_lines = loose_use if weights_note is None else tuple(weights_note)
    if len(weights_lines) != 3 or not all(isinstance(line, str) for line in weights_lines):
        raise ValueError(f"weights_note must be three lines of text, but got {weights_note!r}")
    palette = HEAD_COLOURS if head_colours is None else tuple(head_colours)
    names = dict(code or {})
    unknown = sorted(set(names) - set(NAMES))
    if unknown:
        raise ValueError(f"code has names {unknown} that the picture does not draw; it draws {list(NAMES)}")

    h, h_kv, d_k, d_v = weights.num_heads, weights.num_kv_heads, weights.d_k, weights.d_v
    most = max(h, h_kv)  # the most heads a strip has
    if head_colours is not None and (len(palette) < most or not all(isinstance(c, str) for c in palette)):
        raise ValueError(f"head_colours must be at least {most} colours, one per head, not {head_colours!r}")
    self_attention = key is None and value is None
    inputs: list[tuple[str, torch.Tensor, tuple[int, ...]]]
    inputs = [("X", x2, (0, 1, 2))] if self_attention else [("X", x2, (0,)), ("X_K", k2, (1, 2))]
    if value is not None:
        inputs = [("X", x2, (0,) if key is not None else (0, 1)), ("X_V", v2, (2,))]
        if key is not None:
            inputs.insert(1, ("X_K", k2, (1,)))
    T, S = x2.shape[0], k2.shape[0]
    key_name = "X" if key is None else "X_K"
    multihead = rf"$\mathrm{{MultiHead}}(X, {key_name}, {'X_V' if value is not None else key_name})$"
    rows = [  # (role, weight, its shape, product, its shape)
        ("q", "W^Q", _shape(weights.embed_dim, f"{h}·{d_k}"), "Q", _shape(T, f"{h}·{d_k}")),
        ("k", "W^K", _shape(weights.kdim, f"{h_kv}·{d_k}"), "K", _shape(S, f"{h_kv}·{d_k}")),
        ("v", "W^V", _shape(weights.vdim, f"{h_kv}·{d_v}"), "V", _shape(S, f"{h_kv}·{d_v}")),
    ]

    columns, width, gap = (5, _BOX5, _GAP5) if attention_weights else (4, _BOX, _GAP)
    operations = any(f"op^{r}" in names for r in "QKV")
    gaps = [gap] * (columns - 1)
    if operations:  # room on the arrow W -> product for the operation's name
        width, gaps = (_BOX_OP if attention_weights else _BOX), [_GAP_OP] * (columns - 1)
        gaps[1] = _OP_GAP
    left = (_WIDTH - columns * width - sum(gaps)) / 2
    column = [left + i * width + sum(gaps[:i]) for i in range(columns)]
    value_name = "X_V" if value is not None else key_name
    letters = rf"$Q = X,\ K = {key_name},\ V = {value_name}$"  # cross-attention: the inputs differ
    if self_attention:
        letters = "self-attention: $Q = K = V = X$"  # only there: K = V = memory in cross
    elif key_name == value_name:
        letters = rf"$Q = X,\ K = V = {key_name}$"
    head_i = ("(the paper, head $i$): products,", "strip $i$ of $Q$, $K$, $V$")
    notes: tuple[tuple[int, list[str], str], ...] = tuple(  # (column, its lines, gid)
        (i, ["\n".join(_wrapped(line, width + min(gaps) - 0.08, _NOTE_SIZE)) for line in lines], gid)
        for i, lines, gid in (
            (0, (r"$\mathrm{MultiHead}(Q, K, V)$", "(the paper): inputs,", letters), "paper:X"),
            (1, weights_lines, "paper:W"),  # by default, the loose use
            (2, (r"$\mathrm{Attention}(Q, K, V)$", *head_i), "paper:Q"),  # one head's products
        )
    )  # each line broken where it is wider than its column, so that notes never run together
    note_lines = max(sum(line.count("\n") + 1 for line in lines) for _, lines, _ in notes)

    # W^Q (K, V): its name and shape, a library's name, and its heads' strip W_1^Q ... W_h^Q;
    # its operation below it, and the row as tall as both (never less than the old row).
    named_weights = any(f"W^{r}" in names for r in "QKV")
    weight_height = _WEIGHT_TITLE + _WEIGHT_NAME * named_weights + _WEIGHT_STRIP
    node_offset = weight_height + _INTO_NODE  # the operation's top, from its row's top
    box_height = max(_BOX_HEIGHT, node_offset + _ROW_NODE + 0.02)
    row_height = box_height + (_ROW - _BOX_HEIGHT)
    height = 0.75 + 3 * row_height + 0.25  # room under the products for their strips' label
    band_top = height + 0.05  # what texts call Q, K, V (paper=True): below the strips' label
    if paper:
        height = band_top + _PAPER_BAND + _NOTE_LINE * (note_lines - 3)
    projection_top = height + 0.1  # W^O's row: below the strips' label (and the band)
    if output_projection:  # W^O and its operation, a gap, then the layer's output
        height = projection_top + _PARAM_HEIGHT + _OUT_GAP + _BOX_HEIGHT + 0.15
    figure = Figure(figsize=(_WIDTH, height), dpi=100)
    ax: Axes = figure.add_axes((0.0, 0.0, 1.0, 1.0))
    ax.set_xlim(0, _WIDTH)
    ax.set_ylim(height, 0)  # y grows downwards: Q on top
    ax.axis("off")
    # The second column holds the operations (X -> X W^Q + b^Q), each with its learned
    # weights entering from above: a header over both, not "parameters" alone.
    second = ("operations", "with their trainable weights")
    headers = [
        ("input", "computed per sequence"),
        second,
        ("products", "computed from the input"),
        ("attention", "every head, side by side"),
    ]
    if attention_weights:  # narrower columns, shorter subtitles
        headers = [
            ("input", "per sequence"),
            second,
            ("products", "from the input"),
            ("attention", "where to look"),
            ("output", "weighted values"),
        ]
    for x0, (title, subtitle) in zip(column, headers, strict=True):
        ax.text(x0 + width / 2, 0.2, title, ha="center", va="center", fontsize=FONT, weight="bold",
                color=TEXT_COLOUR)  # fmt: skip
        ax.text(x0 + width / 2, 0.45, subtitle, ha="center", va="center", fontsize=FONT * 0.75,
                color=TEXT_COLOUR)  # fmt: skip

    def row_top(i: float) -> float:
        return 0.7 + i * row_height + (row_height - box_height) / 2

    def box(x0: float, top: float, bottom: float, colour: str, label: str, shape: str, gid: str) -> None:
        from matplotlib.colors import to_rgba
        from matplotlib.patches import FancyBboxPatch

        ax.add_patch(
            FancyBboxPatch((x0, top), width, bottom - top, boxstyle="round,pad=0,rounding_size=0.06",
                           facecolor=to_rgba(colour, 0.18), edgecolor=colour, linewidth=1.4, gid=gid)
        )  # fmt: skip
        middle = (top + bottom) / 2
        plain = gid in ("output", "layer output")  # joined, or the layer's output: words
        title = (label, FONT * 0.9) if plain else (math(label), FONT * 1.25)
        lines: list[tuple[str, float, str | None]] = [(*title, None), (shape, FONT * 0.85, None)]
        if gid in names:  # a library's name, smaller where it would overflow the box
            name = names[gid]
            fits = (width - 0.1) * 72 / (0.6 * len(name))  # monospace: 0.6 em a letter
            if fits < FONT * 0.7 and "(" in name:  # too small: break after the "("
                name = name.replace("(", "(\n", 1)
                fits = (width - 0.1) * 72 / (0.6 * max(len(part) for part in name.split("\n")))
            lines.append((name, min(FONT * 0.75, fits), "monospace"))
        elif gid == "output" and not attention_weights:
            lines.append((r"$\mathrm{softmax}(Q_i K_i^\top/\sqrt{d_k})\,V_i$", FONT * 0.75, None))
        elif gid == "output":
            lines.append((r"joined, before $W^O$", FONT * 0.75, None))
        elif gid == "layer output":  # the paper's name for it, with this figure's inputs
            lines.append((multihead, FONT * 0.75, None))
        offsets = {1: [0.0], 2: [-0.14, 0.14], 3: [-0.26, 0.0, 0.24]}[len(lines)]
        if "\n" in lines[-1][0] or (gid == "output" and output_projection):  # a strip below
            offsets = [-0.3, -0.08, 0.15]  # everything a little higher, clear of the strip
        for (text, size, family), offset in zip(lines, offsets, strict=True):
            ax.text(x0 + width / 2, middle + offset, text, ha="center", va="center", fontsize=size,
                    color=TEXT_COLOUR, family=family)  # fmt: skip

    def param(x0: float, top: float, colour: str, label: str, shape: str, heads: int = 0) -> None:
        """A parameter: a short box above its operation, its name and shape on one line.

        With ``heads``, W^Q (K, V) is cut into its heads' column blocks, a strip along
        its bottom in the heads' colours: the big W^Q is the W_i^Q side by side.
        """
        from matplotlib.colors import to_rgba
        from matplotlib.patches import FancyBboxPatch

        tall = weight_height if heads else _PARAM_HEIGHT
        ax.add_patch(
            FancyBboxPatch((x0, top), width, tall, boxstyle="round,pad=0,rounding_size=0.05",
                           facecolor=to_rgba(colour, 0.18), edgecolor=colour, linewidth=1.4, gid=label)
        )  # fmt: skip
        lines: list[tuple[str, float, str | None]] = [(f"{math(label)} {shape}", FONT * 0.8, None)]
        if label in names:
            name = names[label]
            lines.append((name, min(FONT * 0.75, (width - 0.1) * 72 / (0.6 * len(name))), "monospace"))
        if heads:  # each line in its own band, the strip below them
            for j, (text, size, family) in enumerate(lines):
                y = top + _WEIGHT_TITLE / 2 + 0.02 + j * _WEIGHT_NAME
                ax.text(x0 + width / 2, y, text, ha="center", va="center", fontsize=size, color=TEXT_COLOUR,
                        family=family)  # fmt: skip
            weight_strip(x0, top + tall - 0.05, heads, label)
            return
        offsets = [0.0] if len(lines) == 1 else [-0.09, 0.1]
        for (text, size, family), offset in zip(lines, offsets, strict=True):
            ax.text(x0 + width / 2, top + _PARAM_HEIGHT / 2 + offset, text, ha="center", va="center",
                    fontsize=size, color=TEXT_COLOUR, family=family)  # fmt: skip

    def operation_node(x0: float, top: float, colour: str, label: str, product: str,
                       tall: float = _ROW_NODE) -> None:  # fmt: skip
        """The operation on the arrow from the input to its product: white, outlined."""
        from matplotlib.patches import FancyBboxPatch

        ax.add_patch(
            FancyBboxPatch((x0, top), width, tall, boxstyle="round,pad=0,rounding_size=0.15",
                           facecolor="white", edgecolor=colour, linewidth=1.2, gid=f"op^{product}")
        )  # fmt: skip
        family = None if label.startswith("$") else "monospace"
        size = FONT * 0.85 if family is None else min(FONT * 0.8, (width - 0.1) * 72 / (0.6 * len(label)))
        ax.text(x0 + width / 2, top + tall / 2, label, ha="center", va="center", fontsize=size,
                color=TEXT_COLOUR, family=family)  # fmt: skip

    def head_cells(x0: float, top: float, tall: float, count: int, gid: str, text_gid: str,
                   name: Callable[[int], str] | None = None) -> None:  # fmt: skip
        """One cell per head across a box, each in its head's colour (as in the book's other
        head figures), named ``name(j)`` where that fits, else numbered where a digit fits."""
        from matplotlib.patches import Rectangle

        left, right = x0 + 0.08, x0 + width - 0.08
        cell = (right - left) / count
        named = name is not None and cell >= 0.3  # W_i^Q: three heads in five columns, four in four
        numbered = cell >= 0.14  # a digit: up to 6 heads in five columns, 9 in four
        for j in range(count):
            colour = palette[j % len(palette)]  # repeating only when fewer colours than heads
            ax.add_patch(Rectangle((left + j * cell, top), cell, tall, facecolor=colour, alpha=_STRIP_ALPHA,
                                   edgecolor="white", linewidth=0.4, gid=gid))  # fmt: skip
            if named or numbered:  # in ink that reads at 4.5:1
                text = name(j) if name is not None and named else str(j + 1)
                ax.text(left + (j + 0.5) * cell, top + tall / 2, text, ha="center", va="center",
                        fontsize=FONT * (0.85 if named else 0.75), color=readable_ink(colour),
                        gid=text_gid)  # fmt: skip

    def weight_strip(x0: float, bottom: float, count: int, label: str) -> None:
        """W^Q's column blocks W_1^Q ... W_h^Q, named where the name fits."""
        strip, letter = _WEIGHT_STRIP - 0.07, label[-1]
        head_cells(x0, bottom - strip, strip, count, f"heads:{label}", f"head-name:{label}",
                   lambda j: math(f"W_{{{j + 1}}}^{letter}"))  # fmt: skip

    def head_strip(x0: float, bottom: float, count: int, product: str) -> None:
        """The product's column blocks, one cell per head, along the bottom of its box."""
        head_cells(x0, bottom - 0.06 - 0.12, 0.12, count, f"heads:{product}", f"head-number:{product}")

    def arrow(x0: float, y0: float, x1: float, y1: float) -> None:
        ax.annotate("", xy=(x1, y1), xytext=(x0, y0),
                    arrowprops={"arrowstyle": "-|>", "color": EDGE_COLOUR, "linewidth": 1.0,
                                "shrinkA": 0, "shrinkB": 0})  # fmt: skip

    centre = {i: row_top(i) + box_height / 2 for i in (0, 0.5, 1, 1.5, 2)}
    node = {i: row_top(i) + node_offset + _ROW_NODE / 2 for i in (0, 1, 2)}  # the arrow's height
    for name, tensor, fed in inputs:
        top, bottom = row_top(min(fed)), row_top(max(fed)) + box_height
        if len(fed) == 3:  # one X for the three rows: a box of one row's height, in the middle
            top, bottom = row_top(1), row_top(1) + box_height
        box(column[0], top, bottom, ROLE_COLOURS["x"], name, _shape(*tensor.shape), name)
        for i in fed:  # into the operation, not into the weights
            arrow(column[0] + width, (top + bottom) / 2, column[1], node[i])
    # Where each product goes, and the row the output sits in.
    target, out_row = ({0: 0.5, 1: 0.5, 2: 1.5}, 1.5) if attention_weights else ({0: 1, 1: 1, 2: 1}, 1)
    for i, (role, w_name, w_shape, p_name, p_shape) in enumerate(rows):
        top = row_top(i)
        param(column[1], top, ROLE_COLOURS[role], w_name, w_shape, h if role == "q" else h_kv)
        operation = names.get(f"op^{p_name}")
        node_top = top + node_offset
        bias = rf" + b^{p_name}" if getattr(weights, f"b_{role}") is not None else ""
        default = rf"$\times\,W^{p_name}{bias}$"  # what the operation does; the product names itself
        operation_node(column[1], node_top, ROLE_COLOURS[role], operation or default, p_name)
        arrow(column[1] + width / 2, top + weight_height, column[1] + width / 2, node_top)  # W enters
        arrow(column[1] + width, node[i], column[2], node[i])
        middle = (column[1] + width + column[2]) / 2
        ax.text(middle, node[i] - 0.13, math(f"XW^{p_name} + b^{p_name}") if operation else "", ha="center",
                va="center", fontsize=FONT * 0.75, color=TEXT_COLOUR)  # fmt: skip
        box(column[2], top, top + box_height, ROLE_COLOURS[role], p_name, p_shape, p_name)
        head_strip(column[2], top + box_height, h if role == "q" else h_kv, p_name)
        end = column[columns - 1] if role == "v" else column[3]
        arrow(column[2] + width, centre[i], end, centre[target[i]])
    # What the strips are: the products' column blocks, one cell per head.
    strips = (  # say that each cell is a head
        f"strips: heads 1 to {h}, {d_k} columns each"
        if (h, d_k) == (h_kv, d_v)
        else f"strips: {h} heads ($Q$), {h_kv} ($K$, $V$), one cell per head"
    )
    if max(h, h_kv) > len(palette):  # too many for a colour each, and too narrow for a digit
        strips += f" (colours repeat after {len(palette)})"
    ax.text(column[2] + width / 2, row_top(2) + box_height + 0.16, strips, ha="center", va="center",
            fontsize=FONT * 0.8, color=TEXT_COLOUR, gid="heads-label")  # fmt: skip
    if paper:  # what texts call Q, K, V: one note under each column it names
        ax.plot([column[0], column[2] + width], [band_top + 0.02] * 2, color=EDGE_COLOUR, linewidth=0.6,
                linestyle=":")  # fmt: skip
        ax.text(column[0], band_top + 0.16, "what texts call $Q$, $K$, $V$:", ha="left", va="center",
                fontsize=FONT * 0.78, weight="bold", color=TEXT_COLOUR, gid="paper-header")  # fmt: skip
        for i, note, gid in notes:
            row = 0  # a line broken in two takes two rows
            for line in note:
                offset = 0.38 + _NOTE_LINE * (row + line.count("\n") / 2)
                row += line.count("\n") + 1
                ax.text(column[i] + width / 2, band_top + offset, line, ha="center", va="center",
                        fontsize=_NOTE_SIZE, color=TEXT_COLOUR, gid=gid,
                        linespacing=_NOTE_LINE * 72 / _NOTE_SIZE)  # fmt: skip
    if attention_weights:
        box(column[3], row_top(0.5), row_top(0.5) + box_height, ROLE_COLOURS["weights"], "A",
            _shape(h, T, S), "A")  # fmt: skip
        below = row_top(0.5) + box_height
        per_head = r"$(h, T, S)$: $T \times S$ per head"  # under A: how to read its shape
        ax.text(column[3] + width / 2, below + 0.17, per_head, ha="center", va="center", fontsize=FONT * 0.8,
                color=TEXT_COLOUR)  # fmt: skip
        formula = r"$\mathrm{softmax}(Q_i K_i^\top/\sqrt{d_k})$"  # what makes it: above A,
        ax.text(column[3] + width / 2, row_top(0.5) - 0.2, formula, ha="center", va="center",
                fontsize=FONT * 0.8, color=TEXT_COLOUR, gid="A-formula")  # by Q's and K's arrows
        # A -> output ends on the output's top edge, clear of the text under A.
        arrow(column[3] + width, centre[0.5], column[4] + width / 2, row_top(out_row))
    out_shape = _shape(T, f"{h}·{d_v}")
    top = row_top(out_row)
    colour = ROLE_COLOURS["o"] if attention_weights else ROLE_COLOURS["weights"]
    box(column[columns - 1], top, top + box_height, colour, "heads' outputs", out_shape, "output")
    if output_projection:  # × W^O: the joined outputs down, W^O in from the left
        last, beside = column[columns - 1], column[columns - 2]
        head_strip(last, top + box_height, h, "output")  # the heads, joined side by side
        w_o_shape = _shape(f"{h}·{d_v}", weights.w_o.shape[1])  # (h·d_v, d_model)
        param(beside, projection_top, ROLE_COLOURS["o"], "W^O", w_o_shape)
        node_top = projection_top + (_PARAM_HEIGHT - _NODE_HEIGHT) / 2
        operation_node(last, node_top, ROLE_COLOURS["o"], r"$\times\,W^O$", "O", _NODE_HEIGHT)
        middle = projection_top + _PARAM_HEIGHT / 2
        arrow(beside + width, middle, last, middle)  # W^O enters from the side
        arrow(last + width / 2, top + box_height, last + width / 2, node_top)  # the heads, joined
        out_top = projection_top + _PARAM_HEIGHT + _OUT_GAP
        arrow(last + width / 2, node_top + _NODE_HEIGHT, last + width / 2, out_top)
        box(last, out_top, out_top + _BOX_HEIGHT, ROLE_COLOURS["o"], "layer's output",
            _shape(T, weights.w_o.shape[1]), "layer output")  # fmt: skip
    return figure


def tied_preference(
    queries: torch.Tensor,
    *,
    token: int | Sequence[int] = 0,
    names: Sequence[str] | None = None,
    title: str | None = None,
    reach: float = 1.25,
    shade: float = 0.12,
) -> Figure:
    """Why one matrix for queries and keys keeps a token on itself: the circle picture.

    With W^K = W^Q, token t's score for s minus its score for itself is
    q_t . (q_s - q_t) / sqrt(d_k), whatever the biases, so t prefers s to itself
    exactly when q_s reaches past the line that touches the circle of radius
    ||q_t|| at q_t's tip: a region wholly outside the circle, where only a longer
    query reaches (the Cauchy-Schwarz inequality). Several tokens give one panel
    each, side by side on the same scale: two panels show why two tokens cannot
    each prefer the other, since the shorter query lies inside the longer one's circle.

    Parameters
    ----------
    queries : Tensor, shape (T, 2)
        One head's queries q_1, ..., q_T, with two features so they can be drawn.
    token : int or sequence of int
        The position (from 0) of the token t whose circle is drawn; several
        positions draw one panel each.
    names : sequence of str, optional
        One label per query; default ``"q_1"``, ``"q_2"``, ... (positions from 1).
    title : str, optional
        The figure's title: say what to look at.
    reach : float, default 1.25
        How far the axes reach from 0, as a multiple of the longest query's length.
        The longest query's half-plane starts at its own length, so a larger reach
        shows more of it.
    shade : float, default 0.12
        The opacity of the shaded half-plane, from 0 to 1.

    Returns
    -------
    matplotlib.figure.Figure
        One axes per token. In each, the circle has gid ``"circle"``, the shaded
        half-plane where t prefers a token to itself ``"prefers"``, and query s's
        arrow ``"query-{s}"`` (from 0); an arrow's colour is the key colour where t
        prefers s to itself, grey where not; t's own arrow has its circle's ink, since
        the query colour would mark the same vector as a query in one panel and a key in
        the next.

    See Also
    --------
    data_flow : the three meanings of Q, K and V.
    :doc:`terminology` : why three matrices, not one.

    Examples
    --------
    >>> import torch, qkv
    >>> queries = torch.tensor([[1.0, 0.0], [1.5, 0.5], [0.2, 1.0]])
    >>> figure = qkv.diagrams.tied_preference(queries)
    >>> [p.get_gid() for p in figure.axes[0].patches][:2]
    ['prefers', 'circle']
    >>> len(qkv.diagrams.tied_preference(queries, token=(0, 1)).axes)
    2
    """
    require_matplotlib()
    from matplotlib.figure import Figure

    from qkv._validation import require_tensor, shape_str

    points = require_tensor("queries", queries, ndim=2, layout="(T, 2)").detach().double().cpu()
    if points.shape[1] != 2:
        raise ValueError(f"queries must have 2 features to draw, got shape {shape_str(tuple(points.shape))}")
    count = points.shape[0]
    tokens = [token] if isinstance(token, int) else list(token)
    if not tokens:
        raise ValueError("token must name at least one position")
    for t in tokens:
        if not isinstance(t, int) or not 0 <= t < count:
            raise ValueError(f"token must be a position from 0 to {count - 1}, got {t}")
    labels = [f"q_{s + 1}" for s in range(count)] if names is None else [str(n) for n in names]
    if len(labels) != count:
        raise ValueError(f"names has {len(labels)} labels, but queries has {count} rows")
    for t in tokens:
        if float(points[t].norm()) == 0.0:
            raise ValueError("the chosen token's query is zero: it has no circle to draw")
    if reach <= 1:
        raise ValueError(f"reach must be more than 1, so the longest query fits, got {reach}")
    if not 0 < shade <= 1:
        raise ValueError(f"shade must be an opacity in (0, 1], got {shade}")
    extent = reach * float(points.norm(dim=-1).max())
    figure = Figure(figsize=(4.6 * len(tokens) - 0.4 * (len(tokens) - 1), 4.8), dpi=100, layout="constrained")
    axes = figure.subplots(1, len(tokens), squeeze=False)[0]
    for ax, t in zip(axes, tokens, strict=True):
        _tied_panel(ax, points, t, labels, extent, shade)
        if len(tokens) > 1:
            ax.set_title(f"{math(labels[t])}'s circle", fontsize=FONT + 1)
    if title is not None:
        if len(tokens) > 1:
            figure.suptitle(title, fontsize=FONT + 1)
        else:
            axes[0].set_title(title, fontsize=FONT + 1)
    return figure


def _tied_panel(
    ax: Axes, points: torch.Tensor, token: int, labels: list[str], reach: float, shade: float
) -> None:
    """Draw one token's circle, its half-plane and every query's arrow on ``ax``."""
    import torch
    from matplotlib.colors import to_rgba
    from matplotlib.patches import Circle, FancyArrow, Polygon

    q_t = points[token]
    radius = float(q_t.norm())
    along, across = q_t / radius, torch.stack((-q_t[1], q_t[0])) / radius
    far = 4 * reach  # the half-plane, cut to a large square beyond the tangent line
    corners = [q_t + far * across, q_t + far * across + far * along, q_t - far * across + far * along]
    corners.append(q_t - far * across)
    ax.add_patch(
        Polygon(
            [tuple(c.tolist()) for c in corners], closed=True, facecolor=to_rgba(ROLE_COLOURS["k"], shade),
            edgecolor=ROLE_COLOURS["k"], linestyle="--", linewidth=1.4, gid="prefers",
            label=f"{math(labels[token])} prefers these to itself",
        )
    )  # fmt: skip
    ax.add_patch(
        Circle(
            (0.0, 0.0), radius, fill=False, edgecolor=TEXT_COLOUR, linewidth=1.2, gid="circle",
            label="radius " + math(rf"\Vert {labels[token]} \Vert"),
        )
    )  # fmt: skip
    for s, point in enumerate(points):
        prefers = s != token and float(q_t @ (point - q_t)) > 0
        # t's own arrow in its circle's ink: blue here and vermillion in the next panel
        # would read as a change of role
        colour = TEXT_COLOUR if s == token else (ROLE_COLOURS["k"] if prefers else ROLE_COLOURS["x"])
        ax.add_patch(
            FancyArrow(
                0.0, 0.0, float(point[0]), float(point[1]), width=0.012 * reach, head_width=0.06 * reach,
                length_includes_head=True, color=colour, gid=f"query-{s}",
            )
        )  # fmt: skip
        # the label sits beyond the arrow's tip, along its direction, clear of the head
        direction = point / max(float(point.norm()), 1e-12)
        dx, dy = float(direction[0]), float(direction[1])
        ha = "left" if dx > 0.4 else ("right" if dx < -0.4 else "center")
        va = "bottom" if dy > 0.4 else ("top" if dy < -0.4 else "center")
        ax.annotate(
            math(labels[s]), (float(point[0]), float(point[1])), xytext=(9 * dx, 9 * dy),
            textcoords="offset points", ha=ha, va=va, fontsize=FONT, color=colour,
        )  # fmt: skip
    ax.set_xlim(-reach, reach)
    ax.set_ylim(-reach, reach)
    ax.set_aspect("equal")
    ax.axhline(0, color=EDGE_COLOUR, linewidth=0.5)
    ax.axvline(0, color=EDGE_COLOUR, linewidth=0.5)
    ax.set_xlabel("query feature 1 (one matrix: $W^K = W^Q$)")  # the tied case only
    ax.set_ylabel("query feature 2")
    # below the axes, so it covers no circle, arrow or label however the queries lie
    ax.legend(loc="upper center", bbox_to_anchor=(0.5, -0.16), fontsize=FONT - 1, frameon=False)
