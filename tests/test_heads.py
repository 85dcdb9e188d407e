"""Splitting and merging heads, HeadWeights, and the paper's equations."""

from __future__ import annotations

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

import qkv


def test_split_heads_gives_head_i_the_feature_slice_i():
    B, L, h, d = 2, 5, 3, 4
    x = torch.arange(B * L * h * d).reshape(B, L, h * d)
    heads = qkv.split_heads(x, h)
    assert heads.shape == (B, h, L, d)
    for i in range(h):
        assert torch.equal(heads[:, i], x[..., i * d : (i + 1) * d])


def test_the_transpose_matters():
    x = torch.arange(2 * 5 * 12).reshape(2, 5, 12)
    wrong = x.view(2, 3, 5, 4)  # the classic bug: no transpose
    assert not torch.equal(qkv.split_heads(x, 3), wrong)


@settings(max_examples=30, deadline=None)
@given(B=st.integers(1, 3), L=st.integers(1, 6), h=st.integers(1, 4), d=st.integers(1, 5))
def test_merge_heads_inverts_split_heads(B, L, h, d):
    x = torch.randn(B, L, h * d)
    assert torch.equal(qkv.merge_heads(qkv.split_heads(x, h)), x)
    y = torch.randn(B, h, L, d)
    assert torch.equal(qkv.split_heads(qkv.merge_heads(y), h), y)


def test_split_and_merge_errors():
    with pytest.raises(ValueError, match="x has 10 features, which num_heads=3 does not divide"):
        qkv.split_heads(torch.zeros(2, 5, 10), 3)
    with pytest.raises(ValueError, match=r"x must have 3 dimensions \(B, L, h·d\), got shape \(5, 12\)"):
        qkv.split_heads(torch.zeros(5, 12), 3)
    with pytest.raises(ValueError, match="num_heads must be positive"):
        qkv.split_heads(torch.zeros(2, 5, 12), 0)
    with pytest.raises(ValueError, match=r"x must have 4 dimensions \(B, h, L, d\)"):
        qkv.merge_heads(torch.zeros(2, 5, 12))


def test_head_weights_random_shapes_and_properties():
    hw = qkv.HeadWeights.random(12, 3, kdim=10, vdim=7, d_v=5, dtype=torch.float64)
    assert hw.w_q.shape == (3, 12, 4) and hw.w_k.shape == (3, 10, 4)
    assert hw.w_v.shape == (3, 7, 5) and hw.w_o.shape == (15, 12)
    assert (hw.num_heads, hw.embed_dim, hw.kdim, hw.vdim, hw.d_k, hw.d_v) == (3, 12, 10, 7, 4, 5)
    assert hw.bias and hw.b_v.shape == (3, 5) and hw.b_o.shape == (12,)
    assert hw.w_q.dtype == torch.float64
    assert not qkv.HeadWeights.random(12, 3, bias=False).bias
    assert hw.to(torch.float32).w_o.dtype == torch.float32
    copy = hw.detach()
    assert torch.equal(copy.w_q, hw.w_q) and copy.w_q.data_ptr() != hw.w_q.data_ptr()


def test_head_weights_validation():
    hw = qkv.HeadWeights.random(12, 3)
    with pytest.raises(ValueError, match="w_k has 2 heads, which does not divide the 3 query heads of w_q"):
        qkv.HeadWeights(hw.w_q, hw.w_k[:2], hw.w_v, hw.w_o)
    with pytest.raises(ValueError, match="w_v has 3 heads, but the number of heads in w_k is 1"):
        qkv.HeadWeights(hw.w_q, hw.w_k[:1], hw.w_v, hw.w_o)
    with pytest.raises(ValueError, match="w_o has 11 rows, but h·d_v is 12"):
        qkv.HeadWeights(hw.w_q, hw.w_k, hw.w_v, hw.w_o[:11])
    with pytest.raises(ValueError, match="either all biases or none: got b_q but not b_k, b_v, b_o"):
        qkv.HeadWeights(hw.w_q, hw.w_k, hw.w_v, hw.w_o, b_q=hw.b_q)
    with pytest.raises(ValueError, match=r"b_o must have shape \(12,\), got \(11,\)"):
        qkv.HeadWeights(hw.w_q, hw.w_k, hw.w_v, hw.w_o, hw.b_q, hw.b_k, hw.b_v, hw.b_o[:11])
    with pytest.raises(ValueError, match="embed_dim=10 is not divisible by num_heads=3"):
        qkv.HeadWeights.random(10, 3)


