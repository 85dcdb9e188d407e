"""Where W^Q, W^K and W^V come from: one input, three matrices, one loss, one backward pass.

See also
--------
The chapter :doc:`training` (book/training.ipynb).
"""

from __future__ import annotations

import math as _math
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING

import torch

from qkv._validation import shape_str
from qkv.diagrams._draw import (
    EDGE_COLOUR,
    ROLE_COLOURS,
    TEXT_COLOUR,
    Canvas,
    layer_inputs,
    require_matplotlib,
)
from qkv.diagrams.backward import _shades, require_self_attention_head

if TYPE_CHECKING:  # pragma: no cover
    from matplotlib.figure import Figure

__all__ = ["PARAMETERS", "one_loss", "step_changes", "training_curves"]

#: The parameters ``one_loss`` draws, in the order of the forward pass.
PARAMETERS = ("embeddings", "W^Q", "W^K", "W^V", "W^O", "readout")

BACKWARD_COLOUR = "#A50026"  # the backward pass's arrows: dark red, unlike any role's colour


def one_loss(
    x: object,
    layer: object,
    *,
    gradients: Mapping[str, object] | None = None,
    head: int = 0,
    mark_sum: bool = False,
    notes_from_left: bool = False,
    self_mask: bool = False,
    gradient_rows: Mapping[str, Sequence[int]] | None = None,
) -> Figure:
    """One input X through three different matrices, and one loss back to every parameter.

    A one-layer model as :class:`qkv.models.RecallModel` builds it: the embeddings
    make X; X is multiplied by W^Q, W^K and W^V (three rows, one per matrix) into
    Q, K and V; attention, softmax(Q Kᵀ / √d_k) V, mixes them; W^O and a readout
    make the logits, and one loss reads them. Solid arrows are the forward pass;
    each has a dashed twin running back, the backward pass of one
    ``loss.backward()``. X, the matrices and Q, K, V are drawn to scale, each cell
    shaded by the size of its entry, so three different matrices look different.

    Parameters
    ----------
    x : Tensor, shape (T, d_model) or a batch (B, T, d_model)
        The attention layer's input (of a batch, the first sequence is drawn).
    layer : HeadWeights or a multi-head module
        Where W^Q, W^K, W^V and W^O come from (``to_heads()`` is called on a
        module); self-attention, so its kdim and vdim must be d_model.
    gradients : mapping of str to Tensor or list of Tensor, optional
        Gradients from one ``loss.backward()``, keyed by the names of the
        parameters drawn (``"embeddings"``, ``"W^Q"``, ``"W^K"``, ``"W^V"``,
        ``"W^O"``, ``"readout"``); each named parameter is labelled with its gradient's
        norm (a ``.grad`` of any shape, or a list of them taken as one vector,
        such as the name and number embeddings; ``None`` or absent: no label).
    head : int
        Which head's W^Q, W^K, W^V to draw.
    mark_sum : bool
        Mark where the backward pass's three branches meet at X: a circled plus at
        X's right edge and a note below X, since the gradients from W^Q, W^K and W^V
        add there (X is used three times). ``False`` (the default) draws neither.
    notes_from_left : bool
        Start the gradient labels of W^Q, W^K and W^V at each matrix's left edge,
        so that a label wider than its matrix stays clear of the arrows that run
        diagonally between X and W^Q or W^V. ``False`` (the default) centres every
        label under its matrix.
    self_mask : bool
        Write the attention box's formula with a mask, softmax(Q Kᵀ / √d_k + M) V,
        and note under the box that M is −∞ on the diagonal (each position's weight
        on itself is 0), the weights that :class:`qkv.models.RecallModel`'s
        self-mask gives. ``False`` (the default) writes softmax(Q Kᵀ / √d_k) V and
        no note.
    gradient_rows : mapping of str to sequence of int, optional
        For some of the products ``"Q"``, ``"K"``, ``"V"``, the rows (positions,
        from 0) that the backward pass reaches, e.g. ``{"Q": [T - 1]}`` when the loss
        reads only the last position's output: those rows are outlined in the
        backward pass's colour (dashed) and a note under the product says how many
        of its rows get a gradient. ``None`` (the default) outlines nothing.

    Returns
    -------
    matplotlib.figure.Figure

    See Also
    --------
    qkv.diagrams.backward_paths : the backward pass inside one head, entry by entry.
    :doc:`training` : where W^Q, W^K and W^V come from.

    Examples
    --------
    >>> import torch, qkv
    >>> mha = qkv.MultiHeadAttention(6, 1, bias=False)
    >>> figure = qkv.diagrams.one_loss(torch.randn(4, 6), mha)
    >>> qkv.diagrams.matrix_names(figure)
    ['X', 'W^Q', 'Q', 'W^K', 'K', 'W^V', 'V', 'W^O']
    """
    weights, x2, _, _ = layer_inputs(layer, x, None, None)
    require_self_attention_head(weights, head, "one_loss")
    norms = _gradient_norms(gradients)
    reached = _gradient_rows(gradient_rows, x2.shape[0])
    kv = head // (weights.num_heads // weights.num_kv_heads)
    x2 = x2.to(weights.w_q.dtype)
    with torch.no_grad():
        mats = {"W^Q": weights.w_q[head], "W^K": weights.w_k[kv], "W^V": weights.w_v[kv]}
        products = {"Q": x2 @ mats["W^Q"], "K": x2 @ mats["W^K"], "V": x2 @ mats["W^V"]}  # (T, d_·)
        w_o = weights.w_o.detach()  # (h·d_v, d_model)
    length, d_model = x2.shape
    widest = max(m.shape[1] for m in mats.values())  # d_k or d_v
    row = max(d_model, length)  # a row's height in cells
    gap, above, below, node = 0.55, 0.34, 0.62, 1.75  # inches
    header = 0.45 + 0.5  # inches: the title and the key to the arrows
    canvas = Canvas(d_model + 2 * widest + w_o.shape[1], 3 * row,
                    extra_width=4 * gap + node + 0.3, extra_height=3 * (above + below) + header)  # fmt: skip
    g, top0 = canvas.inch(gap), canvas.inch(header + above)
    tops = [top0 + i * (row + canvas.inch(above + below)) for i in range(3)]
    centres = [t + row / 2 for t in tops]
    x_left = canvas.inch(0.15)
    boxes: dict[str, dict[str, float]] = {}

    def label(name: str) -> str | None:
        return None if name not in norms else f"gradient norm {norms[name]:.3g}"

    def matrix(name: str, tensor: torch.Tensor, colour: str, left: float, centre: float) -> None:
        rows, cols = tensor.shape
        top = centre - rows / 2
        boxes[name] = canvas.matrix(left, top, rows, cols, colour, cell_colours=_shades(tensor.cpu(), colour),
                                    label=name, shape=tuple(tensor.shape), alpha=1.0)  # fmt: skip
        # Vertical arrows stop clear of the label above and of the shape and gradient below.
        boxes[name]["above"], boxes[name]["below"] = canvas.inch(0.32), canvas.inch(0.62)
        note = label(name)
        if note is not None:
            from_left = notes_from_left and name in ("W^Q", "W^K", "W^V")
            canvas.text(left if from_left else left + cols / 2, top + rows + canvas.inch(0.27), note,
                        va="top", size=0.8, colour=BACKWARD_COLOUR, gid=f"{name}:grad",
                        ha="left" if from_left else "center")  # fmt: skip

    def text_node(name: str, text: str, centre_x: float, centre_y: float, width: float) -> None:
        from matplotlib.patches import FancyBboxPatch

        w, h = canvas.inch(width), canvas.inch(0.42)
        canvas.ax.add_patch(FancyBboxPatch((centre_x - w / 2, centre_y - h / 2), w, h, boxstyle="round,pad=0",
                                           facecolor="#FFFFFF", edgecolor=EDGE_COLOUR, linewidth=0.9,
                                           gid=f"{name}:node"))  # fmt: skip
        canvas.text(centre_x, centre_y, text, size=0.85, gid=f"{name}:text")
        boxes[name] = {"x": centre_x - w / 2, "right": centre_x + w / 2, "y": centre_y - h / 2,
                       "bottom": centre_y + h / 2}  # fmt: skip
        if name in norms:
            boxes[name]["below"] = canvas.inch(0.25)
        note = label(name)
        if note is not None:
            canvas.text(centre_x, centre_y + h / 2 + canvas.inch(0.05), note, va="top", size=0.8,
                        colour=BACKWARD_COLOUR, gid=f"{name}:grad")  # fmt: skip

    matrix("X", x2, ROLE_COLOURS["x"], x_left, centres[1])
    text_node("embeddings", "embeddings", x_left + d_model / 2, tops[0] + canvas.inch(0.2), 1.05)
    w_left = x_left + d_model + g
    q_left = w_left + widest + g
    for (w_name, tensor), (p_name, product), role, centre in zip(
        mats.items(), products.items(), ("q", "k", "v"), centres, strict=True
    ):
        matrix(w_name, tensor, ROLE_COLOURS[role], w_left, centre)
        matrix(p_name, product, ROLE_COLOURS[role], q_left, centre)
        if p_name in reached:  # the rows the backward pass reaches, outlined
            _outline_rows(canvas, boxes[p_name], reached[p_name], p_name, length)
    attention_x = q_left + widest + g + canvas.inch(node) / 2
    formula = r"softmax$(QK^\top/\sqrt{d_k}+M)V$" if self_mask else r"softmax$(QK^\top/\sqrt{d_k})V$"
    text_node("attention", formula, attention_x, centres[1], node)
    if self_mask:  # under the box: what M is
        canvas.text(attention_x, centres[1] + canvas.inch(0.26), "$M$: $-\\infty$ on the diagonal", va="top",
                    size=0.75, gid="attention:mask-note")  # fmt: skip
    o_left = attention_x + canvas.inch(node) / 2 + g
    matrix("W^O", w_o, ROLE_COLOURS["o"], o_left, centres[1])
    text_node("readout", "readout", o_left + w_o.shape[1] / 2, centres[2], 0.9)
    text_node("loss", "one loss", attention_x, centres[2], 0.9)
    canvas.text(attention_x, centres[2] + canvas.inch(0.26), "(of the answer only)", va="top", size=0.75)

    offset = canvas.inch(0.05)

    def edge(start: str, end: str, sides: tuple[str, str] = ("right", "left")) -> None:
        a, b = boxes[start], boxes[end]
        x0, y0 = _side(a, sides[0])
        x1, y1 = _side(b, sides[1])
        length_ = _math.hypot(x1 - x0, y1 - y0)
        nx, ny = -(y1 - y0) / length_ * offset, (x1 - x0) / length_ * offset  # a perpendicular
        _arrow(canvas, x0 - nx, y0 - ny, x1 - nx, y1 - ny, EDGE_COLOUR, "-")
        _arrow(canvas, x1 + nx, y1 + ny, x0 + nx, y0 + ny, BACKWARD_COLOUR, "--")

    edge("embeddings", "X", ("bottom", "top"))
    for w_name, p_name in (("W^Q", "Q"), ("W^K", "K"), ("W^V", "V")):
        edge("X", w_name)
        edge(w_name, p_name)
        edge(p_name, "attention")
    edge("attention", "W^O")
    edge("W^O", "readout", ("bottom", "top"))
    edge("readout", "loss", ("left", "right"))
    if mark_sum:  # the three dashed branches end at X's right edge: their gradients add
        x_box = boxes["X"]
        middle = (x_box["y"] + x_box["bottom"]) / 2
        canvas.text(x_box["right"] + canvas.inch(0.02), middle, "+", size=0.9, colour=BACKWARD_COLOUR,
                    gid="X:sum", fontweight="bold",
                    bbox={"boxstyle": "circle,pad=0.12", "facecolor": "#FFFFFF",
                          "edgecolor": BACKWARD_COLOUR, "linewidth": 0.9})  # fmt: skip
        note_x = (x_box["x"] + x_box["right"]) / 2 - canvas.inch(0.12)  # clear of the arrows
        canvas.text(note_x, x_box["bottom"] + canvas.inch(0.34), "three gradients\nadd at +", va="top",
                    size=0.8, colour=BACKWARD_COLOUR, gid="X:sum-note")  # fmt: skip
    key_y = canvas.inch(0.45)
    _arrow(canvas, x_left, key_y, x_left + canvas.inch(0.45), key_y, EDGE_COLOUR, "-")
    canvas.text(x_left + canvas.inch(0.52), key_y, "forward: one input X, three matrices", ha="left",
                size=0.8)  # fmt: skip
    back_x = x_left + canvas.inch(3.55)
    _arrow(canvas, back_x, key_y, back_x + canvas.inch(0.45), key_y, BACKWARD_COLOUR, "--")
    canvas.text(back_x + canvas.inch(0.52), key_y, "backward: one loss.backward()", ha="left", size=0.8,
                colour=BACKWARD_COLOUR)  # fmt: skip
    canvas.title("Three different matrices read one X; one loss trains them all")
    return canvas.fit()


