"""What the browser check looks for on a page, one function per kind of problem.

Each ``find_*`` function takes an open Playwright page and returns a list of
problems, each a short line that says where; an empty list means none. The site
tests (``test_site.py``) run them on every built page; ``test_broken_on_purpose.py`` proves each
one fails on a page broken on purpose.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

from axe_playwright_python.base import AxeResults
from axe_playwright_python.sync_playwright import Axe
from playwright.sync_api import TimeoutError as PlaywrightTimeoutError

ROOT = Path(__file__).resolve().parents[2]
SITE = ROOT / "_build" / "html"
PHONE = 390
DESKTOP = 1280
TIMEOUT_MS = 30_000

# --- typeset maths, images, alt text ---------------------------------------------------

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


# After a resize: the fonts loaded, MathJax done, and two frames drawn, so the layout that
# axe and the overflow checks measure is the one the reader sees, not one halfway through
# (on a loaded machine, a fixed pause was sometimes too short).
SETTLE_JS = """
async () => {
    await document.fonts.ready;
    if (window.MathJax && window.MathJax.startup && window.MathJax.startup.promise) {
        await window.MathJax.startup.promise;
    }
    await new Promise((resolve) => requestAnimationFrame(() => requestAnimationFrame(resolve)));
}
"""


def settle(page: Any) -> None:
    """Wait until the page's layout is at rest (fonts, MathJax, two animation frames)."""
    page.evaluate(SETTLE_JS)


def wait_for_maths(page: Any) -> dict[str, Any]:
    """Wait until MathJax has typeset the page; say what it left untypeset."""
    return page.evaluate(UNRENDERED_MATH_JS)


def find_broken_images(page: Any) -> list[str]:
    return page.evaluate(BROKEN_IMAGES_JS)


def find_meaningless_alt(page: Any) -> list[str]:
    """The page's figures whose alt text does not say what they show."""
    return page.evaluate(MEANINGLESS_ALT_JS)


# --- text the reader should never see ----------------------------------------------------

# Text nodes of the article that are prose (not code, not typeset maths).
PROSE_TEXT_JS = """
() => {
    const article = document.querySelector("article") || document.body;
    const walker = document.createTreeWalker(article, NodeFilter.SHOW_TEXT);
    const skip = "pre, code, kbd, script, style, textarea, mjx-container, .math, .MathJax";
    const texts = [];
    while (walker.nextNode()) {
        const node = walker.currentNode;
        if (node.parentElement && !node.parentElement.closest(skip) && node.textContent.trim()) {
            texts.push(node.textContent);
        }
    }
    return texts;
}
"""
RAW_MARKDOWN_JS = """
(texts) => {
    // A Markdown table's delimiter row (smartquotes may have turned --- into an em dash),
    // or a row of cells; and $...$ maths that nothing typeset.
    const table = /\\|\\s*:?(-{3,}|—|–)+:?\\s*\\|/;
    const row = /(^|\\n)\\s*\\|[^\\n|]+\\|[^\\n]*\\|\\s*($|\\n)/;
    const dollars = /\\$[^$\\s][^$]*\\$/;
    return texts.filter((t) => table.test(t) || row.test(t) || dollars.test(t))
        .map((t) => JSON.stringify(t.trim().slice(0, 100)));
}
"""


def find_raw_markdown(page: Any) -> list[str]:
    """Markdown table syntax or ``$...$`` shown as text instead of a table or maths."""
    texts = page.evaluate(PROSE_TEXT_JS)
    return page.evaluate(RAW_MARKDOWN_JS, texts)


# A local path, as nbval's sanitiser recognises them (book/nbval_sanitize.cfg).
MACHINE_PATHS_JS = """
() => {
    const article = document.querySelector("article") || document.body;
    const roots = "home|root|tmp|usr|opt|work|var|private|Users|content|srv|mnt|builds|github|runner";
    const path = new RegExp(
        String.raw`(?<![\\w.~])(\\/(${roots})\\/|[A-Za-z]:\\\\|site-packages)[^\\s'"<>)\\]]*`, "g");
    return (article.textContent.match(path) || []).slice(0, 10);
}
"""


def find_machine_paths(page: Any) -> list[str]:
    """Paths of the machine that built the book (a traceback's file names, a warning's)."""
    return page.evaluate(MACHINE_PATHS_JS)


