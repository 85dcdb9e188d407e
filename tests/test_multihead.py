"""The fused and per-head multi-head modules: one function, two layouts, two paths."""

from __future__ import annotations

import warnings

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
        fast, no_weights = module(x, k, v, mask=mask)
        assert no_weights is None
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
    torch.testing.assert_close(module(x)[0], module(x)[0])
    module.train()
    assert not torch.allclose(module(x)[0], module(x)[0])
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
        ((x[0, 0], k, v), ValueError, r"query must have 3 dimensions \(B, T, embed_dim\), got shape \(12,\)"),
        ((x[0], k, v), ValueError, r"key must have 2 dimensions \(S, kdim\), as the query is unbatched"),
        (
            (x.double(), k.double(), v.double()),
            TypeError,
            r"query has dtype torch.float64, but the module's parameter ",
        ),
        ((x.long(), k, v), TypeError, r"query must be a floating-point tensor"),
    ]
    for args, error, message in cases:
        with pytest.raises(error, match=message):
            module(*args)
    with pytest.raises(TypeError, match=r"mask must be boolean .* or floating"):
        module(x, k, v, mask=torch.ones(T, S, dtype=torch.long))
    with pytest.raises(TypeError, match=r"mask has dtype torch\.float64, but query has dtype torch\.float32"):
        module(x, k, v, mask=torch.zeros(T, S, dtype=torch.float64))
    with pytest.raises(
        ValueError, match=r"mask of shape \(2, 6\) does not broadcast .* \(B, h, T, S\) = \(2, 3, 4, 6\)"
    ):
        module(x, k, v, mask=torch.ones(B, S, dtype=torch.bool))


# --- Silent traps, closed: each ran before and gave a wrong answer -----------------------------


@pytest.mark.parametrize("module_class", MODULES)
def test_a_float_mask_of_zeros_and_ones_is_refused_by_forward(module_class):
    module = module_class(E, H).double()
    x = inputs()[0]
    blocked = torch.ones(T, T).bool().triu(1)  # (T, T): True = blocked
    for mask in ((~blocked).double(), torch.ones(T, T, dtype=torch.float64)):
        with pytest.raises(TypeError, match=r"mask holds only 0 and 1 as floats: .* pass mask\.bool\(\)"):
            module(x, mask=mask)
    hf_attention_mask = torch.tensor([[1, 1, 1, 0], [1, 1, 1, 1]])  # (B, S): 1 = real token
    with pytest.raises(
        TypeError,
        match=r"key_padding_mask holds only 0 and 1 as floats: .* pass attention_mask == 0",
    ):
        module(x, key_padding_mask=hf_attention_mask.double())
    # The fixes the messages name:
    expected = module(x, mask=hf_attention_mask.bool()[:, None, None, :], need_weights=True)
    fixed = module(x, key_padding_mask=hf_attention_mask == 0, need_weights=True)
    torch.testing.assert_close(fixed, expected)
    causal = module(x, is_causal=True, need_weights=True)
    torch.testing.assert_close(module(x, mask=(~blocked).double().bool(), need_weights=True), causal)


@pytest.mark.parametrize("module_class", MODULES)
def test_qkv_padding_mask_as_key_padding_mask_is_refused_pointing_to_mask(module_class):
    # qkv.padding_mask is True for real keys; torch's key_padding_mask is True for padding.
    module = module_class(E, H, kdim=KDIM, vdim=VDIM)
    x, k, v = inputs(torch.float32)
    keep = qkv.padding_mask([6, 3])  # (B, 1, 1, S)
    message = r"the shape of qkv\.padding_mask\(lengths\), which is True for the real keys: pass it as mask="
    with pytest.raises(ValueError, match=message):
        module(x, k, v, key_padding_mask=keep)
    torch.testing.assert_close(module(x, k, v, key_padding_mask=~keep[:, 0, 0]), module(x, k, v, mask=keep))


