"""What a reader sees around the chapters: titles, links, the theme's buttons, narrow screens.

Jupyter Book 1 pins sphinx-book-theme 1.3 and, through it, pydata-sphinx-theme 0.17.1;
the fixes here are for what those leave wrong in this book. The browser check
(``tests/browser``) fails if any of them comes back.

On the Python side (this file):

* ``<title>`` (the browser tab, bookmarks, search engines) is plain text: a chapter
  title's maths, ``\\(W^Q\\)`` in the HTML, becomes ``WQ``, and ``\\(\\sqrt{d_k}\\)``
  becomes ``√dₖ`` (:func:`plain_maths`). The front page's tab shows the book's title
  once, not "Queries, Keys and Values — Queries, Keys and Values".
* A ``{doc}`` or ``{ref}`` link whose text is a title (a chapter's or a section's) shows
  that title's maths typeset, as the sidebar does, rather than ``W^Q`` with a caret
  (Sphinx writes a title's plain text into such links). The print-only page heading,
  which search summaries read, is plain text like the tab's.
* No top bar: pydata-sphinx-theme renders one for a search field (a second one; the
  sidebar has its own) unless ``navbar_persistent`` is set, and that bar's hidden
  sidebar toggles, first in the page, took the click handlers the visible buttons need.
* The bibliography labels its entries as the text cites them, "Vaswani et al., 2017",
  not [1]-[9] (the ``qkv_author_year`` style, set as ``bibtex_default_style``).
* Exercises are numbered page by page, from 1 (:func:`_number_exercises_per_page`):
  sphinx-exercise numbers them with Sphinx's figure counter, which, in a book whose
  table of contents has no section numbers, runs across the whole book ("Exercise 50"
  on a page with three).
* ``static/reader-view.css`` and ``static/reader-view.js`` are added to every page.

In the browser (``static/reader-view.js``): the sidebar buttons open their sidebars,
search results show maths as plain text, regions too wide for the screen can be
scrolled and say so, and a few buttons get accessible names that match their text.
"""

from __future__ import annotations

import html
import re
from pathlib import Path
from typing import Any

from docutils import nodes
from pybtex.plugin import register_plugin
from pybtex.richtext import Text
from pybtex.style.formatting.plain import Style as PlainStyle
from pybtex.style.labels import BaseLabelStyle

STATIC = Path(__file__).parent / "static"

# Maths in plain text: the commands the book uses; anything else keeps
# its letters and loses its backslash (``\foo`` -> ``foo``). reader-view.js has the
# same rules for search results; tests/browser checks that the two agree.
SYMBOLS = {
    "top": "ᵀ", "times": "×", "cdot": "·", "ldots": "…", "dots": "…", "cdots": "…",
    "in": "∈", "to": "→", "rightarrow": "→", "leftarrow": "←", "le": "≤", "leq": "≤",
    "ge": "≥", "geq": "≥", "ne": "≠", "neq": "≠", "approx": "≈", "sum": "Σ", "infty": "∞",
    "alpha": "α", "beta": "β", "gamma": "γ", "delta": "δ", "epsilon": "ε", "lambda": "λ",
    "mu": "μ", "sigma": "σ", "theta": "θ", "pi": "π", "odot": "⊙", "otimes": "⊗",
    "partial": "∂", "nabla": "∇", "quad": " ", "qquad": " ", "left": "", "right": "",
    "lVert": "‖", "rVert": "‖", "Vert": "‖", "lfloor": "⌊", "rfloor": "⌋", "mapsto": "↦",
}  # fmt: skip
BLACKBOARD = {"R": "ℝ", "N": "ℕ", "Z": "ℤ"}
SUBSCRIPTS = dict(zip("0123456789aehijklmnoprstuvx+-=()", "₀₁₂₃₄₅₆₇₈₉ₐₑₕᵢⱼₖₗₘₙₒₚᵣₛₜᵤᵥₓ₊₋₌₍₎", strict=True))
SUPERSCRIPTS = dict(zip("0123456789+-=()nT", "⁰¹²³⁴⁵⁶⁷⁸⁹⁺⁻⁼⁽⁾ⁿᵀ", strict=True))
DELIMITERS = re.compile(r"\\\(|\\\)|\\\[|\\\]|\$")
ENVIRONMENT = re.compile(r"\\(begin|end)\{[^}]*\}")
GROUP = r"\{([^{}]*)\}"
# A script whose argument is a font command: ``d_\\text{model}`` is ``d_{model}``.
FONT_SCRIPT = re.compile(r"([_^])\\(?:text|mathrm|operatorname|mathbf|mathit|boldsymbol|mathsf|mathtt)\{")
FONT = re.compile(r"\\(?:text|mathrm|operatorname|mathbf|mathit|boldsymbol|mathsf|mathtt)" + GROUP)
SQRT = re.compile(r"\\sqrt" + GROUP)
FRAC = re.compile(r"\\[dt]?frac" + GROUP + GROUP)
MATHBB = re.compile(r"\\mathbb" + GROUP)
SCRIPT = re.compile(r"([_^])(?:" + GROUP + r"|(\\[A-Za-z]+|[A-Za-z0-9]))")
COMMAND = re.compile(r"\\([A-Za-z]+)")
KEPT_UNDERSCORE = "\x00"


