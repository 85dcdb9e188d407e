"""Open every page of the built book in headless Chromium, as a reader would, and check it.

On every page, at phone width (390 px) and laptop width (1280 px), in light mode (one
load, resized), then in dark mode (a second load); a deeper page, whose layout and colours
are its answer page's, and the API and bibliography pages, drawn by Sphinx's templates, at
phone width in light mode only:

* it loads offline: no console error or uncaught exception, no request to another host
  (MathJax, fonts and scripts are served from ``_static``); its maths is typeset and
  its images load, each with alt text that says what it shows;
* no raw Markdown (table syntax, ``$...$``), no path of the machine that built it, no
  traceback longer than a few lines, no TeX in the tab title or in the text of links;
* nothing makes the page wider than the window; a display equation wider than its
  column scrolls and shows it; at 1280 px, code, output and maths fit the column;
* the sidebar buttons open their panels (phone) or hide the sidebar (laptop), on a sample
  of pages (one template draws every page's sidebar);
* axe-core finds no critical or serious accessibility violation, in light and dark mode
  (the colours' contrast checked at one width per mode, and the sizes of what a reader
  taps, on answer pages; highlighted code on one page).

Search results show maths as plain text. Screenshots of every page, at the widths and in
the modes it is checked in, are saved under ``_build/screenshots`` for a person to look at
(``BROWSER_SCREENSHOTS=0`` skips them).

Run with ``make browser`` (it builds the book first). Needs Debian's Chromium at
``/usr/bin/chromium``; Playwright's own browser download is not used.
"""

from __future__ import annotations

import json
import os
import re
import sys
from urllib.parse import quote

import pytest
from bs4 import BeautifulSoup, SoupStrainer, Tag
from page_checks import (
    DESKTOP,
    PHONE,
    ROOT,
    SITE,
    TARGET_RULES,
    TIMEOUT_MS,
    find_accessibility_violations,
    find_broken_images,
    find_clipped_maths,
    find_dead_sidebar_buttons,
    find_late_figure,
    find_long_tracebacks,
    find_machine_paths,
    find_maths_in_links,
    find_maths_in_results,
    find_maths_in_title,
    find_meaningless_alt,
    find_raw_markdown,
    find_squeezed_figures,
    find_wider_than_column,
    find_wider_than_window,
    search_results,
    settle,
    wait_for_maths,
)

pytestmark = pytest.mark.browser

SCREENSHOTS = ROOT / "_build" / "screenshots"
# Pages Sphinx generates that are not content: the index and search pages.
NOT_PAGES = {"genindex.html", "search.html", "index.html"}
# The page whose highlighted code axe checks (the same stylesheet colours every page's code).
CODE_SAMPLE_PAGE = "book/heads.html"
# Pages whose sidebar buttons are clicked: the front page, an answer page and a deeper page
# (every page has the same sidebar, from one template and one script).
SIDEBAR_SAMPLE_PAGES = {"book/intro.html", "book/heads.html", "book/heads/merge.html"}


#: How many headings' words the search check looks up.
MAX_SEARCH_TERMS = 6


#: Reference pages drawn by Sphinx's autodoc and bibliography templates, not written as
#: pages: checked like deeper pages (the API page alone has some 25,000 elements).
REFERENCE_PAGES = {"book/api.html", "book/bibliography.html"}


def is_deeper(relative: str) -> bool:
    """A deeper page (book/<question>/<slug>.html, its answer page's layout) or a reference page."""
    return relative.count("/") > 1 or relative in REFERENCE_PAGES


def is_answer_page(relative: str) -> bool:
    """An answer page: its notebook says so in its metadata (``"qkv": {"page": "answer"}``)."""
    notebook = ROOT / relative.replace(".html", ".ipynb")
    if not notebook.is_file():
        return False
    metadata = json.loads(notebook.read_text(encoding="utf-8")).get("metadata", {})
    return bool(metadata.get("qkv", {}).get("page") == "answer")


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


