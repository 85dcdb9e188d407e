"""The browser check runs only when asked for: ``pytest tests/browser --browser``.

``make browser`` (part of ``make test``) asks for it after building the book. A plain
``pytest tests/`` reports these tests as skipped, with the reason, rather than
silently passing them: they need the built site and Debian's Chromium.

Fixtures: ``base_url`` serves ``_build/html`` on a local port; ``browser`` is headless
Chromium; ``open_page(relative, width=, mode=, block=, init_script=, reuse=)`` opens a page of the site in a
window of that width and colour mode, with every request to another host recorded and
refused, and, for ``test_broken_on_purpose.py``, named files of the site blocked on purpose.
"""

from __future__ import annotations

import functools
import http.server
import threading
from collections.abc import Iterator
from pathlib import Path
from urllib.parse import urlsplit

import pytest
from page_checks import SITE, TIMEOUT_MS

CHROMIUM = Path("/usr/bin/chromium")
CHROMIUM_ARGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
]
LOCAL_HOSTS = {"127.0.0.1", "localhost"}


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


class _QuietHandler(http.server.SimpleHTTPRequestHandler):
    def log_message(self, *args: object) -> None:
        pass


@pytest.fixture(scope="session")
def base_url() -> Iterator[str]:
    if not (SITE / "index.html").is_file():
        pytest.fail(f"no built site at {SITE}: run 'make html-strict' or 'make book' first")
    handler = functools.partial(_QuietHandler, directory=str(SITE))
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()
        thread.join()


@pytest.fixture(scope="session")
def browser():
    if not CHROMIUM.is_file():
        pytest.fail(f"{CHROMIUM} is missing: install Debian's chromium (apt-get install chromium)")
    from playwright.sync_api import sync_playwright

    with sync_playwright() as playwright:
        browser = playwright.chromium.launch(executable_path=str(CHROMIUM), args=CHROMIUM_ARGS, headless=True)
        try:
            yield browser
        finally:
            browser.close()


class PageProblems:
    """Everything that went wrong while one page loaded."""

    def __init__(self, block: tuple[str, ...] = ()) -> None:
        self.console_errors: list[str] = []
        self.external_requests: list[str] = []
        self.block = block

    def on_console(self, message) -> None:
        if message.type == "error":
            self.console_errors.append(f"console: {message.text}")

    def on_response(self, response) -> None:
        if response.status >= 400:
            self.console_errors.append(f"HTTP {response.status}: {response.url}")

    def on_page_error(self, error) -> None:
        self.console_errors.append(f"uncaught: {error}")

    def on_route(self, route) -> None:
        url = route.request.url
        parts = urlsplit(url)
        if any(parts.path.endswith(name) for name in self.block):
            route.abort()  # a file of the site left out on purpose (test_broken_on_purpose.py)
        elif parts.scheme in {"data", "blob", "about"} or parts.hostname in LOCAL_HOSTS:
            route.continue_()
        else:
            # Record and abort, so that a closed network cannot make the test hang.
            self.external_requests.append(url)
            route.abort()


class _Tab:
    """A browser tab in a colour mode, whose handlers report to the problems of its current page."""

    def __init__(self, browser, mode: str, width: int, init_script: str | None = None) -> None:
        self.context = browser.new_context(viewport={"width": width, "height": 900})
        # The theme keeps the reader's colour mode in localStorage.
        self.context.add_init_script(f"window.localStorage.setItem('mode', '{mode}');")
        if init_script:  # runs before the page's own scripts (test_broken_on_purpose.py)
            self.context.add_init_script(init_script)
        self.problems = PageProblems()  # each open() starts the page's own
        self.context.route("**/*", lambda route: self.problems.on_route(route))
        self.page = self.context.new_page()
        self.page.on("console", lambda message: self.problems.on_console(message))
        self.page.on("pageerror", lambda error: self.problems.on_page_error(error))
        self.page.on("response", lambda response: self.problems.on_response(response))

    def open(self, url: str, width: int, block: tuple[str, ...] = ()) -> tuple[object, PageProblems]:
        self.problems = PageProblems(block)
        self.page.set_viewport_size({"width": width, "height": 900})
        # The checks wait for what they need (MathJax, images, search results) themselves.
        self.page.goto(url, wait_until="load", timeout=TIMEOUT_MS)
        return self.page, self.problems


@pytest.fixture(scope="session")
def _reused_tabs(browser) -> Iterator[dict[str, _Tab]]:
    tabs: dict[str, _Tab] = {}
    yield tabs
    for tab in tabs.values():
        tab.context.close()


@pytest.fixture
def open_page(browser, base_url, _reused_tabs):
    """Open a page of the site; return the Playwright page and what went wrong loading it.

    ``reuse=True`` opens it in the one tab this worker keeps for that colour mode, as a
    reader who follows a link does: starting a tab (a new renderer process) and fetching
    the theme's scripts and styles again cost about a second a page, a third of a deeper
    page's check. Only for checks that leave nothing behind but what a new page load
    resets (the DOM, styles added, scrolling); a page that clicks the sidebar or blocks
    files gets a tab of its own.
    """
    tabs: list[_Tab] = []

    def _open(
        relative: str,
        width: int = 1280,
        mode: str = "light",
        block: tuple[str, ...] = (),
        init_script: str | None = None,
        reuse: bool = False,
    ):
        url = f"{base_url}/{relative}"
        if reuse and not block and not init_script:
            if mode not in _reused_tabs:
                _reused_tabs[mode] = _Tab(browser, mode, width)
            try:
                return _reused_tabs[mode].open(url, width)
            except Exception:
                _reused_tabs.pop(mode).context.close()  # the next page starts a new tab
                raise
        tab = _Tab(browser, mode, width, init_script)
        tabs.append(tab)
        page, problems = tab.open(url, width, block)
        if block and any(name.endswith(".js") for name in block):
            # The theme's own console message about a blocked script is not the point.
            problems.console_errors.clear()
        return page, problems

    yield _open
    for tab in tabs:
        tab.context.close()