# A traceback: from "Traceback (most recent call last)" (Python's and IPython's header) to
# the error line; more than MAX_TRACEBACK_LINES lines is a stack the reader does not need.
MAX_TRACEBACK_LINES = 5
LONG_TRACEBACKS_JS = """
(maxLines) => {
    const article = document.querySelector("article") || document.body;
    const found = [];
    for (const pre of article.querySelectorAll("pre")) {
        const lines = pre.textContent.split("\\n");
        for (let i = 0; i < lines.length; i++) {
            if (!/Traceback \\(most recent call last\\)/.test(lines[i])) { continue; }
            let end = i + 1;
            const error = /^[A-Za-z_][\\w.]*(Error|Exception|Warning|Interrupt|Exit)\\b/;
            while (end < lines.length && !error.test(lines[end])) {
                end++;
            }
            const length = Math.min(end, lines.length - 1) - i + 1;
            if (length > maxLines) {
                found.push(`${length} lines: ${lines[Math.min(end, lines.length - 1)].slice(0, 80)}`);
            }
        }
    }
    return found;
}
"""


def find_long_tracebacks(page: Any) -> list[str]:
    """Tracebacks longer than a few lines: an error demonstration shows type and message."""
    return page.evaluate(LONG_TRACEBACKS_JS, MAX_TRACEBACK_LINES)


# TeX where text is expected: delimiters, commands, scripts.
TEX_IN_TEXT = r"\\[()\[\]]|\\[A-Za-z]+|\$|\^|_\{"


# A link's own text (not its typeset maths or code) with TeX in it: a title's maths
# written out, as Sphinx does for {doc} and {ref} links.
TEX_IN_LINKS_JS = """
(tex) => Array.from((document.querySelector("article") || document.body).querySelectorAll("a"))
    .map((a) => {
        const copy = a.cloneNode(true);
        copy.querySelectorAll(".math, mjx-container, code, pre").forEach((el) => el.remove());
        return copy.textContent.trim();
    })
    .filter((text) => new RegExp(tex).test(text))
"""


def find_maths_in_links(page: Any) -> list[str]:
    """Links whose text shows TeX (``W^Q``) instead of typeset maths."""
    return page.evaluate(TEX_IN_LINKS_JS, TEX_IN_TEXT)


def find_maths_in_title(page: Any) -> list[str]:
    """The tab title (``<title>``) must be plain text: ``WQ``, not ``\\(W^Q\\)``."""
    title = page.title()
    found = page.evaluate("([title, tex]) => new RegExp(tex).test(title)", [title, TEX_IN_TEXT])
    return [f"<title>: {title!r}"] if found else []


# --- layout --------------------------------------------------------------------------

# When the page is wider than the window, the elements that stick out (not inside a
# region that scrolls or clips, and not a sidebar parked off-screen).
WIDER_THAN_WINDOW_JS = """
() => {
    const width = window.innerWidth;
    const pageWidth = document.documentElement.scrollWidth;
    if (pageWidth <= width + 1) { return []; }
    const culprits = [];
    for (const el of document.querySelectorAll("body *")) {
        const box = el.getBoundingClientRect();
        if (box.width === 0 || box.right <= width + 1) { continue; }
        let contained = false;
        for (let p = el.parentElement; p; p = p.parentElement) {
            const style = getComputedStyle(p);
            if (style.overflowX !== "visible" || style.position === "fixed") { contained = true; break; }
        }
        if (contained || getComputedStyle(el).position === "fixed") { continue; }
        const text = (el.textContent || "").trim().replace(/\\s+/g, " ").slice(0, 60);
        const tag = `<${el.tagName.toLowerCase()} class="${el.className}">`;
        culprits.push(`${tag} ends at ${Math.round(box.right)} px: ${text}`);
    }
    return [`the page is ${pageWidth} px wide in a ${width} px window`].concat(culprits.slice(-5));
}
"""


def find_wider_than_window(page: Any) -> list[str]:
    """Anything that makes the page wider than the window (sideways scrolling of the page)."""
    return page.evaluate(WIDER_THAN_WINDOW_JS)


