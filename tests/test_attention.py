"""qkv.attention and qkv.fused_attention against PyTorch's fused kernel, and their invariants."""

from __future__ import annotations

import math
import warnings

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


@pytest.mark.parametrize("attend", [qkv.attention, qkv.fused_attention])
def test_bad_masks_get_a_clear_error(attend):
    q, k, v = qkv_tensors(dtype=torch.float32)
    with pytest.raises(TypeError, match=r"mask must be boolean .* or floating .* got dtype torch.int64"):
        attend(q, k, v, torch.ones(4, 6, dtype=torch.long))
    with pytest.raises(TypeError, match=r"mask has dtype torch\.float64, but query has dtype torch\.float32"):
        attend(q, k, v, torch.zeros(4, 6, dtype=torch.float64))
    with pytest.raises(ValueError, match=r"mask of shape \(2, 6\) does not broadcast .* \(2, 3, 4, 6\)"):
        attend(q, k, v, torch.ones(2, 6, dtype=torch.bool))
    with pytest.raises(ValueError, match="does not broadcast"):
        attend(q, k, v, torch.ones(1, 1, 1, 2, 3, 4, 6, dtype=torch.bool))


@pytest.mark.parametrize("attend", [qkv.attention, qkv.fused_attention])
@pytest.mark.parametrize(
    "zero_one", [qkv.causal_mask(4, 6).float(), torch.ones(4, 6)], ids=["causal.float()", "ones"]
)
def test_a_float_mask_of_zeros_and_ones_is_refused_saying_what_to_pass(attend, zero_one):
    # Added to the scores, 0 and 1 block nothing: before, both ran as if unmasked.
    q, k, v = qkv_tensors(dtype=torch.float32)
    message = r"mask holds only 0 and 1 as floats: .* block nothing; .* mask\.bool\(\)"
    with pytest.raises(TypeError, match=message):
        attend(q, k, v, zero_one)
    # Real additive masks stay: 0 and -inf, finfo.min (Hugging Face's), a bias, all zeros.
    for additive in (
        qkv.additive_mask(qkv.causal_mask(4, 6)),
        torch.zeros(4, 6).masked_fill(~qkv.causal_mask(4, 6), torch.finfo(torch.float32).min),
        float_mask(dtype=torch.float32),
        torch.zeros(4, 6),
    ):
        attend(q, k, v, additive)


@pytest.mark.parametrize("attend", [qkv.attention, qkv.fused_attention])
@pytest.mark.parametrize("layout", [torch.jagged, torch.strided])
def test_a_nested_tensor_is_refused_naming_the_argument(attend, layout):
    # Before: AttributeError 'NestedIntNode' (jagged) or RuntimeError (strided) from torch's internals.
    # Two sequences of 4 and 6 tokens, h = 3, d_k = 5; the ragged axis first (torch 2.4's jagged layout)
    ragged = [torch.randn(4, 3, 5), torch.randn(6, 3, 5)]
    with warnings.catch_warnings():  # torch calls its strided layout a prototype
        warnings.simplefilter("ignore", UserWarning)
        nested = torch.nested.nested_tensor(ragged, layout=layout)
    dense = torch.randn(2, 3, 6, 5)
    for position, name in enumerate(("query", "key", "value")):
        args = [dense, dense, dense]
        args[position] = nested
        with pytest.raises(TypeError, match=rf"{name} is a nested tensor \(torch\.nested\).*pad"):
            attend(*args)


@pytest.mark.parametrize("attend", [qkv.attention, qkv.fused_attention])
@pytest.mark.parametrize("shape", [(6,), ()])
def test_a_mask_of_fewer_than_two_dimensions_is_refused_by_both_paths(attend, shape):
    # Before, the explicit path broadcast a 1-D mask while the fused one crashed inside torch.
    q, k, v = qkv_tensors(dtype=torch.float32)
    with pytest.raises(ValueError, match=r"mask must have at least 2 dimensions \(\.\.\., T, S\)"):
        attend(q, k, v, torch.ones(shape, dtype=torch.bool))
    module = qkv.MultiHeadAttention(5, 1)
    with pytest.raises(ValueError, match="mask must have at least 2 dimensions"):
        module(q[:, 0], mask=torch.ones(shape, dtype=torch.bool))


def test_a_mask_on_another_device_is_named():
    q, k, v = qkv_tensors(dtype=torch.float32)
    elsewhere = torch.ones(4, 6, dtype=torch.bool, device="meta")
    with pytest.raises(ValueError, match="mask is on meta, but query is on cpu"):
        qkv.attention(q, k, v, elsewhere)
    with pytest.raises(ValueError, match="mask is on meta, but query is on cpu"):
        qkv.MultiHeadAttention(5, 1)(q[:, 0], mask=elsewhere[:, :4])


