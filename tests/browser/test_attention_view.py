"""qkv.AttentionView in the built book, as a reader uses it, with every request to another host refused.

On every page that has views (the API page's live example, the chapters'): each view
draws itself, in colours for the background it sits on; picking a layer and a head and
clicking a query token shows that token's lines only, for that head, and their weights
add up to 1 (within the encoding's 2/255); the same by keyboard (Tab to a token, Enter; the arrow keys move
on; Esc clears); and the same inside an ``<iframe sandbox="allow-scripts">``, a
stand-in for Colab's output frames, with two copies of one view side by side. No
console errors anywhere.
"""

from __future__ import annotations

import html
import time

import pytest
from conftest import PageProblems
from page_checks import DESKTOP, PHONE, SITE, TIMEOUT_MS

pytestmark = pytest.mark.browser

VIEW = ".qkv-attention-view"
READY = f"{VIEW}[data-qkv-state='ready']"

# The lines the view shows: (query, key, head, weight) of each.
SHOWN_LINES_JS = """
(view) => Array.from(view.querySelectorAll("svg line")).map((line) => [
    Number(line.dataset.query), Number(line.dataset.key), Number(line.dataset.head),
    Number(line.dataset.weight)])
"""


def pages_with_views() -> list[str]:
    if not SITE.is_dir():
        return []
    return sorted(
        path.relative_to(SITE).as_posix()
        for path in SITE.glob("book/*.html")
        if 'class="qkv-attention-view"' in path.read_text(encoding="utf-8")
    )


def test_the_api_page_has_a_live_view() -> None:
    assert "book/api.html" in pages_with_views(), "the API page's live qkv.AttentionView example is missing"


def _api_view_as_stored() -> str:
    """The API page's view as the HTML holds it, before its script ran."""
    source = (SITE / "book" / "api.html").read_text(encoding="utf-8")
    start = source.index('<div class="qkv-attention-view"')
    return source[start : source.index("</script></div>", start) + len("</script></div>")]


def _wait_ready(scope, count: int) -> None:
    scope.wait_for_function(
        f'(n) => document.querySelectorAll("{READY}").length === n', arg=count, timeout=TIMEOUT_MS
    )


def _sizes(view) -> tuple[int, int, int]:
    """Layers, heads and query tokens of a drawn view."""
    layer_count = view.locator("label:has-text('layer') option").count() or 1
    head_count = max(view.locator("label:has-text('head') option").count() - 1, 1)
    return layer_count, head_count, view.locator("button.qkv-av-token").count()


def _pick(view, layer: int, head: int) -> None:
    if view.locator("label:has-text('layer') select").count():
        view.locator("label:has-text('layer') select").select_option(str(layer))
    if view.locator("label:has-text('head') select").count():
        view.locator("label:has-text('head') select").select_option(str(head))


def _only_lines_of(view, query: int, head: int) -> list[str]:
    lines = view.evaluate(SHOWN_LINES_JS)
    problems = []
    if not lines:
        problems.append(f"no lines shown for query {query}, head {head}")
    others = [line for line in lines if line[0] != query or line[2] != head]
    if others:
        problems.append(
            f"{len(others)} of {len(lines)} lines are not query {query}'s in head {head}: {others[:3]}"
        )
    total = sum(line[3] for line in lines)
    if lines and abs(total - 1) > 2 / 255 + 1e-9:  # the encoding: within two steps of 1/255
        problems.append(f"query {query}'s weights in head {head} add up to {total}, not 1")
    return problems


def _eventually(condition, seconds: float = 5.0) -> bool:
    """Pointing redraws at the next animation frame: poll for what it should show."""
    deadline = time.monotonic() + seconds
    while not condition():
        if time.monotonic() > deadline:
            return False
        time.sleep(0.05)
    return True


