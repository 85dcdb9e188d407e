"""Measure every page of the book against the page shape of STYLE.md and CONTRIBUTING.md.

Usage (``make shape`` runs it; ``tests/test_page_shape.py`` too)::

    python scripts/page_shape.py                 # every page _toc.yml lists
    python scripts/page_shape.py templates/*.ipynb   # given notebooks, on their own

A notebook says which shape it has in its metadata, ``"qkv": {"page": "answer"}`` or
``{"page": "deeper"}``. Those pages are held to the budgets below; any other page
(a chapter not converted yet, a Markdown page) is measured and printed, not failed.

What is measured, per page:

- **prose**: the words of the Markdown cells, exercise solutions left out (they are
  collapsed on the page);
- **before code**: the prose words before the first code cell whose code a reader
  sees (a cell tagged ``hide-cell``, ``hide-input``, ``remove-cell`` or
  ``remove-input`` shows no code);
- **answer**: the words of the section headed ``## The answer``;
- **figure**: where the first figure drawn by ``qkv.diagrams`` starts, estimated in
  pixels from the top of the page at 1280 px (text lines, code lines, stored output
  lines and image heights; calibrated on the built book, good to a few lines), for
  "within the first two screens", 2 x 800 px (an estimate that can run a few hundred px
  short; the browser check, ``tests/browser``, measures the built page and fails an
  answer page whose first figure starts below 1,600 px);
- **code cells** and **max lines**: the visible code cells outside exercise
  solutions, and the longest of them;
- **deeper**: on an answer page, whether it links (``{doc}``) every page nested
  under it in ``_toc.yml``.

It also fails when a page in ``book/`` is missing from ``_toc.yml``, or a deeper page
is not nested under another page there. Exit status 1 when anything is over budget.
"""

from __future__ import annotations

import argparse
import base64
import json
import math
import posixpath
import re
import struct
import sys
from dataclasses import dataclass, field
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parents[1]

# Budgets for each shape (STYLE.md, "Pages"; issue 31).
BUDGETS: dict[str, dict[str, int]] = {
    "answer": {"prose": 950, "before_code": 300, "answer": 150, "code_cells": 8, "code_lines": 15},
    "deeper": {"prose": 1500, "before_code": 300, "answer": 150, "code_cells": 8, "code_lines": 15},
}
SCREEN = 800  # px: one screen at 1280 x 800
FIGURE_WITHIN = 2 * SCREEN  # an answer page's picture starts within the first two screens
HIDDEN_CODE = {"hide-cell", "hide-input", "remove-cell", "remove-input"}
REMOVED = {"remove-cell"}
WORD = re.compile(r"[^\s|`*_#>:-][^\s|`*]*")

# The estimate of heights at 1280 px (sphinx-book-theme, the book's CSS).
PAGE_TOP = 190  # header bar, breadcrumbs and the title
CHARS_PER_LINE = 95  # of prose in the text column
PROSE_LINE, BLOCK_GAP, HEADING = 27, 18, 70
CODE_LINE, CODE_PAD, OUTPUT_LINE, OUTPUT_PAD, TOGGLE = 21, 40, 20, 24, 48
COLUMN = 720  # px: the widest an image is shown


@dataclass
class Page:
    path: str
    shape: str  # "answer", "deeper", or "-" for a page not in the new shape
    prose: int = 0
    before_code: int | None = None
    answer: int | None = None
    figure_px: int | None = None
    code_cells: int = 0
    code_lines: int = 0
    deeper_missing: list[str] = field(default_factory=list)
    problems: list[str] = field(default_factory=list)


def _text(value: str | list[str]) -> str:
    return "".join(value) if isinstance(value, list) else value


def words(markdown: str) -> int:
    """Words a reader reads: directive fences, labels, targets and comments left out."""
    kept = []
    for line in markdown.splitlines():
        stripped = line.strip()
        if stripped.startswith(("```", ":label:", ":class:", "<!--")) or re.fullmatch(r"\(.+\)=", stripped):
            continue
        kept.append(line)
    return len(WORD.findall("\n".join(kept)))


def _split_solutions(markdown: str, inside: bool) -> tuple[str, bool]:
    """The part of a Markdown cell outside exercise solutions, and whether one is still open."""
    shown = []
    for line in markdown.splitlines():
        if line.strip().startswith("```{solution-start}"):
            inside = True
        elif line.strip().startswith("```{solution-end}"):
            inside = False
        elif not inside:
            shown.append(line)
    return "\n".join(shown), inside


def _markdown_height(markdown: str) -> int:
    height = 0
    for block in re.split(r"\n\s*\n", markdown.strip()):
        if not block.strip() or block.strip().startswith(("```{solution", "```{exercise", "(")):
            continue
        if block.lstrip().startswith("#"):
            height += HEADING
        elif block.lstrip().startswith("$$"):
            height += PROSE_LINE * (block.count("\\\\") + 2) + BLOCK_GAP
        else:
            lines = sum(max(1, math.ceil(len(line) / CHARS_PER_LINE)) for line in _joined_lines(block))
            height += lines * PROSE_LINE + BLOCK_GAP
    return height