# --- Additive masks, is_causal, dropout: the same meaning as F.scaled_dot_product_attention ---


def float_mask(T=4, S=6, seed=1, dtype=torch.float64):
    g = torch.Generator().manual_seed(seed)
    mask = torch.randn(T, S, generator=g, dtype=dtype)  # (T, S): a learned bias, say
    mask[0, 2] = mask[3, 0] = float("-inf")  # and a few blocked pairs
    return mask


@pytest.mark.parametrize("attend", ["explicit", "fused"])
def test_a_floating_mask_is_added_to_the_scores_as_in_sdpa_and_gets_its_gradient(attend):
    q, k, v = (t.requires_grad_() for t in qkv_tensors())
    mask = float_mask().requires_grad_()
    if attend == "explicit":
        output, weights = qkv.attention(q, k, v, mask)
        assert torch.equal(weights[..., 0, 2], torch.zeros(2, 3, dtype=torch.float64))
    else:
        output = qkv.fused_attention(q, k, v, mask)
    upstream = torch.randn_like(output)
    ours = torch.autograd.grad(output, (q, k, v, mask), upstream)
    expected_output = F.scaled_dot_product_attention(q, k, v, attn_mask=mask)
    expected = torch.autograd.grad(expected_output, (q, k, v, mask), upstream)
    torch.testing.assert_close(output, expected_output)
    for a, b in zip(ours, expected, strict=True):
        torch.testing.assert_close(a, b)
    assert mask.grad is None and ours[3].abs().sum() > 0  # ALiBi-style biases can be learned


@pytest.mark.parametrize("kind", ["boolean", "floating"])
def test_a_row_with_no_allowed_key_is_zero_with_finite_gradients_on_both_paths(kind):
    q, k, v = (t.requires_grad_() for t in qkv_tensors())
    allowed = torch.ones(4, 6, dtype=torch.bool)
    allowed[1] = False  # query 1 may attend to nothing
    mask = allowed if kind == "boolean" else qkv.additive_mask(allowed, torch.float64)
    explicit, weights = qkv.attention(q, k, v, mask)
    fused = qkv.fused_attention(q, k, v, mask)
    for output in (explicit, fused):
        assert torch.equal(output[:, :, 1], torch.zeros(2, 3, 7, dtype=torch.float64))
    assert torch.equal(weights[:, :, 1], torch.zeros(2, 3, 6, dtype=torch.float64))
    grads = [torch.autograd.grad(out.sum(), (q, k, v)) for out in (explicit, fused)]
    for a, b in zip(*grads, strict=True):
        assert torch.isfinite(a).all()
        torch.testing.assert_close(a, b)


def naive_sdpa(query, key, value, attn_mask=None, dropout_p=0.0, is_causal=False, scale=None):
    """F.scaled_dot_product_attention as torch before 2.5 computed it: NaN for a row with no key."""
    assert dropout_p == 0.0 and not is_causal
    scores = query @ key.transpose(-2, -1) * (scale or query.shape[-1] ** -0.5)
    if attn_mask is not None:
        scores = scores + (
            qkv.additive_mask(attn_mask, scores.dtype) if attn_mask.dtype == torch.bool else attn_mask
        )
    return torch.softmax(scores, dim=-1) @ value


@pytest.mark.parametrize("kind", ["boolean", "floating"])
def test_the_fused_path_guards_empty_rows_where_sdpa_gives_nan(monkeypatch, kind):
    """On torch < 2.5 (and devices other than CPU and CUDA) SDPA returns NaN for a query with no
    allowed key; zeroing the output afterwards leaves the NaN in the backward pass. qkv lets such
    rows attend everywhere inside the kernel, then zeroes them: finite, correct gradients."""
    import importlib

    module = importlib.import_module("qkv.attention")  # the module, not the function qkv.attention
    monkeypatch.setattr(F, "scaled_dot_product_attention", naive_sdpa)
    q, k, v = (t.requires_grad_() for t in qkv_tensors())
    allowed = torch.ones(4, 6, dtype=torch.bool)
    allowed[2] = False
    mask = allowed if kind == "boolean" else qkv.additive_mask(allowed, torch.float64)
    explicit = qkv.attention(q, k, v, mask)[0]
    expected = torch.autograd.grad(explicit.sum(), (q, k, v))

    monkeypatch.setattr(module, "SDPA_ZEROES_EMPTY_ROWS", True)  # trust the kernel: NaN
    unguarded = qkv.fused_attention(q, k, v, mask)
    assert unguarded[:, :, 2].isnan().all() and unguarded[:, :, [0, 1, 3]].isfinite().all()
    # Zeroing the output afterwards, as qkv once did, mends the forward pass but not the backward.
    zeroed_after = unguarded.masked_fill(~allowed.any(-1, keepdim=True), 0.0)
    assert zeroed_after.isfinite().all()
    assert torch.autograd.grad(zeroed_after.sum(), q)[0].isnan().any()

    monkeypatch.setattr(module, "SDPA_ZEROES_EMPTY_ROWS", False)  # as on torch < 2.5
    guarded = qkv.fused_attention(q, k, v, mask)
    torch.testing.assert_close(guarded, explicit)
    for a, b in zip(torch.autograd.grad(guarded.sum(), (q, k, v)), expected, strict=True):
        torch.testing.assert_close(a, b)