def _check_view(view, page) -> list[str]:
    """Pick the last layer and head, click a query token, then do the same by keyboard."""
    layers, heads, queries = _sizes(view)
    layer, head, query = layers - 1, heads - 1, min(3, queries - 1)
    _pick(view, layer, head)
    view.locator("button.qkv-av-token").nth(query).click()
    problems = _only_lines_of(view, query, head)
    # The numbers: each key's line weight to two decimals (0.00 with no line), or "masked".
    view.locator("input[type=checkbox]").check()
    weights = {line[1]: line[3] for line in view.evaluate(SHOWN_LINES_JS)}
    written = view.locator(".qkv-av-key .qkv-av-number").all_inner_texts()
    masked = view.evaluate(
        "(v) => Array.from(v.querySelectorAll('.qkv-av-key')).map((r) => "
        "r.classList.contains('qkv-av-masked'))"
    )
    expected = ["masked" if masked[j] else f"{weights.get(j, 0.0) + 1e-9:.2f}" for j in range(len(written))]
    if written != expected:
        problems.append(f"the numbers {written} are not the lines' weights {expected}")
    view.locator("input[type=checkbox]").uncheck()
    if view.locator("button.qkv-av-token").nth(query).get_attribute("aria-pressed") != "true":
        problems.append("the clicked token is not marked as pressed")
    view.locator("button.qkv-av-token").nth(query).click()  # a second click clears it
    if view.locator("button[aria-pressed='true']").count():
        problems.append("a second click did not clear the selection")
    if {line[0] for line in view.evaluate(SHOWN_LINES_JS)} != {query}:
        problems.append("after the second click, the token pointed at should still show its lines alone")
    view.locator(".qkv-av-status").hover()  # the pointer leaves the tokens: every query's lines
    if queries > 1 and not _eventually(lambda: len({line[0] for line in view.evaluate(SHOWN_LINES_JS)}) > 1):
        problems.append("with the pointer away and nothing selected, not every query's lines are shown")

    # The keyboard: Tab from the last control to the first query token, Enter, then ArrowDown.
    view.locator("input[type=checkbox]").focus()
    page.keyboard.press("Tab")
    focused = view.evaluate("(v) => v.ownerDocument.activeElement.className")
    if not focused.startswith("qkv-av-token"):
        problems.append(f"Tab from the last control reaches {focused!r}, not the first query token")
    page.keyboard.press("Enter")
    problems += [f"by keyboard: {p}" for p in _only_lines_of(view, 0, head)]
    if queries > 1:
        page.keyboard.press("ArrowDown")
        problems += [f"after ArrowDown: {p}" for p in _only_lines_of(view, 1, head)]
    page.keyboard.press("Escape")
    if view.locator("button[aria-pressed='true']").count():
        problems.append("Esc left a query selected")
    return problems


@pytest.mark.parametrize("width", [PHONE, DESKTOP])
@pytest.mark.parametrize("relative", pages_with_views() or ["book/api.html"])
def test_views_in_the_book(open_page, relative: str, width: int) -> None:
    page, problems = open_page(relative, width=width, reuse=True)
    views = page.locator(VIEW)
    count = views.count()
    assert count, f"no view on {relative}"
    _wait_ready(page, count)
    found = []
    for index in range(count):
        view = views.nth(index)
        view.scroll_into_view_if_needed()
        found += [f"view {index}: {p}" for p in _check_view(view, page)]
        box, scroller = view.bounding_box(), view.locator(".qkv-av-scroll").bounding_box()
        if box and scroller and scroller["x"] + scroller["width"] > width + 1:
            found.append(f"view {index} sticks out of the {width} px window")
    assert not found and not problems.console_errors and not problems.external_requests, (
        found,
        problems.console_errors,
        problems.external_requests,
    )


@pytest.mark.parametrize(
    ("relative", "dark"), [("book/api.html", True), ("book/cross_attention/abacus.html", False)]
)
def test_the_view_takes_the_colours_of_its_background(open_page, relative: str, dark: bool) -> None:
    """In the book's dark mode, a view on the page's dark background takes the lighter head
    colours; in a chapter, the theme puts HTML outputs in a light box, so it keeps the darker."""
    page, problems = open_page(relative, mode="dark", reuse=True)
    _wait_ready(page, page.locator(VIEW).count())
    view = page.locator(VIEW).first
    assert ("qkv-av-dark" in (view.get_attribute("class") or "")) is dark
    page.evaluate("document.documentElement.dataset.theme = 'light'")  # the colour-mode switch
    page.wait_for_function("(v) => !v.classList.contains('qkv-av-dark')", arg=view.element_handle())
    assert not problems.console_errors, problems.console_errors


def test_what_the_chapters_say_their_views_show(open_page) -> None:
    """The prose's promises that only the browser can check."""
    page, _ = open_page("book/training/recall.html", reuse=True)
    _wait_ready(page, page.locator(VIEW).count())
    recall = page.locator(VIEW).first
    recall.locator("button.qkv-av-token").nth(3).click()
    numbers = recall.locator(".qkv-av-key .qkv-av-number").all_inner_texts()
    assert numbers[3] == "masked" and numbers.count("masked") == 1, numbers  # a token's own key


# The classic notebook (jQuery) inserts an output's HTML, then runs each of its scripts
# as a new <script> in <head>: the script is then nowhere near its view.
CLASSIC_NOTEBOOK_JS = """
(fragment) => {
    const output = document.createElement("div");
    document.body.appendChild(output);
    output.innerHTML = fragment;  // scripts inserted this way do not run
    for (const old of output.querySelectorAll("script")) {
        if (old.type && old.type !== "text/javascript") { continue; }  // jQuery skips data blocks
        const script = document.createElement("script");
        script.text = old.text;
        document.head.appendChild(script).parentNode.removeChild(script);
    }
}
"""


def test_where_the_classic_notebook_runs_scripts(open_page) -> None:
    fragment = _api_view_as_stored()
    page, problems = open_page("book/api.html", reuse=True)
    page.evaluate("document.body.innerHTML = ''")
    page.evaluate(CLASSIC_NOTEBOOK_JS, fragment)
    page.evaluate(CLASSIC_NOTEBOOK_JS, fragment)  # the same view shown twice
    _wait_ready(page, 2)
    found = _check_view(page.locator(VIEW).nth(1), page)
    assert not found and not problems.console_errors, (found, problems.console_errors)


