"""The book's conventions, checked: chapters, table of contents, configuration, pins.

These tests read files only; they do not run notebooks (``make nbval`` does that).
"""

from __future__ import annotations

import ast
import importlib.util
import json
import re
from pathlib import Path

import pytest
import yaml
from pins import pinned_environment, read_pins

ROOT = Path(__file__).resolve().parents[1]
BOOK = ROOT / "book"
PACKAGE = ROOT / "src" / "qkv"
NOTEBOOKS = sorted(p for p in BOOK.glob("**/*.ipynb") if ".ipynb_checkpoints" not in p.parts)
PAGES = sorted(BOOK.glob("**/*.md"))

FIRST_CELL = """\
# Make this chapter self-sufficient: install qkv when it is missing (Colab).
try:
    import qkv
except ImportError:
    import subprocess
    import sys
    from importlib.metadata import distributions

    url = "git+{url}@{branch}"
    before, imported = {{d.name: d.version for d in distributions()}}, set(sys.modules)
    subprocess.run(
        [sys.executable, "-m", "pip", "install", "-q", f"qkv[notebook] @ {{url}}"],
        check=True,
    )
    import qkv

    qkv.restart_notice(before, imported)  # names packages that need a restart

qkv.setup()"""


# The book's code column: a chapter's code and printed output fit it (the page shows
# about 88 characters of monospace, and wraps nothing but error messages).
WIDTH = 88
# The API page's examples (docstring doctests, rendered by autodoc) sit in a code column
# indented inside each entry, about 4 characters narrower than a chapter's WIDTH: 84
# characters at laptop width.
API_EXAMPLE_WIDTH = WIDTH - 4
# An integer (or a float's integer part) of 5 digits or more without thousands
# separators, e.g. 25165824: not part of a word (float16, 0x7f3a1), of a decimal
# fraction (0.99504), or of a number already written 25,165,824.
BARE_INTEGER = re.compile(r"(?<![\w.,])\d{5,}")
# Reprs whose numbers are data, printed as the library prints them: left alone.
DATA_REPRS = ("tensor(", "array(", "torch.Size(", "Parameter containing")


def _config() -> dict:
    return yaml.safe_load((ROOT / "_config.yml").read_text(encoding="utf-8"))


def _toc_files() -> list[str]:
    """Every file the table of contents names, as written (no extension)."""
    toc = yaml.safe_load((ROOT / "_toc.yml").read_text(encoding="utf-8"))
    files = [toc["root"]]

    def walk(node: object) -> None:
        if isinstance(node, dict):
            if "file" in node:
                files.append(node["file"])
            for value in node.values():
                walk(value)
        elif isinstance(node, list):
            for value in node:
                walk(value)

    walk({key: value for key, value in toc.items() if key != "root"})
    return files


def _notebook(path: Path) -> dict:
    return json.loads(path.read_text(encoding="utf-8"))


def _source(cell: dict) -> str:
    source = cell.get("source", "")
    return "".join(source) if isinstance(source, list) else source


def _tags(cell: dict) -> list[str]:
    return cell.get("metadata", {}).get("tags", [])


def _text(value: str | list[str]) -> str:
    return "".join(value) if isinstance(value, list) else value


def _printed(output: dict) -> str:
    """What a reader sees of a stored output as text: a stream, or a result's text/plain."""
    if output.get("output_type") == "stream":
        return _text(output.get("text", ""))
    return _text(output.get("data", {}).get("text/plain", ""))


def _glued(output: dict) -> str:
    """The text of a value glued into the prose (myst_nb's glue), or ''."""
    data = output.get("data", {})
    return "\n".join(_text(v) for k, v in data.items() if k.startswith("application/papermill.record/text/"))


