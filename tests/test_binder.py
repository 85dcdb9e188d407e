"""Binder's environment (binder/), checked against the pins the book is tested with.

repo2docker reads binder/ instead of the repository root: runtime.txt picks the Python,
requirements.txt is installed before the repository is copied (a cached layer), and
postBuild installs qkv itself. These tests read files and the installed packages'
metadata (the .venv holds exactly the root pins); they build nothing.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from importlib import metadata
from pathlib import Path

import pytest
from packaging.requirements import Requirement
from packaging.specifiers import SpecifierSet
from packaging.version import Version
from pins import name as name_of
from pins import pinned_environment, public, read_pins

ROOT = Path(__file__).resolve().parents[1]
BINDER = ROOT / "binder"


# Distributions Binder's own environment provides, which the chapters need as well.
PROVIDED_BY_REPO2DOCKER = {"setuptools"}
# What a CUDA build of torch needs and Binder's CPU-only build does not.
CUDA_ONLY = re.compile(r"nvidia-|cuda-|triton$")
# Tools for testing or building the book: none of them belongs in Binder.
TOOLS = {"pytest", "hypothesis", "nbval", "ruff", "mypy", "playwright", "sphinx", "jupyter-book", "myst-nb"}


def _closure(name: str, extras: tuple[str, ...] = ()) -> dict[str, metadata.Distribution]:
    """Every installed distribution that `name[extras]` needs, itself included."""
    found: dict[str, metadata.Distribution] = {}
    todo, done = [(name, extras)], set()
    while todo:
        name, extras = todo.pop()
        if (name_of(name), extras) in done:
            continue
        done.add((name_of(name), extras))
        distribution = metadata.distribution(name)
        found[name_of(distribution.name)] = distribution
        for requirement in map(Requirement, distribution.requires or []):
            marker = requirement.marker
            if marker is None or any(marker.evaluate({"extra": extra}) for extra in ("", *extras)):
                todo.append((requirement.name, tuple(sorted(requirement.extras))))
    return found


def test_binder_pins_are_the_rootread_pins() -> None:
    root, binder = read_pins(ROOT / "requirements.txt"), read_pins(BINDER / "requirements.txt")
    differ = {
        name: (version, root.get(name))
        for name, version in binder.items()
        if public(version) != root.get(name)
    }
    assert not differ, f"binder/requirements.txt (left) and requirements.txt (right) disagree: {differ}"


@pytest.mark.skipif(not pinned_environment(), reason="reads the pinned environment's metadata (.venv)")
def test_binder_installs_what_the_chapters_import_and_no_tools() -> None:
    binder = read_pins(BINDER / "requirements.txt")
    needed = set(_closure("qkv", ("interop", "plot"))) - {"qkv"} - PROVIDED_BY_REPO2DOCKER
    needed = {name for name in needed if not CUDA_ONLY.match(name)}  # a .venv with CUDA torch
    assert not needed - set(binder), f"binder/requirements.txt lacks {sorted(needed - set(binder))}"
    extra = set(binder) - needed
    assert not extra, f"binder/requirements.txt pins what no chapter needs: {sorted(extra)}"
    assert not TOOLS & set(binder)


def test_binder_takes_torch_cpu_wheels_and_caches_its_dependencies() -> None:
    text = (BINDER / "requirements.txt").read_text(encoding="utf-8")
    assert "--extra-index-url https://download.pytorch.org/whl/cpu" in text.splitlines()
    assert Version(read_pins(BINDER / "requirements.txt")["torch"]).local == "cpu"
    # A local path (-e ., .) would make repo2docker copy the repository first, so that
    # every commit rebuilt the dependency layer; qkv is installed by postBuild instead.
    lines = [line.split("#")[0].strip() for line in text.splitlines()]
    assert not [line for line in lines if line.startswith((".", "-e", "file:"))]
    post_build = BINDER / "postBuild"
    assert os.access(post_build, os.X_OK), "binder/postBuild must be executable"
    assert "pip install --no-cache-dir --no-deps ." in post_build.read_text(encoding="utf-8")


def test_post_build_trusts_every_chapter(tmp_path: Path) -> None:
    """postBuild's own trust line signs every chapter, so that their stored views run on Binder."""
    nbformat = pytest.importorskip("nbformat")
    from nbformat.sign import NotebookNotary

    lines = (BINDER / "postBuild").read_text(encoding="utf-8").splitlines()
    (line,) = [line for line in lines if line.startswith("jupyter trust")]
    # The line as Binder runs it (bash expands the glob), with this environment's jupyter.
    path = f"{Path(sys.executable).parent}{os.pathsep}{os.environ.get('PATH', '')}"
    environment = {**os.environ, "JUPYTER_DATA_DIR": str(tmp_path), "PATH": path}
    subprocess.run(["bash", "-c", line], check=True, cwd=ROOT, env=environment, capture_output=True)
    chapters = sorted(p for p in (ROOT / "book").glob("**/*.ipynb") if ".ipynb_checkpoints" not in p.parts)
    notary = NotebookNotary(data_dir=str(tmp_path))
    untrusted = [c.name for c in chapters if not notary.check_signature(nbformat.read(c, as_version=4))]
    assert chapters and not untrusted, f"not trusted after postBuild's {line!r}: {untrusted}"


@pytest.mark.skipif(not pinned_environment(), reason="reads the pinned environment's metadata (.venv)")
def test_binder_python_satisfies_every_pin() -> None:
    runtime = (BINDER / "runtime.txt").read_text(encoding="utf-8").strip()
    match = re.fullmatch(r"python-(3\.\d+)", runtime)
    assert match, f"binder/runtime.txt must read python-3.X, not {runtime!r}"
    python = Version(match.group(1))
    pyproject = (ROOT / "pyproject.toml").read_text(encoding="utf-8")
    (requires_python,) = re.findall(r'^requires-python = "(.+)"$', pyproject, re.MULTILINE)
    assert python in SpecifierSet(requires_python)
    unsatisfied = {}
    for name, version in read_pins(BINDER / "requirements.txt").items():
        distribution = metadata.distribution(name)
        if public(distribution.version) != public(version):
            pytest.fail(f"{name} {distribution.version} is installed, not the pinned {version}: run make env")
        requires = distribution.metadata.get("Requires-Python") or ""
        if python not in SpecifierSet(requires):
            unsatisfied[name] = requires
    assert not unsatisfied, f"Binder's Python {python} is outside these pins' requires-python: {unsatisfied}"
