"""The fused and per-head multi-head modules: one function, two layouts, two paths."""

from __future__ import annotations

import pytest
import torch
from torch import nn

import qkv

MODULES = [qkv.MultiHeadAttention, qkv.PerHeadMultiHeadAttention]
# Non-square on purpose: 3 heads, kdim != vdim != embed_dim, T != S.
B, T, S, E, KDIM, VDIM, H = 2, 4, 6, 12, 10, 7, 3


def inputs(dtype=torch.float64, seed=0):
    g = torch.Generator().manual_seed(seed)
    return (
        torch.randn(B, T, E, generator=g, dtype=dtype),  # (B, T, embed_dim)
        torch.randn(B, S, KDIM, generator=g, dtype=dtype),  # (B, S, kdim)
        torch.randn(B, S, VDIM, generator=g, dtype=dtype),  # (B, S, vdim)
    )


def pair(dtype=torch.float64, **sizes):
    torch.manual_seed(0)
    fused = qkv.MultiHeadAttention(E, H, kdim=KDIM, vdim=VDIM, **sizes).to(dtype)
    return fused, qkv.PerHeadMultiHeadAttention.from_heads(fused.to_heads())


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize(
    "mask", [None, qkv.causal_mask(T, S), qkv.padding_mask([6, 3])], ids=["none", "causal", "pad"]
)
def test_fused_and_per_head_agree_outputs_weights_and_gradients(dtype, mask):
    fused, per_head = pair(dtype)
    tol = {"atol": 1e-5, "rtol": 1e-5} if dtype == torch.float32 else {"atol": 1e-12, "rtol": 1e-12}
    results = []
    for module in (fused, per_head):
        x, k, v = (t.requires_grad_() for t in inputs(dtype))
        output, weights = module(x, k, v, mask=mask, need_weights=True)
        fast = module(x, k, v, mask=mask)
        torch.testing.assert_close(fast, output, **tol)  # both paths, one meaning
        (output.square().sum() + fast.sum()).backward()
        results.append((output, weights, x.grad, k.grad, v.grad))
    for a, b in zip(*results, strict=True):
        torch.testing.assert_close(a, b, **tol)
    # Parameter gradients agree once cut into heads the same way: fused rows [i·d_k, (i+1)·d_k) are head i.
    for name in ("q_proj", "k_proj", "v_proj"):
        fused_grad = getattr(fused, name).weight.grad.view(H, E // H, -1)  # (h, d_k, in)
        per_head_grad = torch.stack([getattr(head, name).weight.grad for head in per_head.heads])
        torch.testing.assert_close(fused_grad, per_head_grad, **tol)
    torch.testing.assert_close(fused.out_proj.weight.grad, per_head.out_proj.weight.grad, **tol)
    assert sum(p.numel() for p in fused.parameters()) == sum(p.numel() for p in per_head.parameters())


def test_agrees_with_the_papers_equations():
    fused, _ = pair()
    x, k, v = inputs()
    expected, expected_weights = qkv.multi_head_attention(x, k, v, fused.to_heads(), qkv.causal_mask(T, S))
    output, weights = fused(x, k, v, mask=qkv.causal_mask(T, S), need_weights=True)
    torch.testing.assert_close(output, expected)
    torch.testing.assert_close(weights, expected_weights)


@pytest.mark.parametrize("module_class", MODULES)
def test_to_heads_and_from_heads_round_trip(module_class):
    torch.manual_seed(1)
    module = module_class(E, H, kdim=KDIM, vdim=VDIM, d_k=5, d_v=2).double()
    rebuilt = module_class.from_heads(module.to_heads())
    x, k, v = inputs()
    torch.testing.assert_close(rebuilt(x, k, v), module(x, k, v))
    hw = module.to_heads()
    assert (hw.d_k, hw.d_v) == (5, 2) and hw.w_o.shape == (6, E)
    # to_heads returns copies: changing them leaves the module alone.
    hw.w_q.zero_()
    assert module.to_heads().w_q.abs().sum() > 0


@pytest.mark.parametrize("module_class", MODULES)
def test_without_bias(module_class):
    module = module_class(E, H, bias=False).double()
    assert all(m.bias is None for m in module.modules() if isinstance(m, nn.Linear))
    hw = module.to_heads()
    assert not hw.bias
    x, _, _ = inputs()
    torch.testing.assert_close(qkv.MultiHeadAttention.from_heads(hw)(x), module(x))


@pytest.mark.parametrize("module_class", MODULES)
def test_key_defaults_to_query_and_value_to_key(module_class):
    module = module_class(E, H).double()
    x, _, _ = inputs()
    torch.testing.assert_close(module(x), module(x, x, x))
    other = torch.randn(B, S, E, dtype=torch.float64)
    torch.testing.assert_close(module(x, other), module(x, other, other))


def test_heads_are_independent():
    fused, _ = pair()
    x, k, v = inputs()
    _, before = fused(x, k, v, need_weights=True)
    with torch.no_grad():
        fused.q_proj.weight[4:8] += 1.0  # rows of head 1's W_1^Q (d_k = 4)
    _, after = fused(x, k, v, need_weights=True)
    torch.testing.assert_close(after[:, [0, 2]], before[:, [0, 2]])
    assert not torch.allclose(after[:, 1], before[:, 1])


def test_dropout_only_in_training_and_weights_still_sum_to_one():
    torch.manual_seed(0)
    module = qkv.MultiHeadAttention(E, H, dropout=0.5)
    x = torch.randn(B, T, E)
    module.eval()
    torch.testing.assert_close(module(x), module(x))
    module.train()
    assert not torch.allclose(module(x), module(x))
    _, weights = module(x, need_weights=True)
    torch.testing.assert_close(weights.sum(-1), torch.ones(B, H, T))


def test_repr_names_the_sizes():
    text = repr(qkv.MultiHeadAttention(E, H, kdim=KDIM, vdim=VDIM, dropout=0.1))
    assert "embed_dim=12, num_heads=3, kdim=10, vdim=7, d_k=4, d_v=4, dropout=0.1" in text


@pytest.mark.parametrize("module_class", MODULES)
def test_constructor_errors(module_class):
    with pytest.raises(ValueError, match="embed_dim=10 is not divisible by num_heads=3"):
        module_class(10, 3)
    with pytest.raises(ValueError, match="num_heads must be positive, got 0"):
        module_class(12, 0)
    with pytest.raises(ValueError, match="num_heads must be positive, got -2"):
        module_class(12, -2)
    with pytest.raises(TypeError, match="num_heads must be an int, got float"):
        module_class(12, 3.0)
    with pytest.raises(ValueError, match=r"dropout must be in \[0, 1\), got 1.5"):
        module_class(12, 3, dropout=1.5)


@pytest.mark.parametrize("module_class", MODULES)
def test_forward_errors_name_the_argument_and_the_shapes(module_class):
    module = module_class(E, H, kdim=KDIM, vdim=VDIM)
    x, k, v = inputs(torch.float32)
    cases = [
        ((torch.randn(B, T, 15), k, v), ValueError, r"query has 15 features, but embed_dim is 12"),
        ((x, torch.randn(B, S, 16), v), ValueError, r"key has 16 features, but kdim is 10"),
        ((x, k, torch.randn(B, S, 8)), ValueError, r"value has 8 features, but vdim is 7"),
        ((x, k, v[:, :5]), ValueError, r"value has 5 positions, but the key's length S is 6"),
        ((x, k[:1], v[:1]), ValueError, r"key has 1 sequences in the batch, but the query's batch size is 2"),
        ((x[0], k, v), ValueError, r"query must have 3 dimensions \(B, T, embed_dim\), got shape \(4, 12\)"),
        ((x.double(), k, v), TypeError, r"query has dtype torch.float64, but the module's parameters are"),
        ((x.long(), k, v), TypeError, r"query must be a floating-point tensor"),
    ]
    for args, error, message in cases:
        with pytest.raises(error, match=message):
            module(*args)
    with pytest.raises(TypeError, match="mask must be boolean"):
        module(x, k, v, mask=torch.ones(T, S))
    with pytest.raises(
        ValueError, match=r"mask of shape \(2, 6\) does not broadcast .* \(B, h, T, S\) = \(2, 3, 4, 6\)"
    ):
        module(x, k, v, mask=torch.ones(B, S, dtype=torch.bool))


def test_from_heads_rejects_mismatched_weights():
    module = qkv.MultiHeadAttention(E, H)
    with pytest.raises(ValueError, match=r"weights have .* but this module has"):
        module.load_heads(qkv.HeadWeights.random(E, 4))
    with pytest.raises(TypeError, match="weights must be a HeadWeights"):
        qkv.MultiHeadAttention.from_heads(module.state_dict())


def test_attention_head_is_one_head_of_the_per_head_module():
    _, per_head = pair()
    x, k, v = inputs()
    _, weights = per_head(x, k, v, need_weights=True)
    _, head_weights = per_head.heads[2](x, k, v)
    torch.testing.assert_close(head_weights, weights[:, 2])


@pytest.mark.parametrize("module_class", MODULES)
def test_a_3d_mask_is_refused_as_ambiguous(module_class):
    module = module_class(E, H)  # B = h = 3: a (B, T, S) mask would broadcast as (h, T, S)
    x = torch.randn(3, T, E)
    keras_style = torch.ones(3, T, T, dtype=torch.bool)
    with pytest.raises(ValueError, match=r"mask has 3 dimensions \(3, 4, 4\), which is ambiguous"):
        module(x, mask=keras_style)
    torch.testing.assert_close(module(x, mask=keras_style[:, None]), module(x))  # the fix it suggests


@pytest.mark.parametrize("module_class", MODULES)
@pytest.mark.parametrize("need_weights", [True, False])
def test_a_sequence_with_no_allowed_key_gives_finite_outputs_and_gradients(module_class, need_weights):
    module = module_class(E, H, kdim=KDIM, vdim=VDIM).double()
    x, k, v = (t.requires_grad_() for t in inputs())
    mask = qkv.padding_mask([0, 3], S)  # sequence 0 may attend to nothing
    result = module(x, k, v, mask=mask, need_weights=need_weights)
    output = result[0] if need_weights else result
    # No allowed key: every head's output is zero, so the layer returns out_proj's bias.
    torch.testing.assert_close(output[0], module.out_proj.bias.expand(T, E))
    output.sum().backward()
    assert all(torch.isfinite(t.grad).all() for t in (x, k, v))
    if need_weights:
        assert torch.equal(result[1][0], torch.zeros(H, T, S, dtype=torch.float64))


def test_sizes_accept_numpy_integers_and_flags_must_be_bools():
    import numpy as np

    module = qkv.MultiHeadAttention(np.int64(E), np.int64(H))
    assert (module.embed_dim, module.num_heads) == (E, H) and type(module.embed_dim) is int
    with pytest.raises(TypeError, match="need_weights must be True or False, got str"):
        module(torch.randn(B, T, E), need_weights="yes")
    with pytest.raises(TypeError, match="bias must be True or False, got int"):
        qkv.MultiHeadAttention(E, H, bias=1)
