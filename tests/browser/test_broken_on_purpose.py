"""Each check of the browser test, shown to fail on a page broken on purpose.

The pages are the built book's own, opened in the browser and then broken there: the
book's fixes (``_static/reader-view.js`` and ``reader-view.css``, from book/_ext) left
out, or a problem written into the page. Nothing in the book is changed. Where a fix
exists, the same page with the fix is shown to pass, so each test also proves the fix.
"""

from __future__ import annotations

import pytest
from page_checks import (
    DESKTOP,
    PHONE,
    find_accessibility_violations,
    find_broken_images,
    find_clipped_maths,
    find_dead_sidebar_buttons,
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
    wait_for_maths,
)

pytestmark = pytest.mark.browser

WITHOUT_FIXES = ("reader-view.js", "reader-view.css")
WITHOUT_CSS = ("reader-view.css",)
BOX = ".broken-on-purpose"

# Append HTML to the page's article, in a box of its own (BOX: the part axe checks), typeset
# any maths in it, and wait for the layout.
INJECT_JS = """
async (html) => {
    const article = document.querySelector("article");
    const box = document.createElement("section");
    box.className = "broken-on-purpose";
    box.innerHTML = html;
    article.appendChild(box);
    if (window.MathJax && window.MathJax.typesetPromise) { await window.MathJax.typesetPromise([box]); }
    window.dispatchEvent(new Event("resize"));
    await new Promise((resolve) => setTimeout(resolve, 200));
}
"""


def _broken(
    open_page, html: str, width: int = PHONE, block: tuple[str, ...] = (), page: str = "book/intro.html"
):
    opened, _ = open_page(page, width=width, block=block, reuse=True)  # a new tab when it blocks
    wait_for_maths(opened)
    opened.evaluate(INJECT_JS, html)
    return opened


def test_raw_markdown_is_caught(open_page) -> None:
    page = _broken(
        open_page,
        "<p>| Symbol | Shape |\n|—|—|\n| $W^Q$ | (12, 12) |</p>"
        "<p>each head costs $h\\,d_k$ multiplications</p>"
        "<pre>| a | b |\n|---|---|</pre>",  # code may show table syntax: not flagged
    )
    found = find_raw_markdown(page)
    assert len(found) == 2, found


def test_a_page_wider_than_a_phone_is_caught_and_the_css_prevents_it(open_page) -> None:
    token = (
        '<p>Install with <code class="docutils literal notranslate"><span class="pre">'
        "qkv@git+https://github.com/qkv-book/queries-keys-values@main</span></code>.</p>"
    )
    assert find_wider_than_window(_broken(open_page, token, block=WITHOUT_CSS))
    assert not find_wider_than_window(_broken(open_page, token))


def test_clipped_maths_is_caught_and_the_fade_says_it_scrolls(open_page) -> None:
    wide = (
        '<div class="math notranslate nohighlight">\\[Q = X W^Q,\\; K = X W^K,\\; V = X W^V,\\; '
        "W^Q, W^K \\in \\mathbb{R}^{d_\\text{model} \\times d_k},\\; "
        "W^V \\in \\mathbb{R}^{d_\\text{model} \\times d_v}\\]</div>"
    )
    found = find_clipped_maths(_broken(open_page, wide, block=WITHOUT_FIXES))
    assert any("Q=XWQ,K=XWK,V=XWV,WQ,WK∈Rdmodel×dk" in problem for problem in found), found
    assert not find_clipped_maths(_broken(open_page, wide))


def test_a_squeezed_figure_is_caught_and_the_css_prevents_it(open_page) -> None:
    """myst-nb writes a figure's height inline; with the width capped, it would squeeze."""
    without, _ = open_page("book/masks.html", width=PHONE, block=WITHOUT_CSS)
    assert not find_broken_images(without)  # loads every figure before measuring
    assert find_squeezed_figures(without)
    with_css, _ = open_page("book/masks.html", width=PHONE, reuse=True)
    assert not find_broken_images(with_css)
    assert not find_squeezed_figures(with_css)


def test_code_wider_than_the_column_is_caught_and_the_css_prevents_it(open_page) -> None:
    """An 88-character line of a chapter needs sideways scrolling at the theme's code size."""
    without, _ = open_page("book/heads/ladder.html", width=DESKTOP, block=WITHOUT_CSS)
    assert find_wider_than_column(without)
    with_css, _ = open_page("book/heads/ladder.html", width=DESKTOP, reuse=True)
    assert not find_wider_than_column(with_css)


def test_machine_paths_are_caught(open_page) -> None:
    page = _broken(
        open_page,
        '<pre>File "/home/runner/work/qkv/src/qkv/attention.py", line 212, in attention</pre>'
        "<p>see https://github.com/qkv-book/queries-keys-values/tree/main/src</p>",  # a URL: fine
    )
    assert find_machine_paths(page) == ["/home/runner/work/qkv/src/qkv/attention.py"]


