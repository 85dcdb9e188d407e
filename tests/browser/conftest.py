"""The browser check runs only when asked for: ``pytest tests/browser --browser``.

``make browser`` (part of ``make test``) asks for it after building the book. A plain
``pytest tests/`` reports these tests as skipped, with the reason, rather than
silently passing them: they need the built site and Debian's Chromium.
"""

from __future__ import annotations

import pytest


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption(
        "--browser",
        action="store_true",
        default=False,
        help="open every page of _build/html in headless Chromium (make browser)",
    )


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line("markers", "browser: needs the built book and Chromium")


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    if config.getoption("--browser", default=False):
        return
    skip = pytest.mark.skip(reason="browser check: run it with 'make browser'")
    for item in items:
        if item.get_closest_marker("browser"):
            item.add_marker(skip)