def _docstrings(path: Path) -> list[tuple[int, list[str]]]:
    """Each module, class and function docstring in ``path``: its first line, and its lines.

    The lines are as the page shows them: the docstring's own indentation removed.
    """
    found = []
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)):
            docstring = ast.get_docstring(node, clean=False)
            if docstring is None:
                continue
            lines = docstring.expandtabs().splitlines()
            margin = min((len(line) - len(line.lstrip()) for line in lines[1:] if line.strip()), default=0)
            shown = [lines[0].strip()] + [line[margin:].rstrip() for line in lines[1:]]
            found.append((node.body[0].lineno, shown))
    return found


def _code_cells(path: Path) -> list[dict]:
    return [c for c in _notebook(path)["cells"] if c["cell_type"] == "code" and _source(c).strip()]


def test_there_is_at_least_one_chapter() -> None:
    assert NOTEBOOKS, "book/ has no notebooks"


def test_repository_is_configured_once() -> None:
    repository = _config()["repository"]
    assert repository["url"].startswith("https://github.com/")
    assert repository["branch"] == "main"
    # pyproject.toml names the same repository for the package's metadata.
    pyproject = (ROOT / "pyproject.toml").read_text(encoding="utf-8")
    urls = set(re.findall(r'"(https://github\.com/[^"]+?)(?:/issues)?"', pyproject))
    assert urls == {repository["url"]}, f"pyproject.toml names {urls}, _config.yml {repository}"


def test_build_shows_stored_outputs_and_only_the_toc() -> None:
    config = _config()
    assert config["execute"]["execute_notebooks"] == "off"
    assert config["only_build_toc_files"] is True
    assert config["bibtex_bibfiles"] == ["book/references.bib"]
    assert "sphinx-mathjax-offline" in config["sphinx"]["config"]["extensions"]


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.name)
def test_first_code_cell_installs_qkv_and_calls_setup(path: Path) -> None:
    repository = _config()["repository"]
    expected = FIRST_CELL.format(url=repository["url"], branch=repository["branch"])
    first = _code_cells(path)[0]
    assert _source(first) == expected, (
        f"{path.name}: the first code cell must be exactly the install-and-setup cell "
        "of CONTRIBUTING.md, with the repository URL and branch of _config.yml"
    )
    assert "hide-cell" in _tags(first), f"{path.name}: tag the first code cell hide-cell"
    assert not first.get("outputs"), f"{path.name}: the first cell must print nothing"


def test_toc_lists_every_page_and_only_existing_ones() -> None:
    listed = _toc_files()
    assert len(listed) == len(set(listed)), f"_toc.yml lists a file twice: {listed}"
    missing = [
        name for name in listed if not any((ROOT / f"{name}{ext}").is_file() for ext in (".md", ".ipynb"))
    ]
    assert not missing, f"_toc.yml lists files that do not exist: {missing}"
    on_disk = {p.relative_to(ROOT).with_suffix("").as_posix() for p in NOTEBOOKS + PAGES}
    unlisted = sorted(on_disk - set(listed))
    assert not unlisted, f"pages in book/ missing from _toc.yml: {unlisted}"


def test_front_page_links_every_deeper_page() -> None:
    """book/intro.md lists each question's deeper pages under it: a new one is listed too."""
    intro = (BOOK / "intro.md").read_text(encoding="utf-8")
    deeper = [name.removeprefix("book/") for name in _toc_files() if name.count("/") == 2]
    unlinked = [name for name in deeper if f"{{doc}}`{name}`" not in intro]
    assert not unlinked, f"book/intro.md does not link these deeper pages: {unlinked}"


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.name)
def test_notebook_is_executed_top_to_bottom(path: Path) -> None:
    counts = [cell.get("execution_count") for cell in _code_cells(path)]
    unexecuted = [i for i, count in enumerate(counts) if count is None]
    assert not unexecuted, (
        f"{path.name}: code cells {unexecuted} have no stored output; run 'make execute NB={path}'"
    )
    assert counts == list(range(1, len(counts) + 1)), (
        f"{path.name}: execution counts {counts} are not 1, 2, 3...: "
        f"run 'make execute NB={path}' to re-run it top to bottom"
    )


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.name)
def test_notebook_has_no_unexpected_errors(path: Path) -> None:
    for index, cell in enumerate(_code_cells(path)):
        errors = [o for o in cell.get("outputs", []) if o.get("output_type") == "error"]
        if errors and "raises-exception" not in _tags(cell):
            names = [e.get("ename") for e in errors]
            pytest.fail(f"{path.name}: code cell {index} stored {names}; tag it raises-exception")
        if "raises-exception" in _tags(cell):
            assert errors, f"{path.name}: code cell {index} is tagged raises-exception but raised nothing"


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.name)
def test_notebook_tags_follow_the_conventions(path: Path) -> None:
    cells = _code_cells(path)
    for index, cell in enumerate(cells):
        tags = _tags(cell)
        assert "nbval-skip" not in tags, f"{path.name}: code cell {index} is tagged nbval-skip"
        if "nbval-ignore-output" in tags:
            following = cells[index + 1] if index + 1 < len(cells) else None
            assert following is not None and "assert" in _source(following), (
                f"{path.name}: code cell {index} ignores its output (nbval-ignore-output), "
                "so the next code cell must assert what that output shows"
            )


