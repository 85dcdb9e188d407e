"""Inference diagrams: cross-attention in every decoder layer, a decoding step with a KV cache, masks.

Three pictures of attention at work, each drawn from the objects a chapter uses:

- :func:`cross_attention`: every decoder layer projects the *same* encoder output
  through its *own* W^K and W^V, and its decoder states through its own W^Q;
  T queries against S keys.
- :func:`decoding_step`: one new token, its query heads against the cached keys and
  values of their K/V head, and the cache growing by one row.
- :func:`attention_map`: attention weights, one row per query, with the masked
  cells drawn as what they are: blocked, not small.

See also
--------
The chapter :doc:`cross_attention` (book/cross_attention.ipynb), for K and V made from
the encoder's output inside each decoder layer, and computed once per source.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np
import torch
from torch import nn

from qkv._validation import as_numpy, require_positive_int, require_size, shape_str
from qkv.cache import KVCache
from qkv.diagrams._draw import (
    EDGE_COLOUR,
    FONT,
    MASKED_COLOUR,
    MASKED_HATCH,
    ROLE_COLOURS,
    TEXT_COLOUR,
    Canvas,
    Cells,
    as_matrix,
    head_colour,
    head_weights,
    ink_on,
    math,
    register_cells,
    require_matplotlib,
)
from qkv.heads import HeadWeights
from qkv.masks import allowed_cells
from qkv.multihead import MultiHeadAttention

if TYPE_CHECKING:  # pragma: no cover
    from matplotlib.axes import Axes
    from matplotlib.figure import Figure

__all__ = ["attention_map", "bytes_per_step", "cross_attention", "decoding_step", "kv_sharing"]

# --- Geometry shared by the two block diagrams ---------------------------------------------------
#
# Blocks are drawn in cell units (one unit = one entry), text in inches: a label must stay
# readable however small the cells get. A 7-inch figure shown 390 px wide has 56 px per inch,
# so text is set at 12 pt (shape labels 10 pt, about 8 px there) whatever the cell size, and the
# room it needs is reserved in inches and converted to units once the unit is known.

_MAX_WIDTH = 7.0  # inches: the book's column
_MAX_UNIT = 0.16  # inches per cell when there is room (Canvas's default)
_MIN_WIDTH = 6.5  # inches: room for a title and a legend, however small the matrices
_FONT = FONT  # points, as every diagram
_GRID_UNIT = 0.07  # below this many inches per cell, white grid lines would hide the colour


@dataclass(frozen=True)
class _Scale:
    """Inches per cell unit, and the room text needs, in units."""

    unit: float

    def units(self, inches: float) -> float:
        return inches / self.unit

    @property
    def above(self) -> float:
        """Room above a block for its label (maths, 1.15 × the font, 0.06 inch above the block)."""
        return self.units(0.06 + 1.15 * _FONT * 1.6 / 72)

    @property
    def below(self) -> float:
        """Room below a block for its shape (0.85 × the font, 0.05 inch below the block)."""
        return self.units(0.05 + 0.85 * _FONT * 1.6 / 72)

    @property
    def line(self) -> float:
        """One line of text."""
        return self.units(_FONT * 1.9 / 72)

    @property
    def grid(self) -> bool:
        return self.unit >= _GRID_UNIT


def _unit(parts: Sequence[tuple[float, float]]) -> float:
    """The largest unit at which every part, ``units`` of cells plus ``inches`` of text, fits the column."""
    unit = _MAX_UNIT
    for cells, inches in parts:
        unit = min(unit, (_MAX_WIDTH - inches) / cells)
    return unit


def _canvas(width: float, height: float, scale: _Scale) -> Canvas:
    canvas = Canvas(width, height, unit=scale.unit, max_width=_MAX_WIDTH)
    canvas.font = _FONT  # readable at 390 px whatever the cell size (see above)
    return canvas


def _luminance(colour: str) -> float:
    """The Rec. 709 weighting of ``colour``'s red, green and blue: 0 (black) to 1 (white)."""
    from matplotlib.colors import to_rgb

    red, green, blue = to_rgb(colour)
    return 0.2126 * red + 0.7152 * green + 0.0722 * blue


def _fresh(colour: str) -> str:
    """``colour`` for what a step computes now: a light colour moved towards black, so that
    its new row stands apart from its cached rows (``_lighter``) by fill, not only outline."""
    from matplotlib.colors import to_hex, to_rgb

    if _luminance(colour) <= 0.55:
        return colour
    red, green, blue = to_rgb(colour)
    return to_hex((red * 0.65, green * 0.65, blue * 0.65))


def _lighter(colour: str) -> str:
    """``colour`` moved towards white, dark colours further than light ones, so that each stays visible."""
    from matplotlib.colors import to_hex, to_rgb

    red, green, blue = to_rgb(colour)
    amount = 0.1 + 0.6 * (1 - _luminance(colour))  # by luminance
    return to_hex((red + (1 - red) * amount, green + (1 - green) * amount, blue + (1 - blue) * amount))


def _head_dividers(canvas: Canvas, box: dict[str, float], size: int) -> None:
    """White lines between the heads of a block whose columns are heads of ``size`` columns each."""
    for c in range(size, int(box["cols"]), size):
        canvas.ax.plot([box["x"] + c] * 2, [box["y"], box["bottom"]], color="#FFFFFF", linewidth=1.8)


def _weight_and_product(
    canvas: Canvas, columns: tuple[float, float, float], top: float, middle: float, rows: tuple[int, int],
    cols: int, role: str, letter: str, layer: int, size: int, grid: bool,
) -> dict[str, float]:  # fmt: skip
    """``× W^{letter (layer)} = {letter}^(layer)``: the weight (rows[0], cols) and the product
    (rows[1], cols), heads divided every ``size`` columns; returns the product's box.

    The layer goes in a parenthesised superscript: a subscript is a head's index in this book.

    ``columns`` are the x of the weight and of the product, and the gap before each.
    """
    x_w, x_out, gap = columns
    canvas.operator(x_w - gap / 2, middle, "×")
    w_box = canvas.matrix(x_w, top, rows[0], cols, ROLE_COLOURS[role], label=f"W^{{{letter}\\,({layer})}}",
                          shape=(rows[0], cols), grid=grid, gid=f"W^{letter}{layer}")  # fmt: skip
    _head_dividers(canvas, w_box, size)
    canvas.operator(x_out - gap / 2, middle, "=")
    box = canvas.matrix(x_out, top, rows[1], cols, ROLE_COLOURS[role], label=f"{letter}^{{({layer})}}",
                        shape=(rows[1], cols), grid=grid, gid=f"{letter}{layer}")  # fmt: skip
    _head_dividers(canvas, box, size)
    return box


def _line(canvas: Canvas, xs: Sequence[float], ys: Sequence[float]) -> None:
    canvas.ax.plot(xs, ys, color=EDGE_COLOUR, linewidth=1.0, solid_capstyle="butt")


# --- Cross-attention ---------------------------------------------------------------------------


def _decoder_layers(decoder: object) -> tuple[list[object], int | None]:
    """The decoder layers of a model, a layer or a sequence of layers; and the encoder's depth, if known."""
    from qkv.models import TinyEncoderDecoder

    if isinstance(decoder, TinyEncoderDecoder):
        return list(decoder.decoder), len(decoder.encoder)
    if hasattr(decoder, "cross_attn"):
        return [decoder], None
    if isinstance(decoder, (Sequence, nn.ModuleList)) and not isinstance(decoder, (str, bytes)):
        layers = list(decoder)
        if not layers:
            raise ValueError(
                "decoder has no layers: pass a model, a decoder layer or a non-empty list of them"
            )
        return layers, None
    raise TypeError(
        "decoder must be a qkv.models.TinyEncoderDecoder, a decoder layer with a cross_attn module "
        f"(qkv.models.DecoderLayer) or a sequence of them, got {type(decoder).__name__}"
    )


