"""Notebook conventions: one call that makes a chapter reproducible.

Every chapter of the book calls :func:`setup` once, in its first code cell, so
that stored outputs equal a fresh run (the book's CI checks this with nbval).

See also
--------
CONTRIBUTING.md, "Adding a chapter".
"""

from __future__ import annotations

import os
import random
import warnings
from typing import TYPE_CHECKING

import numpy as np
import torch

if TYPE_CHECKING:  # pragma: no cover
    from matplotlib.typing import RcKeyType

__all__ = ["get_device", "seed_everything", "setup"]

#: Matplotlib settings shared by every figure in the book.
PLOT_STYLE: dict[RcKeyType, object] = {
    "figure.figsize": (5.0, 4.0),
    "figure.dpi": 100,
    "savefig.dpi": 100,
    "savefig.bbox": "tight",
    "font.size": 10,
    "axes.titlesize": 11,
    "axes.labelsize": 10,
    "axes.spines.top": False,
    "axes.spines.right": False,
    "image.cmap": "viridis",
    "svg.hashsalt": "qkv",
}


def seed_everything(seed: int = 0) -> None:
    """Seed Python's, NumPy's and torch's random number generators (all devices).

    Parameters
    ----------
    seed : int
        The seed.

    Examples
    --------
    >>> import torch, qkv
    >>> qkv.seed_everything(1); a = torch.rand(2)
    >>> qkv.seed_everything(1); torch.equal(a, torch.rand(2))
    True
    """
    if not isinstance(seed, int) or isinstance(seed, bool):
        raise TypeError(f"seed must be an int, got {type(seed).__name__}")
    random.seed(seed)
    np.random.seed(seed)  # noqa: NPY002 - chapters may use the legacy global generator
    torch.manual_seed(seed)  # seeds CUDA too, when present


def setup(seed: int = 0) -> None:
    """Make a notebook reproducible; call once at the top of a chapter.

    Seeds Python, NumPy and torch; asks torch for deterministic algorithms;
    makes Keras use its torch backend (unless ``KERAS_BACKEND`` is already set);
    sets short, fixed print precision for tensors and arrays; and applies the
    book's matplotlib style when matplotlib is installed, with inline figures at
    twice the resolution in a notebook. Prints nothing.

    Parameters
    ----------
    seed : int
        The seed for every random number generator.

    Examples
    --------
    >>> import qkv
    >>> qkv.setup()
    """
    # cuBLAS needs this before its first use to be deterministic on CUDA.
    os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")
    # The book runs Keras on its torch backend (no TensorFlow); set before keras is imported.
    os.environ.setdefault("KERAS_BACKEND", "torch")
    seed_everything(seed)
    torch.use_deterministic_algorithms(True, warn_only=True)
    # transformers imports tqdm's notebook bar, which warns when ipywidgets is absent.
    warnings.filterwarnings("ignore", message="IProgress not found")
    torch.set_printoptions(precision=4, sci_mode=False, linewidth=100)
    np.set_printoptions(precision=4, suppress=True, linewidth=100)
    try:
        import matplotlib as mpl
    except ImportError:  # figures are optional; qkv itself does not need them
        return
    mpl.rcParams.update(PLOT_STYLE)
    _crisp_inline_figures()


def _crisp_inline_figures() -> None:
    """Inline figures as PNG at twice the resolution, shown at their size ("retina").

    Crisp on high-density screens, phones included. PNG rather than SVG: nbval
    compares SVG outputs byte for byte (they carry dates and platform-dependent
    paths), but leaves PNG alone. Only inside IPython; elsewhere nothing happens.
    """
    try:
        from IPython import get_ipython
        from matplotlib_inline.backend_inline import set_matplotlib_formats
    except ImportError:
        return
    if get_ipython() is not None:
        set_matplotlib_formats("retina")  # type: ignore[no-untyped-call]


def get_device() -> torch.device:
    """The device chapters run on: CUDA when available, else the CPU.

    Returns
    -------
    torch.device

    Examples
    --------
    >>> import torch, qkv
    >>> qkv.get_device().type in ("cpu", "cuda")
    True
    >>> model = qkv.MultiHeadAttention(12, 3).to(qkv.get_device())
    """
    return torch.device("cuda" if torch.cuda.is_available() else "cpu")
