"""What every diagram shares: the book's colours, matrices drawn to scale, arrows and labels.

A diagram is drawn in *cell units*: one unit is one entry of a matrix, so a
(5, 12) matrix is a 12 × 5 rectangle and every block is to scale with every
other. :class:`Canvas` turns units into inches once, for the whole figure.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any, NamedTuple

import torch

from qkv._validation import shape_str
from qkv.heads import HeadWeights

if TYPE_CHECKING:  # pragma: no cover
    from matplotlib.axes import Axes
    from matplotlib.figure import Figure

# One colour per role, across the whole book (Okabe and Ito's palette, safe for the
# common colour-vision deficiencies, dark enough to read on white in either theme).
ROLE_COLOURS: dict[str, str] = {
    "x": "#9A9A9A",  # an input: X, the decoder's states, the encoder's output
    "q": "#0072B2",  # queries and W^Q (blue)
    "k": "#D55E00",  # keys and W^K (vermillion)
    "v": "#009E73",  # values and W^V (bluish green)
    "o": "#CC79A7",  # W^O and the output (reddish purple)
    "weights": "#E69F00",  # attention weights (orange)
}

# One colour per head (Paul Tol's "muted" scheme, also colour-blind safe), in order.
# Green comes last: the first heads never look like V's green.
HEAD_COLOURS: tuple[str, ...] = (
    "#332288",  # indigo
    "#88CCEE",  # cyan
    "#CC6677",  # rose
    "#DDCC77",  # sand
    "#44AA99",  # teal
    "#AA4499",  # purple
    "#999933",  # olive
    "#882255",  # wine
    "#117733",  # green
)

#: The diagrams' text size, in points.
FONT = 11.0

#: The smallest text a diagram draws, in points: 11 CSS px in a figure no wider than the column.
MIN_POINTS = 8.0

#: Above this many cells a matrix is drawn as blocks of one colour, without a grid.
LARGE = 4096

#: What a masked (blocked) cell looks like: never a colour a weight can take.
MASKED_COLOUR = "#FFFFFF"
MASKED_HATCH = "////"
EDGE_COLOUR = "#333333"
TEXT_COLOUR = "#222222"



def head_colour(i: int) -> str:
    """The colour of head ``i`` (cycling after nine heads)."""
    return HEAD_COLOURS[i % len(HEAD_COLOURS)]


def ink_on(colour: str, alpha: float = 0.85) -> str:
    """Dark or white text, whichever reads better on ``colour`` drawn at ``alpha`` over white."""
    from matplotlib.colors import to_rgb

    red, green, blue = (alpha * c + (1 - alpha) for c in to_rgb(colour))  # as seen over white
    return TEXT_COLOUR if 0.299 * red + 0.587 * green + 0.114 * blue > 0.6 else "#FFFFFF"


def contrast_ratio(one: str, other: str) -> float:
    """WCAG's contrast ratio of two opaque colours, from 1 (the same) to 21 (black on white)."""
    from matplotlib.colors import to_rgb

    def luminance(colour: str) -> float:
        linear = [c / 12.92 if c <= 0.04045 else ((c + 0.055) / 1.055) ** 2.4 for c in to_rgb(colour)]
        return 0.2126 * linear[0] + 0.7152 * linear[1] + 0.0722 * linear[2]

    light, dark = sorted((luminance(one), luminance(other)), reverse=True)
    return (light + 0.05) / (dark + 0.05)


def readable_ink(colour: str) -> str:
    """White, the book's dark text or black: the first that reads at 4.5:1 (WCAG AA) on opaque ``colour``."""
    for ink in ("#FFFFFF", TEXT_COLOUR, "#000000"):
        if contrast_ratio(ink, colour) >= 4.5:
            return ink
    return max(("#FFFFFF", "#000000"), key=lambda ink: contrast_ratio(ink, colour))