@pytest.mark.parametrize("module_class", MODULES)
@pytest.mark.parametrize("layout", [torch.jagged, torch.strided])
def test_a_nested_tensor_is_refused_by_forward_naming_the_argument(module_class, layout):
    # Before: AttributeError 'NestedIntNode' object has no attribute 'add' (jagged), RuntimeError (strided).
    module = module_class(E, H)
    with warnings.catch_warnings():  # torch calls its strided layout a prototype
        warnings.simplefilter("ignore", UserWarning)
        nested = torch.nested.nested_tensor([torch.randn(3, E), torch.randn(5, E)], layout=layout)
        nested_mask = torch.nested.nested_tensor([torch.ones(5, 5, dtype=torch.bool)] * 2)
    with pytest.raises(TypeError, match=r"query is a nested tensor \(torch\.nested\).*pad_sequence"):
        module(nested)
    # The advice in the message, which works on every layout from torch 2.4 (whose jagged
    # layout has no to_padded_tensor)
    padded = torch.nn.utils.rnn.pad_sequence(list(nested.unbind()), batch_first=True)  # (B, 5, E)
    with pytest.raises(TypeError, match=r"key is a nested tensor"):
        module(padded, nested, padded)
    with pytest.raises(TypeError, match=r"mask is a nested tensor"):
        module(padded, mask=nested_mask)


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
    output, weights = module(x, k, v, mask=mask, need_weights=need_weights)
    # No allowed key: every head's output is zero, so the layer returns out_proj's bias.
    torch.testing.assert_close(output[0], module.out_proj.bias.expand(T, E))
    output.sum().backward()
    assert all(torch.isfinite(t.grad).all() for t in (x, k, v))
    if need_weights:
        assert torch.equal(weights[0], torch.zeros(H, T, S, dtype=torch.float64))


def test_sizes_accept_numpy_integers_and_flags_must_be_bools():
    import numpy as np

    module = qkv.MultiHeadAttention(np.int64(E), np.int64(H))
    assert (module.embed_dim, module.num_heads) == (E, H) and type(module.embed_dim) is int
    with pytest.raises(TypeError, match="need_weights must be True or False, got str"):
        module(torch.randn(B, T, E), need_weights="yes")
    with pytest.raises(TypeError, match="bias must be True or False, got int"):
        qkv.MultiHeadAttention(E, H, bias=1)


# --- A drop-in for torch.nn.MultiheadAttention: same weights, torch's arguments, torch's answers ---


def torch_pair(batch_first=True, dtype=torch.float64, **sizes):
    """torch's module and qkv's, holding the same weights (3 heads, kdim != vdim != embed_dim)."""
    torch.manual_seed(0)
    sizes = {"kdim": KDIM, "vdim": VDIM, **sizes}
    reference = nn.MultiheadAttention(E, H, batch_first=batch_first, **sizes)
    reference = reference.to(dtype).eval()
    ours = qkv.MultiHeadAttention.from_heads(qkv.interop.from_torch(reference), batch_first=batch_first)
    return reference, ours.eval()


def key_padding(dtype=torch.float64):
    pad = torch.zeros(B, S, dtype=torch.bool)
    pad[0, 4:] = True  # the first sequence has 4 real keys, the second 6
    additive = torch.zeros(B, S, dtype=dtype).masked_fill(pad, float("-inf"))
    return pad, additive


@pytest.mark.parametrize("batch_first", [True, False])
@pytest.mark.parametrize("padding", ["none", "bool", "float"])
@pytest.mark.parametrize("attn", ["none", "bool", "float"])
@pytest.mark.parametrize("average", [True, False])
def test_agrees_with_torch_multiheadattention_on_torchs_arguments(batch_first, padding, attn, average):
    reference, ours = torch_pair(batch_first)
    x, k, v = inputs()
    if not batch_first:  # torch's default layout: (T, B, E)
        x, k, v = x.transpose(0, 1), k.transpose(0, 1), v.transpose(0, 1)
    pad = {"none": None, "bool": key_padding()[0], "float": key_padding()[1]}[padding]
    g = torch.Generator().manual_seed(2)
    blocked = torch.rand(T, S, generator=g) < 0.3  # torch: True = blocked
    bias = torch.randn(T, S, generator=g, dtype=torch.float64)
    torch_attn = {"none": None, "bool": blocked, "float": bias}[attn]
    qkv_mask = {"none": None, "bool": qkv.from_torch_mask(blocked), "float": bias}[attn]
    with warnings.catch_warnings():  # torch deprecates a boolean mask beside a float one; qkv takes both
        warnings.simplefilter("ignore", UserWarning)
        expected, expected_weights = reference(
            x, k, v, key_padding_mask=pad, attn_mask=torch_attn, average_attn_weights=average
        )
    output, weights = ours(
        x, k, v, mask=qkv_mask, key_padding_mask=pad, need_weights=True, average_attn_weights=average
    )
    fast, no_weights = ours(x, k, v, mask=qkv_mask, key_padding_mask=pad)
    torch.testing.assert_close(output, expected)
    torch.testing.assert_close(fast, expected)
    torch.testing.assert_close(weights, expected_weights)
    assert no_weights is None and weights.shape == ((B, T, S) if average else (B, H, T, S))