def _gradient_rows(rows: Mapping[str, Sequence[int]] | None, length: int) -> dict[str, list[int]]:
    """Check ``gradient_rows``: products Q, K, V, each with rows in [0, length)."""
    if rows is None:
        return {}
    if not isinstance(rows, Mapping):
        raise TypeError(f"gradient_rows must be a mapping of Q, K or V to rows, got {type(rows).__name__}")
    checked: dict[str, list[int]] = {}
    for name, wanted in rows.items():
        if name not in ("Q", "K", "V"):
            raise ValueError(f"gradient_rows has the name {name!r}; the products drawn are Q, K, V")
        picked = sorted({int(r) for r in wanted})
        if not picked or picked[0] < 0 or picked[-1] >= length:
            raise ValueError(f"gradient_rows[{name!r}] must hold rows in [0, {length}), got {list(wanted)}")
        checked[name] = picked
    return checked


def _outline_rows(canvas: Canvas, box: dict[str, float], rows: list[int], name: str, length: int) -> None:
    """Outline each run of consecutive rows of a drawn matrix, and say how many."""
    runs: list[list[int]] = []
    for r in rows:
        if runs and r == runs[-1][-1] + 1:
            runs[-1].append(r)
        else:
            runs.append([r])
    for run in runs:
        canvas.outline(box["x"], box["y"] + run[0], box["right"] - box["x"], len(run), colour=BACKWARD_COLOUR,
                       width=1.2, dashed=True, gid=f"{name}:grad-rows")  # fmt: skip
    canvas.text((box["x"] + box["right"]) / 2, box["bottom"] + canvas.inch(0.27),
                f"gradient in {len(rows)} of {length} rows", va="top", size=0.8,
                colour=BACKWARD_COLOUR, gid=f"{name}:grad-note")  # fmt: skip