def test_requirements_pin_the_build() -> None:
    lines = [
        line.split("#")[0].strip()
        for line in (ROOT / "requirements.txt").read_text(encoding="utf-8").splitlines()
    ]
    lines = [line for line in lines if line]
    assert "-e ." in lines, "requirements.txt must install the package itself (-e .)"
    assert "torch==2.13.0" in lines
    jupyter_book = [line for line in lines if re.match(r"jupyter[-_]book\b", line, re.I)]
    assert len(jupyter_book) == 1, jupyter_book
    version = re.fullmatch(r"jupyter[-_]book==(\d+)\.[\w.]+", jupyter_book[0], re.I)
    assert version and int(version.group(1)) < 2, (
        f"{jupyter_book[0]}: the book needs Jupyter Book 1.x (2.x reads none of _config.yml)"
    )
    unpinned = [line for line in lines if line != "-e ." and "==" not in line]
    assert not unpinned, f"requirements.txt must pin exact versions: {unpinned}"


def test_stored_notebooks_stay_small() -> None:
    """Figures are stored at twice the resolution: keep each chapter light to clone and open."""
    for notebook in NOTEBOOKS:
        size = notebook.stat().st_size
        assert size < 1_500_000, f"{notebook.name} is {size / 1e6:.1f} MB; shrink its figures"


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.name)
def test_stored_outputs_show_no_machine_paths_or_tracebacks(path: Path) -> None:
    """Readers see an error demonstration's type and message, never this machine's files."""
    local = re.compile(r"(?<![\w.~])/(home|root|tmp|work|usr|opt|var|Users)/")
    for index, cell in enumerate(_code_cells(path)):
        for output in cell.get("outputs", []):
            if output.get("output_type") == "error":
                assert len(output["traceback"]) == 1, f"{path.name}: code cell {index} stores a traceback"
            text = json.dumps({k: v for k, v in output.items() if k != "data"} | {
                "data": {k: v for k, v in output.get("data", {}).items() if not k.startswith("image/")}
            })
            assert not local.search(text), f"{path.name}: code cell {index} shows a path of this machine"


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.name)
def test_code_and_output_fit_the_page_and_numbers_read_easily(path: Path) -> None:
    """Code and printed output fit WIDTH columns; a large integer has thousands separators.

    Error outputs are exempt from the width (the page wraps them), and so are the
    numbers inside tensor and array reprs, and, in the prose, inside code spans and
    links. `make lint` checks the code's width too.
    """
    for index, cell in enumerate(_notebook(path)["cells"]):
        if cell["cell_type"] == "markdown":
            prose = re.sub(r"`[^`]*`|\(?https?://\S+", "", _source(cell))
            bare = BARE_INTEGER.findall(prose)
            assert not bare, f"{path.name}: cell {index} writes {bare} without thousands separators"
    for index, cell in enumerate(_code_cells(path)):
        for line in _source(cell).splitlines():
            assert len(line) <= WIDTH, (
                f"{path.name}: code cell {index} has a line of {len(line)} > {WIDTH} "
                f"characters: {line!r}; run ruff format --line-length {WIDTH} on it"
            )
        for output in cell.get("outputs", []):
            if output.get("output_type") == "error":
                continue
            printed = _printed(output)
            for line in printed.splitlines():
                assert len(line) <= WIDTH, (
                    f"{path.name}: code cell {index} prints a line of {len(line)} > {WIDTH} "
                    f"characters: {line!r}; print less, or wrap it"
                )
            for text in (printed, _glued(output)):
                if text.lstrip().startswith(DATA_REPRS):
                    continue
                bare = [m.group() for m in BARE_INTEGER.finditer(text)]
                assert not bare, (
                    f"{path.name}: code cell {index} shows {bare} without thousands "
                    f'separators: format it as f"{{n:,}}" ({text[:80]!r})'
                )