def torch_attn_mask(kind, batch=B, dtype=torch.float64, seed=3):
    """An attn_mask in torch's convention, each query keeping key 0 (torch gives NaN for none)."""
    g = torch.Generator().manual_seed(seed)
    lead = (batch * H,) if kind.endswith("3d") else ()  # torch's row b·h + i: sequence b, head i
    blocked = torch.rand(*lead, T, S, generator=g) < 0.4  # True = blocked, torch's meaning
    blocked[..., 0] = False
    if kind.startswith("bool"):
        return blocked
    bias = torch.randn(*lead, T, S, generator=g, dtype=dtype)  # an additive mask: a bias, -inf blocks
    return bias.masked_fill(blocked, float("-inf"))


@pytest.mark.parametrize("module_class", MODULES)
@pytest.mark.parametrize("batch_first", [True, False])
@pytest.mark.parametrize("kind", ["bool 2d", "float 2d", "bool 3d", "float 3d"])
@pytest.mark.parametrize("padding", [False, True])
def test_attn_mask_has_torchs_meaning(module_class, batch_first, kind, padding):
    reference, fused = torch_pair(batch_first)
    ours = module_class.from_heads(fused.to_heads(), batch_first=batch_first).eval()
    x, k, v = inputs()
    if not batch_first:
        x, k, v = x.transpose(0, 1), k.transpose(0, 1), v.transpose(0, 1)
    attn_mask = torch_attn_mask(kind)
    pad = key_padding()[0 if kind.startswith("bool") else 1] if padding else None
    expected, expected_weights = reference(
        x, k, v, attn_mask=attn_mask, key_padding_mask=pad, average_attn_weights=False
    )
    output, weights = ours(x, k, v, attn_mask=attn_mask, key_padding_mask=pad, need_weights=True)
    fast, _ = ours(x, k, v, attn_mask=attn_mask, key_padding_mask=pad)
    torch.testing.assert_close(output, expected)
    torch.testing.assert_close(fast, expected)
    torch.testing.assert_close(weights, expected_weights)


@pytest.mark.parametrize("module_class", MODULES)
def test_a_torch_style_mask_needs_no_inverting_by_hand(module_class):
    # Passed as mask=, torch's boolean mask (True = blocked) is qkv's inverted; attn_mask= reads it
    # as torch does. Before, attn_mask= was a TypeError naming the private class _MultiHeadBase.
    module = module_class(E, H).double()
    x = torch.randn(1, 5, E, dtype=torch.float64)
    blocked = torch.ones(5, 5).bool().triu(1)  # torch's causal mask
    _, inverted = module(x, mask=blocked, need_weights=True)
    assert inverted[0, :, 0, 1:].min() > 0 and inverted[0, :, -1].sum() == 0  # the trap, as before
    _, weights = module(x, attn_mask=blocked, need_weights=True)
    torch.testing.assert_close(weights, module(x, is_causal=True, need_weights=True)[1])
    assert weights[0, :, 0, 1:].abs().max() == 0  # query 0 sees key 0 only
    with pytest.raises(ValueError, match=r"pass mask= \(qkv's convention: True = may attend\) or attn_mask="):
        module(x, mask=~blocked, attn_mask=blocked)


@pytest.mark.parametrize("module_class", MODULES)
def test_bad_attn_masks_are_named(module_class):
    module = module_class(E, H, kdim=KDIM, vdim=VDIM)
    x, k, v = inputs(torch.float32)
    cases = [
        (
            torch.zeros(S, T, dtype=torch.bool),
            ValueError,
            r"attn_mask must have shape \(T, S\) = \(4, 6\) or \(B·h, T, S\) = \(6, 4, 6\), .* got \(6, 4\)",
        ),
        (torch.zeros(B, T, S, dtype=torch.bool), ValueError, r"attn_mask must have shape .* got \(2, 4, 6\)"),
        (torch.zeros(T, S, dtype=torch.long), TypeError, r"attn_mask must be boolean \(True = blocked"),
        (torch.zeros(T, S, dtype=torch.float64), TypeError, r"attn_mask has dtype torch\.float64, but query"),
        (torch.ones(T, S), TypeError, r"attn_mask holds only 0 and 1 as floats: .* pass attn_mask == 0"),
        ([[False] * S] * T, TypeError, r"attn_mask must be a torch\.Tensor .* got list"),
    ]
    for attn_mask, error, message in cases:
        with pytest.raises(error, match=message):
            module(x, k, v, attn_mask=attn_mask)