PAGES = built_pages() or ["book/intro.html"]


def _headings(relative: str) -> list[Tag]:
    """The h1 to h3 elements of the page's article, parsed alone (the whole page takes 4 times longer)."""
    html = (SITE / relative).read_text(encoding="utf-8")
    start, end = html.find("<article"), html.rfind("</article>")
    if start < 0 or end < start:
        return []
    levels = ["h1", "h2", "h3"]
    soup = BeautifulSoup(html[start:end], "html.parser", parse_only=SoupStrainer(levels))
    return list(soup.find_all(levels))


def _maths(relative: str) -> list[Tag]:
    """The page's maths elements (class ``math``), parsed alone: twice as fast as the whole page."""
    # While parsing, the strainer sees the whole class attribute ("math notranslate ..."),
    # so class_="math" matches nothing: match the word inside it.
    only_maths = SoupStrainer(class_=re.compile(r"(^|\s)math(\s|$)"))
    html = (SITE / relative).read_text(encoding="utf-8")
    return list(BeautifulSoup(html, "html.parser", parse_only=only_maths).select(".math"))


def search_terms() -> list[str]:
    """A word of every heading that has maths in it, to search for: its results show that maths."""
    terms: list[str] = []
    for relative in built_pages():
        for heading in _headings(relative):
            if not heading.find(class_="math"):
                continue
            for math in heading.find_all(class_="math"):
                math.decompose()
            words = re.findall(r"[A-Za-z]{4,}", heading.get_text(" "))
            if words:
                term = max(words, key=len).lower()
                if term not in terms:
                    terms.append(term)
        # One search per answer-page question is plenty: the results' titles and summaries
        # go through one function (the same maths-to-text as the tab titles, tested below).
        # Stop parsing once there are enough: every xdist worker collects, so every page
        # parsed here is parsed twice, and the whole site takes some 15 s each.
        if len(terms) >= MAX_SEARCH_TERMS:
            break
    return terms[:MAX_SEARCH_TERMS] or ["attention"]


# Screenshots are for a person to look at, not a check: BROWSER_SCREENSHOTS=0 skips them
# (.ci/run does, unless told otherwise; the GitHub workflow keeps them as an artifact). The
# full-page ones of the long answer pages cost about a second each.
TAKE_SCREENSHOTS = os.environ.get("BROWSER_SCREENSHOTS", "1") != "0"


def _screenshot(page, relative: str, width: int, mode: str, full_page: bool) -> None:
    if not TAKE_SCREENSHOTS:
        return
    SCREENSHOTS.mkdir(parents=True, exist_ok=True)
    name = relative.removesuffix(".html").replace("/", "-")
    page.screenshot(path=str(SCREENSHOTS / f"{name}-{width}-{mode}.png"), full_page=full_page)


def _fail_on(failures: dict[str, list[str]]) -> None:
    report = [f"{what}:\n  " + "\n  ".join(found) for what, found in failures.items() if found]
    assert not report, "\n".join(report)


def test_site_has_pages() -> None:
    assert "book/intro.html" in built_pages(), f"the front page is missing from {SITE}: {built_pages()}"
    for sample in (CODE_SAMPLE_PAGE, *SIDEBAR_SAMPLE_PAGES):
        assert sample in built_pages(), f"{sample}, one of the pages some checks sample, is not built"
    assert any(is_deeper(page) for page in SIDEBAR_SAMPLE_PAGES), "sample a deeper page's sidebar too"


EXERCISE_NUMBER = re.compile(
    r'class="exercise admonition"[^>]*>\s*<p class="admonition-title">'
    r'<span class="caption-number">Exercise (\d+) '
)