def _cross_weights(layers: Sequence[object]) -> list[HeadWeights]:
    found = []
    for i, layer in enumerate(layers):
        module = getattr(layer, "cross_attn", None)
        if module is None:
            raise TypeError(
                f"decoder layer {i} ({type(layer).__name__}) has no cross_attn: a decoder layer reads the "
                "encoder through a cross-attention module named cross_attn (as qkv.models.DecoderLayer)"
            )
        try:
            found.append(head_weights(module))
        except TypeError as error:
            raise TypeError(f"decoder layer {i}'s cross_attn: {error}") from None
    return found


def cross_attention(decoder: object, memory: object, target: object, *, max_layers: int = 2) -> Figure:
    """Cross-attention in each decoder layer: its own W^Q, W^K, W^V; one encoder output for all.

    The encoder's output ``enc`` (its last layer's, S × d_enc) is drawn once, at the
    top, and a line carries it to every decoder layer drawn. In each layer three
    rows, every block to scale: ``dec (T, d_dec) × W^Q = Q``, ``enc × W^K = K`` and
    ``enc × W^V = V``, each W that layer's own, with white lines between heads;
    then Q and K meet in the T × S scores, T queries against S keys, one map
    per head (``Q_i K_i^T``, drawn as a stack). A fourth row finishes the layer:
    ``heads (T, h·d_v) × W^O = out (T, d_dec)``, where head i's block is its
    softmaxed scores times its V. The layer is a superscript:
    ``dec^(1)`` is the decoder's states as they reach layer 1's cross-attention, built on layer 0's output.
    The sizes are read from the objects passed.

    Parameters
    ----------
    decoder : TinyEncoderDecoder, DecoderLayer, or a sequence of decoder layers
        A :class:`qkv.models.TinyEncoderDecoder` (its ``decoder`` layers), one
        :class:`qkv.models.DecoderLayer`, or a list or ``nn.ModuleList`` of layers;
        each must have a ``cross_attn`` module (a :class:`qkv.MultiHeadAttention` or
        anything with ``to_heads()``).
    memory : Tensor, shape (S, d_enc) or (B, S, d_enc)
        The encoder's output, e.g. ``model.encode(source, source_lengths)``; of a
        batch, the first sequence is drawn. d_enc must be every layer's ``kdim``
        and ``vdim``.
    target : Tensor, shape (T, d_dec) or (B, T, d_dec)
        The decoder states that reach the cross-attention (only their shape is
        drawn), e.g. the target's embeddings; d_dec must be every layer's
        ``embed_dim``.
    max_layers : int
        Draw at most this many decoder layers, the first ones (the figure says
        how many more there are).

    Returns
    -------
    matplotlib.figure.Figure

    See Also
    --------
    decoding_step, attention_map
    :doc:`cross_attention/computed-once` : each layer's K and V, computed once per source.

    Examples
    --------
    >>> import torch
    >>> from qkv.diagrams import texts_of
    >>> from qkv.diagrams.inference import cross_attention
    >>> from qkv.models import EncoderDecoderConfig, TinyEncoderDecoder
    >>> config = EncoderDecoderConfig(
    ...     11, 13, encoder_dim=9, decoder_dim=12, num_heads=3, decoder_layers=2
    ... )
    >>> model = TinyEncoderDecoder(config)
    >>> source = torch.randint(1, 11, (1, 7))
    >>> memory = model.encode(source, torch.tensor([7]))  # (1, 7, 9)
    >>> figure = cross_attention(model, memory, torch.zeros(4, 12))
    >>> shapes = ("(7, 9)", "(9, 12)", "(4, 12)", "(7, 12)", "(4, 7)")
    >>> [shape for shape in shapes if shape not in texts_of(figure)]  # all drawn
    []
    """
    layers, encoder_depth = _decoder_layers(decoder)
    max_layers = require_positive_int("max_layers", max_layers)
    weights = _cross_weights(layers)
    enc = as_matrix("memory", memory, layout="(S, d_enc)")
    dec = as_matrix("target", target, layout="(T, d_dec)")
    if (
        isinstance(memory, torch.Tensor)
        and isinstance(target, torch.Tensor)
        and memory.dim() == target.dim() == 3
    ):
        require_size("target", target, 0, memory.shape[0], "sequences", "memory's batch size")
    for i, w in enumerate(weights):
        require_size("memory", enc, 1, w.kdim, "features", f"decoder layer {i}'s cross_attn kdim")
        require_size("memory", enc, 1, w.vdim, "features", f"decoder layer {i}'s cross_attn vdim")
        require_size("target", dec, 1, w.embed_dim, "features", f"decoder layer {i}'s cross_attn embed_dim")
    drawn = weights[:max_layers]
    T, d_dec = dec.shape
    S, d_enc = enc.shape

    # Columns: the bus, inputs, W, products, scores; each gap holds an operator.
    input_cols = max(d_dec, d_enc)
    w_cols = max(max(w.num_heads * w.d_k, w.num_kv_heads * w.d_k, w.num_kv_heads * w.d_v) for w in drawn)
    gap_in, bus_in, margin_in = 0.4, 0.3, 0.35  # the right margin holds half the scores' label
    scale = _Scale(_unit([(input_cols + 2 * w_cols + S, 3 * gap_in + bus_in + margin_in)]))
    gap, bus_x = scale.units(gap_in), scale.units(bus_in) / 2
    x_in = scale.units(bus_in)
    x_w = x_in + input_cols + gap
    x_out = x_w + w_cols + gap
    x_scores = x_out + w_cols + gap
    stack = scale.units(0.07)  # the offset between the heads' stacked score maps
    behind = (max(w.num_heads for w in drawn) - 1) * stack
    caption_x = x_out + max(w.embed_dim for w in drawn) + gap / 2  # the heads' caption, right of out
    width = max(
        x_scores + S + behind + scale.units(margin_in), caption_x + scale.units(1.55), scale.units(_MIN_WIDTH)
    )

    title_h = scale.line * 1.4
    enc_h = scale.above + S + scale.below + scale.units(0.1)
    heads_h = scale.units(0.2)  # the line under the score maps that counts the heads
    q_h = scale.above + behind + max(T + scale.below + heads_h, d_dec) + scale.below
    kv_h = [scale.above + max(S, w.kdim) + scale.below for w in drawn]
    o_h = [scale.above + max(T, w.num_heads * w.d_v) + scale.below for w in drawn]  # heads × W^O = out
    layer_h = [scale.line + q_h + 2 * kv + o for kv, o in zip(kv_h, o_h, strict=True)]
    footer_h = scale.line * 1.3 if len(weights) > len(drawn) else scale.units(0.1)
    height = title_h + enc_h + sum(layer_h) + footer_h
    canvas = _canvas(width, height, scale)
    grid = scale.grid

    canvas.title("Each decoder layer makes its own K and V from one encoder output")
    top = title_h + scale.above
    enc_box = canvas.matrix(
        x_in, top, S, d_enc, ROLE_COLOURS["x"], label=r"\mathrm{enc}", shape=(S, d_enc), grid=grid, gid="enc"
    )
    after = {None: "its last layer", 1: "its one layer"}.get(encoder_depth, f"its {encoder_depth} layers")
    canvas.text(
        enc_box["right"] + gap / 2,
        top + S / 2,
        f"the encoder's output, after {after}:\ncomputed once, read by every decoder layer",
        ha="left",
        size=0.9,
        gid="enc:caption",
    )
    # The bus: from enc down the left margin, with a branch into every W^K and W^V.
    branches: list[float] = []
    y = title_h + enc_h
    for i, w in enumerate(drawn):
        canvas.text(
            x_in,
            y + scale.line / 2,
            f"decoder layer {i}: T = {T} queries, S = {S} keys, {w.num_heads} heads of $d_k$ = {w.d_k}",
            ha="left",
            size=0.95,
            weight="bold",
            gid=f"layer{i}:header",
        )
        y += scale.line
        # Q row: the decoder states through this layer's W^Q (room above for the stacked score maps).
        top = y + scale.above + behind
        canvas.matrix(
            x_in,
            top,
            T,
            d_dec,
            ROLE_COLOURS["x"],
            label=rf"\mathrm{{dec}}^{{({i})}}",  # layer i's input: the decoder's states after layer i - 1
            shape=(T, d_dec),
            grid=grid,
            gid=f"dec{i}",
        )
        q_cols = w.num_heads * w.d_k
        q_box = _weight_and_product(canvas, (x_w, x_out, gap), top, top + T / 2, (d_dec, T), q_cols,
                                    "q", "Q", i, w.d_k, grid)  # fmt: skip
        canvas.arrow(q_box["right"] + 0.3, top + T / 2, x_scores - 0.3, top + T / 2)
        # One T × S map per head: the others stacked behind the first, offset up and right.
        for j in reversed(range(1, w.num_heads)):
            canvas.matrix(x_scores + j * stack, top - j * stack, T, S, _lighter(ROLE_COLOURS["weights"]),
                          grid=False, gid=f"scores{i}:head{j}")  # fmt: skip
        scores = canvas.matrix(
            x_scores,
            top,
            T,
            S,
            ROLE_COLOURS["weights"],
            shape=(T, S),
            grid=grid,
            gid=f"scores{i}",
        )
        over = (w.num_heads - 1) * stack  # the label goes above the whole stack
        label_y = top - over - canvas.inch(0.06)
        canvas.text(x_scores + (S + over) / 2, label_y, math(r"Q_i K_i^\top"), va="bottom", size=1.15,
                    gid=f"scores{i}:label")  # fmt: skip
        canvas.text(
            x_scores + S / 2, scores["bottom"] + scale.below,
            f"one per head: {w.num_heads}" if w.num_heads > 1 else "one head", va="top", size=0.8,
            gid=f"scores{i}:heads",
        )  # fmt: skip
        y += q_h
        # K and V rows: the one encoder output through this layer's W^K and W^V.
        k_box: dict[str, float] = {}
        for role, w_name, cols, size in (
            ("k", "K", w.num_kv_heads * w.d_k, w.d_k),
            ("v", "V", w.num_kv_heads * w.d_v, w.d_v),
        ):
            top = y + scale.above
            middle = top + min(S, d_enc) / 2
            branches.append(middle)
            canvas.arrow(bus_x, middle, x_w - gap / 2 - scale.units(0.12), middle, label=r"$\mathrm{enc}$")
            box = _weight_and_product(canvas, (x_w, x_out, gap), top, middle, (d_enc, S), cols, role,
                                      w_name, i, size, grid)  # fmt: skip
            if role == "k":
                k_box = box
            y += kv_h[i]
        # K meets Q in the scores: an arrow from K up to the line under the scores' shape label.
        under = scores["bottom"] + scale.below + heads_h
        canvas.arrow(k_box["right"] + 0.3, k_box["y"] + S / 2, scores["x"] + S / 2, under)
        # Each head's softmaxed scores average its rows of V; W^O joins the heads: the layer's output.
        top = y + scale.above
        hv = w.num_heads * w.d_v
        heads_box = canvas.matrix(x_in, top, T, hv, _lighter(ROLE_COLOURS["v"]),
                                  label=rf"\mathrm{{heads}}^{{({i})}}", shape=(T, hv), grid=grid,
                                  gid=f"heads{i}")  # fmt: skip
        _head_dividers(canvas, heads_box, w.d_v)
        middle = top + min(T, hv) / 2
        canvas.operator(x_w - gap / 2, middle, "×")
        canvas.matrix(x_w, top, hv, w.embed_dim, ROLE_COLOURS["o"], label=rf"W^{{O\,({i})}}",
                      shape=(hv, w.embed_dim), grid=grid, gid=f"W^O{i}")  # fmt: skip
        canvas.operator(x_out - gap / 2, middle, "=")
        canvas.matrix(x_out, top, T, w.embed_dim, ROLE_COLOURS["x"], label=rf"\mathrm{{out}}^{{({i})}}",
                      shape=(T, w.embed_dim), grid=grid, gid=f"out{i}")  # fmt: skip
        canvas.text(
            caption_x, middle,
            "heads: for each head $i$,\n"
            "$\\mathrm{softmax}(Q_i K_i^\\top / \\sqrt{d_k})\\, V_i$,\nside by side",
            ha="left", size=0.8, gid=f"heads{i}:caption",
        )  # fmt: skip
        y += o_h[i]
    _line(canvas, [enc_box["x"], bus_x, bus_x], [enc_box["y"] + S / 2, enc_box["y"] + S / 2, branches[-1]])
    if len(weights) > len(drawn):
        more = len(weights) - len(drawn)
        canvas.text(
            x_in,
            y + scale.line / 2,
            f"… and {more} more decoder layer{'s' if more > 1 else ''}, each with its own $W^K$ and $W^V$ "
            "reading enc",
            ha="left",
            size=0.9,
        )
    return canvas.fit()


