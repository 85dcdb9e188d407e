"""Run the unit tests, and the chapters where the set says so, against another set of versions.

Usage (through make)::

    make test-oldest [PYTHON=python3.10]   # constraints/oldest.txt: the version floors
    make test-colab [PYTHON=python3.13]    # constraints/colab.txt: Colab's versions

Each set lives in ``constraints/<name>.txt``, whose first line names the Python
(``# python 3.10``); a second line ``# chapters: no`` leaves out step 5 (the floors
promise the package, not the pages: the pages show what the pinned libraries do). The
steps, in a virtual environment ``.venv-<name>`` of its own:

1. install the set, as if it were what the machine already had (Colab: preinstalled);
2. install ``qkv[notebook]`` the way a chapter's first cell does, and fail if pip
   changed any installed package (a floor in pyproject.toml that is too high, or a
   Colab reader who would have to restart) or added one besides qkv;
3. install the test tools, keeping the set's versions;
4. run ``pytest`` on the unit tests and the docstring examples;
5. unless the set says ``# chapters: no``, run every chapter top to bottom with
   nbclient: no cell may fail, and no cell may print to stderr what its stored output
   does not (log noise in a reader's cell). Other outputs may differ (digits, reprs):
   ``make nbval`` compares those, on the pins.

It downloads large wheels (torch), so it is not part of ``make test``.
"""

from __future__ import annotations

import argparse
import glob
import json
import os
import re
import shutil
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
# Step 3: what the tests import besides qkv[notebook] (pytest's own, nbclient's own; nbval for the
# tests of the stored-figure comparison, tests/test_stored_figures.py).
TEST_TOOLS = ["pytest", "hypothesis", "nbclient", "nbformat", "nbval", "PyYAML", "packaging"]


def fail(message: str) -> None:
    print(f"test-versions: {message}", file=sys.stderr)
    sys.exit(1)


def python_version(python: str) -> str | None:
    """'3.10' for a working interpreter, None when it does not run."""
    try:
        result = subprocess.run(
            [python, "-c", "import sys; print('%d.%d' % sys.version_info[:2])"],
            capture_output=True,
            text=True,
            check=False,
        )
    except OSError:
        return None
    return result.stdout.strip() if result.returncode == 0 else None


def find_python(wanted: str, given: str | None) -> str:
    """The interpreter to build the environment with: PYTHON, else pythonX.Y, else pyenv's."""
    candidates = (
        [given]
        if given
        else [
            f"python{wanted}",
            *sorted(glob.glob(os.path.expanduser(f"~/.pyenv/versions/{wanted}.*/bin/python"))),
        ]
    )
    for candidate in candidates:
        if candidate and python_version(candidate) == wanted:
            return candidate
    fail(
        f"needs Python {wanted}: none found as {' or '.join(c for c in candidates if c)}; "
        f"set PYTHON=/path/to/python{wanted}"
    )
    raise AssertionError  # unreachable


def run(*command: str, **kwargs: object) -> None:
    print("+", " ".join(command), flush=True)
    subprocess.run(command, check=True, cwd=ROOT, **kwargs)  # type: ignore[call-overload]


def installed(python: str) -> dict[str, str]:
    """Normalised distribution name -> version, as pip sees the environment."""
    listing = subprocess.run(
        [python, "-m", "pip", "list", "--format=json"], capture_output=True, text=True, check=True
    ).stdout
    return {normalise(d["name"]): d["version"] for d in json.loads(listing)}


