"""Data: small synthetic tasks, made on the fly, that attention must solve.

No downloads: every task is generated from a seed, so a chapter trains the
same way on every machine. Each task documents what a model must attend to.

See also
--------
The chapters "Cross-attention" (book/cross_attention.ipynb) and "Where W^Q,
W^K and W^V come from" (book/training.ipynb).
"""

from __future__ import annotations

__all__: list[str] = []