# --- One decoding step with a KV cache --------------------------------------------------------


def _require_fits(layer: MultiHeadAttention, cache: KVCache) -> None:
    for what, got, expected, name in (
        ("K/V heads", cache.num_kv_heads, layer.num_kv_heads, "num_kv_heads"),
        ("keys of size d_k =", cache.d_k, layer.d_k, "d_k"),
        ("values of size d_v =", cache.d_v, layer.d_v, "d_v"),
    ):
        if got != expected:
            held = f"{got} {what}" if what == "K/V heads" else f"{what} {got}"
            raise ValueError(
                f"cache holds {held}, but layer.{name} is {expected}: the cache belongs to another layer; "
                "make one for this layer with layer.new_cache(batch_size, max_length)"
            )
    cache.require_room(1)  # a full cache cannot take the step drawn


def decoding_step(layer: object, cache: object) -> Figure:
    """One decoding step with a KV cache: the new token's queries against the cached keys and values.

    At the top, the new token x_t (1 × d_model) and its projections q_t, k_t, v_t,
    one row each, coloured by head. Below, one panel per K/V head j: the query
    heads that share it (head i uses K/V head ``i // (h / h_kv)``; the labels
    number heads from 1, as the book's text does, the gids from 0), each a
    1 × d_k row, and that head's keys K_j and values V_j, (length + 1) × d_k and
    (length + 1) × d_v: the cached rows light, the new row (this step's k_t and
    v_t, appended) in full colour and outlined. The projections' labels show a
    bias (``+ b^Q``) where the layer's projection has one, and the legend names the
    cache's allocated length when it exceeds the rows drawn. Query heads are drawn in the
    colour of the K/V head they read, so the grouping reads at a glance (the legend says
    that each query is its head's own); frames keep the roles' colours (Q blue, K
    vermillion, V green). Arrows run from the queries to K (scores) and from K to V (the
    weights average V's rows).

    Parameters
    ----------
    layer : qkv.MultiHeadAttention
        The attention layer that is decoding; its ``num_heads``, ``num_kv_heads``,
        ``embed_dim``, ``d_k`` and ``d_v`` set every size.
    cache : qkv.KVCache
        That layer's cache before the step (e.g. ``layer.new_cache(...)`` after
        a prompt): ``cache.length`` tokens are cached, and it must have room for
        one more.

    Returns
    -------
    matplotlib.figure.Figure

    See Also
    --------
    cross_attention, attention_map
    qkv.KVCache : the cache, and how a step uses it.

    Examples
    --------
    >>> import torch, qkv
    >>> from qkv.diagrams import cells
    >>> from qkv.diagrams.inference import decoding_step
    >>> mha = qkv.MultiHeadAttention(24, 6, num_kv_heads=2)
    >>> cache = mha.new_cache(batch_size=1, max_length=8)
    >>> prompt = torch.randn(1, 5, 24)  # 5 tokens
    >>> _ = mha(prompt, cache=cache, is_causal=True)
    >>> figure = decoding_step(mha, cache)
    >>> keys = cells(figure, "K0").colours  # K/V head 1's keys (gid K0) after the step
    >>> len(keys), len(keys[0])  # (5 cached + 1 new, d_k)
    (6, 4)
    >>> # query head 3 (columns 8..11) reads K/V head 1:
    >>> cells(figure, "q_t").colours[0][2 * 4] == keys[-1][0]
    True
    """
    if not isinstance(layer, MultiHeadAttention):
        raise TypeError(
            "layer must be a qkv.MultiHeadAttention (the module that decodes with a KVCache), got "
            f"{type(layer).__name__}"
        )
    if not isinstance(cache, KVCache):
        raise TypeError(
            f"cache must be a qkv.KVCache (e.g. layer.new_cache(...)), got {type(cache).__name__}"
        )
    _require_fits(layer, cache)
    h, h_kv, d_k, d_v, d_model = layer.num_heads, layer.num_kv_heads, layer.d_k, layer.d_v, layer.embed_dim
    group = h // h_kv  # query heads per K/V head
    cached = cache.length
    rows = cached + 1  # after the step

    # Widths: the top rows (label, block, shape) and the panels (q labels, q, K, V), side by side
    # as long as that does not shrink the cells by more than a tenth.
    top_cols = max(d_model, h * d_k)
    label_in, shape_in, gap_in, panel_gap_in, margin_in = 1.3, 0.75, 0.35, 0.4, 0.15
    q_label_in = 0.55
    panel_cols = d_k + d_k + d_v
    panel_in = q_label_in + 2 * gap_in
    top_part = (top_cols, label_in + shape_in + 2 * margin_in)

    def unit_for(columns: int) -> float:
        panels_in = columns * panel_in + (columns - 1) * panel_gap_in + 2 * margin_in
        return _unit([top_part, (columns * panel_cols, panels_in)])

    columns = 1
    for n in range(min(h_kv, 3), 1, -1):
        if unit_for(n) >= 0.9 * unit_for(1):
            columns = n
            break
    scale = _Scale(unit_for(columns))
    gap, panel_gap = scale.units(gap_in), scale.units(panel_gap_in)
    panel_w = scale.units(q_label_in) + panel_cols + 2 * gap
    margin = scale.units(margin_in)
    x_block = margin + scale.units(label_in)
    panels_w = margin + columns * panel_w + (columns - 1) * panel_gap
    width = max(x_block + top_cols + scale.units(shape_in), panels_w) + margin
    width = max(width, scale.units(_MIN_WIDTH))  # room for the title and the legend

    title_h = scale.line * 1.4
    top_row = max(2.0, scale.units(0.34))
    tops_h = 4 * top_row + scale.units(0.15)
    q_step = max(2.0, scale.units(0.32))
    panel_h = scale.line + scale.above + max(group * q_step - (q_step - 1), rows) + scale.below
    panel_rows = -(-h_kv // columns)
    legend_h = 4 * scale.line + scale.units(0.1)
    height = title_h + tops_h + panel_rows * panel_h + legend_h
    canvas = _canvas(width, height, scale)
    grid = scale.grid

    canvas.title(f"One decoding step: the new token reads {cached} cached tokens and itself")
    # The new token and its projections; q_t's heads in the colour of the K/V head they read.
    q_colours = [_fresh(head_colour((c // d_k) // group)) for c in range(h * d_k)]
    k_colours = [_fresh(head_colour(c // d_k)) for c in range(h_kv * d_k)]
    v_colours = [_fresh(head_colour(c // d_v)) for c in range(h_kv * d_v)]
    y = title_h

    def projection(letter: str, module: object) -> str:  # "x_t W^Q", "+ b^Q" where it has a bias
        bias = getattr(module, "bias", None) is not None
        return f"x_t W^{letter}" + (f" + b^{letter}" if bias else "")

    for name, label, cols, role, colours, size in (
        ("x_t", "x_t", d_model, "x", None, 0),
        ("q_t", f"q_t = {projection('Q', layer.q_proj)}", h * d_k, "q", q_colours, d_k),
        ("k_t", f"k_t = {projection('K', layer.k_proj)}", h_kv * d_k, "k", k_colours, d_k),
        ("v_t", f"v_t = {projection('V', layer.v_proj)}", h_kv * d_v, "v", v_colours, d_v),
    ):
        top = y + (top_row - 1) / 2
        frame = EDGE_COLOUR if role == "x" else ROLE_COLOURS[role]
        box = canvas.matrix(
            x_block,
            top,
            1,
            cols,
            ROLE_COLOURS[role],
            column_colours=colours,
            grid=grid,
            frame=frame,
            gid=name,
        )
        if size:
            _head_dividers(canvas, box, size)
        canvas.text(
            x_block - scale.units(0.12), top + 0.5, math(label), ha="right", size=1.05, gid=f"{name}:label"
        )
        canvas.text(
            box["right"] + scale.units(0.12),
            top + 0.5,
            shape_str((1, cols)),
            ha="left",
            size=0.85,
            gid=f"{name}:shape",
        )
        y += top_row
    y += scale.units(0.15)

    # One panel per K/V head: its query heads, then its keys and values, the new row last.
    new_alpha = 0.85
    for j in range(h_kv):
        px = margin + (j % columns) * (panel_w + panel_gap)
        py = y + (j // columns) * panel_h
        heads = list(range(j * group, (j + 1) * group))
        shared = "query head" if group == 1 else "query heads"
        canvas.text(
            px,
            py + scale.line / 2,
            f"K/V head {j + 1}: {shared} {', '.join(str(i + 1) for i in heads)}",  # from 1
            ha="left",
            size=0.95,
            weight="bold",
            gid=f"panel{j}:header",
        )
        top = py + scale.line + scale.above
        colour = head_colour(j)
        fresh = _fresh(colour)  # computed this step: the queries and the new K/V row
        x_q = px + scale.units(q_label_in)
        for n, i in enumerate(heads):
            q_top = top + n * q_step
            canvas.matrix(x_q, q_top, 1, d_k, fresh, grid=grid, frame=ROLE_COLOURS["q"], gid=f"q{i}")
            canvas.text(
                x_q - scale.units(0.08),
                q_top + 0.5,
                f"$q_{{t,{i + 1}}}$",  # heads numbered from 1, as in the text
                ha="right",
                size=0.95,
                gid=f"q{i}:label",
            )
        arrow_y = top + min(group * q_step - (q_step - 1), rows) / 2
        x_k = x_q + d_k + gap
        canvas.arrow(x_q + d_k + 0.2, arrow_y, x_k - 0.2, arrow_y)  # queries score K's rows
        x_v = x_k + d_k + gap
        canvas.arrow(x_k + d_k + 0.2, arrow_y, x_v - 0.2, arrow_y)  # the weights average V's rows
        for name, x, cols in (("K", x_k, d_k), ("V", x_v, d_v)):
            role = name.lower()
            light = _lighter(colour)
            cells = [[light] * cols for _ in range(cached)] + [[fresh] * cols]
            box = canvas.matrix(
                x,
                top,
                rows,
                cols,
                colour,
                cell_colours=cells,
                label=f"{name}_{_sub(j + 1)}",
                shape=(rows, cols),
                grid=grid,
                frame=ROLE_COLOURS[role],
                alpha=new_alpha,
                gid=f"{name}{j}",
            )
            _outline(canvas, box["x"], box["bottom"] - 1, cols, gid=f"new-row:{name}{j}")
    # The legend: what light and outlined rows mean, with a swatch piece per K/V head's colour.
    legend_top = y + panel_rows * panel_h + scale.units(0.1)
    swatch = scale.units(0.14)
    shown = min(h_kv, 4)  # colours in a swatch: one per K/V head, at most 4
    from matplotlib.patches import Rectangle

    allocated = "" if cache.max_length == rows else f", in a cache allocated for {cache.max_length}"
    for n, (text, outlined) in enumerate(
        (
            (f"cached: keys and values of {cached} earlier tokens{allocated}", False),
            ("new: this step's $k_t$ and $v_t$, appended; computed now, like $q_t$", True),
        )
    ):
        line_y = legend_top + (n + 0.5) * scale.line
        piece = 1.6 * swatch / shown
        for j in range(shown):  # each K/V head's colour (light when cached)
            colour = _fresh(head_colour(j)) if outlined else _lighter(head_colour(j))
            gid = f"legend:{'new' if outlined else 'cached'}:{j}"
            corner = (margin + j * piece, line_y - swatch / 2)
            canvas.ax.add_patch(
                Rectangle(corner, piece, swatch, facecolor=colour, alpha=new_alpha, edgecolor="none", gid=gid)
            )
        canvas.ax.add_patch(
            Rectangle(
                (margin, line_y - swatch / 2),
                1.6 * swatch,
                swatch,
                fill=False,
                edgecolor=EDGE_COLOUR if outlined else "none",
                linewidth=1.8,
                gid=f"legend:{'new' if outlined else 'cached'}",
            )
        )
        canvas.text(margin + 1.6 * swatch + scale.units(0.1), line_y, text, ha="left", size=0.85)
    for n, text in enumerate(
        (
            "arrows: each query scores K's rows; its weights average V's rows",
            "queries: each head's own; colour = the K/V head they read",
        )
    ):
        y_note = legend_top + (2.5 + n) * scale.line
        canvas.text(margin, y_note, text, ha="left", size=0.85, gid=f"legend:note{n}")
    return canvas.fit()


def _outline(canvas: Canvas, x: float, y: float, cols: int, *, gid: str) -> None:
    """A dark outline around one row: the row this step appends."""
    canvas.outline(x, y, cols, 1, colour=TEXT_COLOUR, width=2.0, zorder=3, gid=gid)


# --- Attention maps with their masks -----------------------------------------------------------

_LAYOUTS = {2: "(T, S)", 3: "(h, T, S)", 4: "(B, h, T, S)"}
_HATCH_INK = "#8C8C8C"  # the hatching and the edges of masked cells: grey, lighter than any text
_CHAR = 0.08  # inches: the width of a character of a 10-point tick label, roughly


def _label_map_axis(
    ax: Axes, axis: str, labels: Sequence[str] | None, size: int, name: str, cell: float
) -> None:
    """Ticks at every position (a few, for long maps) or the tokens; tokens wider than a cell turn upright."""
    from matplotlib.ticker import MaxNLocator

    set_ticks = ax.set_xticks if axis == "x" else ax.set_yticks
    set_label = ax.set_xlabel if axis == "x" else ax.set_ylabel
    if labels is None:
        if size <= 16:
            set_ticks(range(size))
        else:
            (ax.xaxis if axis == "x" else ax.yaxis).set_major_locator(MaxNLocator(integer=True))
        set_label(f"{name} position")
        return
    texts = [str(label) for label in labels]
    if axis == "x" and _too_wide(texts, cell):
        ax.set_xticks(range(size), texts, rotation=45, ha="right", rotation_mode="anchor")
    else:
        set_ticks(range(size), texts)
    set_label(name)


def _too_wide(texts: Sequence[str], cell: float) -> bool:
    """Whether a tick label is wider than a cell of ``cell`` inches (10-pt characters are ~0.08 inch)."""
    return max((len(text) for text in texts), default=0) * _CHAR > 0.9 * cell


def _sub(i: int) -> str:
    """``i`` as a maths subscript: ``3``, or ``{12}`` (braces keep both digits in the subscript)."""
    return str(i) if i < 10 else f"{{{i}}}"


def attention_map(
    weights: object,
    mask: object | None = None,
    *,
    queries: Sequence[str] | None = None,
    keys: Sequence[str] | None = None,
    title: str | None = None,
    head: int | None = None,
    sequence: int = 0,
    vmax: float | None = None,
    annotate: bool = False,
) -> Figure:
    """An attention map with its mask: one row per query, one column per key, masked cells hatched.

    A masked cell (the mask blocks it) is drawn white and hatched and is left out
    of the colour scale, so it never looks like a small weight: the colour map's
    lowest colour is dark. Every other cell takes the weight's colour.

    Parameters
    ----------
    weights : Tensor or array, shape (T, S), (h, T, S) or (B, h, T, S)
        Attention weights, e.g. from ``qkv.MultiHeadAttention(..., need_weights=True)``.
        Which map is drawn: a (T, S) map as it is; of (h, T, S) and (B, h, T, S),
        sequence ``sequence`` and head ``head``, or, with ``head=None``, the mean
        of the heads (the colour bar says so). A (B, T, S) batch of averaged weights
        would read as heads: pass ``weights[b]``.
    mask : Tensor or array, optional, broadcastable to the weights' shape
        qkv's convention: boolean True means "may attend" (e.g. ``qkv.causal_mask(T)``
        (T, S), ``qkv.padding_mask(lengths, S)`` (B, 1, 1, S), a (S,) key mask); a
        floating mask is additive: ``-inf``, or -10,000 and below (Hugging Face's
        ``torch.finfo(dtype).min``), blocks, and a floating 0/1 mask is refused (pass
        ``mask.bool()``). Leading axes of size 1 may go beyond the
        weights' (a (1, 1, T, S) mask with (T, S) weights). Averaging heads, a cell
        is hatched when every head's mask blocks it.
    queries, keys : sequence of str, optional
        Token labels for the rows and the columns; without them the axes read
        "query position" and "key position".
    title : str, optional
        Say what to look at.
    head : int, optional
        The head to draw, for weights with a head axis; default the mean of the heads.
    sequence : int
        The sequence to draw, for (B, h, T, S) weights.
    vmax : float, optional
        The top of the colour scale; default the largest weight among the cells
        the mask allows (the scale starts at 0).
    annotate : bool
        Write each weight, to two decimals, in its cell (for small maps). A masked
        cell stays blank: it holds no weight to read.

    Returns
    -------
    matplotlib.figure.Figure
        The map and its colour bar. ``qkv.diagrams.cells(figure, "map")`` reads it
        back: each cell's colour (``MASKED_COLOUR`` where masked), whether it is
        hatched and the text written in it; the hatching is one collection with gid
        ``"map:masked"``.

    See Also
    --------
    qkv.plot_attention : the same map without a mask, on axes of your own.
    cross_attention, decoding_step
    :doc:`equation/attention-maps` : reading a map row by row, and why a masked cell is not a small weight.

    Examples
    --------
    >>> import torch, qkv
    >>> from qkv.diagrams import cells
    >>> from qkv.diagrams.inference import attention_map
    >>> mha = qkv.MultiHeadAttention(12, 3)
    >>> x = torch.randn(1, 6, 12)
    >>> _, weights = mha(x, is_causal=True, need_weights=True)  # (1, 3, 6, 6)
    >>> figure = attention_map(
    ...     weights, qkv.causal_mask(6), head=1, title="head 1 looks back"
    ... )
    >>> sum(map(sum, cells(figure, "map").hatched))  # the 15 cells above the diagonal
    15
    """
    require_matplotlib()
    from matplotlib import colormaps
    from matplotlib.collections import PatchCollection
    from matplotlib.colors import Normalize
    from matplotlib.figure import Figure
    from matplotlib.patches import Patch, Rectangle

    array = as_numpy("weights", weights)
    if array.ndim not in _LAYOUTS:
        raise ValueError(
            f"weights must have 2, 3 or 4 dimensions, (T, S), (h, T, S) or (B, h, T, S), got shape "
            f"{shape_str(array.shape)}"
        )
    if not (np.issubdtype(array.dtype, np.floating) or np.issubdtype(array.dtype, np.integer)):
        raise TypeError(f"weights must hold numbers, got dtype {array.dtype}")
    array = array.astype(float)
    layout = _LAYOUTS[array.ndim]
    allowed = np.ones(array.shape, dtype=bool) if mask is None else allowed_cells(mask, array.shape, layout)
    if array.ndim == 4:
        if isinstance(sequence, bool) or not isinstance(sequence, int):
            raise TypeError(f"sequence must be an int, got {type(sequence).__name__}")
        if not 0 <= sequence < array.shape[0]:
            raise ValueError(
                f"sequence={sequence} is out of range: weights {layout} have {array.shape[0]} sequences "
                f"(shape {shape_str(array.shape)})"
            )
        array, allowed = array[sequence], allowed[sequence]
    elif sequence != 0:
        raise ValueError(f"sequence={sequence} was given, but weights {layout} have no batch axis")
    heads = array.shape[0] if array.ndim == 3 else 0
    if heads and head is not None:
        if isinstance(head, bool) or not isinstance(head, int):
            raise TypeError(f"head must be an int or None, got {type(head).__name__}")
        if not 0 <= head < heads:
            raise ValueError(f"head={head} is out of range: weights {layout} have {heads} heads")
        array, allowed = array[head], allowed[head]
    elif heads:
        array, allowed = array.mean(axis=0), np.asarray(allowed.any(axis=0))  # (T, S)
    elif head is not None:
        raise ValueError(f"head={head} was given, but weights {layout} have no head axis")
    T, S = array.shape
    if T == 0 or S == 0:
        raise ValueError(f"weights have {T} queries and {S} keys: nothing to draw")
    if title is not None and not isinstance(title, str):
        raise TypeError(f"title must be a str, got {type(title).__name__}")
    if vmax is not None and (isinstance(vmax, bool) or not isinstance(vmax, (int, float)) or not vmax > 0):
        raise ValueError(f"vmax must be a positive number or None, got {vmax!r}")
    if not isinstance(annotate, bool):
        raise TypeError(f"annotate must be a bool, got {type(annotate).__name__}")
    for name, labels, size, what in (("queries", queries, T, "query"), ("keys", keys, S, "key")):
        if labels is not None and len(labels) != size:
            raise ValueError(f"{name} has {len(labels)} labels, but the weights have {size} {what} positions")

    blocked = ~allowed  # (T, S)
    visible = array[allowed]
    top = vmax if vmax is not None else (float(visible.max()) if visible.size else 1.0)
    top = top if top > 0 else 1.0
    cell = min(0.42, 4.4 / S, 4.4 / T)  # inches
    height = T * cell + 1.5 + (0.35 if title else 0.0)
    if keys is not None and _too_wide(keys, cell):
        height += 0.7 * _CHAR * max(len(str(key)) for key in keys)  # the keys, turned 45 degrees
    width = S * cell + 1.6 + (_CHAR * max(len(str(q)) for q in queries) if queries else 0.3)
    width = min(7.0, max(width, 1.2 * _CHAR * len(title or "") + 0.3))  # 12-point title characters
    figure = Figure(figsize=(width, height), layout="constrained")
    ax = figure.add_subplot()
    cmap = colormaps["viridis"].with_extremes(bad=(0.0, 0.0, 0.0, 0.0))  # a masked cell shows its hatching
    image = ax.imshow(
        np.ma.masked_array(array, mask=blocked),
        cmap=cmap,
        vmin=0.0,
        vmax=top,
        interpolation="nearest",
        aspect="auto",
    )
    if blocked.any():  # one collection, one rectangle per run of masked cells in a row: fast for long maps
        boxes = []
        for t in range(T):
            row = blocked[t]
            s = 0
            while s < S:
                if row[s]:
                    end = s
                    while end < S and row[end]:
                        end += 1
                    boxes.append(Rectangle((s - 0.5, t - 0.5), end - s, 1))
                    s = end
                else:
                    s += 1
        ax.add_collection(
            PatchCollection(
                boxes,
                facecolors=MASKED_COLOUR,
                edgecolors=_HATCH_INK,
                linewidths=0.4 if cell >= 0.15 else 0.0,  # cell edges, where cells are big enough to see
                hatch=MASKED_HATCH,
                gid="map:masked",
            )
        )
    norm = Normalize(vmin=0.0, vmax=top)
    rgb = np.round(np.asarray(cmap(norm(array)))[..., :3] * 255).astype(int)  # (T, S, 3), all cells at once
    shown = [
        [MASKED_COLOUR if blocked[t, s] else "#{:02x}{:02x}{:02x}".format(*rgb[t, s]) for s in range(S)]
        for t in range(T)
    ]
    written = [  # the text in each cell: its weight, when annotating; a masked cell holds none
        ["" if blocked[t, s] or not annotate else f"{array[t, s]:.2f}" for s in range(S)] for t in range(T)
    ]
    for t, s in np.ndindex(T, S):
        if written[t][s]:  # dark ink on the colour map's bright end, white on its dark end
            ink = "black" if norm(array[t, s]) > 0.6 else "white"
            ax.text(s, t, written[t][s], ha="center", va="center", color=ink, fontsize=_FONT - 2)
    register_cells(figure, "map", Cells(shown, blocked.tolist(), written, (-0.5, -0.5)))
    _label_map_axis(ax, "x", keys, S, "key", cell)
    _label_map_axis(ax, "y", queries, T, "query", cell)
    if title:
        figure.suptitle(title)  # centred on the figure, so a long title may reach over the colour bar
    label = (
        "attention weight" if not heads or head is not None else f"attention weight (mean of {heads} heads)"
    )
    figure.colorbar(image, ax=ax, label=label)
    if blocked.any():
        figure.legend(
            handles=[
                Patch(
                    facecolor=MASKED_COLOUR,
                    hatch=MASKED_HATCH,
                    edgecolor=_HATCH_INK,
                    label="masked: may not attend",
                )
            ],
            loc="outside lower center",
            frameon=False,
        )
    return figure


# --- kv_sharing ----------------------------------------------------------------------------------


def _sharing_name(h: int, h_kv: int) -> str:
    """What a layer with h query heads and h_kv K/V heads is called."""
    if h_kv == h:
        return "multi-head (MHA)"
    if h_kv == 1:
        return "multi-query (MQA)"
    return "grouped-query (GQA)"


def kv_sharing(layers: Sequence[object], *, title: str | None = None) -> Figure:
    """Multi-head, grouped-query and multi-query attention side by side: which K/V head each query head reads.

    One panel per layer. At the top, its h query heads (query head i, numbered from
    0); below, its h_kv K/V heads (K/V head j), the ones a KV cache stores; a line from
    each query head to the K/V head it reads, ``j = i // (h / h_kv)``. Query heads
    take the colour of their K/V head, so a group reads at a glance. Under each
    panel, the K and V numbers cached per token and layer, ``h_kv · (d_k + d_v)``, and
    their fraction of the multi-head layer's ``h · (d_k + d_v)``.

    Parameters
    ----------
    layers : sequence of qkv.HeadWeights or modules with ``to_heads()``
        The layers to draw, left to right (for example ``qkv.MultiHeadAttention``
        with ``num_kv_heads`` = h, a divisor of h, and 1).
    title : str, optional
        A title over the whole figure.

    Returns
    -------
    matplotlib.figure.Figure

    See Also
    --------
    decoding_step : one step of one layer, with its cache.
    qkv.HeadWeights.expand_kv_heads, qkv.HeadWeights.mean_pool_kv_heads
    :doc:`inference` : what sharing K/V heads loses and saves.

    Examples
    --------
    >>> import qkv
    >>> from qkv.diagrams import patches_by_gid, texts_of
    >>> from qkv.diagrams.inference import kv_sharing
    >>> layers = [qkv.MultiHeadAttention(32, 8, num_kv_heads=n) for n in (8, 2, 1)]
    >>> figure = kv_sharing(layers)
    >>> len(patches_by_gid(figure, "kv:1:")), len(patches_by_gid(figure, "query:1:"))
    (2, 8)
    >>> [ax.get_title() for ax in figure.axes]
    ['multi-head (MHA)', 'grouped-query (GQA)', 'multi-query (MQA)']
    >>> "= 16 numbers (2/8)" in " ".join(texts_of(figure))
    True
    """
    require_matplotlib()
    from matplotlib.figure import Figure
    from matplotlib.patches import Rectangle

    if isinstance(layers, (str, bytes)) or not isinstance(layers, Sequence) or not layers:
        raise ValueError(
            "layers must be a non-empty sequence of qkv.HeadWeights or modules with to_heads(), "
            f"got {type(layers).__name__}"
        )
    weights = [head_weights(layer) for layer in layers]
    widest = max(w.num_heads for w in weights)
    figure = Figure(
        figsize=(min(2.4 * len(weights), 2.4 + 0.28 * widest * len(weights)), 2.7),
        dpi=100,
        layout="constrained",
    )
    if title is not None:
        figure.suptitle(title, fontsize=FONT + 1)
    axes = figure.subplots(1, len(weights), squeeze=False)[0]
    for n, (ax, w) in enumerate(zip(axes, weights, strict=True)):
        h, h_kv = w.num_heads, w.num_kv_heads
        group = h // h_kv
        size = 0.8  # a head's square, in head units
        for j in range(h_kv):  # the K/V heads, each under the middle of its group
            x = j * group + (group - 1) / 2
            ax.add_patch(Rectangle((x - size / 2, 0), size, size, facecolor=head_colour(j),
                                   edgecolor=EDGE_COLOUR, gid=f"kv:{n}:{j}"))  # fmt: skip
            if h <= 8:
                kv_label = math(f"K_{{{j + 1}}}") + "\n" + math(f"V_{{{j + 1}}}")  # from 1
                ax.text(x, -0.2, kv_label, ha="center", va="top", fontsize=FONT - 2,
                        color=TEXT_COLOUR, linespacing=1.1)  # fmt: skip
        for i in range(h):  # the query heads, coloured by the K/V head they read
            j = i // group
            ax.add_patch(Rectangle((i - size / 2, 2.2), size, size, facecolor=head_colour(j),
                                   alpha=0.55, edgecolor=EDGE_COLOUR, gid=f"query:{n}:{i}"))  # fmt: skip
            if h <= 8:
                ax.text(i, 3.15, math(f"Q_{{{i + 1}}}"), ha="center", va="bottom", fontsize=FONT - 2,
                        color=TEXT_COLOUR)  # fmt: skip
            ax.plot([i, j * group + (group - 1) / 2], [2.2, size], color=head_colour(j),
                    linewidth=1.2, gid=f"reads:{n}:{i}")  # fmt: skip
        ax.set_xlim(-0.8, widest - 0.2)
        ax.set_ylim(-3.0, 3.8)
        ax.set_aspect("equal")
        ax.axis("off")
        ax.set_title(_sharing_name(h, h_kv), fontsize=FONT)
        cached = h_kv * (w.d_k + w.d_v)  # a key and a value per K/V head
        share = "" if h_kv == h else f" ({h_kv}/{h})"
        label = (  # heads are numbered from 1, as in the book's text
            f"$h$ = {h}, $h_{{kv}}$ = {h_kv}, $d_k$ = {w.d_k}, $d_v$ = {w.d_v}\n"
            f"cached per token per layer:\n$h_{{kv}} (d_k + d_v)$ = {cached} numbers{share}"
        )
        ax.text((h - 1) / 2, -1.6, label, ha="center", va="top", fontsize=FONT - 2, color=TEXT_COLOUR)
    return figure


def cache_growth(cached: int, *, axis_labels: bool = False, previous_row: bool = False) -> Figure:
    """The causal score matrix before and after one decoding step: one new row, one new column.

    Left, the ``cached × cached`` scores :math:`q_t k_s^\\top` of the tokens so far (row
    t a query, column s a key; above the diagonal masked), labelled with their sizes.
    Right, the same after
    one more token: a new row (the new query, in full colour, reading every key)
    and a new column (the new key), masked for every earlier row, so the earlier
    rows, and the outputs made from them, are unchanged. Earlier cells are drawn
    light: they were computed at earlier steps and are not kept (only K and V are
    cached), since no later step needs them.

    Parameters
    ----------
    cached : int
        Tokens before the step (at least 1).
    axis_labels : bool, default False
        Name the axes: "query t" down the left of the first matrix (rows) and "key s"
        under each (columns). Off by default, which draws the figure as before.
    previous_row : bool, default False
        Draw the first matrix's last row in full colour too: the one row the step
        before computed, so each matrix shows its own step's row and the legend says
        so. Off by default, which draws the first matrix all pale, as before.

    Returns
    -------
    matplotlib.figure.Figure
        ``cells(figure, "before")`` and ``cells(figure, "after")`` read the two
        matrices back (colours, and which cells are hatched as masked).

    See Also
    --------
    decoding_step : the same step drawn with its query, key and value rows.
    :doc:`inference` : why the cache keeps K and V and not Q.

    Examples
    --------
    >>> from qkv.diagrams import cells
    >>> from qkv.diagrams.inference import cache_growth
    >>> after = cells(cache_growth(4), "after")
    >>> [row[4] for row in after.hatched]  # the new key: masked for every earlier row
    [True, True, True, True, False]
    """
    cached = require_positive_int("cached", cached)

    rows = cached + 1
    scale = _Scale(min(0.3, (_MAX_WIDTH - 4.0) / (2 * rows)))  # big cells: few of them
    gap, margin = scale.units(1.1), scale.units(0.3)
    top = scale.line * 1.6 + scale.above
    width = margin + cached + gap + rows + scale.units(2.6)
    height = top + rows + scale.below + scale.line * 4.9
    canvas = _canvas(width, height, scale)
    canvas.title(f"Causal attention scores, one step: {cached} tokens, then {rows}")
    colour = ROLE_COLOURS["q"]
    light = _lighter(_lighter(colour))  # paler still: not computed in a cached step

    def cells_of(n: int, new: bool) -> tuple[list[list[str]], list[list[bool]]]:
        latest = new or previous_row  # this matrix's last row: computed at its own step
        colours = [[colour if latest and t == n - 1 else light for s in range(n)] for t in range(n)]
        return colours, [[s > t for s in range(n)] for t in range(n)]

    for name, x, n, new in (("before", margin, cached, False), ("after", margin + cached + gap, rows, True)):
        colours, masked = cells_of(n, new)
        label = math(f"{n} \\times {n}")  # queries × keys: a full pass's T × S
        canvas.matrix(x, top, n, n, colour, cell_colours=colours, hatch_cells=masked, label=label,
                      frame=ROLE_COLOURS["q"], gid=name)  # fmt: skip
    x_after = margin + cached + gap
    middle = top + cached / 2
    canvas.arrow(margin + cached + 0.2, middle, x_after - 0.2, middle, label="+1 token")
    outlines = (
        ("new-row", (x_after, top + cached, rows, 1)),
        ("new-column", (x_after + cached, top, 1, rows)),
    )
    for gid, (x, y, w, h) in outlines:
        canvas.outline(x, y, w, h, gid=gid)
    if axis_labels:  # rows are queries t, columns keys s, in both matrices
        canvas.text(margin - scale.units(0.06), top + cached / 2, "query $t$", ha="right",
                    rotation=90, size=0.85, gid="axis-query")  # fmt: skip
        for x, n in ((margin, cached), (x_after, rows)):
            canvas.text(x + n / 2, top + n + scale.units(0.04), "key $s$", va="top", size=0.85,
                        gid="axis-key")  # fmt: skip
    x_text = x_after + rows + scale.units(0.12)
    canvas.text(x_text, top + cached + 0.5, f"new query: a new row, 1 × {rows}:\nall a cached step computes",
                ha="left", size=0.85)  # fmt: skip
    canvas.text(x_text, middle, "new key: a new column,\nmasked for earlier rows", ha="left", size=0.85)
    pale = (
        "full colour: the one row each cached step computes (left: the step before)\n"
        "pale: computed at earlier steps, unchanged, and not kept (only K and V are cached)"
        if previous_row
        else "pale: not computed in a cached step (computed at earlier steps, unchanged,\n"
        "and not kept: only K and V are cached)"
    )
    legend = (
        f"{pale}\nhatched: masked (a later key)\n"
        f"T queries × S keys: a full pass, T = S = {rows}; a cached step, T = 1, S = {rows}"
    )
    canvas.text(margin, top + rows + scale.below + scale.line, legend, ha="left", va="top", size=0.85)
    return canvas.fit()


# --- Bytes read per decoding step --------------------------------------------------------------


def _gib_values(name: str, values: object) -> list[float]:
    """``values`` as a list of finite, non-negative floats (GiB), or a clear error naming ``name``."""
    if isinstance(values, (str, bytes)) or not isinstance(values, Sequence):
        raise TypeError(f"{name} must be a sequence of numbers (GiB), got {type(values).__name__}")
    numbers = []
    for i, value in enumerate(values):
        if isinstance(value, bool) or not isinstance(value, (int, float, np.integer, np.floating)):
            raise TypeError(f"{name}[{i}] must be a number (GiB), got {type(value).__name__}")
        number = float(value)
        if not np.isfinite(number) or number < 0:
            raise ValueError(f"{name}[{i}] must be a finite number of GiB, at least 0, got {number:g}")
        numbers.append(number)
    return numbers


def bytes_per_step(
    kv_heads: Sequence[int],
    weights: Sequence[float],
    cache: Sequence[float],
    *,
    texts: Sequence[int] = (1, 32),
    title: str | None = None,
) -> Figure:
    """GiB one decoding step reads, weights and K/V cache stacked, for each K/V head count.

    One panel per batch size (``texts``), each on its own scale; in each, one bar per
    K/V head count: the weights at the bottom (grey, read once per step whatever the
    batch), the cache of every text on top (K's colour: ``texts × cache``). Each bar
    is labelled with its total, rounded to 0.1 GiB as ``round(weights + texts × cache, 1)``,
    and each part with its own value (inside the part, or beside it when too thin).

    Parameters
    ----------
    kv_heads : sequence of int
        The K/V head counts compared, left to right in each panel (e.g. ``(32, 8)``).
    weights : sequence of float
        For each K/V head count, the GiB of weights one step reads.
    cache : sequence of float
        For each K/V head count, the GiB of one text's K/V cache.
    texts : sequence of int
        The batch sizes, one panel each (texts decoded together, each with its own cache).
    title : str, optional
        A title over the figure: say what to look at.

    Returns
    -------
    matplotlib.figure.Figure
        One axes per batch size; each bar's parts have gids
        ``"weights:{texts}:{kv_heads}"`` and ``"cache:{texts}:{kv_heads}"``.

    See Also
    --------
    kv_sharing : which K/V head each query head reads.
    :doc:`inference` : what fewer K/V heads save.

    Examples
    --------
    >>> from qkv.diagrams import patches_by_gid
    >>> from qkv.diagrams.inference import bytes_per_step
    >>> figure = bytes_per_step((32, 8), [15.5, 15.0], [4.0, 1.0], texts=(1, 32))
    >>> [float(p.get_height()) for p in patches_by_gid(figure, "cache:32:")]
    [128.0, 32.0]
    """
    require_matplotlib()
    from matplotlib.figure import Figure

    if isinstance(kv_heads, (str, bytes)) or not isinstance(kv_heads, Sequence) or not kv_heads:
        raise ValueError(f"kv_heads must be a non-empty sequence of ints, got {kv_heads!r}")
    heads = [require_positive_int(f"kv_heads[{i}]", n) for i, n in enumerate(kv_heads)]
    weight_gib, cache_gib = _gib_values("weights", weights), _gib_values("cache", cache)
    for name, values in (("weights", weight_gib), ("cache", cache_gib)):
        if len(values) != len(heads):
            raise ValueError(
                f"{name} has {len(values)} values, but kv_heads has {len(heads)}: "
                "one value per K/V head count"
            )
    if isinstance(texts, (str, bytes)) or not isinstance(texts, Sequence) or not texts:
        raise ValueError(f"texts must be a non-empty sequence of ints, got {texts!r}")
    batches = [require_positive_int(f"texts[{i}]", n) for i, n in enumerate(texts)]
    if title is not None and not isinstance(title, str):
        raise TypeError(f"title must be a str, got {type(title).__name__}")

    colours = {"weights": ROLE_COLOURS["x"], "cache": ROLE_COLOURS["k"]}
    names = {"weights": "weights", "cache": "K/V cache"}  # the key's labels
    figure = Figure(figsize=(min(_MAX_WIDTH, 0.6 + 1.2 * len(heads) * len(batches) + 0.9 * len(batches)),
                             3.8), dpi=100, layout="constrained")  # fmt: skip
    axes = figure.subplots(1, len(batches), squeeze=False)[0]
    for ax, batch in zip(axes, batches, strict=True):
        totals = [w + batch * c for w, c in zip(weight_gib, cache_gib, strict=True)]
        top = max(totals) * 1.3 or 1.0  # room for the totals' labels and the key
        for i, (n, w, c) in enumerate(zip(heads, weight_gib, cache_gib, strict=True)):
            bottom = 0.0
            for part, height in (("weights", w), ("cache", batch * c)):
                ax.bar(i, height, 0.6, bottom=bottom, color=colours[part], edgecolor=EDGE_COLOUR,
                       linewidth=0.6, gid=f"{part}:{batch}:{n}",
                       label=names[part] if i == 0 else None)  # fmt: skip
                if height >= 0.1 * top:  # room inside the part
                    ax.text(i, bottom + height / 2, f"{height:.1f}", ha="center", va="center",
                            fontsize=FONT, color=ink_on(colours[part], 1.0))  # fmt: skip
                elif height > 0:  # too thin: beside it
                    ax.text(i + 0.33, bottom + height / 2, f"{height:.1f}", ha="left", va="center",
                            fontsize=FONT - 1, color=TEXT_COLOUR)  # fmt: skip
                bottom += height
            ax.text(i, bottom + 0.02 * top, f"{round(bottom, 1):.1f}", ha="center", va="bottom",
                    fontsize=FONT + 1, color=TEXT_COLOUR, weight="bold",
                    gid=f"total:{batch}:{n}")  # fmt: skip
        ax.set_ylim(0, top)
        ax.set_xlim(-0.55, len(heads) - 0.3)
        ax.set_xticks(range(len(heads)), [str(n) for n in heads], fontsize=FONT)
        ax.set_xlabel("K/V heads", fontsize=FONT)
        ax.set_title(f"{batch} text{'s' if batch != 1 else ''}", fontsize=FONT + 1)
        ax.tick_params(axis="y", labelsize=FONT - 1)
        ax.spines[["top", "right"]].set_visible(False)
    axes[0].set_ylabel("GiB read per step", fontsize=FONT)
    axes[0].legend(loc="upper right", fontsize=FONT - 1, frameon=False)  # one key, first panel
    if title is not None:
        figure.suptitle(title, fontsize=FONT + 2)
    return figure