@pytest.mark.parametrize("module_class", MODULES)
@pytest.mark.parametrize("batch_first", [True, False])
@pytest.mark.parametrize("masks", ["none", "padding", "attn 2d", "attn 3d"])
def test_unbatched_input_as_torch_takes_it(module_class, batch_first, masks):
    reference, fused = torch_pair(batch_first)
    ours = module_class.from_heads(fused.to_heads(), batch_first=batch_first).eval()
    x, k, v = (t[1] for t in inputs())  # (T, E), (S, kdim), (S, vdim): one sequence, unbatched
    arguments = {
        "none": {},
        "padding": {"key_padding_mask": key_padding()[0][0]},  # (S,)
        "attn 2d": {"attn_mask": torch_attn_mask("bool 2d")},  # (T, S)
        "attn 3d": {"attn_mask": torch_attn_mask("float 3d", batch=1)},  # (h, T, S)
    }[masks]
    for average in (True, False):
        expected, expected_weights = reference(x, k, v, average_attn_weights=average, **arguments)
        output, weights = ours(x, k, v, need_weights=True, average_attn_weights=average, **arguments)
        torch.testing.assert_close(output, expected)  # (T, E)
        torch.testing.assert_close(weights, expected_weights)  # (T, S) or (h, T, S)
    fast, no_weights = ours(x, k, v, **arguments)
    torch.testing.assert_close(fast, expected)
    assert fast.shape == (T, E) and no_weights is None


def test_unbatched_input_errors_show_the_shapes_as_passed():
    module = qkv.MultiHeadAttention(E, H, kdim=KDIM, vdim=VDIM)
    x, k, v = (t[0] for t in inputs(torch.float32))
    cases = [
        ((torch.randn(T, 15), k, v), {}, r"query has 15 features, but embed_dim is 12 .* \(4, 15\)\)"),
        ((x, k, torch.randn(S, 8)), {}, r"value has 8 features, but vdim is 7 \(value has shape \(6, 8\)\)"),
        (
            (x, k, v),
            {"key_padding_mask": torch.zeros(1, S, dtype=torch.bool)},
            r"key_padding_mask must have shape \(S,\) for an unbatched query, got \(1, 6\)",
        ),
    ]
    for args, keywords, message in cases:
        with pytest.raises(ValueError, match=message):
            module(*args, **keywords)
    cache = module.new_cache(batch_size=1, max_length=8)  # a batch of one: unbatched decoding works too
    with torch.no_grad():
        steps = [module(x[t : t + 1], k[t : t + 1], v[t : t + 1], cache=cache)[0] for t in range(T)]
        full, _ = module(x, k[:T], v[:T], is_causal=True)
    torch.testing.assert_close(torch.cat(steps), full, atol=1e-6, rtol=1e-5)


def test_is_causal_agrees_with_torch_when_T_equals_S():
    reference, ours = torch_pair(kdim=E, vdim=E)
    x = inputs()[0]  # self-attention: T == S
    blocked = ~qkv.causal_mask(T)  # torch's is_causal is only a hint: it wants the mask too
    expected, _ = reference(x, x, x, attn_mask=blocked, is_causal=True, need_weights=False)
    for need_weights in (True, False):
        output, _ = ours(x, is_causal=True, need_weights=need_weights)
        torch.testing.assert_close(output, expected)


@pytest.mark.parametrize("module_class", MODULES)
@pytest.mark.parametrize("need_weights", [True, False])
def test_is_causal_is_the_bottom_right_causal_mask(module_class, need_weights):
    module = module_class(E, H, kdim=KDIM, vdim=VDIM).double()
    x, k, v = inputs()  # T = 4 queries, the last 4 of S = 6 positions
    expected = module(x, k, v, mask=qkv.causal_mask(T, S), need_weights=need_weights)
    got = module(x, k, v, is_causal=True, need_weights=need_weights)
    torch.testing.assert_close(got, expected)
    with pytest.raises(ValueError, match=r"is_causal=True needs at least as many keys as queries, got T=6"):
        module(k.new_zeros(B, S, E), k[:, :T], v[:, :T], is_causal=True)