def head_weights(layer: object) -> HeadWeights:
    """The per-head weights of a HeadWeights or of a module with ``to_heads()``."""
    if isinstance(layer, HeadWeights):
        return layer
    to_heads = getattr(layer, "to_heads", None)
    if to_heads is None:
        raise TypeError(
            "layer must be a qkv.HeadWeights or a module with to_heads() (qkv.MultiHeadAttention, "
            f"qkv.PerHeadMultiHeadAttention), got {type(layer).__name__}"
        )
    weights = to_heads()
    if not isinstance(weights, HeadWeights):
        raise TypeError(f"layer.to_heads() must return a qkv.HeadWeights, got {type(weights).__name__}")
    return weights


def math(text: str) -> str:
    """``"W^Q"`` as matplotlib maths, ``"$W^Q$"``; text already in ``$...$`` is kept."""
    if text.startswith("$") and text.endswith("$"):
        return text
    return f"${text}$"


def require_matplotlib() -> None:
    """Raise an ImportError that says how to install matplotlib, when it is missing."""
    try:
        import matplotlib  # noqa: F401 - only checks that it can be imported
    except ImportError as error:
        raise ImportError("qkv's diagrams need matplotlib: pip install 'qkv[plot]'") from error


def as_matrix(name: str, x: object, *, layout: str, batch_first: bool = True) -> torch.Tensor:
    """A 2-D tensor from ``x``: a tensor of 2 dimensions, or the first sequence of a 3-D batch.

    A batch is (B, L, features), or (L, B, features) when ``batch_first`` is False (the
    layout of a module built with ``batch_first=False``).
    """
    if not isinstance(x, torch.Tensor):
        raise TypeError(f"{name} must be a torch.Tensor {layout}, got {type(x).__name__}")
    if x.dim() == 3:
        if 0 in x.shape[:2]:
            raise ValueError(f"{name} is an empty batch, shape {shape_str(x.shape)}: nothing to draw")
        x = x[0] if batch_first else x[:, 0]  # the first sequence of a batch
    if x.dim() != 2:
        raise ValueError(
            f"{name} must have 2 dimensions {layout} (or 3, a batch, of which the first sequence is "
            f"drawn), got shape {shape_str(x.shape)}"
        )
    if 0 in x.shape:
        raise ValueError(f"{name} has shape {shape_str(x.shape)}: nothing to draw")
    return x.detach()


def batch_first_of(layer: object) -> bool:
    """Whether ``layer`` (a module, or HeadWeights) takes batch-first inputs; True unless it says not."""
    flag = getattr(layer, "batch_first", True)
    return flag if isinstance(flag, bool) else True


def layer_inputs(
    layer: object, x: object, key: object | None, value: object | None
) -> tuple[HeadWeights, torch.Tensor, torch.Tensor, torch.Tensor]:
    """The layer's per-head weights and its three inputs as matrices, checked against its widths.

    ``key`` defaults to ``x`` (self-attention) and ``value`` to ``key``; a layer whose
    kdim or vdim is not d_model needs them passed.
    """
    from qkv._validation import require_size

    weights = head_weights(layer)
    first = batch_first_of(layer)
    x2 = as_matrix("x", x, layout="(T, d_model)", batch_first=first)
    require_size("x", x2, 1, weights.embed_dim, "features", "the layer's d_model")
    for name, given, width in (("key", key, weights.kdim), ("value", value, weights.vdim)):
        if given is None and width != weights.embed_dim and (name == "key" or key is None):
            raise ValueError(
                f"the layer's {'kdim' if name == 'key' else 'vdim'} is {width}, not d_model = "
                f"{weights.embed_dim}: pass {name}= (S, {width}), the input its W^{name[0].upper()} reads"
            )
    k2 = x2 if key is None else as_matrix("key", key, layout="(S, kdim)", batch_first=first)
    v2 = k2 if value is None else as_matrix("value", value, layout="(S, vdim)", batch_first=first)
    require_size("key", k2, 1, weights.kdim, "features", "the layer's kdim")
    require_size("value", v2, 1, weights.vdim, "features", "the layer's vdim")
    if k2.shape[0] != v2.shape[0]:
        keys_from = "key" if key is not None else "x, the keys' input by default"
        raise ValueError(
            f"value has {v2.shape[0]} positions but the keys ({keys_from}) have {k2.shape[0]}: "
            "keys and values come in pairs"
        )
    return weights, x2, k2, v2