# A decimal number with more than MAX_DIGITS significant digits: a full float repr, or a
# value rounded past what another CPU reproduces (CONTRIBUTING.md, "Stored outputs are
# the same on every machine").
MAX_DIGITS = 6
LONG_DECIMAL = re.compile(r"(?<![\w.])\d+\.\d+(?:e[-+]?\d+)?")


def _significant_digits(number: str) -> int:
    mantissa = number.lower().split("e")[0].replace(".", "").lstrip("0")
    return len(mantissa)


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.name)
def test_stored_numbers_show_only_the_digits_every_machine_agrees_on(path: Path) -> None:
    """No full float repr in a stored output or a glued value: round to what the prose needs.

    Another CPU changes the low digits of float32 sums (and a training run carries the
    change on), so a stored number with many digits fails nbval elsewhere. ``make
    nbval-perturbed`` finds the digits that do change; this finds the numbers shown
    with more digits than any sentence needs, before they reach another machine.
    """
    for index, cell in enumerate(_code_cells(path)):
        if "nbval-ignore-output" in _tags(cell):
            continue
        for output in cell.get("outputs", []):
            for text in (_printed(output), _glued(output)):
                long = [n for n in LONG_DECIMAL.findall(text) if _significant_digits(n) > MAX_DIGITS]
                assert not long, (
                    f"{path.name}: code cell {index} stores {long[:3]}: round to the digits the "
                    f"prose needs ({MAX_DIGITS} significant at most; CONTRIBUTING.md, "
                    "'Stored outputs are the same on every machine')"
                )


def test_docstring_examples_fit_the_api_page() -> None:
    """Every line of a docstring example, input or expected output, fits API_EXAMPLE_WIDTH.

    An example runs from a ``>>>`` line to the next blank line, as doctest reads it.
    """
    too_long = []
    for path in sorted(PACKAGE.rglob("*.py")):
        for first, lines in _docstrings(path):
            in_example = False
            for offset, line in enumerate(lines):
                if line.lstrip().startswith(">>>"):
                    in_example = True
                elif not line.strip():
                    in_example = False
                if in_example and len(line) > API_EXAMPLE_WIDTH:
                    where = f"{path.relative_to(ROOT).as_posix()}:{first + offset}"
                    too_long.append(f"{where}: {len(line)} characters: {line!r}")
    assert not too_long, (
        f"docstring examples with lines longer than {API_EXAMPLE_WIDTH} characters (the API "
        "page's example column); break the call over '...' lines, move a trailing comment "
        "onto its own '>>> #' line, name an intermediate value, or print less:\n" + "\n".join(too_long)
    )