@pytest.mark.parametrize("module_class", MODULES)
def test_the_torch_idiom_out_comma_underscore_cannot_unpack_the_batch(module_class):
    # Before, without need_weights the module returned a bare tensor: with B == 2,
    # `out, _ = mha(x)` quietly split the batch into its two sequences.
    module = module_class(E, H)
    x = torch.randn(2, T, E)
    out, weights = module(x)
    assert out.shape == (2, T, E) and weights is None
    out, weights = module(x, need_weights=True)
    assert out.shape == (2, T, E) and weights.shape == (2, H, T, T)


@pytest.mark.parametrize("module_class", MODULES)
def test_arguments_after_value_are_keyword_only(module_class):
    # torch's fourth positional argument is key_padding_mask (True = padding); qkv's mask
    # means the opposite, so neither may be passed by position.
    module = module_class(E, H)
    x = torch.randn(B, T, E)
    message = rf"{module_class.__name__}\.forward takes .* got 4 positional arguments: .* key_padding_mask="
    with pytest.raises(TypeError, match=message):
        module(x, x, x, torch.zeros(B, T, dtype=torch.bool))


@pytest.mark.parametrize("module_class", MODULES)
def test_sequence_first_layout_is_the_batch_first_one_transposed(module_class):
    module = module_class(E, H, kdim=KDIM, vdim=VDIM).double()
    seq_first = module_class.from_heads(module.to_heads(), batch_first=False)
    x, k, v = inputs()
    expected, expected_weights = module(x, k, v, need_weights=True)
    output, weights = seq_first(x.transpose(0, 1), k.transpose(0, 1), v.transpose(0, 1), need_weights=True)
    torch.testing.assert_close(output, expected.transpose(0, 1))  # (T, B, E)
    torch.testing.assert_close(weights, expected_weights)  # weights stay batch first, as in torch
    assert "batch_first=False" in repr(seq_first)
    with pytest.raises(ValueError, match=r"query must have 3 dimensions \(T, B, embed_dim\)"):
        seq_first(x[0, 0])


@pytest.mark.parametrize("module_class", MODULES)
def test_key_padding_mask_is_torchs_convention_and_combines_with_mask(module_class):
    module = module_class(E, H, kdim=KDIM, vdim=VDIM).double()
    x, k, v = inputs()
    pad, additive = key_padding()
    allowed = ~pad[:, None, None, :] & qkv.causal_mask(T, S)  # (B, 1, T, S)
    expected = module(x, k, v, mask=allowed, need_weights=True)
    torch.testing.assert_close(
        module(x, k, v, mask=qkv.causal_mask(T, S), key_padding_mask=pad, need_weights=True), expected
    )
    torch.testing.assert_close(
        module(x, k, v, key_padding_mask=additive, is_causal=True, need_weights=True), expected
    )


@pytest.mark.parametrize("module_class", MODULES)
def test_bad_key_padding_masks_are_named(module_class):
    module = module_class(E, H, kdim=KDIM, vdim=VDIM)
    x, k, v = inputs(torch.float32)
    cases = [
        (
            torch.zeros(B, S + 1, dtype=torch.bool),
            ValueError,
            r"key_padding_mask must have shape \(B, S\) = \(2, 6\), got \(2, 7\)",
        ),
        (
            torch.zeros(S, B, dtype=torch.bool),
            ValueError,
            r"key_padding_mask must have shape \(B, S\) = \(2, 6\), got \(6, 2\)",
        ),
        (
            torch.zeros(B, S, dtype=torch.long),
            TypeError,
            r"key_padding_mask must be boolean \(True = padding",
        ),
        (
            torch.zeros(B, S, dtype=torch.float64),
            TypeError,
            r"key_padding_mask has dtype torch\.float64, but query",
        ),
        (
            [[False] * S] * B,
            TypeError,
            r"key_padding_mask must be a torch\.Tensor of shape \(B, S\), got list",
        ),
    ]
    for pad, error, message in cases:
        with pytest.raises(error, match=message):
            module(x, k, v, key_padding_mask=pad)


@pytest.mark.parametrize("module_class", MODULES)
def test_average_attn_weights_is_the_mean_over_heads(module_class):
    module = module_class(E, H).double()
    x = inputs()[0]
    _, per_head = module(x, need_weights=True)
    _, averaged = module(x, need_weights=True, average_attn_weights=True)
    torch.testing.assert_close(averaged, per_head.mean(dim=1))


