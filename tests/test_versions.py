"""The version floors in pyproject.toml are the versions `make test-oldest` runs on.

constraints/oldest.txt pins the oldest torch, NumPy, transformers, Keras and matplotlib
that the package and the chapters support (the scheduled workflow runs the unit tests
and every chapter on them); pyproject.toml must promise exactly those lower bounds.
"""

from __future__ import annotations

import re
from pathlib import Path

from packaging.requirements import Requirement
from packaging.version import Version
from pins import name as name_of
from pins import read_pins

ROOT = Path(__file__).resolve().parents[1]
CONSTRAINTS = ROOT / "constraints"


def _constraints(name: str) -> tuple[Version, dict[str, Version]]:
    """The Python a set names in its first line, and its pins."""
    text = (CONSTRAINTS / f"{name}.txt").read_text(encoding="utf-8")
    header = re.match(r"# python (3\.\d+)\n", text)
    assert header, f"constraints/{name}.txt must start with '# python 3.X'"
    pins = {pin: Version(version) for pin, version in read_pins(CONSTRAINTS / f"{name}.txt").items()}
    return Version(header.group(1)), pins


def _floors() -> tuple[Version, dict[str, Version]]:
    """requires-python's floor and each dependency's lower bound, extras included."""
    pyproject = (ROOT / "pyproject.toml").read_text(encoding="utf-8")
    (python,) = re.findall(r'^requires-python = ">=(3\.\d+)"$', pyproject, re.MULTILINE)
    floors = {}
    for quoted in re.findall(r'"([A-Za-z][\w.-]*(?:\[[\w,]+\])?\s*[<>=!~][^"]*)"', pyproject):
        requirement = Requirement(quoted)
        lower = [s.version for s in requirement.specifier if s.operator == ">="]
        if lower:
            floors[name_of(requirement.name)] = Version(lower[0])
    return Version(python), floors


def test_pyproject_floors_are_the_oldest_tested_versions() -> None:
    python, floors = _floors()
    oldest_python, oldest = _constraints("oldest")
    assert python == oldest_python, f"requires-python >={python}, but make test-oldest runs {oldest_python}"
    for name in ("torch", "numpy", "transformers", "keras", "matplotlib"):
        assert floors[name] == oldest[name], (
            f"pyproject.toml promises {name}>={floors[name]}, but make test-oldest runs {oldest[name]}"
        )


def test_colab_set_is_within_the_floors() -> None:
    _, floors = _floors()
    python, colab = _constraints("colab")
    assert python >= Version("3.12")
    below = {name: str(v) for name, v in colab.items() if name in floors and v < floors[name]}
    assert not below, f"constraints/colab.txt is below pyproject.toml's floors: {below}"
    assert "tensorflow" in colab, "Colab has TensorFlow installed beside Keras; so must the check"


def test_readme_states_the_floors() -> None:
    python, floors = _floors()
    names = {"torch": "torch", "numpy": "NumPy", "transformers": "transformers", "keras": "Keras"}
    stated = " ".join((ROOT / "README.md").read_text(encoding="utf-8").split())
    expected = (
        f"It supports Python {python} or newer with "
        + ", ".join(f"{label} {floors[name]}" for name, label in names.items())
        + f" and matplotlib {floors['matplotlib']} or newer"
    )
    assert expected in stated, f"README.md should say: {expected!r}"