def _side(box: dict[str, float], side: str) -> tuple[float, float]:
    """The middle of one side of a drawn box."""
    middle_x, middle_y = (box["x"] + box["right"]) / 2, (box["y"] + box["bottom"]) / 2
    return {"left": (box["x"], middle_y), "right": (box["right"], middle_y),
            "top": (middle_x, box["y"] - box.get("above", 0.0)),
            "bottom": (middle_x, box["bottom"] + box.get("below", 0.0))}[side]  # fmt: skip


def _arrow(canvas: Canvas, x0: float, y0: float, x1: float, y1: float, colour: str, style: str) -> None:
    canvas.ax.annotate(
        "", xy=(x1, y1), xytext=(x0, y0),
        arrowprops={"arrowstyle": "-|>", "color": colour, "linewidth": 1.0, "linestyle": style,
                    "shrinkA": 3, "shrinkB": 3},
    )  # fmt: skip


def _gradient_norms(gradients: Mapping[str, object] | None) -> dict[str, float]:
    """Each named gradient's norm, checking the names and the types."""
    if gradients is None:
        return {}
    if not isinstance(gradients, Mapping):
        raise TypeError(
            f"gradients must be a mapping of parameter name to Tensor, got {type(gradients).__name__}"
        )
    norms: dict[str, float] = {}
    for name, grad in gradients.items():
        if name not in PARAMETERS:
            raise ValueError(
                f"gradients has the name {name!r}; the parameters drawn are {', '.join(PARAMETERS)}"
            )
        if grad is None:
            continue
        parts: list[torch.Tensor] = []
        for part in grad if isinstance(grad, (list, tuple)) else [grad]:
            if not isinstance(part, torch.Tensor):
                kind = type(part).__name__
                raise TypeError(
                    f"gradients[{name!r}] must be a Tensor (a .grad) or a list of them, got {kind}"
                )
            parts.append(part.detach())
        if sum(part.numel() for part in parts) == 0:
            shapes = ", ".join(shape_str(part.shape) for part in parts) or "no tensors"
            raise ValueError(f"gradients[{name!r}] is empty ({shapes})")
        norms[name] = _math.sqrt(sum(float(part.double().pow(2).sum()) for part in parts))
    return norms


