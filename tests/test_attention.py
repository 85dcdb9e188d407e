"""qkv.attention and qkv.fused_attention against PyTorch's fused kernel, and their invariants."""

from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F
from hypothesis import given, settings
from hypothesis import strategies as st

import qkv

DTYPES = [torch.float32, torch.float64]


def tolerance(dtype: torch.dtype) -> dict[str, float]:
    return {"atol": 1e-5, "rtol": 1e-5} if dtype == torch.float32 else {"atol": 1e-12, "rtol": 1e-12}


def qkv_tensors(B=2, h=3, T=4, S=6, d_k=5, d_v=7, dtype=torch.float64, seed=0):
    g = torch.Generator().manual_seed(seed)
    q = torch.randn(B, h, T, d_k, generator=g, dtype=dtype)  # (B, h, T, d_k)
    k = torch.randn(B, h, S, d_k, generator=g, dtype=dtype)  # (B, h, S, d_k)
    v = torch.randn(B, h, S, d_v, generator=g, dtype=dtype)  # (B, h, S, d_v)
    return q, k, v


@pytest.mark.parametrize("dtype", DTYPES)
def test_matches_the_formula(dtype):
    q, k, v = qkv_tensors(dtype=dtype)
    output, weights = qkv.attention(q, k, v)
    expected_weights = torch.softmax(q @ k.transpose(-2, -1) / math.sqrt(q.shape[-1]), dim=-1)
    torch.testing.assert_close(weights, expected_weights, **tolerance(dtype))
    torch.testing.assert_close(output, expected_weights @ v, **tolerance(dtype))
    assert output.shape == (2, 3, 4, 7) and weights.shape == (2, 3, 4, 6)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("kind", ["none", "causal", "padding"])
def test_explicit_and_fused_paths_agree_with_torch_sdpa(dtype, kind):
    q, k, v = qkv_tensors(dtype=dtype)
    mask = {"none": None, "causal": qkv.causal_mask(4, 6), "padding": qkv.padding_mask([6, 2])}[kind]
    reference = F.scaled_dot_product_attention(q, k, v, attn_mask=mask)
    explicit, _ = qkv.attention(q, k, v, mask)
    fused = qkv.fused_attention(q, k, v, mask)
    torch.testing.assert_close(explicit, reference, **tolerance(dtype))
    torch.testing.assert_close(fused, reference, **tolerance(dtype))


def test_gradients_agree_between_paths():
    q, k, v = qkv_tensors(dtype=torch.float64)
    mask = qkv.causal_mask(4, 6)
    grads = []
    for fn in (lambda *a: qkv.attention(*a)[0], qkv.fused_attention):
        inputs = [t.clone().requires_grad_() for t in (q, k, v)]
        fn(*inputs, mask).square().sum().backward()
        grads.append([t.grad for t in inputs])
    for explicit, fused in zip(*grads, strict=True):
        torch.testing.assert_close(explicit, fused, atol=1e-12, rtol=1e-12)


def test_gradcheck_explicit_path():
    q, k, v = (t.requires_grad_() for t in qkv_tensors(B=1, h=2, T=3, S=4, d_k=2, d_v=3))
    mask = qkv.padding_mask([3], 4)
    assert torch.autograd.gradcheck(lambda a, b, c: qkv.attention(a, b, c, mask), (q, k, v))


def test_fully_masked_query_gets_zero_weights_and_output_never_nan():
    q, k, v = qkv_tensors()
    mask = torch.ones(4, 6, dtype=torch.bool)
    mask[2] = False  # query 2 may attend to nothing
    for inputs in [(q, k, v)]:
        inputs = [t.clone().requires_grad_() for t in inputs]
        output, weights = qkv.attention(*inputs, mask)
        fused = qkv.fused_attention(*inputs, mask)
        assert torch.equal(weights[..., 2, :], torch.zeros_like(weights[..., 2, :]))
        assert torch.equal(output[..., 2, :], torch.zeros_like(output[..., 2, :]))
        assert torch.equal(fused[..., 2, :], torch.zeros_like(fused[..., 2, :]))
        (output.sum() + fused.sum()).backward()
        assert all(torch.isfinite(t.grad).all() for t in inputs)


def test_any_leading_dimensions_and_broadcasting():
    q = torch.randn(4, 8)  # (T, d_k): no batch at all
    k, v = torch.randn(6, 8), torch.randn(6, 3)
    output, weights = qkv.attention(q, k, v)
    assert output.shape == (4, 3) and weights.shape == (4, 6)
    q5 = torch.randn(2, 3, 5, 4, 8)  # (..., T, d_k) with three leading axes
    output, weights = qkv.attention(q5, k, v)  # key and value broadcast over the leading axes
    assert output.shape == (2, 3, 5, 4, 3) and weights.shape == (2, 3, 5, 4, 6)