def test_what_the_docstring_promises_on_views_made_here(open_page) -> None:
    """Twelve heads (dashed beyond the ninth, the overview cut to its 4,000 heaviest lines, the
    per-head cells, the legend) and three heads (opening on all of them)."""
    import torch

    import qkv

    torch.manual_seed(0)
    tokens = [f"t{i}" for i in range(30)]
    twelve = qkv.AttentionView(torch.randn(12, 30, 30).mul(2).softmax(-1), tokens, title="twelve")
    three = qkv.AttentionView(torch.randn(3, 4, 4).softmax(-1), tokens[:4], title="three")
    page, problems = open_page("book/api.html", reuse=True)
    page.set_content(f"<!doctype html><meta charset='utf-8'><body>{twelve.to_html()}{three.to_html()}</body>")
    _wait_ready(page, 2)
    big, small = page.locator(VIEW).nth(0), page.locator(VIEW).nth(1)
    assert big.locator("label:has-text('head') select").input_value() == "0"
    assert small.locator("label:has-text('head') select").input_value() == "-1"
    big.locator("label:has-text('head') select").select_option("-1")
    assert big.locator("svg line").count() == 4000
    drawn = int((twelve.stored()[0] > 0).sum())  # every weight stored above 0 has a line
    assert f"the 4000 heaviest of {drawn}" in big.locator(".qkv-av-status").inner_text()
    dashes = big.evaluate(
        "(v) => Array.from(v.querySelectorAll('svg line')).map((l) => "
        "[Number(l.dataset.head), l.hasAttribute('stroke-dasharray')])"
    )
    assert all(dashed == (head >= 9) for head, dashed in dashes)
    # A query picked with every head: each key's cells are the heads' stored weights, head 0 first.
    big.locator("button.qkv-av-token").nth(2).click()
    titles = big.evaluate(
        "(v) => Array.from(v.querySelectorAll('.qkv-av-key')).map((row) => "
        "Array.from(row.querySelectorAll('.qkv-av-cell')).map((c) => c.title))"
    )
    stored = twelve.stored()[0, :, 2]  # (h, S)
    expected = [[f"head {g}: {stored[g, j]:.2f}" for g in range(12)] for j in range(30)]
    assert titles == expected
    # Up moves back; the legend shows one head alone; clicking the picked token again clears it.
    page.keyboard.press("ArrowUp")
    assert big.locator("button[aria-pressed='true']").get_attribute("data-query") == "1"
    big.locator(".qkv-av-legend-entry").nth(3).click()
    assert big.locator("label:has-text('head') select").input_value() == "3"
    assert _only_lines_of(big, 1, 3) == []
    big.locator("button.qkv-av-token").nth(1).click()  # the pointer stays on it
    assert big.locator("button[aria-pressed='true']").count() == 0
    assert {line[0] for line in big.evaluate(SHOWN_LINES_JS)} == {1}
    # A finger's second tap clears it all: nothing stays pointed at.
    big.locator("button.qkv-av-token").nth(1).click()
    big.locator("button.qkv-av-token").nth(1).evaluate(
        "(b) => { b.dispatchEvent(new PointerEvent('pointerdown', {pointerType: 'touch', bubbles: true}));"
        " b.dispatchEvent(new MouseEvent('click', {detail: 1, bubbles: true})); }"
    )
    assert len({line[0] for line in big.evaluate(SHOWN_LINES_JS)}) > 1
    assert not problems.console_errors, problems.console_errors


def test_in_a_sandboxed_frame_like_colab(browser, base_url) -> None:
    """The API page's view, twice in one document, in a frame allowed scripts only (opaque origin).

    A context of its own: the other tests' set-up script writes the colour mode to
    localStorage, which a sandboxed frame may not touch.
    """
    fragment = _api_view_as_stored()
    document = html.escape(f"<!doctype html><meta charset='utf-8'><body>{fragment}<hr>{fragment}</body>")
    context = browser.new_context(viewport={"width": DESKTOP, "height": 900})
    problems = PageProblems()
    context.route("**/*", problems.on_route)
    try:
        page = context.new_page()
        page.on("console", problems.on_console)
        page.on("pageerror", problems.on_page_error)
        page.goto(f"{base_url}/book/api.html", wait_until="load", timeout=TIMEOUT_MS)  # a local origin
        page.set_content(
            f"<iframe sandbox='allow-scripts' style='width:900px;height:1200px' srcdoc=\"{document}\">"
        )
        frame = page.frames[1]
        _wait_ready(frame, 2)
        views = frame.locator(VIEW)
        found = _check_view(views.nth(0), page)
        _pick(views.nth(1), 0, 0)
        views.nth(1).locator("button.qkv-av-token").nth(2).click()
        found += [f"second copy: {p}" for p in _only_lines_of(views.nth(1), 2, 0)]
        first = {line[0] for line in views.nth(0).evaluate(SHOWN_LINES_JS)}
        if len(first) < 2:
            found.append(f"clicking the second copy changed the first: it shows queries {first} only")
    finally:
        context.close()
    assert not found and not problems.console_errors and not problems.external_requests, (
        found,
        problems.console_errors,
        problems.external_requests,
    )