class Canvas:
    """A figure whose coordinates are matrix cells, y growing downwards.

    Parameters
    ----------
    width, height : float
        The drawing's extent in cell units (margins included).
    unit : float
        Inches per cell unit; the figure is ``width · unit`` inches wide, capped at
        ``max_width`` inches (then every unit shrinks alike).
    max_width : float
        The widest the figure may be, in inches (7 fits the book's column).
    """

    def __init__(
        self,
        width: float,
        height: float,
        *,
        unit: float = 0.16,
        max_width: float = 7.0,
        extra_width: float = 0.0,
        extra_height: float = 0.0,
        font: float | None = None,
    ) -> None:
        require_matplotlib()
        from matplotlib.figure import Figure

        # extra_width/extra_height: inches of gaps and labels, which do not scale with the cells.
        unit = min(unit, (max_width - extra_width) / width)
        self.unit = unit
        width, height = width + extra_width / unit, height + extra_height / unit
        self.width, self.height = width, height
        self.figure: Figure = Figure(figsize=(width * unit, height * unit), dpi=100)
        self.ax: Axes = self.figure.add_axes((0.0, 0.0, 1.0, 1.0))
        self.ax.set_xlim(0, width)
        self.ax.set_ylim(height, 0)  # y grows downwards, as rows of a matrix do
        self.ax.set_aspect("equal")
        self.ax.axis("off")
        # One text size for every diagram, whatever the cells' size: readable at phone width.
        self.font = font if font is not None else FONT

    def inch(self, inches: float) -> float:
        """``inches`` in cell units: for gaps and offsets that must not shrink with the cells."""
        return inches / self.unit

    def matrix(
        self,
        x: float,
        y: float,
        rows: int,
        cols: int,
        colour: str,
        *,
        column_colours: Sequence[str] | None = None,
        row_colours: Sequence[str] | None = None,
        cell_colours: Sequence[Sequence[str]] | None = None,
        cell_text: Sequence[Sequence[str]] | None = None,
        hatch_cells: Sequence[Sequence[bool]] | None = None,
        label: str | None = None,
        shape: Sequence[int] | None = None,
        grid: bool = True,
        alpha: float = 0.85,
        frame: str = EDGE_COLOUR,
        gid: str | None = None,
    ) -> dict[str, float]:
        """Draw a ``rows × cols`` matrix with its top-left corner at (x, y); return its box.

        ``column_colours`` colours each column (a head's block of columns, say),
        ``row_colours`` each row, ``cell_colours`` each cell; otherwise all cells
        are ``colour``; ``hatch_cells`` marks cells drawn as masked (hatched on
        white). ``frame`` colours the outline (the role's colour when the cells show
        heads). ``label`` (maths, e.g. ``"W^Q"``) goes above, ``shape`` below, as
        ``(5, 12)``. The cells are one collection per matrix (fast at any size);
        what each cell shows is recorded under ``gid`` (default: the label) for
        :func:`cells` to read back.
        """
        from matplotlib.collections import PatchCollection
        from matplotlib.patches import Rectangle

        name = gid if gid is not None else (label or "matrix")
        cell_points = 72 * self.unit  # a cell's side, in points
        grid = grid and cell_points >= 4  # grid lines on tiny cells would wash the colours out
        colours: list[list[str]] = []
        for r in range(rows):
            if cell_colours is not None:
                colours.append([cell_colours[r][c] for c in range(cols)])
            elif column_colours is not None:
                colours.append([column_colours[c] for c in range(cols)])
            elif row_colours is not None:
                colours.append([row_colours[r]] * cols)
            else:
                colours.append([colour] * cols)
        hatched = [[bool(hatch_cells[r][c]) if hatch_cells is not None else False for c in range(cols)]
                   for r in range(rows)]  # fmt: skip
        plain = [(r, c) for r in range(rows) for c in range(cols) if not hatched[r][c]]
        masked = [(r, c) for r in range(rows) for c in range(cols) if hatched[r][c]]
        if rows * cols > LARGE and not masked and cell_text is None:
            # Too many cells to draw one by one (and too small to see): draw each run of one
            # colour along the columns as one rectangle spanning the rows that share it.
            self._runs(x, y, colours, alpha, name)
            plain = []
        if plain:
            self.ax.add_collection(
                PatchCollection(
                    [Rectangle((x + c, y + r), 1, 1) for r, c in plain],
                    facecolors=[colours[r][c] for r, c in plain],
                    edgecolors="#FFFFFF" if grid else "none",
                    linewidths=0.4 if grid else 0.0,
                    alpha=alpha,
                    gid=f"{name}:cells",
                )
            )
        if masked:
            hatched_patches = PatchCollection(
                [Rectangle((x + c, y + r), 1, 1) for r, c in masked],
                facecolors=MASKED_COLOUR, edgecolors=EDGE_COLOUR, linewidths=0.4, hatch=MASKED_HATCH,
                gid=f"{name}:masked",
            )  # fmt: skip
            self.ax.add_collection(hatched_patches)
        texts = [["" for _ in range(cols)] for _ in range(rows)]
        if cell_text is not None:
            for r in range(rows):
                for c in range(cols):
                    if cell_text[r][c]:
                        texts[r][c] = cell_text[r][c]
                        # The text fits its cell (about 0.6 of the side per character), or is left out.
                        length = max(1, len(cell_text[r][c]))
                        points = min(0.75 * self.font, 0.9 * cell_points / length)
                        if points < MIN_POINTS and MIN_POINTS * 0.6 * length <= 0.85 * cell_points:
                            points = MIN_POINTS  # a digit is about 0.6 em wide: it still fits
                        if points >= MIN_POINTS:  # smaller would be unreadable in the book
                            ink = TEXT_COLOUR if hatched[r][c] else ink_on(colours[r][c], alpha)
                            self.text(x + c + 0.5, y + r + 0.5, cell_text[r][c], size=points / self.font,
                                      colour=ink)  # fmt: skip
        shown = [[MASKED_COLOUR if hatched[r][c] else colours[r][c] for c in range(cols)]
                 for r in range(rows)]  # fmt: skip
        _registry(self.figure)[name] = Cells(shown, hatched, texts, (x, y))
        # A role-coloured frame, thinner than a third of a cell so that it never hides one.
        width = 0.9 if frame == EDGE_COLOUR else max(0.6, min(2.2, cell_points / 3))
        self.ax.add_patch(
            Rectangle((x, y), cols, rows, fill=False, edgecolor=frame, linewidth=width, gid=f"{name}:frame")
        )
        if label is not None:
            above = y - self.inch(0.06)
            self.text(x + cols / 2, above, math(label), va="bottom", size=1.15, gid=f"{name}:label")
        if shape is not None:
            below = y + rows + self.inch(0.05)
            self.text(x + cols / 2, below, shape_str(shape), va="top", size=0.85, gid=f"{name}:shape")
        return {"x": x, "y": y, "right": x + cols, "bottom": y + rows, "cols": cols, "rows": rows}

    def _runs(self, x: float, y: float, colours: list[list[str]], alpha: float, name: str) -> None:
        """A large matrix as rectangles of equal colour: runs along each row, merged down the rows."""
        from matplotlib.collections import PatchCollection
        from matplotlib.patches import Rectangle

        boxes: list[Rectangle] = []
        faces: list[str] = []
        start = 0
        rows = len(colours)
        while start < rows:  # rows with identical colour sequences are drawn as one band
            end = start + 1
            while end < rows and colours[end] == colours[start]:
                end += 1
            row = colours[start]
            c = 0
            while c < len(row):
                c_end = c + 1
                while c_end < len(row) and row[c_end] == row[c]:
                    c_end += 1
                boxes.append(Rectangle((x + c, y + start), c_end - c, end - start))
                faces.append(row[c])
                c = c_end
            start = end
        self.ax.add_collection(
            PatchCollection(boxes, facecolors=faces, edgecolors="none", alpha=alpha, gid=f"{name}:cells")
        )

    def text(
        self,
        x: float,
        y: float,
        text: str,
        *,
        size: float = 1.0,
        ha: str = "center",
        va: str = "center",
        colour: str = TEXT_COLOUR,
        gid: str | None = None,
        **kwargs: Any,
    ) -> None:
        """Text at (x, y) in cell units; ``size`` relative to the canvas's font."""
        self.ax.text(x, y, text, ha=ha, va=va, fontsize=self.font * size, color=colour, gid=gid, **kwargs)

    def arrow(
        self, x0: float, y0: float, x1: float, y1: float, *, label: str | None = None,
        via: tuple[tuple[float, float], ...] = (),
    ) -> None:  # fmt: skip
        """An arrow from (x0, y0) to (x1, y1), with an optional label beside its middle.

        ``via``: corners it bends through on the way, in order (a line to the last corner,
        the head on the final leg); by default it runs straight.
        """
        if via:
            xs, ys = zip((x0, y0), *via, strict=False)
            self.ax.plot(xs, ys, color=EDGE_COLOUR, linewidth=1.0)
        start = via[-1] if via else (x0, y0)
        self.ax.annotate(
            "", xy=(x1, y1), xytext=start,
            arrowprops={"arrowstyle": "-|>", "color": EDGE_COLOUR, "linewidth": 1.0,
                        "shrinkA": 0 if via else 2, "shrinkB": 2},
        )  # fmt: skip
        if label is not None:
            self.text((x0 + x1) / 2, (y0 + y1) / 2 - self.inch(0.04), label, va="bottom", size=0.85)

    def outline(
        self, x: float, y: float, cols: float, rows: float, *, colour: str = EDGE_COLOUR, width: float = 1.8,
        dashed: bool = False, zorder: float = 1, gid: str | None = None,
    ) -> None:  # fmt: skip
        """An unfilled frame around a ``rows × cols`` region with its top-left corner at (x, y).

        It marks part of a drawn matrix (a row a step appends, the rows a gradient
        reaches); ``dashed`` draws it dashed, ``zorder`` (matplotlib's default for a
        patch, 1) lifts it above patches drawn later.
        """
        from matplotlib.patches import Rectangle

        self.ax.add_patch(Rectangle((x, y), cols, rows, fill=False, edgecolor=colour, linewidth=width,
                                    linestyle="--" if dashed else "-", zorder=zorder, gid=gid))  # fmt: skip

    def operator(self, x: float, y: float, symbol: str) -> None:
        """An operator between blocks: ``"×"``, ``"="``, ``"→"``."""
        self.text(x, y, symbol, size=1.3)

    def title(self, text: str) -> None:
        """A title above the drawing, inside the figure."""
        self.figure.text(0.5, 0.995, text, fontsize=self.font * 1.1, ha="center", va="top", color=TEXT_COLOUR)

    def fit(self) -> Figure:
        """Widen the figure until every text lies inside it; return the figure.

        Texts keep one size whatever the cells' size, so with few or small cells a
        title or a label can be wider than the drawing, and a saved figure would
        cut it off. The drawing keeps its scale: the figure grows by the text that
        sticks out, on the side where it does (a centred title, on both sides).
        """
        from matplotlib.backends.backend_agg import RendererAgg

        figure, pad = self.figure, 4.0  # pixels of margin around the texts
        dpi = figure.dpi
        width = figure.get_figwidth() * dpi  # pixels
        renderer = RendererAgg(int(width), int(figure.get_figheight() * dpi), dpi)  # type: ignore[no-untyped-call]
        left = right = centred = 0.0
        for text in self.ax.texts:
            if text.get_text():
                box = text.get_window_extent(renderer)
                left, right = max(left, pad - box.x0), max(right, box.x1 + pad - width)
        for text in figure.texts:  # titles: centred on the figure
            if text.get_text():
                centred = max(centred, text.get_window_extent(renderer).width + 2 * pad)
        grow = max(left + right, centred - width)
        if grow <= 0:
            return figure
        extra = (grow - left - right) / 2  # what a centred title still needs, per side
        left, right = left + extra, right + extra
        per_unit = self.unit * dpi  # pixels per cell unit
        x0, x1 = self.ax.get_xlim()
        self.ax.set_xlim(x0 - left / per_unit, x1 + right / per_unit)
        figure.set_figwidth((width + left + right) / dpi)
        self.width += (left + right) / per_unit
        return figure