def _joined_lines(block: str) -> list[str]:
    """A paragraph's source lines joined as the page flows them; list items start new lines."""
    lines: list[str] = []
    for line in block.splitlines():
        if re.match(r"\s*([-*]|\d+\.)\s", line) or not lines:
            lines.append(line.strip())
        else:
            lines[-1] += " " + line.strip()
    return lines


def _png_height(data: str) -> int:
    """Shown height in px of a stored PNG (stored at twice the resolution, at most COLUMN wide)."""
    raw = base64.b64decode(data[:64] + "=" * (-len(data[:64]) % 4))
    width, height = struct.unpack(">II", raw[16:24])
    shown_width = min(width / 2, COLUMN)
    return round(height * shown_width / width)


def _output_height(output: dict) -> int:
    data = output.get("data", {})
    if "image/png" in data:
        return _png_height(_text(data["image/png"])) + OUTPUT_PAD
    if output.get("output_type") == "stream":
        return _text(output.get("text", "")).count("\n") * OUTPUT_LINE + OUTPUT_PAD
    if "text/html" in data or "text/markdown" in data:
        return 200
    if "text/plain" in data:
        return (_text(data["text/plain"]).count("\n") + 1) * OUTPUT_LINE + OUTPUT_PAD
    if output.get("output_type") == "error":
        return 2 * OUTPUT_LINE + OUTPUT_PAD
    return 0


def measure(path: Path, sections: list[str] | None = None) -> Page:
    """Measure one notebook; ``sections`` are the pages nested under it in _toc.yml."""
    notebook = json.loads(path.read_text(encoding="utf-8"))
    shape = notebook.get("metadata", {}).get("qkv", {}).get("page", "-")
    page = Page(_name(path), shape)
    inside_solution, prose_before, height = False, 0, PAGE_TOP
    answer_words: int | None = None
    in_answer = False
    for cell in notebook["cells"]:
        source = _text(cell.get("source", ""))
        tags = set(cell.get("metadata", {}).get("tags", []))
        if cell["cell_type"] == "markdown":
            shown, inside_solution = _split_solutions(source, inside_solution)
            count = words(shown)
            page.prose += count
            prose_before += count
            height += _markdown_height(shown)
            for heading, body in _sections_of(shown):
                if heading is not None:
                    in_answer = heading.strip().lower() == "the answer"
                    if in_answer:
                        answer_words = 0
                if in_answer and answer_words is not None:
                    answer_words += words(body)
            continue
        if cell["cell_type"] != "code" or tags & REMOVED or not source.strip():
            continue
        visible = not tags & HIDDEN_CODE
        if visible and not inside_solution:
            page.code_cells += 1
            page.code_lines = max(page.code_lines, len(source.rstrip().splitlines()))
            if page.before_code is None:
                page.before_code = prose_before
        if inside_solution:
            continue
        height += (len(source.splitlines()) * CODE_LINE + CODE_PAD) if visible else TOGGLE
        if "qkv.diagrams." in source and page.figure_px is None:
            if any("image/png" in o.get("data", {}) for o in cell.get("outputs", [])):
                page.figure_px = height - (len(source.splitlines()) * CODE_LINE + CODE_PAD if visible else 0)
        if "remove-output" not in tags:
            height += sum(_output_height(o) for o in cell.get("outputs", []))
    if page.before_code is None:
        page.before_code = prose_before
    page.answer = answer_words
    if shape == "answer" and sections is not None:
        text = "\n".join(_text(c["source"]) for c in notebook["cells"] if c["cell_type"] == "markdown")
        links = set(re.findall(r"\{doc\}`(?:[^`<]*<)?([^`>]+)>?`", text))
        here = posixpath.dirname(page.path)
        for section in sections:
            relative = posixpath.relpath(section, here)
            if not {relative, "/" + section} & links:
                page.deeper_missing.append(relative)
    _judge(page)
    return page


def _sections_of(markdown: str) -> list[tuple[str | None, str]]:
    """(heading of level 2, text) pairs; the first heading is None for text before any."""
    parts: list[tuple[str | None, str]] = []
    heading: str | None = None
    body: list[str] = []
    for line in markdown.splitlines():
        match = re.match(r"##\s+(.*)", line)
        if match and not line.startswith("###"):
            parts.append((heading, "\n".join(body)))
            heading, body = match.group(1), []
        else:
            body.append(line)
    parts.append((heading, "\n".join(body)))
    return parts