def test_exercises_are_numbered_page_by_page() -> None:
    """Each page's exercises read 1, 2, ... (book/_ext/reader_view.py); Sphinx alone would
    count them across the whole book, "Exercise 50" on a page with three."""
    numbered = {}
    for relative in built_pages():
        numbers = [int(n) for n in EXERCISE_NUMBER.findall((SITE / relative).read_text(encoding="utf-8"))]
        if numbers:
            numbered[relative] = numbers
    assert len(numbered) > 20, f"expected most pages to have exercises, found {sorted(numbered)}"
    wrong = {page: found for page, found in numbered.items() if found != list(range(1, len(found) + 1))}
    assert not wrong, f"exercises not numbered 1, 2, ... on their page: {wrong}"


@pytest.mark.parametrize("relative", PAGES)
def test_page_reads_well(open_page, relative: str) -> None:
    """Every check of a page, in two loads: light mode at phone then laptop width, then dark.

    What does not depend on the window (the page's text, maths, images, links) is checked
    once; what does (layout, the sidebar buttons, accessibility) at each width. Resizing
    the loaded page is what a reader who widens the window sees: the theme's layout is
    CSS, and the book's own script re-measures on resize.
    """
    # One tab per worker goes from page to page (conftest.open_page); a page whose sidebar
    # buttons are clicked gets its own.
    page, problems = open_page(relative, width=PHONE, reuse=relative not in SIDEBAR_SAMPLE_PAGES)
    code = relative == CODE_SAMPLE_PAGE  # axe checks highlighted code on one page only
    maths = wait_for_maths(page)
    no_mathjax = [f"{maths['count']} maths elements but no MathJax"] if not maths["hasMathJax"] else []
    failures = {
        "maths MathJax did not render": maths["unrendered"] + (no_mathjax if maths["count"] else []),
        "images that did not load": find_broken_images(page),
        "figures without alt text that says what they show (mystnb.image.alt in the metadata)": (
            find_meaningless_alt(page)
        ),
        "Markdown shown as text": find_raw_markdown(page),
        "paths of the build machine": find_machine_paths(page),
        "tracebacks longer than a few lines (show the type and message)": find_long_tracebacks(page),
        "TeX in the tab title": find_maths_in_title(page),
        "TeX in the text of links": find_maths_in_links(page),
    }
    # A deeper page is checked at phone width, where its tables and maths are likeliest to
    # overflow; at laptop width its layout is its answer page's, and its code and output
    # lines are held to 88 characters (tests/test_repository.py).
    for width in (PHONE,) if is_deeper(relative) else (PHONE, DESKTOP):
        if width != PHONE:
            page.set_viewport_size({"width": width, "height": 900})
            page.wait_for_timeout(200)  # the resize handlers
            settle(page)
        failures[f"wider than a {width} px window"] = find_wider_than_window(page)
        failures[f"display maths cut off, no sign that it scrolls ({width} px)"] = find_clipped_maths(page)
        failures[f"figures squeezed out of shape ({width} px)"] = find_squeezed_figures(page)
        if width == DESKTOP:
            failures["code, output or maths wider than the column at 1280 px"] = find_wider_than_column(page)
            if is_answer_page(relative):  # the picture within the first two screens (issue 31)
                failures["answer page's picture below the first two screens at 1280 x 800"] = (
                    find_late_figure(page, within=2 * 800)
                )
        # The colours' contrast once in light mode (here, at phone width) and once in dark,
        # on answer pages: a deeper page's colours are its answer page's, and contrast is
        # two thirds of axe's time (page_checks.find_accessibility_violations) on every page.
        # Likewise the sizes of what a reader taps (TARGET_RULES): a deeper page's buttons,
        # toggles, maths and links are its answer page's kinds, in the same CSS.
        contrast = width == PHONE and not is_deeper(relative)
        failures[f"critical or serious accessibility violations (light mode, {width} px)"] = (
            find_accessibility_violations(
                page,
                rules="all" if contrast else "structure",
                code=code,
                skip=TARGET_RULES if is_deeper(relative) else frozenset(),
            )
        )
        _screenshot(page, relative, width, "light", full_page=not is_deeper(relative))
        if relative in SIDEBAR_SAMPLE_PAGES:
            failures[f"sidebar buttons ({width} px)"] = find_dead_sidebar_buttons(page)

    failures["console errors"] = problems.console_errors
    failures["requests to other hosts"] = problems.external_requests
    if not is_deeper(relative):  # a deeper page's colours are its answer page's
        _check_dark_mode(open_page, relative, code, failures)
    _fail_on(failures)


