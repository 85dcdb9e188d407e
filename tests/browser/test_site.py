"""Open every page of the built book in headless Chromium and check it renders.

Fails on a console error or uncaught exception, on any request to a host other
than the local server (the site must work offline: MathJax, fonts and scripts are
all served from ``_static``), on maths that MathJax did not typeset, and on an
image that did not load. Saves a screenshot of the front page to
``_build/screenshot-intro.png``.

Run with ``make browser`` (it builds the book first). Needs Debian's Chromium at
``/usr/bin/chromium``; Playwright's own browser download is not used.
"""

from __future__ import annotations

import functools
import http.server
import threading
from collections.abc import Iterator
from pathlib import Path
from urllib.parse import urlsplit

import pytest

pytestmark = pytest.mark.browser

ROOT = Path(__file__).resolve().parents[2]
SITE = ROOT / "_build" / "html"
SCREENSHOT = ROOT / "_build" / "screenshot-intro.png"
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
# Pages Sphinx generates that are not content: the index and search pages.
NOT_PAGES = {"genindex.html", "search.html", "index.html"}
TIMEOUT_MS = 30_000


def built_pages() -> list[str]:
    """Every HTML page of the built site, as a path relative to its root."""
    if not SITE.is_dir():
        return []
    pages = []
    for path in sorted(SITE.rglob("*.html")):
        relative = path.relative_to(SITE)
        if relative.parts[0] in {"_static", "_sources"} or relative.name in NOT_PAGES:
            continue
        if any(part.startswith(".") for part in relative.parts):
            continue
        pages.append(relative.as_posix())
    return pages


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

    def __init__(self) -> None:
        self.console_errors: list[str] = []
        self.external_requests: list[str] = []

    def on_console(self, message) -> None:
        if message.type == "error":
            self.console_errors.append(f"console: {message.text}")

    def on_page_error(self, error) -> None:
        self.console_errors.append(f"uncaught: {error}")

    def on_route(self, route) -> None:
        url = route.request.url
        parts = urlsplit(url)
        if parts.scheme in {"data", "blob", "about"} or parts.hostname in LOCAL_HOSTS:
            route.continue_()
        else:
            # Record and abort, so that a closed network cannot make the test hang.
            self.external_requests.append(url)
            route.abort()


@pytest.fixture
def open_page(browser, base_url):
    """Open a page of the site; return the Playwright page and what went wrong."""
    contexts = []

    def _open(relative: str):
        context = browser.new_context(viewport={"width": 1280, "height": 900})
        contexts.append(context)
        problems = PageProblems()
        context.route("**/*", problems.on_route)
        page = context.new_page()
        page.on("console", problems.on_console)
        page.on("pageerror", problems.on_page_error)
        page.goto(f"{base_url}/{relative}", wait_until="load", timeout=TIMEOUT_MS)
        page.wait_for_load_state("networkidle", timeout=TIMEOUT_MS)
        return page, problems

    yield _open
    for context in contexts:
        context.close()


# Wait for MathJax to typeset, then list the maths elements it did not render.
UNRENDERED_MATH_JS = """
async () => {
    const maths = Array.from(document.querySelectorAll("span.math, div.math"));
    if (maths.length === 0) { return {count: 0, unrendered: [], hasMathJax: !!window.MathJax}; }
    const deadline = Date.now() + 20000;
    while (!(window.MathJax && window.MathJax.startup && window.MathJax.startup.promise)) {
        if (Date.now() > deadline) { break; }
        await new Promise((resolve) => setTimeout(resolve, 50));
    }
    if (window.MathJax && window.MathJax.startup && window.MathJax.startup.promise) {
        await window.MathJax.startup.promise;
    }
    const unrendered = maths
        .filter((el) => !el.querySelector("mjx-container") || el.querySelector("mjx-merror"))
        .map((el) => el.textContent.slice(0, 80));
    return {count: maths.length, unrendered: unrendered, hasMathJax: !!window.MathJax};
}
"""

# Make lazy images load, wait for every image, and list those that failed.
BROKEN_IMAGES_JS = """
async () => {
    const images = Array.from(document.images);
    images.forEach((img) => { img.loading = "eager"; });
    await Promise.all(images.map((img) => img.complete ? null : new Promise((resolve) => {
        img.addEventListener("load", resolve, {once: true});
        img.addEventListener("error", resolve, {once: true});
        setTimeout(resolve, 10000);
    })));
    return images.filter((img) => !img.complete || img.naturalWidth === 0)
        .map((img) => img.currentSrc || img.src);
}
"""