# A figure shown at another shape than it was drawn: its width capped at the column while
# an inline height stayed, which squeezes its text and shapes sideways.
SQUEEZED_FIGURES_JS = """
() => Array.from(document.querySelectorAll("article img"))
    .filter((img) => img.naturalWidth > 0 && img.naturalHeight > 0)
    .filter((img) => {
        const box = img.getBoundingClientRect();
        if (box.width === 0 || box.height === 0) { return false; }
        const drawn = img.naturalWidth / img.naturalHeight;
        const shown = box.width / box.height;
        return Math.abs(shown / drawn - 1) > 0.02;
    })
    .map((img) => {
        const box = img.getBoundingClientRect();
        return `${img.getAttribute("src")}: drawn ${img.naturalWidth} x ${img.naturalHeight}, ` +
            `shown ${Math.round(box.width)} x ${Math.round(box.height)}`;
    })
"""


def find_squeezed_figures(page: Any) -> list[str]:
    """Figures shown at another aspect ratio than they were drawn (more than 2 % off)."""
    return page.evaluate(SQUEEZED_FIGURES_JS)


# Where an answer page's picture starts, in px from the top of the page: the first image
# in a cell's output (the page's first figure, drawn by qkv.diagrams). scripts/page_shape.py
# estimates the same from the notebook; this measures what a reader sees.
FIRST_FIGURE_JS = """
() => {
    const img = document.querySelector("article .cell_output img");
    return img ? img.getBoundingClientRect().top + window.scrollY : null;
}
"""


def find_late_figure(page: Any, within: int) -> list[str]:
    """The first figure, when it starts below ``within`` px (or when the page has none)."""
    top = page.evaluate(FIRST_FIGURE_JS)
    if top is None:
        return ["no figure in any cell's output"]
    return [] if top <= within else [f"the first figure starts at {round(top):,} px, below {within:,} px"]


# Maths (display, or inline in a span) wider than its column must scroll and show that it
# does (a faded edge: phones hide scroll bars). Scrolled to its end, the fade moves to the other side.
CLIPPED_MATHS_JS = """
() => Array.from(document.querySelectorAll("mjx-container[display='true'], span.math"))
    .filter((box) => {
        // Inline maths: the formula's width against the span (scrollWidth would count
        // MathJax's glyph overhang, which hides nothing); display maths: its scroll width.
        const formula = box.matches("span.math") && box.querySelector("mjx-container");
        const width = formula ? formula.getBoundingClientRect().width : box.scrollWidth;
        return width > box.clientWidth + 1;
    })
    .filter((box) => {
        const style = getComputedStyle(box);
        const scrolls = style.overflowX === "auto" || style.overflowX === "scroll";
        const mask = style.maskImage || style.webkitMaskImage || "none";
        return !scrolls || mask === "none";
    })
    .map((box) => `${box.scrollWidth} px of maths in ${box.clientWidth} px, no scroll affordance: ` +
        (box.closest(".math") || box).textContent.trim().slice(0, 60))
"""


def find_clipped_maths(page: Any) -> list[str]:
    """Display equations cut off at the column's edge, with nothing to say there is more."""
    return page.evaluate(CLIPPED_MATHS_JS)


# On a laptop, code, printed output and display maths fit the column (88 characters).
WIDER_THAN_COLUMN_JS = """
() => {
    const article = document.querySelector("article") || document.body;
    return Array.from(article.querySelectorAll("pre, mjx-container[display='true']"))
        .filter((el) => el.scrollWidth > el.clientWidth + 1)
        .map((el) => {
            const line = el.textContent.split("\\n").reduce((a, b) => (b.length > a.length ? b : a), "");
            const size = `${el.scrollWidth} px in ${el.clientWidth} px`;
            return `<${el.tagName.toLowerCase()}> ${size}: ${line.trim().slice(0, 70)}`;
        });
}
"""


def find_wider_than_column(page: Any) -> list[str]:
    """Blocks of code, output or maths that need sideways scrolling (checked at 1280 px)."""
    return page.evaluate(WIDER_THAN_COLUMN_JS)


# --- the sidebar buttons -------------------------------------------------------------------

VISIBLE_BUTTON_JS = """
(selector) => {
    // Marks from an earlier call (at another window width) would name a hidden button.
    const marked = document.querySelectorAll("[data-check-visible]");
    marked.forEach((el) => el.removeAttribute("data-check-visible"));
    const visible = Array.from(document.querySelectorAll(selector)).filter((el) => {
        const box = el.getBoundingClientRect();
        return box.width > 0 && box.height > 0 && getComputedStyle(el).visibility !== "hidden";
    });
    visible.forEach((el, i) => el.setAttribute("data-check-visible", String(i)));
    return visible.length;
}
"""