@pytest.mark.parametrize("module_class", MODULES)
def test_bad_flags_are_named(module_class):
    module = module_class(E, H)
    x = torch.randn(B, T, E)
    for flag in ("need_weights", "average_attn_weights", "is_causal"):
        with pytest.raises(TypeError, match=f"{flag} must be True or False, got str"):
            module(x, **{flag: "yes"})
    with pytest.raises(TypeError, match="batch_first must be True or False, got int"):
        module_class(E, H, batch_first=0)
    with pytest.raises(ValueError, match='init must be "linear" or "torch", got \'xavier\''):
        module_class(E, H, init="xavier")


@pytest.mark.parametrize("module_class", MODULES)
@pytest.mark.parametrize("name", ["bias", "weight"])
def test_every_parameter_is_checked_not_only_the_first(module_class, name):
    # Before, only the first parameter's dtype was compared with the input's: a float64
    # bias elsewhere crashed deep inside F.linear.
    module = module_class(E, H)
    x = torch.randn(B, T, E)
    last = module.out_proj
    setattr(last, name, nn.Parameter(getattr(last, name).detach().double()))
    with pytest.raises(
        TypeError,
        match=rf"query has dtype torch\.float32, but the module's parameter out_proj\.{name} has dtype "
        r"torch\.float64",
    ):
        module(x)


@pytest.mark.parametrize("module_class", MODULES)
def test_a_parameter_on_another_device_is_named(module_class):
    module = module_class(E, H)
    module.out_proj.bias = nn.Parameter(torch.zeros(E, device="meta"))
    with pytest.raises(
        ValueError, match=r"query is on cpu, but the module's parameter out_proj\.bias is on meta"
    ):
        module(torch.randn(B, T, E))


def test_autocast_runs_float32_weights_on_lower_precision_inputs_as_torch_does():
    reference, ours = torch_pair(dtype=torch.float32)
    x, k, v = (t.bfloat16() for t in inputs(torch.float32))
    with torch.autocast("cpu", dtype=torch.bfloat16):
        expected, _ = reference(x, k, v, need_weights=False)
        output, _ = ours(x, k, v)
    assert output.dtype == expected.dtype == torch.bfloat16
    torch.testing.assert_close(output, expected, atol=0.05, rtol=0.05)


@pytest.mark.parametrize("module_class", MODULES)
def test_torchscript_is_refused_with_a_plain_message(module_class):
    module = module_class(E, H)
    message = r"does not support TorchScript \(torch\.jit\.script\).*torch\.compile"
    with warnings.catch_warnings():  # recent torch deprecates torch.jit.script itself
        warnings.simplefilter("ignore", DeprecationWarning)
        with pytest.raises(TypeError, match=message):
            torch.jit.script(module)
        with pytest.raises(TypeError, match=message):
            torch.jit.script(nn.Sequential(nn.Linear(E, E), module))  # inside a user's model too


def test_torch_export_traces_the_module():
    module = qkv.MultiHeadAttention(E, H).eval()
    x = torch.randn(B, T, E)
    exported = torch.export.export(module, (x,), kwargs={"is_causal": True})
    torch.testing.assert_close(exported.module()(x, is_causal=True), module(x, is_causal=True))


def test_a_float_mask_compiles_without_a_graph_break():
    # The 0-and-1 check reads the mask's values, which a graph cannot: it is skipped while
    # torch.compile traces (fullgraph=True makes a graph break an error), and checked eagerly.
    module = qkv.MultiHeadAttention(E, H).eval()
    x = torch.randn(B, T, E)
    bias = float_mask_for(T)  # (T, T): an ALiBi-style bias with -inf
    compiled = torch.compile(module, fullgraph=True, backend="eager")
    torch.testing.assert_close(compiled(x, mask=bias)[0], module(x, mask=bias)[0])
    blocked = torch.ones(T, T, dtype=torch.bool).triu(1)
    torch.testing.assert_close(compiled(x, attn_mask=blocked)[0], module(x, is_causal=True)[0])


def float_mask_for(T):
    distance = (torch.arange(T)[:, None] - torch.arange(T)[None, :]).float()  # (T, T)
    return (-0.5 * distance.abs()).masked_fill(distance < 0, float("-inf"))  # causal, nearer counts more


@pytest.mark.parametrize("module_class", MODULES)
def test_device_and_dtype_at_construction_and_meta_initialisation(module_class):
    module = module_class(E, H, kdim=KDIM, dtype=torch.float64)
    assert {p.dtype for p in module.parameters()} == {torch.float64}
    lazy = module_class(E, H, kdim=KDIM, device="meta")
    assert {p.device.type for p in lazy.parameters()} == {"meta"}
    lazy = lazy.to_empty(device="cpu")
    lazy.reset_parameters()
    assert all(torch.isfinite(p).all() and p.abs().max() < 1 for p in lazy.parameters())
    output, _ = lazy(torch.randn(B, T, E), torch.randn(B, S, KDIM), torch.randn(B, S, E))
    assert output.shape == (B, T, E)