def training_curves(
    steps: Sequence[int],
    curves: Mapping[str, Sequence[float]],
    *,
    chance: float | None = None,
    chance_label: str = "chance",
    ylabel: str = "share of held-out sequences",
    title: str | None = None,
) -> Figure:
    """Shares measured during training against the step, one line per measure.

    Parameters
    ----------
    steps : sequence of int
        The training steps measured, in increasing order (0: before training).
    curves : mapping of str to sequence of float
        For each measure (e.g. ``"accuracy"``, ``"attention on the match"``), its
        value at each step, one per entry of ``steps``, each in [0, 1].
    chance : float, optional
        A chance level, drawn as a dotted line.
    chance_label : str
        What the chance level is of, for the legend (its value is added).
    ylabel, title : str, optional
        The y axis's label, and the figure's title: say what to look at.

    Returns
    -------
    matplotlib.figure.Figure
        Each measure's line has gid ``"curve-{name}"``; its y data are the values given.

    See Also
    --------
    :doc:`training` : the answers' loss alone trains the attention.

    Examples
    --------
    >>> import qkv
    >>> figure = qkv.diagrams.training_curves([0, 10], {"accuracy": [0.1, 0.9]})
    >>> [line.get_gid() for line in figure.axes[0].lines]
    ['curve-accuracy']
    """
    require_matplotlib()
    from matplotlib.figure import Figure

    at = [int(s) for s in steps]
    if not at or at != sorted(set(at)) or at[0] < 0:
        raise ValueError(f"steps must be distinct steps in increasing order, got {list(steps)}")
    if not isinstance(curves, Mapping) or not curves:
        raise ValueError("curves must map at least one measure's name to one value per step")
    figure = Figure(figsize=(6.4, 3.4), dpi=100, layout="constrained")
    ax = figure.subplots()
    for name, values in curves.items():
        numbers = [float(v) for v in values]
        if len(numbers) != len(at):
            raise ValueError(f"curves[{name!r}] has {len(numbers)} values, but steps has {len(at)}")
        if any(not 0.0 <= v <= 1.0 for v in numbers):
            raise ValueError(f"curves[{name!r}] holds a value outside [0, 1]: {numbers}")
        ax.plot(at, numbers, marker="o", markersize=3, linewidth=2, label=name, gid=f"curve-{name}")
    if chance is not None:
        label = f"{chance_label}, {chance:.3g}"
        ax.axhline(chance, color=TEXT_COLOUR, linestyle=":", linewidth=1, label=label)
    ax.set_ylim(0, 1.02)
    ax.set_xlabel("training step")
    ax.set_ylabel(ylabel)
    ax.grid(alpha=0.3)
    ax.legend(loc="center right", frameon=False)
    if title:
        ax.set_title(title)
    return figure


