"""Masks: True means "may attend", as in F.scaled_dot_product_attention."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

import qkv


def test_causal_mask_square_is_the_lower_triangle():
    assert torch.equal(qkv.causal_mask(5), torch.ones(5, 5, dtype=torch.bool).tril())


def test_causal_mask_rectangular_lets_the_last_query_see_every_key():
    mask = qkv.causal_mask(2, 5)  # the last 2 positions of a 5-token sequence
    assert mask.shape == (2, 5)
    assert mask[-1].all()
    assert mask[0].tolist() == [True, True, True, True, False]
    # It is the bottom rows of the full square mask: what cached decoding needs.
    assert torch.equal(mask, qkv.causal_mask(5)[-2:])


def test_causal_mask_matches_sdpa_is_causal_for_square():
    q, k, v = torch.randn(1, 2, 6, 4), torch.randn(1, 2, 6, 4), torch.randn(1, 2, 6, 3)
    torch.testing.assert_close(
        qkv.fused_attention(q, k, v, qkv.causal_mask(6)),
        F.scaled_dot_product_attention(q, k, v, is_causal=True),
    )


def test_causal_mask_errors():
    with pytest.raises(ValueError, match="at least as many keys as queries, got T=4 queries and S=3"):
        qkv.causal_mask(4, 3)
    with pytest.raises(ValueError, match="T must be positive, got 0"):
        qkv.causal_mask(0)
    with pytest.raises(TypeError, match="T must be an int, got float"):
        qkv.causal_mask(2.0)


def test_padding_mask_shape_and_content():
    mask = qkv.padding_mask(torch.tensor([3, 1]), 4)
    assert mask.shape == (2, 1, 1, 4)
    assert mask[:, 0, 0].tolist() == [[True, True, True, False], [True, False, False, False]]
    assert qkv.padding_mask([2, 3]).shape == (2, 1, 1, 3)  # S defaults to the longest


def test_padding_mask_broadcasts_over_heads_and_queries():
    q, k, v = torch.randn(2, 3, 4, 5), torch.randn(2, 3, 6, 5), torch.randn(2, 3, 6, 5)
    _, weights = qkv.attention(q, k, v, qkv.padding_mask([6, 2]))
    assert torch.equal(weights[1, ..., 2:], torch.zeros(3, 4, 4))
    torch.testing.assert_close(weights.sum(-1), torch.ones(2, 3, 4))


def test_padding_mask_errors():
    with pytest.raises(ValueError, match="lengths go up to 5, longer than S=4"):
        qkv.padding_mask([5, 2], 4)
    with pytest.raises(TypeError, match="lengths must hold integers"):
        qkv.padding_mask(torch.tensor([1.0, 2.0]))
    with pytest.raises(ValueError, match="non-negative"):
        qkv.padding_mask([-1, 2])
    with pytest.raises(ValueError, match=r"lengths must have 1 dimensions \(B,\), got shape \(1, 2\)"):
        qkv.padding_mask([[1, 2]])
    with pytest.raises(ValueError, match="at least one sequence"):
        qkv.padding_mask(torch.tensor([], dtype=torch.long))


def test_from_torch_mask_converts_the_multiheadattention_convention():
    torch.manual_seed(0)
    mha = torch.nn.MultiheadAttention(12, 3, batch_first=True).eval()
    x = torch.randn(2, 5, 12)
    blocked = ~qkv.causal_mask(5)  # torch: True = blocked
    expected, _ = mha(x, x, x, attn_mask=blocked)
    ours = qkv.MultiHeadAttention.from_heads(qkv.interop.from_torch(mha))
    torch.testing.assert_close(ours(x, mask=qkv.from_torch_mask(blocked))[0], expected)
    with pytest.raises(TypeError, match=r"blocked must be boolean, got dtype torch\.float32"):
        qkv.from_torch_mask(torch.zeros(3))


def test_additive_mask_is_equivalent_to_the_boolean_one():
    q, k, v = torch.randn(2, 4, 5), torch.randn(2, 6, 5), torch.randn(2, 6, 3)
    mask = qkv.causal_mask(4, 6)
    additive = qkv.additive_mask(mask)
    assert additive.dtype == torch.float32
    assert set(additive.unique().tolist()) == {0.0, float("-inf")}
    torch.testing.assert_close(
        F.scaled_dot_product_attention(q, k, v, attn_mask=additive), qkv.attention(q, k, v, mask)[0]
    )
    with pytest.raises(TypeError, match="floating dtype"):
        qkv.additive_mask(mask, torch.int64)