def _script(match: re.Match[str]) -> str:
    """``_k`` -> ``ₖ``, ``^\\top`` -> ``ᵀ``; without a Unicode form, the plain letters."""
    kind, group, single = match.groups()
    text = _commands(group if group is not None else single)
    table = SUBSCRIPTS if kind == "_" else SUPERSCRIPTS
    if text == "ᵀ":
        return text
    if text and all(char in table for char in text):
        return "".join(table[char] for char in text)
    # No Unicode form: a subscript keeps its underscore, as code writes it (d_model);
    # KEPT_UNDERSCORE stands for it until the end, so that it is not read as TeX again.
    return f"{KEPT_UNDERSCORE}{text}" if kind == "_" and len(text) > 1 else text


def _root(match: re.Match[str]) -> str:
    """``\\sqrt{d_k}`` -> ``√d_k``; a longer argument in parentheses: ``√(2n)``."""
    argument = match.group(1)
    return "√" + (argument if len(argument) <= 1 or "_" in argument else f"({argument})")


def _commands(text: str) -> str:
    return COMMAND.sub(lambda m: SYMBOLS.get(m.group(1), m.group(1)), text)


def plain_maths(tex: str) -> str:
    """A TeX string as a reader would type it: ``\\(\\sqrt{d_k}\\)`` -> ``√dₖ``, ``W^Q`` -> ``WQ``.

    For places that show text, not typeset maths: the browser tab, search results.
    """
    text = DELIMITERS.sub("", tex)
    text = ENVIRONMENT.sub("", text)
    text = text.replace("\\\\", ";").replace("&", "")
    text = re.sub(r"\\[,;:! ]", " ", text)
    previous = None
    while previous != text:  # innermost groups first
        previous = text
        text = FONT_SCRIPT.sub(r"\1{", text)
        text = FONT.sub(r"\1", text)
        text = MATHBB.sub(lambda m: BLACKBOARD.get(m.group(1), m.group(1)), text)
        text = SQRT.sub(_root, text)
        text = FRAC.sub(r"\1/\2", text)
        text = SCRIPT.sub(_script, text)
    text = _commands(text).replace("{", "").replace("}", "").replace(KEPT_UNDERSCORE, "_")
    return re.sub(r"\s+", " ", text).strip()


def plain_title(node: nodes.Element) -> str:
    """A title node's text with its maths in plain text."""
    parts = []
    for child in node.findall(nodes.Text):
        parent = child.parent
        parts.append(plain_maths(child.astext()) if isinstance(parent, nodes.math) else child.astext())
    return re.sub(r"\s+", " ", "".join(parts)).strip()


def _theme_defaults(app: Any, config: Any) -> None:
    options = config.html_theme_options
    # No top bar: pydata-sphinx-theme would render one for a second search field, and its
    # hidden sidebar toggles, first in the page, would take the click handlers that the
    # visible buttons need. The sidebar keeps its own search field.
    options.setdefault("navbar_persistent", [])
    # The sidebar shows the book's title from here, so that the front page can leave it
    # out of its tab title (pydata-sphinx-theme shows ``docstitle`` otherwise).
    options.setdefault("logo", {}).setdefault("text", config.html_title)
    config.html_static_path.append(str(STATIC))


def _page_title(app: Any, pagename: str, templatename: str, context: dict[str, Any], doctree: Any) -> None:
    env = app.builder.env
    if pagename in env.titles:
        # Both are HTML to the templates: the tab's title, and sphinx-book-theme's print-only
        # <h1> (``pagetitle``, which search summaries also read).
        plain = html.escape(plain_title(env.titles[pagename]))
        context["title"] = plain
        if "pagetitle" in context:
            context["pagetitle"] = plain
    if pagename in {app.config.root_doc, app.config.master_doc}:
        # The front page's title is the book's title: say it once in the tab.
        context["docstitle"] = ""