def step_changes(
    changes: Mapping[float, Sequence[float]],
    parts: Sequence[str],
    *,
    title: str | None = None,
) -> Figure:
    """The loss's change after one gradient step, each part alone, their sum, and all at once.

    One panel per step size, each on its own scale: a bar for each part of the
    parameters stepped alone, one for the sum of those changes, and one for the
    change when every part steps together; the panel's title gives the last two.
    Where those agree, the parts' steps add up; where they differ, the parts interact.

    Parameters
    ----------
    changes : mapping of float to sequence of float
        For each step size, the loss's change with each part stepped alone, in the
        order of ``parts``, then with all of them stepped together (one more value).
    parts : sequence of str
        The parts' names, for the bars' labels (matplotlib maths such as ``"$W^Q$"``
        is typeset).
    title : str, optional
        The figure's title: say what to look at.

    Returns
    -------
    matplotlib.figure.Figure
        One axes per step size, bars along x; each bar has gid
        ``"bar-{step size}-{label}"``, its width the value given (the sum's: the sum of
        the parts' values), and is labelled with that value, so a bar too short to see
        still shows it.

    See Also
    --------
    :doc:`training` : the parts of a network do not fight over one loss.

    Examples
    --------
    >>> import qkv
    >>> figure = qkv.diagrams.step_changes({0.1: [-0.01, -0.02, -0.03]}, ["a", "b"])
    >>> [round(float(p.get_width()), 2) for p in figure.axes[0].patches]
    [-0.01, -0.02, -0.03, -0.03]
    """
    require_matplotlib()
    from matplotlib.figure import Figure
    from matplotlib.ticker import MaxNLocator

    names = [str(p) for p in parts]
    if not names:
        raise ValueError("parts must name at least one part")
    if not isinstance(changes, Mapping) or not changes:
        raise ValueError("changes must map at least one step size to the loss's changes")
    labels = [*names, "sum of parts", "all together"]
    colours = [EDGE_COLOUR] * len(names) + ["#4575B4", "#A50026"]
    # Bars lie along x, so that the parts' names and the values read level, never rotated
    # into one another; each panel keeps its own scale (its values may be 100 times larger).
    # At most two panels in a row, so that each stays wide enough for its numbers.
    columns = min(2, len(changes))
    rows = -(-len(changes) // columns)
    height = rows * (0.42 * len(labels) + 1.3) + 0.3
    figure = Figure(figsize=(1.4 + 2.8 * columns, height), dpi=100, layout="constrained")
    grid = figure.subplots(rows, columns, squeeze=False, sharey=True)
    axes = list(grid.flat)
    for ax in axes[len(changes):]:  # an odd count leaves the last place empty
        ax.set_visible(False)
    for ax, (eta, values) in zip(axes, changes.items(), strict=False):
        numbers = [float(v) for v in values]
        if len(numbers) != len(names) + 1:
            raise ValueError(
                f"changes[{eta!r}] has {len(numbers)} values, but {len(names)} parts need "
                f"{len(names) + 1} (each alone, then all together)"
            )
        heights = [*numbers[:-1], sum(numbers[:-1]), numbers[-1]]
        for i, (label, height, colour) in enumerate(zip(labels, heights, colours, strict=True)):
            bar = ax.barh(i, height, color=colour, gid=f"bar-{eta:g}-{label}")
            ax.bar_label(bar, [f"{height:+.2g}"], fontsize=9, padding=3)
        ax.axvline(0, color=TEXT_COLOUR, linewidth=0.8)
        ax.set_yticks(range(len(labels)), labels, fontsize=10)
        ax.set_title(f"η = {eta:g}\nsum {heights[-2]:+.2g}, together {heights[-1]:+.2g}", fontsize=10)
        ax.margins(x=0.6)  # room for the bars' labels, on either side of 0
        ax.tick_params(axis="x", labelsize=9)
        ax.xaxis.set_major_locator(MaxNLocator(nbins=3))  # few ticks: long numbers stay apart
        ax.set_xlabel("change in the loss", fontsize=10)
    axes[0].invert_yaxis()  # the parts first, from the top (the axes share y)
    if title:
        figure.suptitle(title)
    return figure