@pytest.mark.parametrize("module_class", MODULES)
@pytest.mark.parametrize("sizes", [{}, {"kdim": KDIM, "vdim": VDIM}], ids=["packed", "separate"])
def test_init_torch_follows_torch_multiheadattention(module_class, sizes):
    torch.manual_seed(0)
    big = 96  # enough entries that the largest is near the bound
    ours = module_class(big, H, init="torch", **sizes).to_heads()
    reference = qkv.interop.from_torch(nn.MultiheadAttention(big, H, **sizes))
    for name in ("w_q", "w_k", "w_v", "w_o"):
        ours_max, torch_max = getattr(ours, name).abs().max(), getattr(reference, name).abs().max()
        torch.testing.assert_close(ours_max, torch_max, atol=0.02 * torch_max, rtol=0)
    for name in ("b_q", "b_k", "b_v", "b_o"):
        assert torch.equal(getattr(ours, name), torch.zeros_like(getattr(ours, name)))
        assert torch.equal(getattr(reference, name), getattr(ours, name))
    # The default is nn.Linear's: biases are not zero.
    assert module_class(big, H).to_heads().b_q.abs().max() > 0


def test_hooks_and_replaced_projections_still_run():
    # The forward pass skips nn.Module.__call__ for a plain nn.Linear with no hooks; anything
    # else on a projection (a hook, a subclass such as a LoRA or quantised layer) must still run.
    module = qkv.MultiHeadAttention(E, H).double()
    x = inputs()[0]
    before, _ = module(x)
    seen = []
    handle = module.q_proj.register_forward_hook(lambda layer, args, out: seen.append(out.shape))
    module(x)
    handle.remove()
    assert seen == [(B, T, E)]

    class Doubled(nn.Linear):
        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return 2 * super().forward(x)

    doubled = Doubled(E, E, dtype=torch.float64)
    doubled.load_state_dict(module.out_proj.state_dict())
    module.out_proj = doubled
    after, _ = module(x)
    torch.testing.assert_close(after, 2 * before)
    global_seen = []
    handle = nn.modules.module.register_module_forward_hook(
        lambda layer, args, out: global_seen.append(type(layer))
    )
    try:
        module.out_proj = nn.Linear(E, E, dtype=torch.float64)
        module(x)
    finally:
        handle.remove()
    assert global_seen.count(nn.Linear) == 4  # q, k, v and out projections, each seen by the hook


@pytest.mark.parametrize("module_class", MODULES)
def test_a_mismatch_is_blamed_on_the_input_that_has_it(module_class):
    module = module_class(E, H, kdim=KDIM, vdim=VDIM)
    x, k, v = inputs(torch.float32)
    with pytest.raises(TypeError, match=r"key has dtype torch\.float64, but query has dtype torch\.float32"):
        module(x, k.double(), v)
    with pytest.raises(ValueError, match=r"query is on meta, but the module's parameter .* is on cpu"):
        module(x.to("meta"), k.to("meta"), v.to("meta"))  # autocast knows no meta device
    numpy_dropout = module_class(E, H, dropout=__import__("numpy").float32(0.25))
    assert numpy_dropout.dropout == 0.25


# --- A drop-in inside torch's transformer layers -------------------------------------------------


def torch_layer_pair(kind, num_heads, batch_first):
    """torch's layer, and a copy whose attention is qkv's, loaded from torch's state dict."""
    torch.manual_seed(0)
    make = nn.TransformerEncoderLayer if kind == "encoder" else nn.TransformerDecoderLayer
    reference = make(E, num_heads, dim_feedforward=16, dropout=0.0, batch_first=batch_first).double()
    ours = make(E, num_heads, dim_feedforward=16, dropout=0.0, batch_first=batch_first).double()
    sizes = {"batch_first": batch_first, "dtype": torch.float64}
    ours.self_attn = qkv.MultiHeadAttention(E, num_heads, **sizes)
    if kind == "decoder":
        ours.multihead_attn = qkv.MultiHeadAttention(E, num_heads, **sizes)
    ours.load_state_dict(reference.state_dict())  # torch's in_proj_weight, at "self_attn." and beyond
    return reference, ours