def normalise(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def stderr_texts(cell: dict) -> list[str]:
    return [
        o["text"] if isinstance(o["text"], str) else "".join(o["text"])
        for o in cell.get("outputs", [])
        if o.get("name") == "stderr"
    ]


def run_chapters(python: str, keep: Path) -> list[str]:
    """Execute every chapter in .venv-<name>'s kernel; return the problems found.

    The executed notebooks are kept in ``keep`` (under _build/) for a closer look.
    """
    # In the environment's own Python, with the kernel of that Python (as make execute).
    script = r"""
import json, sys
import nbformat
from nbclient import NotebookClient
sys.path.insert(0, "scripts")
from execute_notebooks import _kernel_manager_class

nb = nbformat.read(sys.argv[1], as_version=4)
NotebookClient(
    nb, timeout=600, kernel_name="python3", allow_errors=True,
    kernel_manager_class=_kernel_manager_class(), resources={"metadata": {"path": "book"}},
).execute()
print(json.dumps(nb.cells))
"""
    problems = []
    for path in sorted(p for p in (ROOT / "book").glob("**/*.ipynb") if ".ipynb_checkpoints" not in p.parts):
        stored = json.loads(path.read_text(encoding="utf-8"))["cells"]
        start = time.perf_counter()
        result = subprocess.run(
            [python, "-c", script, str(path)],
            cwd=ROOT,
            capture_output=True,
            text=True,
            check=False,
            env={**os.environ, "PYTHONHASHSEED": "0"},
        )
        if result.returncode != 0:
            problems.append(f"{path.name}: nbclient failed: {result.stderr.strip()[-2000:]}")
            continue
        ran = json.loads(result.stdout)
        keep.mkdir(parents=True, exist_ok=True)
        executed = json.loads(path.read_text(encoding="utf-8"))
        executed["cells"] = ran
        (keep / path.name).write_text(json.dumps(executed, indent=1, ensure_ascii=False), encoding="utf-8")
        print(f"{path.name}: ran in {time.perf_counter() - start:.0f} s", flush=True)
        for index, (old, new) in enumerate(zip(stored, ran, strict=True)):
            if new["cell_type"] != "code":
                continue
            tags = new.get("metadata", {}).get("tags", [])
            errors = [o for o in new.get("outputs", []) if o.get("output_type") == "error"]
            if errors and "raises-exception" not in tags:
                error = errors[0]
                problems.append(
                    f"{path.name} cell {index}: {error['ename']}: {error['evalue']}\n"
                    + "".join(new["source"])[:300]
                )
            if "raises-exception" in tags and not errors:
                problems.append(f"{path.name} cell {index}: raised nothing (tagged raises-exception)")
            noise = [text for text in stderr_texts(new) if text not in stderr_texts(old)]
            if noise:
                problems.append(f"{path.name} cell {index} printed to stderr:\n{''.join(noise)[:1500]}")
    return problems


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("name", choices=[p.stem for p in sorted((ROOT / "constraints").glob("*.txt"))])
    parser.add_argument(
        "--python", default=os.environ.get("PYTHON") or None, help="the interpreter (default: pythonX.Y)"
    )
    args = parser.parse_args()

    constraints = ROOT / "constraints" / f"{args.name}.txt"
    header = re.match(r"# python (3\.\d+)\n", constraints.read_text(encoding="utf-8"))
    if not header:
        fail(f"{constraints.relative_to(ROOT)} must start with '# python 3.X'")
    wanted = header.group(1)
    chapters = not re.match(r"# python 3\.\d+\n# chapters: no\b", constraints.read_text(encoding="utf-8"))
    venv = ROOT / f".venv-{args.name}"
    python = str(venv / "bin" / "python")
    if python_version(python) != wanted:
        shutil.rmtree(venv, ignore_errors=True)
        run(find_python(wanted, args.python), "-m", "venv", str(venv))
    pip = [python, "-m", "pip", "install", "--quiet", "--disable-pip-version-check"]

    run(*pip, "-r", str(constraints))
    # What installing qkv[notebook] would change, asked before doing it (so that a venv
    # left over from an earlier run, which already has those changes, still fails).
    report = venv / "pip-report.json"
    run(*pip, "--dry-run", "--report", str(report), "-e", ".[notebook]")
    planned = json.loads(report.read_text(encoding="utf-8"))["install"]
    present = installed(python)
    changes = [
        f"{item['metadata']['name']} {present.get(normalise(item['metadata']['name']), '(new)')}"
        f" -> {item['metadata']['version']}"
        for item in planned
        if normalise(item["metadata"]["name"]) != "qkv"
    ]
    if changes:
        fail(f"installing qkv[notebook] would change the environment: {', '.join(changes)}")
    run(*pip, "-e", ".[notebook]")
    run(*pip, "-c", str(constraints), *TEST_TOOLS)

    tests = subprocess.run(
        [
            python,
            "-m",
            "pytest",
            "-p",
            "no:cacheprovider",
            "-q",
            "tests",
            "src/qkv",
            "--doctest-modules",
            "--ignore=tests/browser",
        ],
        cwd=ROOT,
        check=False,
    )
    problems = run_chapters(python, ROOT / "_build" / "versions" / args.name) if chapters else []
    if tests.returncode != 0:
        problems.insert(0, f"pytest failed (exit code {tests.returncode}): see above")
    if problems:
        print("\n\n".join(problems), file=sys.stderr)
        fail(f"{len(problems)} problems on {constraints.relative_to(ROOT)}")
    what = "the unit tests and every chapter pass" if chapters else "the unit tests pass (chapters: no)"
    print(f"test-{args.name}: {what} on {constraints.relative_to(ROOT)}")


if __name__ == "__main__":
    main()