class Cells(NamedTuple):
    """What a drawn matrix shows, cell by cell (row-major), as :func:`cells` reads it back."""

    colours: list[list[str]]  # the face colour of each cell (MASKED_COLOUR where hatched)
    hatched: list[list[bool]]  # drawn as masked
    text: list[list[str]]  # the text written in each cell ("" for none)
    corner: tuple[float, float]  # the top-left corner, in cell units


def _registry(figure: Figure) -> dict[str, Cells]:
    registry: dict[str, Cells] | None = getattr(figure, "_qkv_cells", None)
    if registry is None:
        registry = {}
        figure._qkv_cells = registry  # type: ignore[attr-defined]
    return registry


def cells(figure: Figure, name: str) -> Cells:
    """The cells of the matrix drawn as ``name`` in ``figure`` (its label, e.g. ``"W^Q"``).

    For tests and checks: a picture is right when what it shows matches the tensors.

    Examples
    --------
    >>> import torch, qkv
    >>> mha = qkv.MultiHeadAttention(12, 3)
    >>> figure = qkv.diagrams.projection(torch.randn(5, 12), mha)
    >>> grid = qkv.diagrams.cells(figure, "W^Q").colours
    >>> len(grid), len(grid[0])  # (d_model, h·d_k)
    (12, 12)
    """
    registry = _registry(figure)
    if name not in registry:
        raise KeyError(f"no matrix named {name!r} in this figure; it has {sorted(registry)}")
    return registry[name]


