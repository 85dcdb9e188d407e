"""Reading the pin files (requirements.txt, binder/, constraints/) and the installed pins.

Shared by the tests of the Binder environment, the version floors and the repository.
"""

from __future__ import annotations

import re
from importlib import metadata
from pathlib import Path

from packaging.requirements import Requirement
from packaging.version import Version

ROOT = Path(__file__).resolve().parents[1]


def name(distribution: str) -> str:
    """A distribution's normalised name: ruamel.yaml, ruamel_yaml -> ruamel-yaml."""
    return re.sub(r"[-_.]+", "-", distribution).lower()


def public(version: str) -> str:
    """The version without its local label: 2.13.0+cpu -> 2.13.0."""
    return Version(version).public


def read_pins(path: Path) -> dict[str, str]:
    """Normalised name -> version of every `name==version` line; options and comments skipped."""
    pins = {}
    for line in path.read_text(encoding="utf-8").splitlines():
        line = line.split("#")[0].strip()
        if line and not line.startswith("-"):
            requirement = Requirement(line)
            (specifier,) = requirement.specifier
            assert specifier.operator == "==", f"{path.name}: pin {line!r} exactly"
            pins[name(requirement.name)] = specifier.version
    return pins


def pinned_environment() -> bool:
    """Whether this Python has every root pin installed (the .venv), not other versions."""
    pins = read_pins(ROOT / "requirements.txt")
    try:
        return all(public(metadata.version(pin)) == version for pin, version in pins.items())
    except metadata.PackageNotFoundError:
        return False


def is_pinned(distribution: str) -> bool:
    """Whether the installed `distribution` is the version requirements.txt pins.

    Tests that check what a page quotes from one library's source (its comments, its
    names) hold for the pinned version the page was run with, not for every version
    `make test-oldest` or `make test-colab` installs.
    """
    try:
        installed = public(metadata.version(distribution))
    except metadata.PackageNotFoundError:
        return False
    return read_pins(ROOT / "requirements.txt").get(name(distribution)) == installed
