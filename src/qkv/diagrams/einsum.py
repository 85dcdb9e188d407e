"""The shapes of one cross-attention layer, in the letters of an einsum string.

:func:`cross_attention_shapes` draws one layer's data flow to scale, every block
named by its einsum letters as well as its sizes, and each input by the keyword it
is passed with (``key=enc_output``: what the layer is handed as ``key`` becomes K
only through W^K). The query ``N × I`` becomes
``N × H × O`` through W^Q, the memory ``M × I′`` becomes ``M × H × O`` through W^K
and through W^V, Q and K meet in ``H × N × M`` scores, the softmaxed scores weight an average of V's rows, and
W^O maps the ``H × O`` head features back to ``I``. The four weight matrices, the
layer's own learned parameters, are the only blocks in strong colours; the data
(inputs, what the layer computes, its output) are grey or pale. The decoder's
residual, which adds the query to the output, is a note beside the output: it is
the decoder's step, not the layer's.
:func:`memory_fan_out` draws one memory feeding the W^K and W^V of several
layers, each its own. The letters are TensorFlow Addons' (``"...NI , HIO -> ...NHO"``): N query positions,
M key and value positions, H heads, I and I′ the inputs' features, O the head size.
O means the head size throughout: Addons' own output string, ``"...NHI,HIO->...NO"``,
reuses I for the head size and O for the output's features; here W^O is
``H × O × I``.

See also
--------
The chapter :doc:`cross_attention` (book/cross_attention.ipynb): what
``key=enc_output`` means, and what N, M and O count.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

from qkv._validation import require_size, shape_str
from qkv.diagrams._draw import EDGE_COLOUR, ROLE_COLOURS, Canvas, as_matrix, head_weights, require_matplotlib

if TYPE_CHECKING:  # pragma: no cover
    from matplotlib.figure import Figure

__all__ = ["cross_attention_shapes", "memory_fan_out"]

_MAX_WIDTH = 7.0  # inches: the book's column
_DATA_ALPHA = 0.4  # Q, K, V, the scores: pale, so that only the learned weights are strong


def _argument(keyword: str, name: str) -> str:
    """A keyword argument as typed maths: ``key``, ``enc_output`` -> ``key=enc_output``."""
    return r"\mathtt{" + keyword + "{=}" + name.replace("_", r"\_") + "}"


def cross_attention_shapes(
    layer: object,
    query: object,
    memory: object,
    *,
    query_name: str = "query",
    memory_name: str = "memory",
    title: str | None = None,
    paper_letters: bool = False,
    paper_inputs: bool = False,
    book_names: bool = False,
    product_names: bool = False,
    heads_colour: str = "#8FD3BE",
) -> Figure:
    """One cross-attention layer to scale, each block named by its einsum letters.

    Three rows project the inputs, ``query (N × I) · W^Q (I × H × O) = Q (N × H × O)``
    and ``memory (M × I′) · W^K = K``, ``· W^V = V`` (each ``M × H × O``), with white
    lines between the heads; Q and K meet in the ``H × N × M`` scores, drawn as a stack
    of N × M maps whose rows and columns are labelled (N target positions, M source
    positions); the softmaxed scores weight an average of V's rows into ``heads (N × H × O)``, and ``W^O
    (H × O × I)``, its head blocks of O rows split by white lines, maps them back to the
    query's ``I`` features, as wide as the query. The learned weights (W^Q, W^K, W^V,
    W^O; each layer has its own) are drawn in strong colours, the data in grey (inputs,
    output) or pale (Q, K, V, scores, heads), and a legend line says so. The decoder's
    residual (``out1 + output``) is not in the layer's equation: an arrow from the
    output leads to a note saying the decoder adds the query next, entry by entry: both
    are ``N × I``. Each input is labelled as the layer's call passes it,
    ``query=out1``, ``key=enc_output`` and ``value=enc_output``: the input named ``key``
    is not K, but what W^K multiplies into K. A line under the title says what each
    letter counts, and the inputs' and the output's captions say what their rows are
    (target or source positions); O is the head size throughout, in W^O too (Addons'
    output string reuses I and O otherwise, so the default title names no library's
    letters). One sequence, no batch axis; the biases (if any) are not drawn. The sizes are read
    from the objects passed; a block's caption gives its letters and its sizes, e.g. ``N
    × H × O = (4, 2, 5)``.

    Parameters
    ----------
    layer : HeadWeights, a module with ``to_heads()``, or a Keras layer
        The layer: a built ``keras.layers.MultiHeadAttention`` (read with
        :func:`qkv.interop.from_keras`), a :class:`qkv.MultiHeadAttention`, or
        per-head weights. Its query and key heads must be
        ``d_k = d_v`` wide and as many (no grouped K/V heads).
    query : Tensor, shape (N, I) or (B, N, I)
        The query input (the decoder's states); of a batch, the first sequence.
    memory : Tensor, shape (M, I′) or (B, M, I′)
        The key and value input (the encoder's output); of a batch, the first
        sequence.
    query_name, memory_name : str
        What the two inputs are called in the reader's code (``"out1"``,
        ``"enc_output"``); the inputs are labelled ``query=out1``,
        ``key=enc_output`` and ``value=enc_output``.
    title : str, optional
        A title; the default says what the picture shows.
    paper_letters : bool, default False
        Name the blocks as the paper's ``MultiHead(Q, K, V)`` does, whose Q, K and V
        are the layer's inputs and whose heads use ``Q W_i^Q``, ``K W_i^K`` and
        ``V W_i^V``: each input block is marked ``the paper's K`` (Q, V), under its
        keyword, the products read ``QW^Q``, ``KW^K`` and ``VW^V``, the scores
        ``QW^Q (KW^K)ᵀ/√O`` and V's average ``VW^V``'s. The blocks and sizes are the
        same either way. The default names the products Q, K and V, as Keras's code
        does (``key = self._key_dense(key)``), and draws what it drew before.
    paper_inputs : bool, default False
        Mark each input block ``the paper's Q`` (K, V), as ``paper_letters`` does, but
        keep the products named Q, K and V, as Keras's code and the book do: one name
        per product, and the paper's letters only on what the paper calls its inputs.
        ``paper_letters`` implies the marks.
    book_names : bool, default False
        Add a legend line giving each letter's name elsewhere in the book (its front
        page's): N = T, M = S, H = h, O = d_k, I = d_model, I′ = d_enc. The default
        draws no such line.
    product_names : bool, default False
        Title each product with the input that makes it, ``Q = out1·W^Q``,
        ``K = enc_output·W^K`` and ``V = enc_output·W^V`` (the inputs as
        ``query_name`` and ``memory_name`` give them), so that the input and its product
        do not both read as plain K. The default titles them Q, K and V, as before;
        ``paper_letters``, which titles them ``QW^Q`` and so on, takes precedence.
        K's arrow to the scores then runs right, clear of K's longer title, then up
        beside the scores' captions, and into the scores.
    heads_colour : str, default "#8FD3BE"
        The fill of the ``heads (N × H × O)`` block. The default, a pale green, is
        what the picture always drew; pass a grey (say ``"#C8C8C8"``) so that the
        heads, data like the inputs and the output, do not read as V's green.

    Returns
    -------
    matplotlib.figure.Figure

    Raises
    ------
    ValueError
        When an input's features do not match the layer's weights (``query has 9
        features, but the layer's embed_dim is 8``), or the layer has grouped K/V
        heads or ``d_v != d_k``.

    See Also
    --------
    qkv.diagrams.cross_attention : every decoder layer of a model, in the book's letters.
    :doc:`cross_attention` : what ``key=enc_output`` means, and N, M and O.

    Examples
    --------
    >>> import torch
    >>> import qkv
    >>> from qkv.diagrams import texts_of
    >>> layer = qkv.MultiHeadAttention(10, 2, kdim=6, vdim=6)  # H = 2 heads of O = 5
    >>> figure = cross_attention_shapes(layer, torch.zeros(4, 10), torch.zeros(7, 6))
    >>> "H × N × M = (2, 4, 7)" in texts_of(figure)
    True
    """
    require_matplotlib()
    if type(layer).__module__.startswith("keras") and hasattr(layer, "key_dense"):
        from qkv.interop import from_keras

        weights = from_keras(layer)
    else:
        weights = head_weights(layer)
    q = as_matrix("query", query, layout="(N, I)")
    kv = as_matrix("memory", memory, layout="(M, I′)")
    require_size("query", q, 1, weights.embed_dim, "features", "the layer's embed_dim")
    require_size("memory", kv, 1, weights.kdim, "features", "the layer's kdim")
    require_size("memory", kv, 1, weights.vdim, "features", "the layer's vdim")
    if weights.num_kv_heads != weights.num_heads or weights.d_v != weights.d_k:
        raise ValueError(
            "cross_attention_shapes draws one head size O for queries, keys and values: the layer has "
            f"{weights.num_heads} query heads of d_k = {weights.d_k} and {weights.num_kv_heads} K/V heads "
            f"of d_v = {weights.d_v} (w_q {shape_str(weights.w_q.shape)}, w_v {shape_str(weights.w_v.shape)})"
        )
    N, I = q.shape  # noqa: E741 - the einsum's letters
    M, I2 = kv.shape
    H, O = weights.num_heads, weights.d_k  # noqa: E741
    HO = H * O

    gap_in, text_in = 0.45, 0.42  # inches: the gap between blocks, the room for a caption
    cells_wide = max(I, I2) + 2 * HO + M + (H - 1) * 0.6
    unit = min(0.16, (_MAX_WIDTH - 4 * gap_in) / cells_wide)
    canvas = Canvas(1, 1, unit=unit, max_width=_MAX_WIDTH)  # resized below, once the layout is known
    gap, above, below = canvas.inch(gap_in), canvas.inch(0.35), canvas.inch(text_in)
    x_in = canvas.inch(0.1)
    x_w = x_in + max(I, I2) + gap
    x_p = x_w + HO + gap
    x_s = x_p + HO + gap + (canvas.inch(0.6) if product_names else 0)  # clear of Q's long title
    stack = canvas.inch(0.08)

    # Each input as the call passes it: query=out1, key=enc_output, value=enc_output.
    passed = [_argument("query", query_name), _argument("key", memory_name), _argument("value", memory_name)]
    rows = [
        ("Q", "q", passed[0], N, I, "N × I", "I × H × O", "N × H × O", (N, I), (I, H, O), (N, H, O)),
        ("K", "k", passed[1], M, I2, "M × I′", "I′ × H × O", "M × H × O", (M, I2), (I2, H, O), (M, H, O)),
        ("V", "v", passed[2], M, I2, "M × I′", "I′ × H × O", "M × H × O", (M, I2), (I2, H, O), (M, H, O)),
    ]
    heights = [above + max(r[3], r[4]) + below for r in rows]
    out_h = above + canvas.inch(0.3) + max(N, HO) + below
    legend_line = 0.16  # inches: one line of the legend
    # the title and the legend's lines (four, and a fifth with the book's names)
    title_h = canvas.inch(0.95 + legend_line + (legend_line if book_names else 0))
    width = max(x_s + M + (H - 1) * stack, x_in + HO + 2 * I + 3 * gap + canvas.inch(1.5)) + canvas.inch(1.3)
    height = title_h + sum(heights) + out_h
    canvas = Canvas(width, height, unit=unit, max_width=_MAX_WIDTH)
    default_title = "One cross-attention layer: the asker's letters and I′ (O: head size), Keras's layout"
    canvas.title(title or default_title)
    # Four short lines rather than three long ones: the legend sets the figure's width,
    # and a figure wider than the book's column shows every text smaller.
    legend = (f"N: {query_name}'s positions (target)   M: {memory_name}'s positions (source)\n"
              f"H: heads   O: head size (key_dim)   I, I′: the widths of {query_name} "
              f"and {memory_name}\nstrong colours: this layer's learned weights (each layer "
              f"has its own)\ngrey, pale: data   one sequence, biases not drawn")  # fmt: skip
    if book_names:  # the front page's names, on a line of their own
        legend += ("\nelsewhere in the book: N = $T$,  M = $S$,  H = $h$,  O = $d_k$,  "
                   r"I = $d_\mathrm{model}$,  I′ = $d_\mathrm{enc}$")  # fmt: skip
    canvas.text(x_in, canvas.inch(0.3), legend, ha="left", va="top", size=0.8, gid="legend")

    def caption(box: dict[str, float], letters: str, sizes: tuple[int, ...], rows: str = "") -> None:
        canvas.text((box["x"] + box["right"]) / 2, box["bottom"] + canvas.inch(0.05),
                    f"{letters} = {shape_str(sizes)}", va="top", size=0.8)  # fmt: skip
        if rows:  # what the rows count, on a line of its own
            canvas.text((box["x"] + box["right"]) / 2, box["bottom"] + canvas.inch(0.21),
                        f"rows: {rows}", va="top", size=0.8, gid="rows")  # fmt: skip

    def dividers(box: dict[str, float]) -> None:
        for c in range(O, HO, O):
            canvas.ax.plot([box["x"] + c] * 2, [box["y"], box["bottom"]], color="#FFFFFF", linewidth=1.8)

    def row_dividers(box: dict[str, float]) -> None:  # W^O: one block of O rows per head
        for r in range(O, HO, O):
            canvas.ax.plot([box["x"], box["right"]], [box["y"] + r] * 2, color="#FFFFFF", linewidth=1.8)

    y = title_h
    boxes: dict[str, dict[str, float]] = {}
    for (letter, role, name, length, features, l_in, l_w, l_out, s_in, s_w, s_out), h in zip(
        rows, heights, strict=True
    ):
        top = y + above
        middle = top + min(length, features) / 2
        box = canvas.matrix(
            x_in, top, length, features, ROLE_COLOURS["x"], label=name, gid=f"{letter}:input"
        )
        caption(box, l_in, s_in, "target positions" if letter == "Q" else "source positions")
        if paper_letters or paper_inputs:  # the input is what the paper's MultiHead(Q, K, V) calls Q
            canvas.text(box["x"] + features / 2, top + length / 2, f"the paper's {letter}", size=0.8,
                        gid=f"{letter}:paper", bbox={"boxstyle": "round,pad=0.2", "facecolor": "#FFFFFF",
                                                     "edgecolor": "none", "alpha": 0.85})  # fmt: skip
        canvas.operator(x_w - gap / 2, middle, "×")
        box = canvas.matrix(
            x_w, top, features, HO, ROLE_COLOURS[role], label=f"W^{letter}", gid=f"W^{letter}"
        )
        dividers(box)
        caption(box, l_w, s_w)
        canvas.operator(x_p - gap / 2, middle, "=")
        product = f"{letter}W^{letter}" if paper_letters else letter  # the paper's K W^K, or K
        if product_names and not paper_letters:  # K = enc_output·W^K: which input made it
            source = (query_name if letter == "Q" else memory_name).replace("_", r"\_")
            product = rf"{letter} = \mathtt{{{source}}}{{\cdot}}W^{letter}"
        box = canvas.matrix(x_p, top, length, HO, ROLE_COLOURS[role], label=product, gid=letter,
                            alpha=_DATA_ALPHA)  # data: pale
        dividers(box)
        caption(box, l_out, s_out)
        boxes[letter] = box
        y += h

    # The scores: H maps of N × M, stacked, level with Q; Q and K arrive from the left.
    s_top = title_h + above + (H - 1) * stack
    for j in reversed(range(1, H)):
        canvas.matrix(x_s + j * stack, s_top - j * stack, N, M, "#F5D08A", grid=False, gid=f"scores:head{j}",
                      alpha=_DATA_ALPHA)  # fmt: skip
    scores = canvas.matrix(x_s, s_top, N, M, ROLE_COLOURS["weights"], gid="scores", alpha=_DATA_ALPHA)
    if paper_letters:  # longer than the stack is wide: it starts at the stack, clear of QW^Q
        canvas.text(x_s, s_top - (H - 1) * stack - canvas.inch(0.06),
                    r"$QW^Q (KW^K)^\top / \sqrt{O}$ per head", ha="left", va="bottom", size=1.05)  # fmt: skip
    else:
        canvas.text(x_s + (M + (H - 1) * stack) / 2, s_top - (H - 1) * stack - canvas.inch(0.06),
                    r"$Q K^\top / \sqrt{O}$ per head", va="bottom", size=1.05)  # fmt: skip
    canvas.text(scores["x"], scores["bottom"] + canvas.inch(0.05), f"H × N × M = {shape_str((H, N, M))}",
                ha="left", va="top", size=0.8)  # fmt: skip  # left-aligned: clear of K's arrow
    for n, (axis, what) in enumerate((("rows", "N target positions"), ("columns", "M source positions"))):
        canvas.text(scores["x"], scores["bottom"] + canvas.inch(0.21 + 0.16 * n), f"{axis}: {what}",
                    ha="left", va="top", size=0.8, gid=f"scores:{axis}")  # fmt: skip
    q_box, k_box, v_box = boxes["Q"], boxes["K"], boxes["V"]
    canvas.arrow(q_box["right"], q_box["y"] + N / 2, x_s, s_top + N / 2)
    k_middle, y_end = k_box["y"] + M / 2, s_top + 0.85 * N  # ends on the block
    x_turn = x_s - canvas.inch(0.15)  # with product_names, K's long title: right, up, then in
    via = ((x_turn, k_middle), (x_turn, y_end)) if product_names and not paper_letters else ()
    canvas.arrow(k_box["right"], k_middle, x_s, y_end, via=via)

    # The output row: softmax(scores) averages V, head by head; W^O joins the heads.
    top = y + above + canvas.inch(0.3)  # room above for the lines that arrive
    middle = top + min(N, HO) / 2
    heads = canvas.matrix(x_in, top, N, HO, heads_colour, label=r"\mathrm{heads}", gid="heads")
    dividers(heads)
    caption(heads, "N × H × O", (N, H, O))
    x_wo = heads["right"] + gap
    canvas.operator(x_wo - gap / 2, middle, "×")
    w_o = canvas.matrix(x_wo, top, HO, I, ROLE_COLOURS["o"], label="W^O", gid="W^O")
    row_dividers(w_o)
    caption(w_o, "H × O × I", (H, O, I))
    x_out = w_o["right"] + gap
    canvas.operator(x_out - gap / 2, middle, "=")
    out = canvas.matrix(x_out, top, N, I, ROLE_COLOURS["x"], label=r"\mathrm{output}", gid="output")
    caption(out, "N × I", (N, I), "target positions")
    # The decoder's residual is the decoder's step, not the layer's: a note, not a term.
    x_note = out["right"] + gap
    canvas.arrow(out["right"], middle, x_note, middle)
    residual_note = (f"next, the decoder\n(not this layer) adds\n{query_name} + output:"
                     "\nboth N × I, so entry\nby entry")  # fmt: skip
    canvas.text(x_note + canvas.inch(0.05), middle, residual_note, ha="left", size=0.8, gid="residual")
    # V leaves for the heads (the weights average its rows), and so do the softmaxed scores.
    into = top - canvas.inch(0.3)  # just above the heads' label
    bend = top - canvas.inch(0.5)
    x_line = x_s + 0.75 * M
    canvas.ax.plot([x_line, x_line, heads["x"] + HO / 2], [scores["bottom"] + canvas.inch(0.62), bend, bend],
                   color="#333333", linewidth=1.0)  # fmt: skip
    canvas.arrow(heads["x"] + HO / 2, bend, heads["x"] + HO / 2, into)
    canvas.arrow(v_box["x"] + HO / 2, v_box["bottom"] + canvas.inch(0.3), v_box["x"] + HO / 2, bend)
    canvas.text(x_line + canvas.inch(0.08), (scores["bottom"] + canvas.inch(0.62) + bend) / 2,
                "softmax over M,\nthen a weighted\naverage of " + ("$VW^V$" if paper_letters else "V")
                + "'s rows", ha="left", size=0.8)  # fmt: skip
    return canvas.fit()


def memory_fan_out(
    layers: Sequence[object],
    memory: object,
    *,
    memory_name: str = "memory",
    title: str | None = None,
    branch_at: float = 0.0,
) -> Figure:
    """One memory, several cross-attention layers: each makes its own K and V from it.

    The memory (the encoder's output, ``M × I′``) is drawn once, on the left; an arrow
    leads from it to every layer's W^K and W^V (``I′ × H × O``, that layer's own
    learned weights, in strong colours), and each product, K or V (``M × H × O``,
    data, pale), sits to its right, labelled with the layer's number:
    ``K^(0) = memory · W^K(0)``. Blocks are to scale, with white lines between heads;
    one sequence, biases not drawn. The sizes are read from the objects passed.

    Parameters
    ----------
    layers : sequence of HeadWeights, modules with ``to_heads()``, or Keras layers
        The decoder layers' cross-attentions, in order: built
        ``keras.layers.MultiHeadAttention`` layers (read with
        :func:`qkv.interop.from_keras`), :class:`qkv.MultiHeadAttention` modules, or
        per-head weights. Each must read the memory's ``I′`` features.
    memory : Tensor, shape (M, I′) or (B, M, I′)
        The key and value input (the encoder's output); of a batch, the first
        sequence.
    memory_name : str
        What the memory is called in the reader's code (``"enc_output"``).
    title : str, optional
        A title; the default says what the picture shows.
    branch_at : float
        How far right of the memory, in inches, its arrows part: at 0 (the default)
        every arrow starts at the memory's right edge; above 0, one line runs to that
        point first, so that the arrows clear the note under the memory, which is wider
        than a narrow memory.

    Returns
    -------
    matplotlib.figure.Figure

    Raises
    ------
    ValueError
        When no layer is given, or the memory's features do not match a layer's
        ``kdim`` or ``vdim`` (``memory has 5 features, but layer 1's kdim is 6``).

    See Also
    --------
    cross_attention_shapes : one such layer, every step, in the same letters.
    :doc:`cross_attention` : what ``key=enc_output`` means, and N, M and O.

    Examples
    --------
    >>> import torch
    >>> import qkv
    >>> from qkv.diagrams import texts_of
    >>> layers = [qkv.MultiHeadAttention(10, 2, kdim=6, vdim=6) for _ in range(2)]
    >>> figure = memory_fan_out(layers, torch.zeros(7, 6))
    >>> "$K^{(1)}$" in texts_of(figure)
    True
    """
    require_matplotlib()
    from qkv.interop import from_keras

    if len(layers) == 0:
        raise ValueError("memory_fan_out needs at least one layer, but the sequence is empty")
    weights = [
        from_keras(layer) if type(layer).__module__.startswith("keras") else head_weights(layer)
        for layer in layers
    ]
    kv = as_matrix("memory", memory, layout="(M, I′)")
    for n, w in enumerate(weights):
        require_size("memory", kv, 1, w.kdim, "features", f"layer {n}'s kdim")
        require_size("memory", kv, 1, w.vdim, "features", f"layer {n}'s vdim")
    M, I2 = kv.shape  # the einsum's letters
    widths = [(w.num_kv_heads * w.d_k, w.num_kv_heads * w.d_v) for w in weights]
    widest = max(max(pair) for pair in widths)

    gap_in, above_in, below_in = 0.5, 0.3, 0.12  # inches: gaps, room for labels, between rows
    unit = min(0.1, (_MAX_WIDTH - 3.5) / (I2 + 2 * widest))
    canvas = Canvas(1, 1, unit=unit, max_width=_MAX_WIDTH)  # resized below, once the layout is known
    gap, above, below = canvas.inch(gap_in), canvas.inch(above_in), canvas.inch(below_in)
    row_h = above + max(I2, M) + below
    header = canvas.inch(0.25)
    title_h = canvas.inch(0.75)
    height = title_h + len(weights) * (header + 2 * row_h)
    x_in = canvas.inch(0.1)
    x_w = x_in + I2 + 2 * gap
    x_p = x_w + widest + gap
    width = x_p + widest + canvas.inch(1.6)
    canvas = Canvas(width, height, unit=unit, max_width=_MAX_WIDTH)
    count = {1: "one", 2: "two", 3: "three"}.get(len(weights), str(len(weights)))
    canvas.title(title or f"One {memory_name} feeds {count} decoder layers, each with its own weights")
    legend = (f"strong colours: each layer's own learned weights   grey, pale: data\n"
              f"M: {memory_name}'s positions   I′: its width   H × O: heads × head size   "
              f"each W: I′ × H × O = {shape_str((I2, weights[0].num_kv_heads, weights[0].d_k))}")  # fmt: skip
    canvas.text(x_in, canvas.inch(0.3), legend, ha="left", va="top", size=0.75, gid="legend")

    body = height - title_h
    top = title_h + (body - M) / 2
    name = r"\mathtt{" + memory_name.replace("_", r"\_") + "}"
    memory_box = canvas.matrix(x_in, top, M, I2, ROLE_COLOURS["x"], label=name, gid="memory")
    note = f"M × I′ = {shape_str((M, I2))}\none tensor, passed as\nkey and value\nto every layer"
    canvas.text((memory_box["x"] + memory_box["right"]) / 2, memory_box["bottom"] + canvas.inch(0.05),
                note, va="top", size=0.8)  # fmt: skip
    start = (memory_box["right"], top + M / 2)
    if branch_at > 0:  # one line to the branch point, clear of the note
        branch = (memory_box["right"] + canvas.inch(branch_at), top + M / 2)
        canvas.ax.plot([start[0], branch[0]], [start[1], branch[1]], color=EDGE_COLOUR, linewidth=1.0,
                       gid="branch")  # fmt: skip
        start = branch

    y = title_h
    for n, (w, (k_cols, v_cols)) in enumerate(zip(weights, widths, strict=True)):
        canvas.text(x_w, y + header / 2, f"decoder layer {n}", ha="left", size=0.95, weight="bold",
                    gid=f"layer{n}:header")  # fmt: skip
        y += header
        for letter, role, cols, size in (("K", "k", k_cols, w.d_k), ("V", "v", v_cols, w.d_v)):
            row_top = y + above
            middle = row_top + I2 / 2
            canvas.arrow(*start, x_w - canvas.inch(0.05), middle)
            box = canvas.matrix(x_w, row_top, I2, cols, ROLE_COLOURS[role],
                                label=rf"W^{{{letter}\,({n})}}", gid=f"W^{letter}({n})")  # fmt: skip
            for c in range(size, cols, size):  # white lines between heads
                canvas.ax.plot([box["x"] + c] * 2, [box["y"], box["bottom"]], color="#FFFFFF", linewidth=1.5)
            canvas.arrow(box["right"], middle, x_p - canvas.inch(0.05), row_top + M / 2)
            product = canvas.matrix(x_p, row_top, M, cols, ROLE_COLOURS[role], label=rf"{letter}^{{({n})}}",
                                    gid=f"{letter}({n})", alpha=_DATA_ALPHA)  # fmt: skip
            sizes = shape_str((M, cols // size, size))
            canvas.text(product["right"] + canvas.inch(0.1), row_top + M / 2, f"M × H × O\n= {sizes}",
                        ha="left", size=0.8)  # fmt: skip
            y += row_h
    return canvas.fit()