def _judge(page: Page) -> None:
    budget = BUDGETS.get(page.shape)
    if budget is None:
        return
    checks = [
        ("prose", page.prose, budget["prose"]),
        ("before code", page.before_code or 0, budget["before_code"]),
        ("code cells", page.code_cells, budget["code_cells"]),
        ("max lines", page.code_lines, budget["code_lines"]),
    ]
    page.problems += [f"{name} {value} > {limit}" for name, value, limit in checks if value > limit]
    if page.answer is None:
        page.problems.append('no "## The answer" section')
    elif page.answer > budget["answer"]:
        page.problems.append(f"answer {page.answer} words > {budget['answer']}")
    if page.shape == "answer":
        if page.figure_px is None:
            page.problems.append("no figure drawn by qkv.diagrams")
        elif page.figure_px > FIGURE_WITHIN:
            page.problems.append(f"figure starts at ~{page.figure_px} px > {FIGURE_WITHIN}")
        if page.deeper_missing:
            page.problems.append(f"does not link {', '.join(page.deeper_missing)}")


def _name(path: Path) -> str:
    try:
        return path.resolve().relative_to(ROOT).with_suffix("").as_posix()
    except ValueError:
        return path.with_suffix("").as_posix()


def toc_tree(toc_path: Path) -> dict[str, list[str]]:
    """Every file of the table of contents, each with the files nested under it, in order."""
    toc = yaml.safe_load(toc_path.read_text(encoding="utf-8"))
    tree: dict[str, list[str]] = {toc["root"]: []}

    def walk(entries: list[dict]) -> None:
        for entry in entries:
            if "file" in entry:
                tree[entry["file"]] = [s["file"] for s in entry.get("sections", []) if "file" in s]
            for key in ("chapters", "sections"):
                walk(entry.get(key, []))

    walk(toc.get("parts", []))
    walk(toc.get("chapters", []))
    return tree


def measure_book(root: Path = ROOT) -> tuple[list[Page], list[str]]:
    """Measure every page _toc.yml lists; also report pages missing from it."""
    tree = toc_tree(root / "_toc.yml")
    pages, problems = [], []
    parents = {child: parent for parent, children in tree.items() for child in children}
    for name, sections in tree.items():
        notebook = root / f"{name}.ipynb"
        if notebook.is_file():
            page = measure(notebook, sections)
            if page.shape == "deeper" and name not in parents:
                page.problems.append("a deeper page must be nested under its page in _toc.yml")
            pages.append(page)
        elif (root / f"{name}.md").is_file():
            text = (root / f"{name}.md").read_text(encoding="utf-8")
            pages.append(Page(name, "-", prose=words(text)))
    on_disk = {
        p.relative_to(root).with_suffix("").as_posix()
        for pattern in ("book/**/*.ipynb", "book/**/*.md")
        for p in root.glob(pattern)
        if ".ipynb_checkpoints" not in p.parts
    }
    problems += [f"{name}: not in _toc.yml" for name in sorted(on_disk - set(tree))]
    return pages, problems


def table(pages: list[Page]) -> str:
    def cell(value: object) -> str:
        return "-" if value is None else f"{value:,}" if isinstance(value, int) else str(value)

    header = ["page", "shape", "prose", "before code", "answer", "figure px", "code cells", "max lines", "ok"]
    rows = [
        [
            page.path,
            page.shape,
            cell(page.prose),
            cell(page.before_code),
            cell(page.answer),
            cell(page.figure_px),
            cell(page.code_cells),
            cell(page.code_lines),
            ("yes" if not page.problems else "NO: " + "; ".join(page.problems)) if page.shape != "-" else "-",
        ]
        for page in pages
    ]
    widths = [max(len(row[i]) for row in [header, *rows]) for i in range(len(header) - 1)]
    lines = []
    for row in [header, *rows]:
        padded = (value.ljust(width) for value, width in zip(row[:-1], widths, strict=True))
        lines.append("  ".join(padded) + "  " + row[-1])
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("notebooks", nargs="*", type=Path, help="default: every page of _toc.yml")
    args = parser.parse_args(argv)
    if args.notebooks:
        pages, problems = [measure(path) for path in args.notebooks], []
    else:
        pages, problems = measure_book()
    print(table(pages))
    for shape, budget in BUDGETS.items():
        limits = ", ".join(f"{name.replace('_', ' ')} {value:,}" for name, value in budget.items())
        extra = f", a qkv.diagrams figure within ~{FIGURE_WITHIN:,} px" if shape == "answer" else ""
        print(f"budget, {shape} pages: {limits}{extra}")
    print("pages marked '-' are not in the new shape yet: measured, not judged")
    failed = [page for page in pages if page.problems]
    for message in problems:
        print(f"problem: {message}")
    if failed or problems:
        print(f"page shape: {len(failed) + len(problems)} over budget or misplaced", file=sys.stderr)
        return 1
    print(f"page shape: {sum(p.shape != '-' for p in pages)} pages in the new shape, all within budget")
    return 0


if __name__ == "__main__":
    sys.exit(main())
