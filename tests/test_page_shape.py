"""The page shape (STYLE.md, CONTRIBUTING.md "The shape of a page"): every page measured.

``scripts/page_shape.py`` does the measuring; these tests run it on the book and on the
templates, and check that it fails what is over budget.
"""

from __future__ import annotations

import importlib.util
import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
SCRIPT = ROOT / "scripts" / "page_shape.py"
TEMPLATES = {shape: ROOT / "templates" / f"{shape}-page.ipynb" for shape in ("answer", "deeper")}

_spec = importlib.util.spec_from_file_location("page_shape", SCRIPT)
assert _spec and _spec.loader
page_shape = importlib.util.module_from_spec(_spec)
sys.modules["page_shape"] = page_shape
_spec.loader.exec_module(page_shape)


def _run(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, str(SCRIPT), *args], capture_output=True, text=True, cwd=ROOT)


def test_every_page_of_the_book_is_within_its_budget() -> None:
    result = _run()
    print(result.stdout)  # the table, for `pytest -s` (`make shape` prints it in `make test`)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "book/heads  " in result.stdout and "answer" in result.stdout


def test_the_templates_keep_the_shape() -> None:
    for shape, path in TEMPLATES.items():
        page = page_shape.measure(path)
        assert page.shape == shape, f"{path.name} is marked {page.shape!r}, not {shape!r}"
        assert not page.problems, f"{path.name}: {page.problems}"
    assert _run(*map(str, TEMPLATES.values())).returncode == 0


def _notebook(tmp_path: Path, cells: list[dict], shape: str = "answer") -> Path:
    path = tmp_path / "page.ipynb"
    notebook = {"cells": cells, "metadata": {"qkv": {"page": shape}}, "nbformat": 4, "nbformat_minor": 5}
    path.write_text(json.dumps(notebook), encoding="utf-8")
    return path


def _md(text: str) -> dict:
    return {"cell_type": "markdown", "metadata": {}, "source": text}


def _code(text: str, *tags: str) -> dict:
    return {"cell_type": "code", "metadata": {"tags": list(tags)}, "outputs": [], "source": text}


def test_a_page_over_budget_fails(tmp_path: Path) -> None:
    long_code = "\n".join(f"x{i} = {i}" for i in range(16))
    answer, proof = _md("## The answer\n\n" + "word " * 200), _md("## The proof\n\n" + "more " * 1100)
    cells = [_md("# Title"), answer, _code(long_code), proof]
    page = page_shape.measure(_notebook(tmp_path, cells))
    problems = " | ".join(page.problems)
    for expected in ("prose 1305 > 950", "answer 200 words", "max lines 16", "no figure"):
        assert expected in problems, problems
    assert _run(str(tmp_path / "page.ipynb")).returncode == 1


def test_solutions_and_hidden_code_are_not_counted(tmp_path: Path) -> None:
    cells = [
        _md("## The answer\n\nshort answer here"),
        _code("hidden = 1", "hide-cell"),
        _md("```{solution-start} ex\n:class: dropdown\n```\n" + "solution " * 2000),
        _code("\n".join(f"y{i} = {i}" for i in range(30))),  # inside the solution
        _md("```{solution-end}\n```\nafter"),
    ]
    page = page_shape.measure(_notebook(tmp_path, cells, "deeper"))
    assert (page.prose, page.answer, page.code_cells, page.code_lines) == (6, 4, 0, 0)
    assert not page.problems, page.problems
