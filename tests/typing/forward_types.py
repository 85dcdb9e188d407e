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


def inference_arguments_keep_the_types() -> None:
    mha = qkv.MultiHeadAttention(16, 4, num_kv_heads=2)
    x = torch.randn(1, 1, 16)
    cache = mha.new_cache(batch_size=1, max_length=8)
    assert_type(cache, qkv.KVCache)
    assert_type(mha(x, cache=cache), tuple[Tensor, None])
    assert_type(mha(x, cache=cache, need_weights=True), tuple[Tensor, Tensor])
    kv = mha.project_key_value(torch.randn(1, 6, 16))
    assert_type(kv, qkv.KeyValue)
    assert_type(kv.keys, Tensor)
    assert_type(mha(x, key_value=kv, need_weights=True), tuple[Tensor, Tensor])