def _maths_titles(env: Any) -> dict[str, dict[str, nodes.title]]:
    """Per document, its titles (page and sections) that contain maths, by their text."""
    if not hasattr(env, "qkv_maths_titles"):
        env.qkv_maths_titles = {}
    return env.qkv_maths_titles  # type: ignore[no-any-return]


def _collect_maths_titles(app: Any, doctree: nodes.document) -> None:
    _maths_titles(app.env)[app.env.docname] = {
        title.astext(): title.deepcopy()
        for title in doctree.findall(nodes.title)
        if any(title.findall(nodes.math))
    }


def _forget_maths_titles(app: Any, env: Any, docname: str) -> None:
    _maths_titles(env).pop(docname, None)


def _merge_maths_titles(app: Any, env: Any, docnames: Any, other: Any) -> None:
    for docname in docnames:
        if docname in _maths_titles(other):
            _maths_titles(env)[docname] = _maths_titles(other)[docname]


def _typeset_title_links(app: Any, doctree: nodes.document, docname: str) -> None:
    """A link whose text is a title with maths shows that maths typeset, not ``W^Q``.

    Sphinx writes a title's plain text (``W^Q``) into ``{doc}`` and ``{ref}`` links that
    have no text of their own; these get the title's own nodes instead, as the sidebar has.
    """
    with_maths = {text: title for titles in _maths_titles(app.env).values() for text, title in titles.items()}
    for inline in list(doctree.findall(nodes.inline)):
        classes = inline.get("classes", [])
        if not ("doc" in classes or "std-ref" in classes) or not isinstance(inline.parent, nodes.reference):
            continue
        title = with_maths.get(inline.astext())
        if title is not None:
            inline.children = []
            inline.extend(child.deepcopy() for child in title.children)


class AuthorYearLabels(BaseLabelStyle):  # type: ignore[misc]
    """Bibliography labels in the text's citation style: "Shazeer, 2019", "Vaswani et al., 2017"."""

    def format_labels(self, sorted_entries: Any) -> Any:
        for entry in sorted_entries:
            people = entry.persons.get("author") or entry.persons.get("editor") or []
            names = [Text.from_latex(" ".join(person.last_names)).render_as("text") for person in people]
            if len(names) > 2:
                who = f"{names[0]} et al."
            else:
                who = " and ".join(names) or entry.fields.get("title", entry.key)
            yield f"{who}, {entry.fields.get('year', 'n.d.')}"


class AuthorYearStyle(PlainStyle):  # type: ignore[misc]
    """pybtex's plain style, labelled by author and year."""

    default_label_style = AuthorYearLabels


def _number_exercises_per_page(app: Any, env: Any) -> list[str]:
    """Renumber each page's exercises 1, 2, ... in the order Sphinx numbered them.

    Sphinx's toctree collector assigns the numbers (``env.toc_fignumbers``) on every
    ``env-get-updated``, for the whole book; this runs after it (a later priority). The
    exercise titles and every reference to an exercise read their number from there.
    """
    for numbers in env.toc_fignumbers.values():
        exercises = numbers.get("exercise")
        if exercises:
            in_order = sorted(exercises, key=exercises.__getitem__)
            numbers["exercise"] = {ids: (n,) for n, ids in enumerate(in_order, start=1)}
    return []


def setup(app: Any) -> dict[str, Any]:
    register_plugin("pybtex.style.formatting", "qkv_author_year", AuthorYearStyle)
    app.connect("config-inited", _theme_defaults)
    # After sphinx-book-theme's own handler, which sets ``pagetitle``.
    app.connect("html-page-context", _page_title, priority=900)
    app.connect("doctree-read", _collect_maths_titles)
    app.connect("env-purge-doc", _forget_maths_titles)
    app.connect("env-merge-info", _merge_maths_titles)
    app.connect("doctree-resolved", _typeset_title_links)
    app.connect("env-get-updated", _number_exercises_per_page, priority=900)
    app.add_css_file("reader-view.css")
    # Deferred: it runs once the page is parsed, after searchtools.js and the search index
    # on the search page (it converts the index already loaded, and any loaded later).
    app.add_js_file("reader-view.js", loading_method="defer")
    return {"parallel_read_safe": True, "parallel_write_safe": True}