def _check_dark_mode(open_page, relative: str, code: bool, failures: dict[str, list[str]]) -> None:
    """A second load in dark mode: it switches, its colours pass axe's contrast check."""
    dark, dark_problems = open_page(relative, width=DESKTOP, mode="dark", reuse=True)
    wait_for_maths(dark)
    mode = dark.evaluate("document.documentElement.dataset.mode")
    assert mode == "dark", f"the page did not switch to dark mode (data-mode={mode!r})"
    # The structure is the light mode's (checked above); the colours are checked once.
    failures["colour contrast (dark mode)"] = find_accessibility_violations(dark, rules="contrast", code=code)
    _screenshot(dark, relative, DESKTOP, "dark", full_page=False)
    if TAKE_SCREENSHOTS:  # dark mode at phone width, for a person to look at
        dark.set_viewport_size({"width": PHONE, "height": 900})
        dark.wait_for_timeout(200)
        settle(dark)
        _screenshot(dark, relative, PHONE, "dark", full_page=False)
    failures["console errors"] += dark_problems.console_errors
    failures["requests to other hosts"] += dark_problems.external_requests


@pytest.mark.parametrize("term", search_terms())
def test_search_results_show_maths_as_text(open_page, term: str) -> None:
    """Search for a word of a heading with maths: the results' titles and summaries show no TeX."""
    page, problems = open_page(f"search.html?q={quote(term)}", width=DESKTOP)
    results = search_results(page)
    assert results, f"searching for {term!r} found nothing"
    _fail_on(
        {"console errors": problems.console_errors, "TeX in search results": find_maths_in_results(results)}
    )


def test_plain_maths_is_the_same_in_python_and_in_the_browser(open_page) -> None:
    """The tab titles (Python) and the search results (JavaScript) turn maths into the same text."""
    sys.path.insert(0, str(ROOT / "book" / "_ext"))
    try:
        from reader_view import plain_maths
    finally:
        sys.path.pop(0)
    tex = sorted({element.get_text() for relative in built_pages() for element in _maths(relative)})
    assert len(tex) > 20, f"expected the book's maths, found {len(tex)} expressions"
    page, _ = open_page("book/intro.html")
    in_browser = page.evaluate("(all) => all.map((tex) => window.qkvPlainMaths(tex))", tex)
    differ = [(t, p, b) for t, p, b in zip(tex, map(plain_maths, tex), in_browser, strict=True) if p != b]
    assert not differ, "Python and JavaScript disagree:\n" + "\n".join(map(repr, differ[:10]))
    assert plain_maths(r"\(\sqrt{d_k}\)") == "√dₖ"
    assert plain_maths(r"\(W^Q\)") == "WQ"


def test_front_page(open_page) -> None:
    """The site root leads to the front page, whose maths renders, under the book's title alone."""
    page, problems = open_page("index.html")
    page.wait_for_url("**/book/intro.html", timeout=TIMEOUT_MS)
    maths = wait_for_maths(page)
    assert not problems.console_errors and not maths["unrendered"], (problems.console_errors, maths)
    assert page.locator("h1").first.inner_text().startswith("Queries, Keys and Values")
    assert page.title() == "Queries, Keys and Values", f"the tab title repeats itself: {page.title()!r}"
    rendered = page.locator("mjx-container").count()
    assert rendered >= 5, f"expected the front page's formulas typeset, found {rendered}"