def test_long_tracebacks_are_caught(open_page) -> None:
    frames = "".join(f'  File "attention.py", line {n}, in f{n}\n    f{n + 1}()\n' for n in range(4))
    page = _broken(
        open_page,
        f"<pre>Traceback (most recent call last):\n{frames}ValueError: key has 15 features</pre>"
        "<pre>Traceback (most recent call last):\n  ...\nValueError: key has 15 features</pre>",
    )
    found = find_long_tracebacks(page)
    assert len(found) == 1 and found[0].startswith("10 lines"), found


def test_maths_in_the_tab_title_is_caught(open_page) -> None:
    page, _ = open_page("book/heads.html", reuse=True)
    assert not find_maths_in_title(page), page.title()
    page.evaluate("document.title = 'One big \\\\(W^Q\\\\) or one per head? — Queries, Keys and Values'")
    assert find_maths_in_title(page)


# The layout that broke the sidebar buttons: pydata-sphinx-theme 0.17.1 and
# sphinx-book-theme 1.3 wire the *first* .primary-toggle and .secondary-toggle of the
# page, and a top bar (which the book no longer renders) put hidden ones first.
HIDDEN_TOGGLES_FIRST = """
document.addEventListener("readystatechange", () => {  // parsed, before deferred scripts run
    if (document.readyState !== "interactive") { return; }
    for (const name of ["primary-toggle", "secondary-toggle"]) {
        const hidden = document.createElement("button");
        hidden.className = `sidebar-toggle ${name}`;
        hidden.style.display = "none";
        document.body.prepend(hidden);
    }
});
"""


def test_maths_in_link_text_is_caught(open_page) -> None:
    page = _broken(
        open_page,
        '<p>See <a href="heads.html"><span class="doc">One big W^Q or one per head?</span></a> and '
        '<a href="heads.html">One big <span class="math">\\(W^Q\\)</span></a>.</p>',  # typeset: fine
    )
    assert find_maths_in_links(page) == ["One big W^Q or one per head?"]


@pytest.mark.parametrize("width", [PHONE, DESKTOP])
def test_dead_sidebar_buttons_are_caught(open_page, width: int) -> None:
    """Hidden toggles first and no reader-view.js: the buttons a reader sees are dead."""
    broken, _ = open_page(
        "book/inference.html", width=width, block=WITHOUT_FIXES, init_script=HIDDEN_TOGGLES_FIRST
    )
    assert find_dead_sidebar_buttons(broken)
    # reader-view.js forwards their clicks to the wired ones.
    fixed, _ = open_page("book/inference.html", width=width, init_script=HIDDEN_TOGGLES_FIRST)
    assert not find_dead_sidebar_buttons(fixed)


def test_tex_in_search_results_is_caught(open_page) -> None:
    broken, _ = open_page("search.html?q=divide", width=DESKTOP, block=WITHOUT_FIXES)
    assert find_maths_in_results(search_results(broken))


def test_accessibility_violations_are_caught(open_page) -> None:
    """Without reader-view.js: the bibliography's list roles (critical) and buttons whose
    names do not match their text (serious)."""
    broken, _ = open_page("book/bibliography.html", width=DESKTOP, block=WITHOUT_FIXES)
    found = " ".join(find_accessibility_violations(broken))
    assert "aria-required-children (critical" in found and "label-content-name-mismatch (serious" in found, (
        found
    )


def test_small_targets_are_caught_but_links_in_a_sentence_are_not(open_page) -> None:
    """WCAG 2.5.8: two 9 px links side by side fail; the same links inside a sentence are
    "inline" (the line height sets their size) and pass, however the line wraps them."""
    links = '<a href="#" style="font-size:9px;line-height:9px">a</a><a href="#" style="font-size:9px">b</a>'
    alone = _broken(open_page, f"<div>{links}</div>")
    found = " ".join(find_accessibility_violations(alone, rules="structure", within=BOX))
    assert "target-size (serious, 2 elements)" in found, found
    sentence = f'<p style="width:230px">Words before two small links, {links}, and words after them.</p>'
    in_a_sentence = _broken(open_page, sentence)
    found = " ".join(find_accessibility_violations(in_a_sentence, rules="structure", within=BOX))
    assert "target-size" not in found, found


def test_a_faint_link_on_an_exercise_is_caught_and_the_css_darkens_it(open_page) -> None:
    """The theme's link blue on an exercise's tinted background falls below 4.5:1 (a
    citation in rotary/additive's exercise did); reader-view.css darkens it there."""
    exercise = (
        '<div class="exercise admonition"><p class="admonition-title">Exercise</p>'
        '<section><p>See <a class="reference internal" href="#">a citation</a>.</p></section></div>'
    )
    broken = _broken(open_page, exercise, block=WITHOUT_CSS)
    found = " ".join(find_accessibility_violations(broken, rules="contrast", within=BOX))
    assert "color-contrast (serious" in found and ">a citation</a>" in found, found
    assert not find_accessibility_violations(_broken(open_page, exercise), rules="contrast", within=BOX)


def test_figures_without_meaningful_alt_text_are_caught(browser) -> None:
    """Hashed, empty and missing alt text fail; a sentence that says what the figure shows passes."""
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
        flagged = find_meaningless_alt(page)
    finally:
        page.close()
    assert [entry.split(":")[0] for entry in flagged] == ["a.png", "b.png", "c.png"], flagged
