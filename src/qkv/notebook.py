"""Notebook conventions: one call that makes a chapter reproducible.

Every chapter of the book calls :func:`setup` once, in its first code cell, so
that stored outputs equal a fresh run (the book's CI checks this with nbval).

See also
--------
CONTRIBUTING.md, "Adding a page".
"""

from __future__ import annotations

import base64
import contextlib
import importlib
import io
import logging
import os
import random
import re
import sys
import warnings
from collections.abc import Collection, Mapping
from importlib import metadata
from typing import TYPE_CHECKING

import numpy as np
import torch

if TYPE_CHECKING:  # pragma: no cover
    from matplotlib.typing import RcKeyType

__all__ = ["get_device", "glue", "restart_notice", "seed_everything", "setup"]

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

    Seeds Python, NumPy and torch; asks eager torch for deterministic algorithms
    (warning, not failing, where an operation has none; ``torch.compile``'s inductor
    keeps its own flag unless it was imported first);
    makes Keras use its torch backend (unless ``KERAS_BACKEND`` is already set), on
    the CPU (unless ``KERAS_TORCH_DEVICE`` is set), where the book measured what Keras
    does: on a GPU its fused path differs (on an H100 it refused a key and a value of
    different lengths that the CPU's accepted, and gave an empty row another output);
    keeps log noise out of the cells' output where TensorFlow is installed beside
    Keras (its C++ start-up lines, unless ``TF_CPP_MIN_LOG_LEVEL`` is set) or a
    CUDA build of torch finds no GPU (as on Colab's CPU runtime); sets short,
    fixed print precision for tensors and arrays; and applies the book's
    matplotlib style when matplotlib is installed, with inline figures at
    twice the resolution in a notebook, stored as palette PNGs (at most 256
    colours, about a third of the bytes). Prints nothing.

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
    # The book runs Keras on its torch backend; set before keras is imported.
    os.environ.setdefault("KERAS_BACKEND", "torch")
    os.environ.setdefault("KERAS_TORCH_DEVICE", "cpu")
    # Where TensorFlow is installed beside Keras (as on Colab), its C++ start-up log
    # lines would land in reader cells; 3 keeps errors only. Read when TF loads.
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
    # A CUDA build of torch on a machine with a CUDA toolkit but no GPU (Colab's CPU
    # runtime) says "No CUDA runtime is found" when torch.utils.cpp_extension is first
    # imported (torch.utils.benchmark imports it): a log line in recent versions, a
    # print in older ones (torch 2.4). Import it here, quietly, so no cell shows it.
    if torch.version.cuda and not torch.cuda.is_available():
        logging.getLogger("torch.utils.cpp_extension").setLevel(logging.ERROR)
        with contextlib.redirect_stderr(io.StringIO()):
            importlib.import_module("torch.utils.cpp_extension")
    seed_everything(seed)
    _use_deterministic_algorithms()
    # transformers imports tqdm's notebook bar, which warns when ipywidgets is absent.
    warnings.filterwarnings("ignore", message="IProgress not found")
    # Keras 3.0 warns that its EinsumDense projections drop the mask of an input that
    # carries one; the attention layer has read that mask already. Later Keras is silent.
    keras_mask_warning = r"Layer '\w+' \(of type EinsumDense\) was passed an input with a mask"
    warnings.filterwarnings("ignore", message=keras_mask_warning)
    torch.set_printoptions(precision=4, sci_mode=False, linewidth=100)
    np.set_printoptions(precision=4, suppress=True, linewidth=100)
    try:
        import matplotlib as mpl
    except ImportError:  # figures are optional; qkv itself does not need them
        return
    mpl.rcParams.update(PLOT_STYLE)
    _crisp_inline_figures()


def _use_deterministic_algorithms() -> None:
    """``torch.use_deterministic_algorithms(True, warn_only=True)``, without its slow import.

    Since torch 2.x the public function also imports ``torch._inductor.config`` (about
    two seconds, in every notebook that calls :func:`setup`) to set inductor's own flag,
    which only ``torch.compile`` reads. The book compiles nothing, so the eager flag is
    set directly; where inductor is already imported, the public function costs nothing
    and sets both.
    """
    if "torch._inductor.config" in sys.modules or not hasattr(torch._C, "_set_deterministic_algorithms"):
        torch.use_deterministic_algorithms(True, warn_only=True)
    else:
        torch._C._set_deterministic_algorithms(True, warn_only=True)


def _crisp_inline_figures() -> None:
    """Inline figures as PNG at twice the resolution, shown at their size ("retina").

    Crisp on high-density screens, phones included. PNG rather than SVG: nbval
    compares SVG outputs byte for byte (they carry dates and platform-dependent
    paths), but leaves PNG alone. Each PNG is stored with a palette
    (:func:`_fewer_colours`). Only inside IPython; elsewhere nothing happens.
    """
    try:
        from IPython import get_ipython
        from matplotlib_inline.backend_inline import set_matplotlib_formats
    except ImportError:
        return
    shell = get_ipython()
    if shell is None:
        return
    import matplotlib.pyplot  # noqa: F401 - activates the inline backend now, not after us

    set_matplotlib_formats("retina")  # type: ignore[no-untyped-call]
    from matplotlib.figure import Figure

    formatter = shell.display_formatter.formatters["image/png"]
    retina = formatter.lookup_by_type(Figure)
    formatter.for_type(Figure, lambda figure: _fewer_colours(retina(figure)))


def _fewer_colours(formatted: tuple[str, dict[str, int]] | None) -> tuple[str, dict[str, int]] | None:
    """A retina PNG (base64 text, size) redrawn with at most 256 colours.

    A figure's lines, text and colour maps use far fewer colours than a PNG can
    hold; a palette PNG of the same pixels is about a third of the bytes, so a
    chapter with a dozen figures stays light on a phone. Deterministic, and left
    as it is when Pillow is missing or the image has transparent pixels.
    """
    if formatted is None:
        return None
    try:
        from PIL import Image
    except ImportError:
        return formatted
    data, size = formatted
    image = Image.open(io.BytesIO(base64.b64decode(data)))
    if image.mode == "RGBA" and image.getchannel("A").getextrema()[0] != 255:
        return formatted
    palette = image.convert("RGB").quantize(256, method=Image.Quantize.MEDIANCUT, dither=Image.Dither.NONE)
    out = io.BytesIO()
    palette.save(out, "PNG", optimize=True)
    return base64.b64encode(out.getvalue()).decode("ascii"), size


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


#: The MIME type prefix under which a value glued with ``display=False`` is stored
#: (myst-nb's ``GLUE_PREFIX``: a test checks the two agree).
GLUE_PREFIX = "application/papermill.record/"


def glue(name: str, value: object, display: bool = True) -> None:
    """Store a computed value in the cell's output, for the prose to quote.

    The book's text quotes numbers with ``{glue:text}`name``` instead of typing
    them. This writes exactly the output ``myst_nb.glue`` writes, without needing
    myst-nb (a book-building package) where the chapters run, such as Colab.

    Parameters
    ----------
    name : str
        The name the text refers to; unique within a chapter.
    value : object
        The value; what is stored is its display form (``repr`` for a number).
    display : bool
        Show the value in the cell's output too.

    Examples
    --------
    >>> import qkv
    >>> qkv.glue("answer", 42, display=False)  # in a script, IPython shows nothing
    """
    if not isinstance(name, str) or not name:
        raise TypeError(f"name must be a non-empty str, got {name!r}")
    try:
        from IPython.core.formatters import format_display_data
        from IPython.display import display as ipython_display
    except ImportError as error:  # pragma: no cover - IPython comes with every kernel
        raise ImportError("qkv.glue needs IPython (it runs in a notebook)") from error
    bundle, bundle_metadata = format_display_data(value)  # type: ignore[no-untyped-call]
    prefix = "" if display else GLUE_PREFIX
    bundle_metadata["scrapbook"] = {"name": name, "mime_prefix": prefix}
    data = {prefix + key: item for key, item in bundle.items()}
    ipython_display(data, raw=True, metadata=bundle_metadata)  # type: ignore[no-untyped-call]


def _normalise(distribution: str) -> str:
    return re.sub(r"[-_.]+", "-", distribution).lower()


def restart_notice(before: Mapping[str, str], imported: Collection[str]) -> str:
    """After ``pip install`` in a running notebook: say whether to restart it.

    A package that pip upgraded or downgraded while the session had already
    imported it stays at its old version in memory, beside new files on disk,
    until the runtime restarts. The chapters' install cell records the installed
    versions and the imported modules before installing, then calls this.

    Parameters
    ----------
    before : Mapping[str, str]
        Distribution name to version, as installed before (for example
        ``{d.name: d.version for d in importlib.metadata.distributions()}``).
    imported : Collection[str]
        The names in ``sys.modules`` before installing.

    Returns
    -------
    str
        ``""`` when no imported package changed, else one line naming them,
        which is also printed.

    Examples
    --------
    >>> import sys, qkv
    >>> from importlib.metadata import distributions
    >>> before = {d.name: d.version for d in distributions()}
    >>> qkv.restart_notice(before, set(sys.modules))  # nothing was installed
    ''
    """
    old = {_normalise(name): version for name, version in before.items()}
    modules = {name.partition(".")[0] for name in imported}
    providers = metadata.packages_distributions()
    # A name can be installed twice (setuptools vendors packaging, for one): a package
    # changed when the version seen before is none of those installed now.
    now: dict[str, set[str]] = {}
    for distribution in metadata.distributions():
        now.setdefault(_normalise(distribution.name or ""), set()).add(distribution.version)
    changed = []
    for name, versions in now.items():
        if name not in old or old[name] in versions:
            continue
        tops = [module for module, owners in providers.items() if name in map(_normalise, owners)]
        if modules.intersection(tops):
            changed.append(f"{name} {old[name]} -> {', '.join(sorted(versions))}")
    if not changed:
        return ""
    notice = (
        f"pip changed {', '.join(sorted(changed))}, already imported in this session: "
        "restart the runtime (in Colab: Runtime > Restart session), then run the chapter again."
    )
    print(notice, file=sys.stderr)
    return notice
