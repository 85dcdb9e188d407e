"""Read by mypy in ``make lint``, never run: the type of ``module(...)`` follows ``need_weights``.

A type checker sees that ``output, weights = mha(x)`` gives ``weights: None`` and
``mha(x, need_weights=True)`` a tensor of weights, for both multi-head modules.
"""

from __future__ import annotations

import torch
from torch import Tensor
from typing_extensions import assert_type

import qkv


def returns_follow_need_weights(flag: bool) -> None:
    x = torch.randn(2, 5, 12)
    for module in (qkv.MultiHeadAttention(12, 3), qkv.PerHeadMultiHeadAttention(12, 3)):
        assert_type(module(x), tuple[Tensor, None])
        assert_type(module(x, need_weights=False), tuple[Tensor, None])
        assert_type(module(x, need_weights=True), tuple[Tensor, Tensor])
        assert_type(module(x, need_weights=flag), tuple[Tensor, Tensor | None])
        assert_type(module.forward(x, x, x, need_weights=True), tuple[Tensor, Tensor])
