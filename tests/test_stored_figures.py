"""The nbval settings in book/conftest.py compare each fresh figure with the stored one.

nbval itself skips PNG outputs (their bytes differ between machines), yet the book is
built from the stored outputs, so a stale or misplaced figure would reach readers.
These tests show the loose comparison passing the same figure and failing another.
"""

from __future__ import annotations

import base64
import importlib.util
import io
from pathlib import Path

import matplotlib
import pytest

matplotlib.use("Agg")
import matplotlib.pyplot as plt

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def settings():
    spec = importlib.util.spec_from_file_location("book_conftest", ROOT / "book" / "conftest.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _output(draw) -> dict:
    figure, ax = plt.subplots(figsize=(4, 3))
    draw(ax)
    buffer = io.BytesIO()
    figure.savefig(buffer, format="png", dpi=72)
    plt.close(figure)
    data = {"image/png": base64.b64encode(buffer.getvalue()).decode(), "text/plain": "<Figure>"}
    return {"output_type": "display_data", "data": data, "metadata": {}}


def _line(ax) -> None:
    ax.plot([0, 1, 2], [0, 1, 4])
    ax.set_title("curves")


def _bars(ax) -> None:
    ax.bar(["a", "b", "c"], [3, 1, 2], color="black")
    ax.set_title("bars")


def test_the_same_figure_passes(settings) -> None:
    assert settings.figure_differences([_output(_line)], [_output(_line)]) == []


def test_another_figure_fails_with_a_message_that_says_what_to_do(settings) -> None:
    problems = settings.figure_differences([_output(_line)], [_output(_bars)])
    assert len(problems) == 1 and "stale" in problems[0] and "make execute" in problems[0]


def test_a_missing_or_extra_figure_fails(settings) -> None:
    text = {"output_type": "stream", "name": "stdout", "text": "hello\n"}
    assert settings.figure_differences([_output(_line), text], [text])[0].startswith("the cell draws 1")


def test_nbval_compares_figures_once_the_settings_load(settings) -> None:
    from nbval.plugin import IPyNbCell

    assert getattr(IPyNbCell.compare_outputs, "compares_figures", False)