def test_the_pinned_environment_names_its_oldest_python() -> None:
    """The Makefile and the README name the oldest Python that every pin supports."""
    from importlib import metadata

    from packaging.specifiers import SpecifierSet
    from packaging.version import Version

    if not pinned_environment():
        pytest.skip("reads the pinned environment's metadata (.venv)")
    installed = {pin: metadata.distribution(pin) for pin in read_pins(ROOT / "requirements.txt")}
    (minimum,) = re.findall(r"^MIN_PYTHON := ([\d.]+)$", (ROOT / "Makefile").read_text(), re.MULTILINE)
    lowest = {
        name: distribution.metadata.get("Requires-Python") or ""
        for name, distribution in installed.items()
        if Version(minimum) not in SpecifierSet(distribution.metadata.get("Requires-Python") or "")
    }
    assert not lowest, f"Makefile's MIN_PYTHON {minimum} is below these pins' requires-python: {lowest}"
    bounds = [
        Version(spec.version)
        for d in installed.values()
        for spec in SpecifierSet(d.metadata.get("Requires-Python") or "")
        if spec.operator == ">="
    ]
    assert Version(minimum) == max(bounds), f"MIN_PYTHON could be {max(bounds)}, not {minimum}"
    assert f"Python {minimum} or newer" in (ROOT / "README.md").read_text()


def _workflow(name: str) -> dict:
    workflow = yaml.safe_load((ROOT / ".github" / "workflows" / name).read_text(encoding="utf-8"))
    workflow["on"] = workflow.pop(True, workflow.get("on"))  # YAML 1.1 reads the key `on` as True
    return workflow


def _steps(workflow: dict) -> list[dict]:
    return [step for job in workflow["jobs"].values() for step in job.get("steps", [])]


def test_workflows_test_publish_and_check_the_other_versions() -> None:
    ci = _workflow("ci.yml")
    assert set(ci["on"]) == {"push", "pull_request"}
    assert any(step.get("run") == "bash .ci/run" for step in _steps(ci))
    publish = _workflow("publish.yml")
    uses = {step["uses"].split("@")[0]: step for step in _steps(publish) if "uses" in step}
    assert uses["actions/upload-pages-artifact"]["with"]["path"] == "_build/html"
    assert "actions/deploy-pages" in uses
    assert any(step.get("run") == "make html-strict" for step in _steps(publish))
    versions = _workflow("versions.yml")
    assert "schedule" in versions["on"]
    matrix = versions["jobs"]["versions"]["strategy"]["matrix"]["include"]
    assert {entry["target"] for entry in matrix} == {"test-oldest", "test-colab"}
    for entry in matrix:  # the Python each constraints file names in its first line
        constraints = ROOT / "constraints" / f"{entry['target'].removeprefix('test-')}.txt"
        assert constraints.read_text(encoding="utf-8").startswith(f"# python {entry['python']}\n")
    for name in ("ci.yml", "publish.yml", "versions.yml"):
        for step in _steps(_workflow(name)):
            if "uses" in step:
                pinned = re.fullmatch(r"[\w-]+/[\w-]+@[0-9a-f]{40}", step["uses"])
                assert pinned, f"{name}: pin {step['uses']} to a commit hash"


def test_readme_links_the_published_book() -> None:
    owner, name = _config()["repository"]["url"].removeprefix("https://github.com/").split("/")
    assert f"<https://{owner}.github.io/{name}/>" in (ROOT / "README.md").read_text(encoding="utf-8")


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.name)
def test_chapters_need_no_book_tooling(path: Path) -> None:
    """Colab installs qkv[notebook] only: a chapter importing myst_nb or sphinx fails there."""
    for index, cell in enumerate(_code_cells(path)):
        book_tooling = r"^\s*(?:from|import) (myst_nb|myst_parser|sphinx\w*|jupyter_book)\b"
        found = re.findall(book_tooling, _source(cell), re.MULTILINE)
        assert not found, f"{path.name}: code cell {index} imports {found}; use qkv.glue"


