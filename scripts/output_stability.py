"""Which stored outputs of a page change on another CPU? Run it several ways and compare.

Usage (through make, which uses the project's .venv)::

    make stability NB=book/training.ipynb

Another processor (AVX-512 or AVX2, Intel or AMD, ARM) or another thread count changes
the low digits of float32 sums, and a training run carries such a change into its
later steps. This runs the page once as it is and once under each of the
perturbations below, which change low digits here the way another machine does,
and lists every text output (glued values included) that is not the same in all
runs, with each run's text. A number the prose shows must be rounded to digits that
all runs agree on: ``make nbval`` (part of ``make test``) checks the stored outputs
against a run under the last perturbation, two of the others at once.

The notebook file is not changed: it runs from a copy.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

#: Each perturbation: the environment it adds, and what it changes.
PERTURBATIONS: dict[str, dict[str, str]] = {
    "as is": {},
    # torch's own kernels (sums, softmax, elementwise) without SIMD: other reduction orders.
    "no SIMD": {"ATEN_CPU_CAPABILITY": "default"},
    # AVX2 kernels, as on a machine without AVX-512.
    "AVX2": {"ATEN_CPU_CAPABILITY": "avx2"},
    # One thread: matrix products and reductions split differently.
    "1 thread": {"OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1"},
    # Both at once: what `make nbval` runs (the Makefile's PERTURB).
    "make nbval": {"ATEN_CPU_CAPABILITY": "default", "OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1"},
}


def _texts(path: Path) -> dict[tuple[int, int, str], str]:
    """Every text output of the notebook, keyed by (cell index, output index, MIME type)."""
    cells = json.loads(path.read_text(encoding="utf-8"))["cells"]
    texts: dict[tuple[int, int, str], str] = {}
    for index, cell in enumerate(cells):
        if "nbval-ignore-output" in cell.get("metadata", {}).get("tags", []):
            continue
        for number, output in enumerate(cell.get("outputs", [])):
            if "text" in output:  # a stream may arrive in pieces: keep it whole
                key = (index, -1, output.get("name", "stream"))
                texts[key] = texts.get(key, "") + "".join(output["text"])
                continue
            for mime, data in output.get("data", {}).items():
                if mime.endswith("text/plain"):
                    texts[index, number, mime] = "".join(data)
    return texts


def run(notebook: Path, environment: dict[str, str], folder: Path) -> dict[tuple[int, int, str], str]:
    copy = folder / notebook.name
    shutil.copy(notebook, copy)
    subprocess.run(
        [sys.executable, str(ROOT / "scripts" / "execute_notebooks.py"), str(copy)],
        check=True,
        env={**os.environ, **environment},
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    return _texts(copy)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("notebooks", nargs="+", type=Path)
    parser.add_argument(
        "--only", action="append", choices=list(PERTURBATIONS), help="run only these (repeatable)"
    )
    args = parser.parse_args(argv)
    chosen = {name: PERTURBATIONS[name] for name in args.only or PERTURBATIONS}
    differing = 0
    for notebook in args.notebooks:
        runs = {}
        for name, environment in chosen.items():
            with tempfile.TemporaryDirectory(dir=notebook.parent) as folder:
                runs[name] = run(notebook, environment, Path(folder))
        stored = _texts(notebook)
        keys = sorted(set().union(*runs.values()))
        for key in keys:
            seen = {name: texts.get(key) for name, texts in runs.items()}
            if len(set(seen.values())) > 1 or seen[next(iter(seen))] != stored.get(key):
                differing += 1
                cell, output, mime = key
                print(f"{notebook} cell {cell} output {output} ({mime}):")
                print(f"  {'stored':>9}: {stored.get(key)!r:.200}")
                for name, text in seen.items():
                    print(f"  {name:>9}: {text!r:.200}")
    print(f"{differing} output(s) differ between runs or from what is stored")
    return 1 if differing else 0


if __name__ == "__main__":
    sys.exit(main())
