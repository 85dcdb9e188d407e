"""Figures: attention maps drawn the way they are read, one row per query.

matplotlib is imported inside the functions, so ``import qkv`` does not need
it; install it with ``pip install qkv[plot]``.

See also
--------
The page :doc:`equation/attention-maps` (book/equation/attention-maps.ipynb).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

import numpy as np
import torch

from qkv._validation import require_positive_int, shape_str

if TYPE_CHECKING:  # pragma: no cover
    from matplotlib.axes import Axes
    from matplotlib.figure import Figure

__all__ = ["plot_attention", "plot_heads"]


def _require_matplotlib() -> None:
    """Raise an ImportError that says how to install matplotlib, when it is missing."""
    try:
        import matplotlib.pyplot  # noqa: F401 - only checks that it can be imported
    except ImportError as error:
        raise ImportError("qkv's figures need matplotlib: pip install 'qkv[plot]'") from error


def _as_array(weights: Any, ndim: int, layout: str) -> np.ndarray:
    if isinstance(weights, torch.Tensor):
        weights = weights.detach().float().cpu().numpy()
    array = np.asarray(weights, dtype=float)
    if array.ndim != ndim:
        raise ValueError(f"weights must have {ndim} dimensions {layout}, got shape {shape_str(array.shape)}")
    return array


def _label_axis(ax: Axes, axis: str, labels: Sequence[str] | None, size: int, name: str) -> None:
    from matplotlib.ticker import MaxNLocator

    set_ticks = ax.set_xticks if axis == "x" else ax.set_yticks
    set_label = ax.set_xlabel if axis == "x" else ax.set_ylabel
    if labels is None:
        (ax.xaxis if axis == "x" else ax.yaxis).set_major_locator(MaxNLocator(integer=True))
        set_label(f"{name} position")
        return
    if len(labels) != size:
        raise ValueError(f"{name}s has {len(labels)} labels, but weights have {size} {name} positions")
    # Short labels (digits, short words) read best upright; long ones are turned.
    rotate = axis == "x" and max((len(str(label)) for label in labels), default=0) > 5
    rotation: dict[str, Any] = {"rotation": 90} if rotate else {}
    set_ticks(range(size), labels, **rotation)
    set_label(name)


def plot_attention(
    weights: Any,
    *,
    queries: Sequence[str] | None = None,
    keys: Sequence[str] | None = None,
    ax: Axes | None = None,
    title: str | None = None,
    annotate: bool = False,
    colorbar: bool = True,
    vmax: float | None = 1.0,
    figsize: tuple[float, float] | None = None,
) -> Axes:
    """Draw an attention map: one row per query, one column per key.

    Parameters
    ----------
    weights : Tensor or array, shape (T, S)
        Attention weights; row t is where query t looks.
    queries, keys : sequence of str, optional
        Tick labels (e.g. tokens) for the rows and the columns; without them
        the axes are labelled "query position" and "key position".
    ax : matplotlib Axes, optional
        Where to draw; default a new figure.
    title : str, optional
        Say what to look at.
    annotate : bool
        Write each weight in its cell (for small maps).
    colorbar : bool
        Add a colour bar.
    vmax : float or None
        Top of the colour scale; 1.0 by default so maps are comparable, None
        to fit the data.
    figsize : (float, float), optional
        Size of the new figure, when ``ax`` is not given.

    Returns
    -------
    matplotlib.axes.Axes

    See Also
    --------
    plot_heads
    :doc:`equation/attention-maps` : reading a map row by row.

    Examples
    --------
    >>> import torch, qkv
    >>> ax = qkv.plot_attention(torch.softmax(torch.randn(4, 6), -1), title="random")
    """
    _require_matplotlib()
    import matplotlib.pyplot as plt

    array = _as_array(weights, 2, "(T, S)")
    if ax is None:
        _, ax = plt.subplots(figsize=figsize, layout="constrained")
    image = ax.imshow(array, vmin=0.0, vmax=vmax, aspect="auto", interpolation="nearest")
    _label_axis(ax, "x", keys, array.shape[1], "key")
    _label_axis(ax, "y", queries, array.shape[0], "query")
    if annotate:
        top = vmax if vmax is not None else float(array.max())
        for t, s in np.ndindex(*array.shape):
            colour = "black" if array[t, s] > 0.6 * top else "white"
            ax.text(s, t, f"{array[t, s]:.2f}", ha="center", va="center", color=colour, fontsize=8)
    if title:
        ax.set_title(title)
    if colorbar:
        ax.figure.colorbar(image, ax=ax, label="attention weight")
    return ax


def plot_heads(
    weights: Any,
    *,
    queries: Sequence[str] | None = None,
    keys: Sequence[str] | None = None,
    title: str | None = None,
    vmax: float | None = 1.0,
    ncols: int | None = None,
) -> Figure:
    """Draw each head's attention map, at most ``ncols`` to a row, with one shared colour bar.

    Parameters
    ----------
    weights : Tensor or array, shape (h, T, S)
        One map per head (take one sequence of a (B, h, T, S) batch).
    queries, keys : sequence of str, optional
        Tick labels, as in :func:`plot_attention`.
    title : str, optional
        A title for the whole figure.
    vmax : float or None
        Top of the colour scale.
    ncols : int, optional
        Maps per row; default 2, so that a figure shown at phone width keeps its
        labels readable (more heads wrap onto more rows).

    Returns
    -------
    matplotlib.figure.Figure

    See Also
    --------
    plot_attention
    :doc:`heads` : one map per head, section "Each head has its own weights".

    Examples
    --------
    >>> import torch, qkv
    >>> mha = qkv.MultiHeadAttention(12, 3)
    >>> _, weights = mha(torch.randn(1, 5, 12), need_weights=True)
    >>> figure = qkv.plot_heads(weights[0], title="three heads, three patterns")
    """
    _require_matplotlib()
    import matplotlib.pyplot as plt

    array = _as_array(weights, 3, "(h, T, S)")
    heads = array.shape[0]
    columns = min(heads, 2 if ncols is None else require_positive_int("ncols", ncols))
    rows = -(-heads // columns)  # ceiling division
    figure, grid = plt.subplots(
        rows, columns, figsize=(3.0 * columns + 0.8, 3.4 * rows), squeeze=False, layout="constrained"
    )
    for ax in grid.flat[heads:]:
        ax.set_visible(False)  # the last row's empty places
    used = list(grid.flat[:heads])
    for i, ax in enumerate(used):
        plot_attention(
            array[i], queries=queries, keys=keys, ax=ax, title=f"head {i}", colorbar=False, vmax=vmax
        )
        if i % columns:
            ax.set_ylabel("")  # the first map of each row carries the label
    figure.colorbar(used[-1].images[0], ax=list(grid.flat), label="attention weight")
    if title:
        figure.suptitle(title)
    return figure