MODAL_SHOWS_LINKS_JS = """
(id) => {
    const dialog = document.getElementById(id);
    if (!dialog || !dialog.open) { return 0; }
    return Array.from(dialog.querySelectorAll("a[href]")).filter((a) => {
        const box = a.getBoundingClientRect();
        return box.width > 0 && box.height > 0 && box.top < window.innerHeight;
    }).length;
}
"""


SIDEBAR_SHOWN_JS = """
() => {
    const box = document.getElementById("pst-primary-sidebar")?.getBoundingClientRect();
    return Boolean(box) && box.width > 0 && box.x >= 0;
}
"""
# How long a panel may take to open or close (the theme animates it in about 0.3 s).
SETTLE_MS = 1_000


def _click_visible(page: Any, selector: str) -> bool:
    if page.evaluate(VISIBLE_BUTTON_JS, selector) == 0:
        return False
    page.locator(f"{selector}[data-check-visible='0']").click(timeout=5_000)
    return True


def _becomes(page: Any, script: str, arg: object = None, *, want: bool = True) -> bool:
    """Whether ``script(arg)`` turns truthy (or falsy, ``want=False``) within SETTLE_MS."""
    check = script if want else f"(arg) => !(({script})(arg))"
    try:
        page.wait_for_function(check, arg=arg, timeout=SETTLE_MS, polling=50)
    except PlaywrightTimeoutError:
        return False
    return True


def find_dead_sidebar_buttons(page: Any) -> list[str]:
    """Click the sidebar buttons a reader sees; each must open (phone) or hide (laptop) its sidebar.

    At phone width, the navigation button opens a panel with the chapters' links, and the
    "on this page" button (on pages that have sections) opens one with the page's
    sections. At laptop width the navigation button hides the sidebar and shows it again.
    """
    problems = _sidebar_problems(page)
    # Leave no hover or focus behind: a tooltip left showing would cover the next click
    # (the same page is checked again at another width).
    page.mouse.move(0, 0)
    page.evaluate("() => document.activeElement && document.activeElement.blur()")
    page.wait_for_timeout(100)
    return problems


def _sidebar_problems(page: Any) -> list[str]:
    problems = []
    width = page.viewport_size["width"]
    if width < 992:
        for selector, dialog, name in [
            (".primary-toggle", "pst-primary-sidebar-modal", "navigation"),
            (".secondary-toggle", "pst-secondary-sidebar-modal", "on this page"),
        ]:
            if not _click_visible(page, selector):
                if selector == ".primary-toggle":
                    problems.append(f"no visible {name} button ({selector}) at {width} px")
                continue
            if not _becomes(page, MODAL_SHOWS_LINKS_JS, dialog):
                problems.append(f"the {name} button ({selector}) opens no panel with links at {width} px")
            page.keyboard.press("Escape")
            _becomes(page, MODAL_SHOWS_LINKS_JS, dialog, want=False)  # closed again
    else:
        shown_before = page.evaluate(SIDEBAR_SHOWN_JS)
        if not _click_visible(page, ".primary-toggle"):
            return [f"no visible navigation button at {width} px"]
        if not shown_before or not _becomes(page, SIDEBAR_SHOWN_JS, want=False):
            problems.append(f"the navigation button does not hide the sidebar at {width} px")
        else:
            page.locator(".primary-toggle[data-check-visible='0']").click(timeout=5_000)
            if not _becomes(page, SIDEBAR_SHOWN_JS):
                problems.append(f"the navigation button does not show the sidebar again at {width} px")
    return problems


# --- search results ----------------------------------------------------------------------

SEARCH_RESULTS_JS = """
async () => {
    const deadline = Date.now() + 20000;
    const results = () => document.querySelector("#search-results");
    while (Date.now() < deadline) {
        const box = results();
        const status = box && box.querySelector(".search-summary");
        if (status && /\\d/.test(status.textContent)) {  // "Search finished, found 5 page(s)..."
            // Summaries arrive one by one (each page is fetched); an API entry has a
            // description instead, and no summary.
            const items = Array.from(box.querySelectorAll("li"));
            const done = ":scope > p.context, :scope > span:not(.math)";
            if (items.every((li) => li.querySelector(done))) { break; }
        }
        await new Promise((resolve) => setTimeout(resolve, 100));
    }
    const box = results();
    return box ? Array.from(box.querySelectorAll("li")).map((li) => ({
        title: (li.querySelector("a") || li).textContent,
        summary: (li.querySelector("p.context") || {textContent: ""}).textContent,
    })) : [];
}
"""


