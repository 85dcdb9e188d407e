"""Models: small networks built from qkv's own attention modules, for the book's experiments.

See also
--------
The chapters "Cross-attention" (book/cross_attention.ipynb) and "Where W^Q,
W^K and W^V come from" (book/training.ipynb).
"""

from __future__ import annotations

__all__: list[str] = []
