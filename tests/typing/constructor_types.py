"""Read by mypy in ``make lint``, never run: ``init`` takes only the schemes it knows.

``init="xavier"`` is a ``ValueError`` at run time; a type checker refuses it before. Each
``type: ignore[arg-type]`` below is needed (mypy --strict reports an unused one), so each
line is an error that mypy finds.
"""

from __future__ import annotations

import qkv


def init_is_one_of_its_choices() -> None:
    qkv.MultiHeadAttention(12, 3, init="torch")
    qkv.PerHeadMultiHeadAttention(12, 3, init="linear")
    qkv.HeadWeights.random(12, 3, init="torch")
    qkv.MultiHeadAttention(12, 3, init="xavier")  # type: ignore[arg-type]
    qkv.PerHeadMultiHeadAttention(12, 3, init="xavier")  # type: ignore[arg-type]
    qkv.HeadWeights.random(12, 3, init="xavier")  # type: ignore[arg-type]
