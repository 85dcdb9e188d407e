/* Queries, Keys and Values: fixes to what a reader sees (book/_ext/reader_view.py says why).
 *
 * 1. The sidebar buttons. pydata-sphinx-theme 0.17.1 and sphinx-book-theme 1.3 attach
 *    their click handlers to the *first* ".primary-toggle" and ".secondary-toggle" in
 *    the page. The book renders no top bar (reader_view.py), so those are the buttons a
 *    reader sees; should a top bar with hidden toggles come back first, forward the
 *    visible buttons' clicks to the wired ones.
 * 2. Regions wider than the screen (display maths, code, tables) scroll sideways; mark
 *    them so that the CSS fades the edge where more is hidden, and make them reachable
 *    from the keyboard.
 * 3. Accessible names that match the visible text, and a name for the sidebar's toggles
 *    of deeper pages, which show only a chevron.
 * 4. Search results: maths as plain text, not TeX.
 */
"use strict";

(() => {
  // --- 4. maths as plain text (the same rules as plain_maths in reader_view.py) ---
  const SYMBOLS = {
    top: "ᵀ", times: "×", cdot: "·", ldots: "…", dots: "…", cdots: "…", in: "∈",
    to: "→", rightarrow: "→", leftarrow: "←", le: "≤", leq: "≤", ge: "≥", geq: "≥",
    ne: "≠", neq: "≠", approx: "≈", sum: "Σ", infty: "∞", alpha: "α", beta: "β",
    gamma: "γ", delta: "δ", epsilon: "ε", lambda: "λ", mu: "μ", sigma: "σ", theta: "θ",
    pi: "π", odot: "⊙", otimes: "⊗", partial: "∂", nabla: "∇", quad: " ", qquad: " ",
    left: "", right: "", lVert: "‖", rVert: "‖", Vert: "‖", lfloor: "⌊", rfloor: "⌋",
    mapsto: "↦",
  };
  const BLACKBOARD = { R: "ℝ", N: "ℕ", Z: "ℤ" };
  const table = (from, to) => Object.fromEntries([...from].map((c, i) => [c, [...to][i]]));
  const SUBSCRIPTS = table("0123456789aehijklmnoprstuvx+-=()", "₀₁₂₃₄₅₆₇₈₉ₐₑₕᵢⱼₖₗₘₙₒₚᵣₛₜᵤᵥₓ₊₋₌₍₎");
  const SUPERSCRIPTS = table("0123456789+-=()nT", "⁰¹²³⁴⁵⁶⁷⁸⁹⁺⁻⁼⁽⁾ⁿᵀ");
  const GROUP = String.raw`\{([^{}]*)\}`;
  // A script whose argument is a font command: d_\text{model} is d_{model}.
  const FONT_SCRIPT = new RegExp(String.raw`([_^])\\(?:text|mathrm|operatorname|mathbf|mathit|boldsymbol|mathsf|mathtt)\{`, "g");
  const FONT = new RegExp(String.raw`\\(?:text|mathrm|operatorname|mathbf|mathit|boldsymbol|mathsf|mathtt)` + GROUP, "g");
  const SQRT = new RegExp(String.raw`\\sqrt` + GROUP, "g");
  const FRAC = new RegExp(String.raw`\\[dt]?frac` + GROUP + GROUP, "g");
  const MATHBB = new RegExp(String.raw`\\mathbb` + GROUP, "g");
  const SCRIPT = new RegExp(String.raw`([_^])(?:` + GROUP + String.raw`|(\\[A-Za-z]+|[A-Za-z0-9]))`, "g");
  const commands = (text) => text.replace(/\\([A-Za-z]+)/g, (m, name) => (Object.hasOwn(SYMBOLS, name) ? SYMBOLS[name] : name));
  const script = (m, kind, group, single) => {
    const text = commands(group !== undefined ? group : single);
    const map = kind === "_" ? SUBSCRIPTS : SUPERSCRIPTS;
    if (text === "ᵀ") return text;
    if (text && [...text].every((c) => c in map)) return [...text].map((c) => map[c]).join("");
    // No Unicode form: a subscript keeps its underscore, as code writes it (d_model);
    // "\u0000" stands for it until the end, so that it is not read as TeX again.
    return kind === "_" && [...text].length > 1 ? `\u0000${text}` : text;
  };
  const plainMaths = (tex) => {
    let text = tex.replace(/\\\(|\\\)|\\\[|\\\]|\$/g, "").replace(/\\(begin|end)\{[^}]*\}/g, "");
    text = text.split("\\\\").join(";").split("&").join("").replace(/\\[,;:! ]/g, " ");
    let previous = null;
    while (previous !== text) {
      previous = text;
      text = text.replace(FONT_SCRIPT, "$1{").replace(FONT, "$1")
        .replace(MATHBB, (m, letter) => BLACKBOARD[letter] || letter)
        .replace(SQRT, (m, arg) => "√" + ([...arg].length <= 1 || arg.includes("_") ? arg : `(${arg})`))
        .replace(FRAC, "$1/$2")
        .replace(SCRIPT, script);
    }
    return commands(text).replace(/[{}]/g, "").split("\u0000").join("_").replace(/\s+/g, " ").trim();
  };
  window.qkvPlainMaths = plainMaths; // for tests/browser, which compares it with reader_view.py

  // Text with its \( ... \) and \[ ... \] spans made plain, the rest untouched.
  const plainMathsIn = (text) =>
    text.replace(/\\\(([\s\S]*?)\\\)|\\\[([\s\S]*?)\\\]/g, (m) => plainMaths(m));

  // Sphinx's searchtools.js declares `const Search` (a global binding, not window.Search).
  const patchSearch = () => {
    // eslint-disable-next-line no-undef
    const search = typeof Search !== "undefined" ? Search : null;
    if (!search || search.qkvPlain) return;
    search.qkvPlain = true;
    // Summaries are cut from the page's text, where maths is TeX: make it plain first.
    const htmlToText = search.htmlToText;
    search.htmlToText = (html, anchor) => plainMathsIn(htmlToText(html, anchor));
    // Result titles: page titles are HTML with maths spans; section titles are TeX without
    // delimiters (Sphinx indexes a title's text): those with a backslash or a caret are
    // made plain (an underscore alone may be code, as in attn_mask). The index may
    // be loaded already (the theme loads it before this script runs) or come later.
    const plainIndex = (index) => {
      const plainHtml = (html) => {
        const div = document.createElement("div");
        div.innerHTML = html;
        div.querySelectorAll(".math").forEach((el) => { el.textContent = plainMaths(el.textContent); });
        return div.innerHTML;
      };
      if (Array.isArray(index.titles)) index.titles = index.titles.map(plainHtml);
      if (index.alltitles) {
        index.alltitles = Object.fromEntries(Object.entries(index.alltitles).map(
          ([title, places]) => [/[\\^]/.test(title) ? plainMaths(title) : title, places]));
      }
      return index;
    };
    if (search._index) plainIndex(search._index);
    const setIndex = search.setIndex;
    search.setIndex = (index) => setIndex.call(search, plainIndex(index));
  };
  patchSearch();

  const ready = (callback) => {
    if (document.readyState !== "loading") callback();
    else document.addEventListener("DOMContentLoaded", callback);
  };

  // --- 1. the sidebar buttons ---
  const forwardToggles = () => {
    for (const selector of [".primary-toggle", ".secondary-toggle"]) {
      const [wired, ...others] = document.querySelectorAll(selector);
      if (!wired) continue;
      for (const button of others) {
        button.addEventListener("click", (event) => {
          event.preventDefault();
          event.stopImmediatePropagation();
          wired.click();
        });
      }
    }
  };

  // --- 2. regions wider than the screen ---
  const SCROLLERS = "mjx-container[display='true'], span.math, div.highlight pre, div.output pre, " +
    ".pst-scrollable-table-container";
  const markScrollState = (el) => {
    el.classList.toggle("qkv-more-left", el.scrollLeft > 1);
    el.classList.toggle("qkv-more-right", el.scrollLeft + el.clientWidth < el.scrollWidth - 1);
  };
  // Inline maths is cut off when its formula is wider than the span the theme clamps to
  // the column. (Its scrollWidth would count MathJax's glyph overhang, which hides nothing.)
  const tooWide = (el) => {
    const formula = el.matches("span.math") && el.querySelector("mjx-container");
    if (formula) return formula.getBoundingClientRect().width > el.clientWidth + 1;
    return el.scrollWidth > el.clientWidth + 1;
  };
  const markOverflows = () => {
    document.querySelectorAll(SCROLLERS).forEach((el) => {
      const overflows = tooWide(el);
      el.classList.toggle("qkv-overflows", overflows);
      if (overflows) {
        if (!el.hasAttribute("tabindex")) el.setAttribute("tabindex", "0");
        if (!el.dataset.qkvScroll) {
          el.dataset.qkvScroll = "1";
          el.addEventListener("scroll", () => markScrollState(el), { passive: true });
        }
      }
      markScrollState(el);
    });
  };

  // --- 3. accessible names ---
  const fixNames = () => {
    // The name comes from the visible text ("Show code cell content", "Search Ctrl+K").
    document.querySelectorAll("summary[aria-label], .search-button-field[aria-label]")
      .forEach((el) => el.removeAttribute("aria-label"));
    // The sidebar's toggle that opens a page's deeper pages shows only a chevron: its
    // name says whose pages it shows.
    document.querySelectorAll("li.has-children > details > summary").forEach((summary) => {
      const link = summary.parentElement.parentElement.querySelector(":scope > a");
      if (link && !summary.textContent.trim()) {
        summary.setAttribute("aria-label", `The pages under ${link.textContent.trim()}`);
      }
    });
    // Maths inside a link: MathJax makes each formula focusable, which would cut the
    // link into smaller targets (and nest one control in another); the link is the
    // control.
    document.querySelectorAll("a mjx-container[tabindex]").forEach((maths) => {
      maths.removeAttribute("tabindex");
    });
    // The bibliography: docutils writes role="list" around entries whose role is not
    // "listitem", which screen readers then cannot list.
    document.querySelectorAll(".citation-list[role='list'] > .citation").forEach((entry) => {
      entry.setAttribute("role", "listitem");
    });
    // The colour-mode button's icons are decoration: its name is "Color mode". (Font
    // Awesome may already have turned each <i title> into an <svg> with a <title>.)
    document.querySelectorAll(".theme-switch-button .theme-switch").forEach((icon) => {
      icon.removeAttribute("title");
      icon.removeAttribute("aria-labelledby");
      icon.querySelectorAll("title").forEach((title) => title.remove());
      icon.setAttribute("aria-hidden", "true");
    });
  };

  // Maths has its width once MathJax has typeset it. MathJax loads after this script (both
  // are deferred; the page names this one first) and reads its configuration then: mark
  // the overflows as part of its page-ready step, so that MathJax.startup.promise, which
  // readers' scripts and the browser check wait for, resolves only after the marks.
  const config = (window.MathJax = window.MathJax || {});
  config.startup = config.startup || {};
  const pageReady = config.startup.pageReady;
  config.startup.pageReady = () =>
    (pageReady ? pageReady() : window.MathJax.startup.defaultPageReady()).then(() => {
      markOverflows();
      fixNames();
    });

  ready(() => {
    patchSearch();
    forwardToggles();
    fixNames();
    markOverflows();
    window.addEventListener("load", () => { fixNames(); markOverflows(); });
    window.addEventListener("resize", markOverflows);
  });
})();
