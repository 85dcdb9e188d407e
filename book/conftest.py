"""nbval settings for the chapter notebooks (pytest loads this for book/*.ipynb).

nbval compares every output of a fresh run with the stored one, except the MIME
types in each notebook collector's ``skip_compare``. It already skips PNG and JPEG;
this adds the image outputs that are not byte-for-byte reproducible across
platforms and library versions: SVG figures, and images stored by myst-nb's
``glue`` (which records them under ``application/papermill.record/<mime type>``).
Text outputs, glued text included (``application/papermill.record/text/plain``),
are still compared, after the substitutions in ``nbval_sanitize.cfg``.
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
