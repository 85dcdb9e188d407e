"""Binder's environment (binder/), checked against the pins the book is tested with.

repo2docker reads binder/ instead of the repository root: runtime.txt picks the Python,
requirements.txt is installed before the repository is copied (a cached layer), and
postBuild installs qkv itself. These tests read files and the installed packages'
metadata (the .venv holds exactly the root pins); they build nothing.
"""

from __future__ import annotations

import os
import re
from importlib import metadata
from pathlib import Path

import pytest
from packaging.requirements import Requirement
from packaging.specifiers import SpecifierSet
from packaging.version import Version

ROOT = Path(__file__).resolve().parents[1]
BINDER = ROOT / "binder"


def _installed_is_pinned() -> bool:
    """Whether this Python has the root pins (the .venv), not another set of versions."""
    pins = _pins(ROOT / "requirements.txt")
    return all(_public(metadata.version(name)) == pins[name] for name in ("torch", "numpy", "transformers"))


# Distributions Binder's own environment provides, which the chapters need as well.
PROVIDED_BY_REPO2DOCKER = {"setuptools"}
# What a CUDA build of torch needs and Binder's CPU-only build does not.
CUDA_ONLY = re.compile(r"nvidia-|cuda-|triton$")
# Tools for testing or building the book: none of them belongs in Binder.
TOOLS = {"pytest", "hypothesis", "nbval", "ruff", "mypy", "playwright", "sphinx", "jupyter-book", "myst-nb"}


def _name(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def _pins(path: Path) -> dict[str, str]:
    """name -> version of every `name==version` line (options and comments skipped)."""
    pins = {}
    for line in path.read_text(encoding="utf-8").splitlines():
        line = line.split("#")[0].strip()
        if line and not line.startswith("-"):
            requirement = Requirement(line)
            (specifier,) = requirement.specifier
            assert specifier.operator == "==", f"{path.name}: pin {line!r} exactly"
            pins[_name(requirement.name)] = specifier.version
    return pins


def _public(version: str) -> str:
    return Version(version).public  # 2.13.0+cpu -> 2.13.0


def _closure(name: str, extras: tuple[str, ...] = ()) -> dict[str, metadata.Distribution]:
    """Every installed distribution that `name[extras]` needs, itself included."""
    found: dict[str, metadata.Distribution] = {}
    todo, done = [(name, extras)], set()
    while todo:
        name, extras = todo.pop()
        if (_name(name), extras) in done:
            continue
        done.add((_name(name), extras))
        distribution = metadata.distribution(name)
        found[_name(distribution.name)] = distribution
        for requirement in map(Requirement, distribution.requires or []):
            marker = requirement.marker
            if marker is None or any(marker.evaluate({"extra": extra}) for extra in ("", *extras)):
                todo.append((requirement.name, tuple(sorted(requirement.extras))))
    return found


def test_binder_pins_are_the_root_pins() -> None:
    root, binder = _pins(ROOT / "requirements.txt"), _pins(BINDER / "requirements.txt")
    differ = {
        name: (version, root.get(name))
        for name, version in binder.items()
        if _public(version) != root.get(name)
    }
    assert not differ, f"binder/requirements.txt (left) and requirements.txt (right) disagree: {differ}"


@pytest.mark.skipif(not _installed_is_pinned(), reason="reads the pinned environment's metadata (.venv)")
def test_binder_installs_what_the_chapters_import_and_no_tools() -> None:
    binder = _pins(BINDER / "requirements.txt")
    needed = set(_closure("qkv", ("interop", "plot"))) - {"qkv"} - PROVIDED_BY_REPO2DOCKER
    needed = {name for name in needed if not CUDA_ONLY.match(name)}  # a .venv with CUDA torch
    assert not needed - set(binder), f"binder/requirements.txt lacks {sorted(needed - set(binder))}"
    extra = set(binder) - needed
    assert not extra, f"binder/requirements.txt pins what no chapter needs: {sorted(extra)}"
    assert not TOOLS & set(binder)


def test_binder_takes_torch_cpu_wheels_and_caches_its_dependencies() -> None:
    text = (BINDER / "requirements.txt").read_text(encoding="utf-8")
    assert "--extra-index-url https://download.pytorch.org/whl/cpu" in text.splitlines()
    assert Version(_pins(BINDER / "requirements.txt")["torch"]).local == "cpu"
    # A local path (-e ., .) would make repo2docker copy the repository first, so that
    # every commit rebuilt the dependency layer; qkv is installed by postBuild instead.
    lines = [line.split("#")[0].strip() for line in text.splitlines()]
    assert not [line for line in lines if line.startswith((".", "-e", "file:"))]
    post_build = BINDER / "postBuild"
    assert os.access(post_build, os.X_OK), "binder/postBuild must be executable"
    assert "pip install --no-cache-dir --no-deps ." in post_build.read_text(encoding="utf-8")


@pytest.mark.skipif(not _installed_is_pinned(), reason="reads the pinned environment's metadata (.venv)")
def test_binder_python_satisfies_every_pin() -> None:
    runtime = (BINDER / "runtime.txt").read_text(encoding="utf-8").strip()
    match = re.fullmatch(r"python-(3\.\d+)", runtime)
    assert match, f"binder/runtime.txt must read python-3.X, not {runtime!r}"
    python = Version(match.group(1))
    pyproject = (ROOT / "pyproject.toml").read_text(encoding="utf-8")
    (requires_python,) = re.findall(r'^requires-python = "(.+)"$', pyproject, re.MULTILINE)
    assert python in SpecifierSet(requires_python)
    unsatisfied = {}
    for name, version in _pins(BINDER / "requirements.txt").items():
        distribution = metadata.distribution(name)
        if _public(distribution.version) != _public(version):
            pytest.fail(f"{name} {distribution.version} is installed, not the pinned {version}: run make env")
        requires = distribution.metadata.get("Requires-Python") or ""
        if python not in SpecifierSet(requires):
            unsatisfied[name] = requires
    assert not unsatisfied, f"Binder's Python {python} is outside these pins' requires-python: {unsatisfied}"