@pytest.mark.parametrize("T, S", [(4, 4), (3, 7), (1, 5)])
def test_is_causal_is_the_bottom_right_causal_mask_on_both_paths(T, S):
    q, k, v = qkv_tensors(T=T, S=S)
    expected_output, expected_weights = qkv.attention(q, k, v, qkv.causal_mask(T, S))
    output, weights = qkv.attention(q, k, v, is_causal=True)
    torch.testing.assert_close(output, expected_output)
    torch.testing.assert_close(weights, expected_weights)
    torch.testing.assert_close(qkv.fused_attention(q, k, v, is_causal=True), expected_output)
    torch_causal = F.scaled_dot_product_attention(q, k, v, is_causal=True)  # aligned top left
    if T == S:
        torch.testing.assert_close(torch_causal, expected_output)
    else:  # qkv's last query sees every key; torch's sees only the first T
        assert not torch.allclose(torch_causal[..., -1, :], expected_output[..., -1, :])
        torch.testing.assert_close(
            torch_causal[..., -1, :], qkv.attention(q, k[..., :T, :], v[..., :T, :])[0][..., -1, :]
        )


def test_is_causal_combines_with_a_mask():
    q, k, v = qkv_tensors(T=4, S=6)
    padding = qkv.padding_mask([5, 3], 6)[:, :, 0]  # (B, 1, S) -> broadcast (B, 1, 1, S) below
    mask = padding[:, None]  # (B, 1, 1, S)
    combined = mask & qkv.causal_mask(4, 6)
    for path in (
        lambda **kw: qkv.attention(q, k, v, **kw)[0],
        lambda **kw: qkv.fused_attention(q, k, v, **kw),
    ):
        torch.testing.assert_close(path(mask=mask, is_causal=True), path(mask=combined))
        additive = qkv.additive_mask(mask, torch.float64)
        torch.testing.assert_close(path(mask=additive, is_causal=True), path(mask=combined))


def test_dropout_p_drops_weights_after_the_softmax():
    q, k, v = qkv_tensors()
    torch.manual_seed(3)
    output, weights = qkv.attention(q, k, v, dropout_p=0.4)
    torch.manual_seed(3)
    torch.testing.assert_close(output, F.dropout(weights, p=0.4) @ v)
    torch.testing.assert_close(weights.sum(-1), torch.ones(2, 3, 4, dtype=torch.float64))  # before dropout
    assert not torch.allclose(qkv.fused_attention(q, k, v, dropout_p=0.4), qkv.attention(q, k, v)[0])
    torch.testing.assert_close(qkv.fused_attention(q, k, v, dropout_p=0.0), qkv.attention(q, k, v)[0])


@pytest.mark.parametrize("attend", [qkv.attention, qkv.fused_attention])
def test_bad_new_arguments_are_named(attend):
    q, k, v = qkv_tensors()
    with pytest.raises(TypeError, match="is_causal must be True or False, got int"):
        attend(q, k, v, is_causal=1)
    with pytest.raises(
        ValueError, match=r"is_causal=True needs at least as many keys as queries, got T=4 .* S=3"
    ):
        attend(q, k[..., :3, :], v[..., :3, :], is_causal=True)
    with pytest.raises(ValueError, match=r"dropout_p must be in \[0, 1\), got 1.0"):
        attend(q, k, v, dropout_p=1.0)
    with pytest.raises(TypeError, match="dropout_p must be a float, got str"):
        attend(q, k, v, dropout_p="0.1")


@pytest.mark.parametrize("attend", [qkv.attention, qkv.fused_attention])
def test_scale_is_checked(attend):
    q, k, v = qkv_tensors()
    with pytest.raises(TypeError, match="scale must be a float or None, got str"):
        attend(q, k, v, scale="a")
    for bad in (float("nan"), 0.0, -1.0, float("inf")):
        with pytest.raises(ValueError, match="scale must be a finite positive number"):
            attend(q, k, v, scale=bad)
    import numpy as np

    torch.testing.assert_close(
        attend(q, k, v, scale=np.float32(0.5), dropout_p=np.float32(0.0)), attend(q, k, v, scale=0.5)
    )