def layer_arguments(kind, case, batch_first):
    """Inputs and masks for a layer: T = 4 targets, S = 6 sources, sequence 0 padded."""
    g = torch.Generator().manual_seed(1)
    x = torch.randn(B, S, E, generator=g, dtype=torch.float64)  # (B, S, E): the encoder's source
    y = torch.randn(B, T, E, generator=g, dtype=torch.float64)  # (B, T, E): the decoder's target
    if not batch_first:
        x, y = x.transpose(0, 1), y.transpose(0, 1)
    pad = torch.zeros(B, S, dtype=torch.bool)
    pad[0, 4:] = True  # True = padding, torch's meaning
    causal = nn.Transformer.generate_square_subsequent_mask  # (L, L), -inf above the diagonal
    if kind == "encoder":
        masks = {
            "none": {},
            "padding": {"src_key_padding_mask": pad},
            "causal": {"src_mask": causal(S, dtype=torch.float64), "is_causal": True},
            "bool mask and padding": {"src_mask": causal(S).isinf(), "src_key_padding_mask": pad},
        }[case]
        return (x,), masks
    masks = {
        "none": {},
        "padding": {"memory_key_padding_mask": pad, "tgt_key_padding_mask": pad.flip(0)[:, 1 : T + 1]},
        "causal": {"tgt_mask": causal(T, dtype=torch.float64), "tgt_is_causal": True},
        "bool mask and padding": {
            "tgt_mask": causal(T).isinf(),
            "memory_mask": torch.eye(T, S, dtype=torch.bool),  # (T, S): True = blocked
            "memory_key_padding_mask": pad,
        },
    }[case]
    return (y, x), masks


@pytest.mark.parametrize("kind", ["encoder", "decoder"])
@pytest.mark.parametrize("num_heads", [3, 4])  # 4: an even count, for torch's own eval fast path
@pytest.mark.parametrize("batch_first", [True, False])
@pytest.mark.parametrize("case", ["none", "padding", "causal", "bool mask and padding"])
def test_a_drop_in_for_the_attention_of_torchs_transformer_layers(kind, num_heads, batch_first, case):
    reference, ours = torch_layer_pair(kind, num_heads, batch_first)
    inputs_, masks = layer_arguments(kind, case, batch_first)
    # Training mode, gradients recorded:
    expected_inputs = [t.clone().requires_grad_() for t in inputs_]
    our_inputs = [t.clone().requires_grad_() for t in inputs_]
    expected = reference.train()(*expected_inputs, **masks)
    output = ours.train()(*our_inputs, **masks)
    torch.testing.assert_close(output, expected)
    expected.square().sum().backward()
    output.square().sum().backward()
    for a, b in zip(our_inputs, expected_inputs, strict=True):
        torch.testing.assert_close(a.grad, b.grad)
    # Evaluation without gradients, where torch's encoder layer takes its fused kernel (even heads,
    # batch first) and calls qkv's module instead:
    fused_calls = []
    fused_kernel = torch._transformer_encoder_layer_fwd

    def counted(*args, **kwargs):
        fused_calls.append(args[0].shape)
        return fused_kernel(*args, **kwargs)

    with torch.no_grad(), pytest.MonkeyPatch.context() as patch:
        patch.setattr(torch, "_transformer_encoder_layer_fwd", counted)
        output = ours.eval()(*inputs_, **masks)
        assert not fused_calls  # qkv's forward ran
        expected = reference.eval()(*inputs_, **masks)
    torch.testing.assert_close(output, expected)
    assert len(fused_calls) == (kind == "encoder" and num_heads % 2 == 0 and batch_first)


def test_torchs_encoder_stack_runs_with_qkv_layers():
    reference, ours = torch_layer_pair("encoder", 4, batch_first=True)
    with pytest.warns(UserWarning, match=r"self_attn\._qkv_same_embed_dim was not True"):
        stack = nn.TransformerEncoder(ours, num_layers=2)  # torch says why it keeps its nested path off
    torch_stack = nn.TransformerEncoder(reference, num_layers=2)
    (x,), masks = layer_arguments("encoder", "padding", batch_first=True)
    with torch.no_grad(), warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)  # torch calls its strided nested tensors a prototype
        expected = torch_stack.eval()(x, **masks)  # torch's own nested-tensor fast path: 0 at padding
    with torch.no_grad():
        output = stack.eval()(x, **masks)
    real = ~masks["src_key_padding_mask"]  # (B, S)
    torch.testing.assert_close(output[real], expected[real])