def test_the_stability_script_measures_what_make_nbval_runs() -> None:
    """`make stability`'s "make nbval" run is the Makefile's PERTURB, word for word."""
    makefile = (ROOT / "Makefile").read_text(encoding="utf-8")
    (line,) = re.findall(r"^PERTURB \?= (.+)$", makefile, re.MULTILINE)
    perturb = dict(word.split("=", 1) for word in line.split())
    script = ROOT / "scripts" / "output_stability.py"
    spec = importlib.util.spec_from_file_location("output_stability", script)
    assert spec and spec.loader
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    assert module.PERTURBATIONS["make nbval"] == perturb
    assert "ATEN_CPU_CAPABILITY" in perturb and perturb.get("OMP_NUM_THREADS") == "1"


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.name)
def test_every_figure_has_alt_text_that_says_what_it_shows(path: Path) -> None:
    """A stored figure needs ``mystnb.image.alt`` in its cell's metadata (four words at least).

    The browser check finds the same after a full build; this finds it in seconds.
    """
    for index, cell in enumerate(_code_cells(path)):
        tags = _tags(cell)
        if "remove-cell" in tags or "remove-output" in tags:
            continue
        if not any("image/png" in output.get("data", {}) for output in cell.get("outputs", [])):
            continue
        alt = cell.get("metadata", {}).get("mystnb", {}).get("image", {}).get("alt", "")
        assert len(re.findall(r"[A-Za-z]+", alt)) >= 4, (
            f"{path.name}: code cell {index} shows a figure without alt text; set "
            'its metadata "mystnb": {"image": {"alt": "what the figure shows"}}'
        )


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.name)
def test_no_alt_text_without_its_figure(path: Path) -> None:
    """Alt text sits only on a cell that stores a figure: a stale alt, left on a cell whose
    figure moved, describes nothing (a round-22 reader found one on book/masks.ipynb)."""
    for index, cell in enumerate(_code_cells(path)):
        alt = cell.get("metadata", {}).get("mystnb", {}).get("image", {}).get("alt")
        if alt is None:
            continue
        figures = sum("image/png" in output.get("data", {}) for output in cell.get("outputs", []))
        assert figures, (
            f"{path.name}: code cell {index} has alt text but stores no figure; move the "
            "alt to the figure's cell or drop it"
        )
        # One alt per cell: a second figure in the cell would carry the first one's alt text.
        assert figures == 1, (
            f"{path.name}: code cell {index} stores {figures} figures under one alt text; "
            "give each figure a cell of its own and its own alt"
        )


def test_no_removed_cell_holds_an_assert() -> None:
    """CONTRIBUTING's cell tags: an assert that backs a sentence stays reachable (hide-cell, a toggle).

    remove-cell takes a cell out of the HTML altogether, so a reader who doubts a
    sentence could not find its check; cold readers asked for it more than once.
    """
    removed = []
    for path in sorted((ROOT / "book").glob("**/*.ipynb")):
        for index, cell in enumerate(json.loads(path.read_text(encoding="utf-8"))["cells"]):
            source = "".join(cell["source"])
            if "remove-cell" in cell.get("metadata", {}).get("tags", []) and re.search(
                r"\bassert\b|assert_close|pytest\.raises", source
            ):
                removed.append(f"{path.relative_to(ROOT)} cell {index}")
    assert not removed, f"asserts in remove-cell cells (tag them hide-cell): {removed}"


def test_every_label_is_defined_once() -> None:
    """A MyST target `(name)=` or a directive's `:label:` names one place in the whole book.

    Sphinx does not always warn when two pages define the same target: a helper once
    labelled a section `rotary-fix`, already taken by rotary/symptoms, and the strict
    build passed while the link went to the other page.
    """
    places: dict[str, list[str]] = {}
    pages = sorted((ROOT / "book").glob("**/*.ipynb")) + sorted((ROOT / "book").glob("**/*.md"))
    for path in pages:
        if path.suffix == ".ipynb":
            cells = json.loads(path.read_text(encoding="utf-8"))["cells"]
            text = "\n".join("".join(c["source"]) for c in cells if c["cell_type"] == "markdown")
        else:
            text = path.read_text(encoding="utf-8")
        names = re.findall(r"^\((\S+?)\)=\s*$", text, re.M) + re.findall(r":label:\s*(\S+)", text)
        for name in names:
            places.setdefault(name, []).append(str(path.relative_to(ROOT)))
    repeated = {name: where for name, where in places.items() if len(where) > 1}
    assert not repeated, f"labels defined more than once: {repeated}"