def search_results(page: Any) -> list[dict[str, str]]:
    """The results on an open search page, once every summary has arrived."""
    return page.evaluate(SEARCH_RESULTS_JS)


def find_maths_in_results(results: list[dict[str, str]]) -> list[str]:
    """TeX in search results: titles must be plain text, summaries free of TeX markup."""
    tex = re.compile(TEX_IN_TEXT)
    summary_tex = re.compile(r"\\[()\[\]]|\\[A-Za-z]+")
    problems = []
    for result in results:
        if tex.search(result["title"]):
            problems.append(f"result title: {result['title']!r}")
        match = summary_tex.search(result["summary"])
        if match:
            start = max(match.start() - 30, 0)
            problems.append(f"summary of {result['title']!r}: ...{result['summary'][start : start + 80]!r}")
    return problems


# --- accessibility -------------------------------------------------------------------------

# axe-core's WCAG 2.x A and AA rules, its best practices and its experimental rules (one
# of which compares buttons' accessible names with their visible text). No preload: axe
# would fetch the stylesheets again itself, resolving theme.css's ``@import "../basic.css"``
# against the page rather than the stylesheet (a 404 that no reader's browser makes).
AXE_TAGS = ["wcag2a", "wcag2aa", "wcag21a", "wcag21aa", "wcag22aa", "best-practice", "experimental"]
# The rules that judge colours; the others judge the structure, the same in either mode.
COLOUR_RULES = {"color-contrast", "link-in-text-block"}
# The rule that measures what a reader taps (WCAG 2.5.8): the theme's buttons, the cells'
# toggles and copy buttons, focusable maths and code, links standing alone. Every page
# draws them from the same templates and CSS, and it is half of axe's time on a deeper page.
TARGET_RULES = frozenset({"target-size"})

# Which of those rules can fail the check. axe reports a violation at the impact its rule
# declares (a meta-viewport that blocks zooming comes back "moderate", though the check
# inside says "critical"), and only critical and serious ones fail here, so a rule that
# declares "minor" or "moderate" would run for nothing: a quarter of the structure's time
# on a deeper page (region, hidden-content, the landmark rules). The list is read from
# the axe-core that runs, so a rule an upgrade makes serious is run.
AXE_RULES_JS = """tags => axe._audit.rules
    .filter((rule) => rule.tags.some((tag) => tags.includes(tag)))
    .filter((rule) => rule.impact !== "minor" && rule.impact !== "moderate")
    .map((rule) => rule.id)"""
_AXE = Axe()


def _inject_axe(page: Any) -> None:
    """Load axe-core (shipped inside axe-playwright-python) into the page, once per load."""
    if not page.evaluate("() => !!window.axe"):
        page.evaluate(_AXE.axe_script)


def _run_axe(page: Any, context: dict[str, Any], options: dict[str, Any]) -> AxeResults:
    """axe-core's ``axe.run`` on the page."""
    _inject_axe(page)
    return AxeResults(page.evaluate("([context, options]) => axe.run(context, options)", [context, options]))


# WCAG 2.5.8's "inline" exception: a link in a sentence, whose size the line height sets.
# axe-core means to skip such targets, but it flagged a link that wrapped across two lines
# (the fragment at the next line's start measured 28 px), depending on where the fonts broke
# the line. A link that is inline and shares its paragraph or list item with other text is
# left out here; a link standing alone (a button, a list of links) is still measured.
_INLINE_LINK = """selector => {
    const el = document.querySelector(selector);
    if (!el || el.tagName !== "A" || getComputedStyle(el).display !== "inline") return false;
    const block = el.closest("p, li, dd, td, figcaption");
    if (!block) return false;
    const own = el.textContent.trim().length;
    return block.textContent.trim().length > own + 10;
}"""


def _inline_link(page: Any, target: list[Any]) -> bool:
    """Whether axe's node ``target`` (a selector, not inside a frame) is a link in a sentence."""
    return len(target) == 1 and isinstance(target[0], str) and bool(page.evaluate(_INLINE_LINK, target[0]))