def test_multi_head_attention_is_the_papers_per_head_loop():
    torch.manual_seed(0)
    hw = qkv.HeadWeights.random(12, 3, kdim=10, vdim=7, dtype=torch.float64)
    x, memory, values = (
        torch.randn(2, 4, 12).double(),
        torch.randn(2, 6, 10).double(),
        torch.randn(2, 6, 7).double(),
    )
    output, weights = qkv.multi_head_attention(x, memory, values, hw)
    heads = []
    for i in range(3):  # head_i = Attention(X W_i^Q, K W_i^K, V W_i^V), written out
        q = x @ hw.w_q[i] + hw.b_q[i]
        k = memory @ hw.w_k[i] + hw.b_k[i]
        v = values @ hw.w_v[i] + hw.b_v[i]
        head, w = qkv.attention(q, k, v)
        torch.testing.assert_close(w, weights[:, i])
        heads.append(head)
    torch.testing.assert_close(output, torch.cat(heads, -1) @ hw.w_o + hw.b_o)


def test_multi_head_attention_errors():
    hw = qkv.HeadWeights.random(12, 3, kdim=10)
    x = torch.randn(2, 4, 12)
    with pytest.raises(ValueError, match="key has 12 features, but kdim is 10"):
        qkv.multi_head_attention(x, x, x, hw)
    with pytest.raises(TypeError, match="weights must be a HeadWeights"):
        qkv.multi_head_attention(x, x, x, {"w_q": hw.w_q})


def test_grouped_query_weights_validation_and_expansion():
    hw = qkv.HeadWeights.random(16, 4, num_kv_heads=2, dtype=torch.float64)
    with pytest.raises(ValueError, match=r"w_k has no heads: its first axis is empty \(shape \(0, 16, 4\)\)"):
        qkv.HeadWeights(hw.w_q, hw.w_k[:0], hw.w_v[:0], hw.w_o)
    with pytest.raises(ValueError, match="w_k has 3 heads, which does not divide the 4 query heads of w_q"):
        qkv.HeadWeights(hw.w_q, torch.cat([hw.w_k, hw.w_k[:1]]), hw.w_v, hw.w_o)
    trainable = hw._map(lambda t: t.clone().requires_grad_())
    full = trainable.expand_kv_heads()
    assert full.w_q is trainable.w_q and full.num_kv_heads == 4
    x = torch.randn(2, 3, 16, dtype=torch.float64)
    out, _ = qkv.multi_head_attention(x, x, x, full)
    out.sum().backward()  # gradients reach the shared K/V heads
    assert trainable.w_k.grad is not None and trainable.w_k.grad.shape == (2, 16, 4)


def test_mean_pool_kv_heads_averages_each_group_and_round_trips_equal_heads():
    hw = qkv.HeadWeights.random(24, 6, kdim=10, vdim=12, bias=True, dtype=torch.float64)
    pooled = hw.mean_pool_kv_heads(2)  # 6 K/V heads -> 2, groups of 3
    assert pooled.num_kv_heads == 2 and pooled.w_q is hw.w_q and pooled.w_o is hw.w_o
    assert pooled.w_k.shape == (2, 10, 4) and pooled.w_v.shape == (2, 12, 4)
    torch.testing.assert_close(pooled.w_k[1], hw.w_k[3:].mean(dim=0))
    torch.testing.assert_close(pooled.b_v[0], hw.b_v[:3].mean(dim=0))
    # Copying heads into groups and pooling them again gives the same layer back:
    again = pooled.expand_kv_heads().mean_pool_kv_heads(2)
    torch.testing.assert_close(again.w_k, pooled.w_k)
    x = torch.randn(2, 5, 24, dtype=torch.float64)
    m = torch.randn(2, 5, 10, dtype=torch.float64)
    v = torch.randn(2, 5, 12, dtype=torch.float64)
    torch.testing.assert_close(
        qkv.multi_head_attention(x, m, v, again)[0], qkv.multi_head_attention(x, m, v, pooled)[0]
    )
    # Pooling distinct heads changes the output:
    assert not torch.allclose(
        qkv.multi_head_attention(x, m, v, pooled)[0], qkv.multi_head_attention(x, m, v, hw)[0]
    )
    assert hw.mean_pool_kv_heads(6).num_kv_heads == 6  # no pooling: the same heads


def test_mean_pool_kv_heads_errors_name_the_argument_and_shapes():
    hw = qkv.HeadWeights.random(16, 4)
    with pytest.raises(
        ValueError,
        match=r"num_kv_heads must divide the layer's 4 K/V heads \(w_k shaped \(4, 16, 4\)\), got 3",
    ):
        hw.mean_pool_kv_heads(3)
    with pytest.raises(ValueError, match="num_kv_heads"):
        hw.mean_pool_kv_heads(0)
