"""The hand-derived backward pass of attention agrees with autograd and with finite differences."""

from __future__ import annotations

from dataclasses import fields

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

import qkv
from qkv.gradients import (
    attention_backward,
    manual_attention,
    manual_multi_head_attention,
    multi_head_attention_backward,
    softmax_backward,
)

DTYPE = torch.float64
TOL = {"rtol": 0.0, "atol": 1e-10}


def leaf(*shape: int, generator: torch.Generator) -> torch.Tensor:
    return torch.randn(*shape, dtype=DTYPE, generator=generator).requires_grad_()


def weight_tensors(hw: qkv.HeadWeights) -> list[torch.Tensor | None]:
    return [getattr(hw, f.name) for f in fields(hw)]


def test_softmax_backward_is_the_jacobian_product():
    g = torch.Generator().manual_seed(0)
    s = torch.randn(5, dtype=DTYPE, generator=g)
    dp = torch.randn(5, dtype=DTYPE, generator=g)
    p = torch.softmax(s, -1)
    jacobian = torch.autograd.functional.jacobian(lambda x: torch.softmax(x, -1), s)  # (5, 5)
    torch.testing.assert_close(jacobian, torch.diag(p) - torch.outer(p, p), **TOL)
    ds = softmax_backward(p, dp)
    torch.testing.assert_close(ds, jacobian.T @ dp, **TOL)
    assert abs(float(ds.sum())) < 1e-12  # rows of dS sum to zero


@pytest.mark.parametrize("masked", [False, True])
def test_attention_backward_matches_autograd_with_broadcasting(masked):
    g = torch.Generator().manual_seed(1)
    q, k, v = leaf(2, 3, 4, 5, generator=g), leaf(2, 1, 6, 5, generator=g), leaf(6, 7, generator=g)
    mask = None
    if masked:
        mask = torch.rand(2, 3, 4, 6, generator=g) > 0.4
        mask[0, 0, 1] = False  # a query that may attend to nothing
    output, _ = qkv.attention(q, k, v, mask)
    upstream = torch.randn(output.shape, dtype=DTYPE, generator=g)
    output.backward(upstream)
    dq, dk, dv = attention_backward(q.detach(), k.detach(), v.detach(), upstream, mask)
    torch.testing.assert_close(dq, q.grad, **TOL)
    torch.testing.assert_close(dk, k.grad, **TOL)
    torch.testing.assert_close(dv, v.grad, **TOL)
    if masked:
        assert dq[0, 0, 1].abs().max() == 0  # nothing to attend to, nothing to learn


def test_attention_backward_custom_scale():
    g = torch.Generator().manual_seed(2)
    q, k, v = leaf(3, 4, generator=g), leaf(5, 4, generator=g), leaf(5, 2, generator=g)
    output, _ = qkv.attention(q, k, v, scale=0.3)
    upstream = torch.randn(3, 2, dtype=DTYPE, generator=g)
    output.backward(upstream)
    grads = attention_backward(q.detach(), k.detach(), v.detach(), upstream, scale=0.3)
    for mine, theirs in zip(grads, (q.grad, k.grad, v.grad), strict=True):
        torch.testing.assert_close(mine, theirs, **TOL)


def test_manual_attention_passes_gradcheck():
    g = torch.Generator().manual_seed(3)
    q, k, v = leaf(2, 3, 4, generator=g), leaf(2, 5, 4, generator=g), leaf(2, 5, 3, generator=g)
    mask = qkv.causal_mask(3, 5)
    assert torch.autograd.gradcheck(lambda q, k, v: manual_attention(q, k, v, mask), (q, k, v))
    torch.testing.assert_close(manual_attention(q, k, v, mask), qkv.attention(q, k, v, mask)[0])


@pytest.mark.parametrize("bias", [True, False])
@pytest.mark.parametrize("num_kv_heads", [6, 3, 1])
def test_multi_head_backward_matches_autograd(bias, num_kv_heads):
    g = torch.Generator().manual_seed(4)
    # Non-square on purpose: 6 heads (sharing 6, 3 or 1 K/V heads), kdim != vdim != d_model,
    # d_k != d_v, T != S.
    hw = qkv.HeadWeights.random(
        12, 6, kdim=10, vdim=7, d_k=5, d_v=2, num_kv_heads=num_kv_heads, bias=bias, dtype=DTYPE, generator=g
    )
    x, memory, values = leaf(2, 4, 12, generator=g), leaf(2, 6, 10, generator=g), leaf(2, 6, 7, generator=g)
    mask = qkv.padding_mask(torch.tensor([6, 3]), 6)
    trainable = qkv.HeadWeights(
        *(None if t is None else t.clone().requires_grad_() for t in weight_tensors(hw))
    )
    output, _ = qkv.multi_head_attention(x, memory, values, trainable, mask)
    upstream = torch.randn(output.shape, dtype=DTYPE, generator=g)
    output.backward(upstream)
    dx, dm, dv, grads = multi_head_attention_backward(
        x.detach(), memory.detach(), values.detach(), hw, upstream, mask
    )
    torch.testing.assert_close(dx, x.grad, **TOL)
    torch.testing.assert_close(dm, memory.grad, **TOL)
    torch.testing.assert_close(dv, values.grad, **TOL)
    for f in fields(hw):
        mine, parameter = getattr(grads, f.name), getattr(trainable, f.name)
        if parameter is None:
            assert mine is None
        else:
            torch.testing.assert_close(mine, parameter.grad, **TOL, msg=f.name)