def _small_targets(page: Any, nodes: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The nodes of axe's target-size violation that are small targets, measured at rest.

    Links in a sentence are left out (``_inline_link``). A target is measured against what
    stands around it at that moment, so a layout still settling on a loaded machine, or a
    fixed bar over the target at the current scroll position, could flag a link a reader
    sees well spaced (seen on the front page, with two browsers and the pages' re-run
    sharing two cores). So each target left is scrolled to the middle of the window and
    measured again after a pause; only a target small both times counts.
    """
    small = []
    for node in nodes:
        target = node["target"]
        if _inline_link(page, target):
            continue
        if len(target) == 1 and isinstance(target[0], str):  # not inside a frame
            page.evaluate("s => document.querySelector(s).scrollIntoView({block: 'center'})", target[0])
            page.wait_for_timeout(300)
            settle(page)
            only = {"preload": False, "runOnly": {"type": "rule", "values": ["target-size"]}}
            again = _run_axe(page, {"include": [target]}, only)
            if not again.response["violations"]:
                continue
        small.append(node)
    return small


def _reason(node: dict[str, Any]) -> str:
    """axe's message for one failing element, from whichever of its checks failed."""
    messages = [check.get("message", "") for kind in ("any", "all", "none") for check in node.get(kind, [])]
    return " / ".join(message for message in messages if message)[:200]


def find_accessibility_violations(
    page: Any,
    rules: str = "all",
    *,
    code: bool = True,
    within: str | None = None,
    skip: frozenset[str] = frozenset(),
) -> list[str]:
    """axe-core's critical and serious violations (axe-core ships inside axe-playwright-python).

    ``code=False`` leaves the highlighted code blocks out: their colours and markup come
    from one stylesheet, the same on every page, so the site tests check them on one
    page (``CODE_SAMPLE_PAGE``) and spare axe the thousands of token spans elsewhere.

    ``rules``: ``"all"``; ``"structure"``, all but the rules that judge colours
    (``COLOUR_RULES``: contrast is two thirds of axe's time on a long page); or
    ``"contrast"``, those alone. The site tests run the structure once per width and
    the contrast once per colour mode: the structure does not change with the colours,
    nor the colours with the width. Of axe's rules (``AXE_TAGS``), only those that can
    report a critical or serious violation run (``AXE_RULES_JS``).

    ``skip``: rules left out (the site tests leave ``TARGET_RULES`` out on deeper pages).

    ``within``: a CSS selector; only that part of the page is checked (the tests that
    break a page on purpose check the part they broke, not the whole page again).
    """
    if rules not in {"all", "structure", "contrast"}:
        raise ValueError(f"rules must be 'all', 'structure' or 'contrast', got {rules!r}")
    # Measure the page at rest, as a reader sees it: the theme animates colours when the
    # mode changes, and web fonts can still be swapping in; axe would catch them halfway.
    page.add_style_tag(content="*, *::before, *::after { transition: none !important; "
                       "animation: none !important; }")  # fmt: skip
    settle(page)
    _inject_axe(page)
    chosen = page.evaluate(AXE_RULES_JS, AXE_TAGS)
    assert "image-alt" in chosen and "color-contrast" in chosen, f"axe's rules not found: {chosen}"
    if rules == "structure":
        chosen = [rule for rule in chosen if rule not in COLOUR_RULES]
    elif rules == "contrast":
        chosen = [rule for rule in chosen if rule in COLOUR_RULES]
    chosen = [rule for rule in chosen if rule not in skip]
    options = {"preload": False, "runOnly": {"type": "rule", "values": chosen}, "resultTypes": ["violations"]}
    context: dict[str, Any] = {"exclude": [] if code else [[".highlight"]]}
    if within is not None:
        context["include"] = [[within]]
    results = _run_axe(page, context, options)
    problems = []
    for violation in results.response["violations"]:
        if violation["id"] == "target-size":
            violation["nodes"] = _small_targets(page, violation["nodes"])
        if violation["impact"] in {"critical", "serious"} and violation["nodes"]:
            # Each element with axe's reason (for target-size: what it overlaps, and where).
            nodes = "; ".join(f"{node['html'][:100]} ({_reason(node)})" for node in violation["nodes"][:3])
            problems.append(
                f"{violation['id']} ({violation['impact']}, {len(violation['nodes'])} elements): "
                f"{violation['help']}: {nodes}"
            )
    return problems
