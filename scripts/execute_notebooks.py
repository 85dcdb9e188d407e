"""Re-run chapter notebooks in place, reproducibly, and store their outputs.

Usage (through make, which uses the project's .venv)::

    make execute                        # every book/*.ipynb
    make execute NB=book/heads.ipynb    # one chapter

Each notebook runs top to bottom in a fresh kernel of *this* Python (the .venv),
with the notebook's folder as working directory, as nbval runs it. Cell ids are
kept, execution timings are not recorded, and volatile metadata (the Python patch
version, widget state, per-cell execution records) is removed, so that re-running
an unchanged chapter leaves the file unchanged. A cell that raises stops the run,
unless it is tagged ``raises-exception``; such a cell's stored error keeps its type
and message only, not the traceback.
"""

from __future__ import annotations

import argparse
import os
import sys
import uuid
from pathlib import Path

import ipykernel.kernelspec
import nbformat
from jupyter_client.kernelspec import KernelSpecManager
from nbclient import NotebookClient

KERNEL_NAME = "python3"
KERNELSPEC = {"name": "python3", "display_name": "Python 3 (ipykernel)", "language": "python"}


class CurrentEnvKernelSpecManager(KernelSpecManager):
    """Resolve every kernel name to an ipykernel running on this interpreter."""

    def get_kernel_spec(self, kernel_name: str):
        return self.kernel_spec_class(
            resource_dir=ipykernel.kernelspec.RESOURCES,
            **ipykernel.kernelspec.get_kernel_dict(),
        )


def _strip_volatile(nb: nbformat.NotebookNode) -> None:
    nb.metadata.pop("widgets", None)
    nb.metadata.pop("papermill", None)
    nb.metadata.pop("execution", None)
    nb.metadata["kernelspec"] = dict(KERNELSPEC)
    language_info = nb.metadata.get("language_info", {})
    language_info.pop("version", None)
    for cell in nb.cells:
        cell.metadata.pop("execution", None)
        cell.metadata.pop("ExecuteTime", None)
        cell.metadata.pop("collapsed", None)
        cell.metadata.pop("scrolled", None)
        if cell.cell_type == "code":
            for output in cell.get("outputs", []):
                # Transient display ids are random per run and never shown.
                output.get("metadata", {}).pop("transient", None)
                output.pop("transient", None)


def _short_errors(nb: nbformat.NotebookNode) -> None:
    """Store an error demonstration as the reader needs it: its type and message, nothing else.

    A full traceback runs through qkv's source with this machine's paths, and buries
    the message, which is the point of the demonstration. (nbval does not compare
    tracebacks; it compares the error's type and message, which are kept.)
    """
    for cell in nb.cells:
        for output in cell.get("outputs", []) if cell.cell_type == "code" else []:
            if output.get("output_type") == "error":
                output["traceback"] = [f"{output['ename']}: {output['evalue']}"]


def _whole_streams(nb: nbformat.NotebookNode) -> None:
    """Join a cell's consecutive pieces of one stream: how a print arrives in pieces
    depends on the machine's load, and the stored file should not."""
    for cell in nb.cells:
        if cell.cell_type != "code":
            continue
        outputs: list[nbformat.NotebookNode] = []
        for output in cell.get("outputs", []):
            previous = outputs[-1] if outputs else None
            if (
                output.get("output_type") == "stream"
                and previous is not None
                and previous.get("output_type") == "stream"
                and previous.get("name") == output.get("name")
            ):
                previous["text"] = "".join(previous["text"]) + "".join(output["text"])
            else:
                outputs.append(output)
        cell["outputs"] = outputs


def _ensure_ids(nb: nbformat.NotebookNode) -> None:
    """Keep existing cell ids; give new cells one (nbformat 4.5 requires ids)."""
    nb.nbformat, nb.nbformat_minor = 4, max(nb.get("nbformat_minor", 5), 5)
    seen: set[str] = set()
    for cell in nb.cells:
        cell_id = cell.get("id")
        if not cell_id or cell_id in seen:
            cell_id = uuid.uuid4().hex[:8]
            cell["id"] = cell_id
        seen.add(cell_id)


def execute(path: Path, timeout: int) -> None:
    nb = nbformat.read(path, as_version=4)
    _ensure_ids(nb)
    client = NotebookClient(
        nb,
        timeout=timeout,
        kernel_name=KERNEL_NAME,
        kernel_manager_class=_kernel_manager_class(),
        record_timing=False,
        allow_errors=False,  # cells tagged raises-exception may still raise
        resources={"metadata": {"path": str(path.parent.resolve())}},
    )
    client.execute()
    _strip_volatile(nb)
    _whole_streams(nb)
    _short_errors(nb)
    nbformat.validate(nb)
    text = nbformat.writes(nb) + "\n"
    if path.read_text(encoding="utf-8") != text:
        path.write_text(text, encoding="utf-8")
        print(f"executed {path}: outputs updated")
    else:
        print(f"executed {path}: unchanged")


def _kernel_manager_class():
    from jupyter_client.manager import AsyncKernelManager

    class CurrentEnvKernelManager(AsyncKernelManager):
        def __init__(self, **kwargs):
            kwargs.setdefault("kernel_spec_manager", CurrentEnvKernelSpecManager())
            super().__init__(**kwargs)

    return CurrentEnvKernelManager


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("notebooks", nargs="*", type=Path, help="default: every notebook under book/")
    parser.add_argument("--timeout", type=int, default=600, help="seconds per cell")
    args = parser.parse_args(argv)
    every = (p for p in Path("book").glob("**/*.ipynb") if ".ipynb_checkpoints" not in p.parts)
    notebooks = args.notebooks or sorted(every)
    if not notebooks:
        print("no notebooks to execute", file=sys.stderr)
        return 1
    os.environ.setdefault("PYTHONHASHSEED", "0")
    for path in notebooks:
        if path.suffix != ".ipynb" or not path.is_file():
            print(f"not a notebook: {path}", file=sys.stderr)
            return 1
        execute(path, args.timeout)
    return 0


if __name__ == "__main__":
    sys.exit(main())