# Every figure in the page's article (not the theme's buttons) needs alt text that says what
# it shows: at least four words, not a file name or a hash (what myst-nb writes by default).
MEANINGLESS_ALT_JS = """
() => Array.from(document.querySelectorAll("article img"))
    .filter((img) => {
        const alt = (img.getAttribute("alt") || "").trim();
        const words = alt.split(/\\s+/).filter((w) => /[A-Za-z]/.test(w));
        return words.length < 4 || /^[0-9a-f]{16,}/i.test(alt) || /\\.(png|svg|jpe?g|gif)$/i.test(alt);
    })
    .map((img) => `${img.getAttribute("src")}: alt=${JSON.stringify(img.getAttribute("alt"))}`)
"""


def meaningless_alt(page) -> list[str]:
    """The page's figures whose alt text does not say what they show."""
    return page.evaluate(MEANINGLESS_ALT_JS)


def check_page(page, problems: PageProblems) -> None:
    maths = page.evaluate(UNRENDERED_MATH_JS)
    broken_images = page.evaluate(BROKEN_IMAGES_JS)
    no_alt = meaningless_alt(page)
    page.wait_for_load_state("networkidle", timeout=TIMEOUT_MS)
    failures = []
    if problems.console_errors:
        failures.append("console errors:\n  " + "\n  ".join(problems.console_errors))
    if problems.external_requests:
        failures.append("requests to other hosts:\n  " + "\n  ".join(problems.external_requests))
    if maths["count"] and not maths["hasMathJax"]:
        failures.append(f"{maths['count']} maths elements but MathJax did not load")
    if maths["unrendered"]:
        failures.append("maths MathJax did not render:\n  " + "\n  ".join(maths["unrendered"]))
    if broken_images:
        failures.append("images that did not load:\n  " + "\n  ".join(broken_images))
    if no_alt:
        failures.append(
            "figures without alt text that says what they show (set mystnb.image.alt in the cell's "
            "metadata):\n  " + "\n  ".join(no_alt)
        )
    assert not failures, "\n".join(failures)


def test_the_alt_text_check_catches_a_figure_without_it(browser) -> None:
    """The check itself, on a page broken on purpose: hashed, empty and missing alt text fail."""
    page = browser.new_page()
    try:
        page.set_content(
            "<article>"
            '<img src="a.png" alt="3f9c2b7e1d0a4c5b8e6f7a9d2c1b0e3f4a5b6c7d8e9f0a1b2c3d4e5f6a7b8c9d.png">'
            '<img src="b.png" alt="">'
            '<img src="c.png">'
            '<img src="d.png" alt="An attention map: each row puts its weight on the previous token.">'
            "</article>"
        )
        flagged = meaningless_alt(page)
    finally:
        page.close()
    assert [entry.split(":")[0] for entry in flagged] == ["a.png", "b.png", "c.png"], flagged


def test_site_has_pages() -> None:
    pages = built_pages()
    assert "book/intro.html" in pages, f"the front page is missing from {SITE}: {pages}"


@pytest.mark.parametrize("relative", built_pages() or ["book/intro.html"])
def test_page_renders_offline(open_page, relative: str) -> None:
    page, problems = open_page(relative)
    check_page(page, problems)


def test_front_page(open_page) -> None:
    """The site root leads to the front page, whose maths renders; screenshot it."""
    page, problems = open_page("index.html")
    page.wait_for_url("**/book/intro.html", timeout=TIMEOUT_MS)
    page.wait_for_load_state("networkidle", timeout=TIMEOUT_MS)
    check_page(page, problems)
    assert page.locator("h1").first.inner_text().startswith("Queries, Keys and Values")
    rendered = page.locator("mjx-container").count()
    assert rendered >= 5, f"expected the front page's formulas typeset, found {rendered}"
    SCREENSHOT.parent.mkdir(parents=True, exist_ok=True)
    page.screenshot(path=str(SCREENSHOT), full_page=False)
    assert SCREENSHOT.stat().st_size > 10_000
