"""Every figure a diagram test draws is checked for text a reader can read."""

from __future__ import annotations

import traceback
from pathlib import Path

import pytest

from qkv.diagrams._draw import MIN_TEXT_PX, shown_text_px

DIAGRAMS = str(Path(__file__).parent.parent / "src" / "qkv" / "diagrams")


@pytest.fixture(autouse=True)
def readable_diagrams(request, monkeypatch):
    """Fail a diagram test whose figures show a text under MIN_TEXT_PX at 1280 px, naming both.

    Every ``Figure`` made while a ``tests/test_diagrams*.py`` test runs is recorded with
    the public ``qkv.diagrams`` function that made it; after the test, each is laid out
    as the book saves it and its smallest text is measured (see ``shown_text_px``).
    """
    if not request.node.fspath.basename.startswith("test_diagrams"):
        yield
        return
    from matplotlib.figure import Figure

    made: list[tuple[Figure, str]] = []
    init = Figure.__init__

    def recording(self, *args, **kwargs):
        init(self, *args, **kwargs)
        stack = traceback.extract_stack()
        makers = [frame.name for frame in stack if frame.filename.startswith(DIAGRAMS)]
        made.append((self, makers[0] if makers else "?"))

    monkeypatch.setattr(Figure, "__init__", recording)
    yield
    monkeypatch.undo()
    small = []
    for figure, maker in made:
        if maker == "?" or not figure.axes:
            continue
        shown = shown_text_px(figure)
        small += [f"{maker}: {text!r} shows at {px:.1f} px" for px, text in shown if px < MIN_TEXT_PX]
    assert not small, f"texts under {MIN_TEXT_PX} px at 1280 px:\n" + "\n".join(dict.fromkeys(small))