def test_multi_head_backward_agrees_with_the_module():
    """The HeadWeights gradients are the module's, read in the paper's orientation."""
    torch.manual_seed(5)
    module = qkv.MultiHeadAttention(8, 2).double()
    x = torch.randn(3, 5, 8, dtype=DTYPE, requires_grad=True)
    mask = qkv.causal_mask(5)
    output, _ = module(x, mask=mask)
    upstream = torch.randn_like(output)
    output.backward(upstream)
    dq, dk, dv, grads = multi_head_attention_backward(
        x.detach(), x.detach(), x.detach(), module.to_heads(), upstream, mask
    )
    torch.testing.assert_close(dq + dk + dv, x.grad, **TOL)  # self-attention: three paths add
    torch.testing.assert_close(grads.w_q, module.q_proj.weight.grad.T.reshape(8, 2, 4).transpose(0, 1), **TOL)
    torch.testing.assert_close(grads.w_o, module.out_proj.weight.grad.T, **TOL)
    torch.testing.assert_close(grads.b_k, module.k_proj.bias.grad.view(2, 4), **TOL)


def test_manual_multi_head_attention_passes_gradcheck():
    g = torch.Generator().manual_seed(6)
    # Small (gradcheck perturbs every entry) but still non-square everywhere.
    hw = qkv.HeadWeights.random(4, 2, kdim=3, vdim=5, d_k=3, d_v=2, dtype=DTYPE, generator=g)
    inputs = [leaf(2, 2, 4, generator=g), leaf(2, 3, 3, generator=g), leaf(2, 3, 5, generator=g)]
    weights = [t.clone().requires_grad_() for t in weight_tensors(hw) if t is not None]
    mask = qkv.padding_mask(torch.tensor([3, 2]), 3)

    def layer(query, key, value, *tensors):
        return manual_multi_head_attention(query, key, value, qkv.HeadWeights(*tensors), mask)

    assert torch.autograd.gradcheck(layer, (*inputs, *weights))
    expected, _ = qkv.multi_head_attention(*inputs, hw, mask)
    torch.testing.assert_close(layer(*inputs, *weights), expected, **TOL)


@settings(max_examples=25, deadline=None)
@given(
    t=st.integers(1, 4), s=st.integers(1, 5), d_k=st.integers(1, 4), d_v=st.integers(1, 3),
    seed=st.integers(0, 2**16),
)  # fmt: skip
def test_attention_backward_property(t, s, d_k, d_v, seed):
    g = torch.Generator().manual_seed(seed)
    q, k, v = leaf(t, d_k, generator=g), leaf(s, d_k, generator=g), leaf(s, d_v, generator=g)
    upstream = torch.randn(t, d_v, dtype=DTYPE, generator=g)
    dq, dk, dv = attention_backward(q, k, v, upstream)
    output, _ = qkv.attention(q, k, v)
    gq, gk, gv = torch.autograd.grad(output, (q, k, v), upstream)
    for mine, theirs in ((dq, gq), (dk, gk), (dv, gv)):
        torch.testing.assert_close(mine, theirs, **TOL)
    # The keys' gradients sum to zero: moving every key by the same vector shifts a
    # query's scores by one constant, which the softmax ignores.
    torch.testing.assert_close(dk.sum(0), torch.zeros(d_k, dtype=DTYPE), **TOL)


def test_errors_name_the_argument():
    q, k, v = torch.randn(3, 4), torch.randn(5, 4), torch.randn(5, 2)
    with pytest.raises(
        ValueError, match=r"grad_output must have the output's shape \(\.\.\., T, d_v\) = \(3, 2\)"
    ):
        attention_backward(q, k, v, torch.randn(3, 4))
    with pytest.raises(ValueError, match="query has 4 features per position, but key has 3"):
        attention_backward(q, torch.randn(5, 3), v, torch.randn(3, 2))
    with pytest.raises(TypeError, match="mask must be boolean"):  # an additive mask: autograd's to do
        attention_backward(q, k, v, torch.randn(3, 2), mask=torch.zeros(3, 5))
    with pytest.raises(
        TypeError, match=r"grad_output has dtype torch\.float64, but query has dtype torch\.float32"
    ):
        attention_backward(q, k, v, torch.randn(3, 2, dtype=DTYPE))
    with pytest.raises(ValueError, match="grad_weights must have the shape of weights"):
        softmax_backward(torch.rand(3, 5), torch.rand(3, 4))
    hw = qkv.HeadWeights.random(8, 2)
    x = torch.randn(2, 3, 8)
    with pytest.raises(TypeError, match="weights must be a HeadWeights"):
        multi_head_attention_backward(x, x, x, "weights", x)
    with pytest.raises(ValueError, match="key has 6 features, but kdim is 8"):
        multi_head_attention_backward(x, torch.randn(2, 3, 6), x, hw, x)
    with pytest.raises(
        ValueError, match=r"grad_output must have the output's shape \(B, T, d_model\) = \(2, 3, 8\)"
    ):
        multi_head_attention_backward(x, x, x, hw, torch.randn(2, 3, 4))
    with pytest.raises(ValueError, match="does not broadcast to the attention scores' shape"):
        manual_multi_head_attention(x, x, x, hw, mask=torch.ones(4, 4, dtype=torch.bool))


def test_the_scores_gradient_passed_for_do_is_caught_when_s_differs_from_d_v():
    # The mistake of passing dZ, (T, S), where dO, (T, d_v), belongs (from the training
    # chapter's backward page): caught at the boundary, with both shapes named.
    query, key, value = torch.randn(4, 3), torch.randn(5, 3), torch.randn(5, 2)
    with pytest.raises(ValueError, match=r"= \(4, 2\), got \(4, 5\)"):
        attention_backward(query, key, value, torch.randn(4, 5))
