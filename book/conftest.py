"""nbval settings for the chapter notebooks (pytest loads this for book/*.ipynb).

nbval compares every output of a fresh run with the stored one, except the MIME
types in each notebook collector's ``skip_compare``. It already skips PNG and JPEG;
this adds the image outputs that are not byte-for-byte reproducible across
platforms and library versions: SVG figures, and images stored by myst-nb's
``glue`` (which records them under ``application/papermill.record/<mime type>``).
Text outputs, glued text included (``application/papermill.record/text/plain``),
are still compared, after the substitutions in ``nbval_sanitize.cfg``. PNG figures
that a cell displays are compared loosely (below: their number, their size and a
32 × 32 grey thumbnail); PNGs stored by ``glue`` are not compared at all.
"""

from __future__ import annotations

import pytest

GLUE_PREFIX = "application/papermill.record/"
IMAGE_TYPES = ("image/png", "image/jpeg", "image/svg+xml", "image/gif", "application/pdf")
NOT_COMPARED = (
    "image/svg+xml",
    *(GLUE_PREFIX + mime for mime in IMAGE_TYPES),
)


def pytest_collectstart(collector: pytest.Collector) -> None:
    skip_compare = getattr(collector, "skip_compare", None)
    if type(collector).__name__ == "IPyNbFile" and isinstance(skip_compare, tuple):
        collector.skip_compare = skip_compare + tuple(
            mime for mime in NOT_COMPARED if mime not in skip_compare
        )


# --- stored figures ---------------------------------------------------------
# nbval skips PNG outputs: their bytes differ between machines. But the book is built
# from the stored outputs (execute_notebooks: off), so a stored figure that a later edit
# left stale, or that came from another cell, would reach readers unnoticed. Each fresh
# PNG is therefore compared with the stored one loosely: the same number of figures,
# sizes within a few per cent, and the same picture at 32 × 32 grey pixels.
FIGURE_SIZE_TOLERANCE = 0.03  # relative, on width and on height
FIGURE_PIXEL_TOLERANCE = 0.02  # mean absolute difference at 32 × 32, grey levels 0 to 1


def _pngs(outputs: list) -> list[str]:
    return [
        output["data"]["image/png"]
        for output in outputs
        if output.get("output_type") in ("display_data", "execute_result")
        and "image/png" in output.get("data", {})
    ]


def _look(png: str) -> tuple[tuple[int, int], object]:
    import base64
    import io

    import numpy as np
    from PIL import Image

    image = Image.open(io.BytesIO(base64.b64decode(png))).convert("L")
    small = image.resize((32, 32), Image.Resampling.BILINEAR)
    return image.size, np.asarray(small, dtype=float) / 255


def figure_differences(fresh: list, stored: list) -> list[str]:
    """How the fresh run's figures differ from the stored ones, beyond rendering noise."""
    new, old = _pngs(fresh), _pngs(stored)
    if len(new) != len(old):
        return [f"the cell draws {len(new)} figure(s); {len(old)} stored"]
    problems = []
    for number, (a, b) in enumerate(zip(new, old, strict=True), start=1):
        (size_a, pixels_a), (size_b, pixels_b) = _look(a), _look(b)
        gaps = [abs(x - y) / y for x, y in zip(size_a, size_b, strict=True)]
        mean = float(abs(pixels_a - pixels_b).mean())
        if max(gaps) > FIGURE_SIZE_TOLERANCE or mean > FIGURE_PIXEL_TOLERANCE:
            problems.append(
                f"figure {number}: {size_a[0]} × {size_a[1]} px fresh, {size_b[0]} × "
                f"{size_b[1]} px stored, mean grey difference {mean:.3f} at 32 × 32: "
                "the stored figure is stale (re-execute the page: make execute NB=...)"
            )
    return problems


def _compare_figures_too() -> None:
    from nbval.plugin import IPyNbCell

    compare = IPyNbCell.compare_outputs
    if getattr(compare, "compares_figures", False):
        return

    def compare_outputs(self, test, ref, skip_compare=None):  # type: ignore[no-untyped-def]
        if not compare(self, test, ref, skip_compare):
            return False
        problems = figure_differences(test, ref)
        self.comparison_traceback.extend(problems)
        return not problems

    compare_outputs.compares_figures = True  # type: ignore[attr-defined]
    IPyNbCell.compare_outputs = compare_outputs


_compare_figures_too()