def register_cells(figure: Figure, name: str, cells: Cells) -> None:
    """Record what a figure drawn without :class:`Canvas` shows, for :func:`cells` to read back."""
    _registry(figure)[name] = cells


def matrix_names(figure: Figure) -> list[str]:
    """The names of every matrix drawn in ``figure``, in drawing order."""
    return list(_registry(figure))


def patches_by_gid(figure: Figure, prefix: str) -> list[Any]:
    """Every patch of ``figure`` whose gid starts with ``prefix`` (for tests and checks)."""
    found: list[Any] = []
    for ax in figure.axes:
        found.extend(p for p in ax.patches if (p.get_gid() or "").startswith(prefix))
    return found


def texts_of(figure: Figure) -> list[str]:
    """Every text drawn in ``figure`` (titles and labels included), for tests."""
    texts = [t.get_text() for ax in figure.axes for t in ax.texts]
    texts += [t.get_text() for t in figure.texts]  # suptitle and figure-level text
    return texts


#: The smallest a figure's text may show, in CSS pixels, on a 1280-px-wide screen.
MIN_TEXT_PX = 11.0

#: The book's text column at 1280 px, in CSS pixels: a wider figure is scaled down to it.
COLUMN_PX = 720.0


def shown_text_px(figure: Figure) -> list[tuple[float, str]]:
    """Each text drawn in ``figure`` with the size it shows at in the book, smallest first.

    The book saves a figure at 100 dpi with a tight bounding box and shows it at its
    natural width in CSS pixels, scaled down to the text column (:data:`COLUMN_PX`)
    when wider; so ``s`` points show at ``s · 100/72 · min(1, COLUMN_PX / width)``
    pixels. The figure is laid out as saved, and every text it draws counts: tick labels
    and numbers in cells too, hidden ones and those of a hidden axis not.
    """
    import matplotlib as mpl
    from matplotlib.text import Text

    drawn: list[Text] = []
    draw = Text.draw

    def recording(self: Text, renderer: Any) -> None:
        if self.get_visible() and self.get_text().strip():
            drawn.append(self)
        draw(self, renderer)

    # Laid out and drawn as ``savefig`` would, but without pixels (about a third less time):
    # the saved width is the tight bounding box plus its padding on each side.
    Text.draw = recording  # type: ignore[method-assign,assignment]
    try:
        figure.draw_without_rendering()
    finally:
        Text.draw = draw  # type: ignore[method-assign]
    pad = float(mpl.rcParams["savefig.pad_inches"])
    width = (figure.get_tightbbox().width + 2 * pad) * 100
    scale = min(1.0, COLUMN_PX / width)
    return sorted((float(text.get_fontsize()) * 100 / 72 * scale, text.get_text()) for text in drawn)
