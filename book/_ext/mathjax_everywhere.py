"""Load MathJax on every page, not only on pages whose body contains maths.

Chapter titles contain maths (for example "Where $W^Q$, $W^K$ and $W^V$ come
from"), and the navigation sidebar shows every title on every page; without
MathJax, a page with no maths of its own would show those titles as raw LaTeX.
"""

from __future__ import annotations

from typing import Any


def setup(app: Any) -> dict[str, Any]:
    app.set_html_assets_policy("always")
    return {"parallel_read_safe": True, "parallel_write_safe": True}