def test_custom_scale():
    q, k, v = qkv_tensors()
    _, weights = qkv.attention(q, k, v, scale=1.0)
    torch.testing.assert_close(weights, torch.softmax(q @ k.transpose(-2, -1), dim=-1))


@settings(max_examples=40, deadline=None)
@given(
    T=st.integers(1, 6),
    S=st.integers(1, 7),
    d_k=st.integers(1, 5),
    d_v=st.integers(1, 5),
    seed=st.integers(0, 2**16),
)
def test_rows_of_weights_sum_to_one(T, S, d_k, d_v, seed):
    q, k, v = qkv_tensors(B=1, h=2, T=T, S=S, d_k=d_k, d_v=d_v, seed=seed)
    _, weights = qkv.attention(q, k, v)
    torch.testing.assert_close(weights.sum(-1), torch.ones(1, 2, T, dtype=weights.dtype))
    assert (weights >= 0).all()


@settings(max_examples=40, deadline=None)
@given(S=st.integers(2, 8), seed=st.integers(0, 2**16))
def test_permuting_keys_and_values_together_changes_nothing(S, seed):
    q, k, v = qkv_tensors(T=3, S=S, seed=seed)
    perm = torch.randperm(S, generator=torch.Generator().manual_seed(seed))
    output, weights = qkv.attention(q, k, v)
    output_p, weights_p = qkv.attention(q, k[..., perm, :], v[..., perm, :])
    torch.testing.assert_close(output_p, output)
    torch.testing.assert_close(weights_p, weights[..., perm])


@settings(max_examples=25, deadline=None)
@given(T=st.integers(2, 7), seed=st.integers(0, 2**16))
def test_causal_mask_makes_outputs_independent_of_the_future(T, seed):
    q, k, v = qkv_tensors(T=T, S=T, seed=seed)
    cut = T // 2
    k2, v2 = k.clone(), v.clone()
    k2[..., cut + 1 :, :] += 3.0  # change only the future of position `cut`
    v2[..., cut + 1 :, :] -= 5.0
    mask = qkv.causal_mask(T)
    before, _ = qkv.attention(q, k, v, mask)
    after, _ = qkv.attention(q, k2, v2, mask)
    torch.testing.assert_close(after[..., : cut + 1, :], before[..., : cut + 1, :])


def test_batch_elements_are_independent():
    q, k, v = qkv_tensors()
    output, _ = qkv.attention(q, k, v)
    alone, _ = qkv.attention(q[1:], k[1:], v[1:])
    torch.testing.assert_close(alone, output[1:])


@pytest.mark.parametrize(
    ("args", "error", "message"),
    [
        (lambda q, k, v: (q.int(), k, v), TypeError, "query must be a floating-point tensor"),
        (lambda q, k, v: (q, k.double(), v), TypeError, "key has dtype torch.float64"),
        (lambda q, k, v: (q[0, 0, 0], k, v), ValueError, r"query must have at least 2 dimensions"),
        (lambda q, k, v: (q, k[..., :4], v), ValueError, "query has 5 features per position, but key has 4"),
        (lambda q, k, v: (q, k, v[..., :5, :]), ValueError, "key has 6 positions, but value has 5"),
        (lambda q, k, v: (q, k[:1].expand(3, -1, -1, -1), v), ValueError, "do not broadcast"),
        (lambda q, k, v: ([[1.0]], k, v), TypeError, "query must be a torch.Tensor, got list"),
    ],
)
def test_bad_input_gets_a_clear_error(args, error, message):
    q, k, v = qkv_tensors(dtype=torch.float32)
    with pytest.raises(error, match=message):
        qkv.attention(*args(q, k, v))
    with pytest.raises(error, match=message):
        qkv.fused_attention(*args(q, k, v))


def test_bad_masks_get_a_clear_error():
    q, k, v = qkv_tensors(dtype=torch.float32)
    with pytest.raises(TypeError, match="mask must be boolean"):
        qkv.attention(q, k, v, torch.ones(4, 6))
    with pytest.raises(ValueError, match=r"mask of shape \(2, 6\) does not broadcast .* \(2, 3, 4, 6\)"):
        qkv.attention(q, k, v, torch.ones(2, 6, dtype=torch.bool))
    with pytest.raises(ValueError, match="does not broadcast"):
        qkv.attention(q, k, v, torch.ones(1, 1, 1, 2, 3, 4, 6, dtype=torch.bool))


def test_a_mask_on_another_device_is_named():
    q, k, v = qkv_tensors(dtype=torch.float32)
    elsewhere = torch.ones(4, 6, dtype=torch.bool, device="meta")
    with pytest.raises(ValueError, match="mask is on meta, but query is on cpu"):
        qkv.attention(q, k, v, elsewhere)
    with pytest.raises(ValueError, match="mask is on meta, but query is on cpu"):
        qkv.MultiHeadAttention(5, 1)(q[:, 0], mask=elsewhere[:, :4])
