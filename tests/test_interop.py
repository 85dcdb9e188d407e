"""qkv.interop against the real layers of PyTorch, Hugging Face and Keras, with random weights."""

from __future__ import annotations

import os

import pytest
import torch
from torch import nn

import qkv
from qkv import interop

os.environ.setdefault("KERAS_BACKEND", "torch")  # before keras is imported anywhere

B, T, S, E, KDIM, VDIM, H = 2, 4, 6, 12, 10, 7, 3


def inputs(dtype=torch.float64, kdim=KDIM, vdim=VDIM, seed=0):
    g = torch.Generator().manual_seed(seed)
    return (
        torch.randn(B, T, E, generator=g, dtype=dtype),
        torch.randn(B, S, kdim, generator=g, dtype=dtype),
        torch.randn(B, S, vdim, generator=g, dtype=dtype),
    )


# --- PyTorch -----------------------------------------------------------------------------


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize(("kdim", "vdim"), [(E, E), (KDIM, VDIM)], ids=["packed", "separate"])
@pytest.mark.parametrize("bias", [True, False])
def test_from_torch_matches_torch_outputs_weights_and_gradients(dtype, kdim, vdim, bias):
    torch.manual_seed(0)
    reference = nn.MultiheadAttention(E, H, kdim=kdim, vdim=vdim, bias=bias, batch_first=True, dtype=dtype)
    assert (reference.in_proj_weight is None) == (kdim != E)  # both of torch's layouts are covered
    ours = qkv.MultiHeadAttention.from_heads(interop.from_torch(reference))
    x, k, v = inputs(dtype, kdim, vdim)
    keep = qkv.padding_mask([6, 3])  # True = may attend
    causal = qkv.causal_mask(T, S)
    expected, expected_weights = reference(
        x, k, v, key_padding_mask=~keep[:, 0, 0], attn_mask=~causal, average_attn_weights=False
    )  # torch: True = blocked
    output, weights = ours(x, k, v, mask=keep & causal, need_weights=True)
    tol = {"atol": 1e-5, "rtol": 1e-5} if dtype == torch.float32 else {"atol": 1e-12, "rtol": 1e-12}
    torch.testing.assert_close(output, expected, **tol)
    torch.testing.assert_close(weights, expected_weights, **tol)
    expected.sum().backward()
    output.sum().backward()
    if reference.in_proj_weight is not None:
        torch.testing.assert_close(ours.q_proj.weight.grad, reference.in_proj_weight.grad[:E], **tol)
        torch.testing.assert_close(ours.v_proj.weight.grad, reference.in_proj_weight.grad[2 * E :], **tol)
    else:
        torch.testing.assert_close(ours.k_proj.weight.grad, reference.k_proj_weight.grad, **tol)
    torch.testing.assert_close(ours.out_proj.weight.grad, reference.out_proj.weight.grad, **tol)


@pytest.mark.parametrize(("kdim", "vdim"), [(E, E), (KDIM, VDIM)])
def test_to_torch_round_trip(kdim, vdim):
    hw = qkv.HeadWeights.random(E, H, kdim=kdim, vdim=vdim, dtype=torch.float64)
    module = interop.to_torch(hw)
    assert module.batch_first
    assert (module.in_proj_weight is None) == (kdim != E)  # packed only when every width is embed_dim
    back = interop.from_torch(module)
    for name in ("w_q", "w_k", "w_v", "w_o", "b_q", "b_k", "b_v", "b_o"):
        torch.testing.assert_close(getattr(back, name), getattr(hw, name))
    x, k, v = inputs(kdim=kdim, vdim=vdim)
    torch.testing.assert_close(module(x, k, v)[0], qkv.multi_head_attention(x, k, v, hw)[0])


def test_in_proj_weight_rows_are_q_then_k_then_v_transposed():
    hw = qkv.HeadWeights.random(E, H, dtype=torch.float64)
    packed = interop.to_torch(hw).in_proj_weight  # (3·E, E)
    w_q = torch.cat(list(hw.w_q), dim=1)  # W^Q (E, E): the heads' W_i^Q side by side
    torch.testing.assert_close(packed[:E], w_q.T)  # nn.Linear stores W transposed


def test_torch_errors():
    with pytest.raises(ValueError, match="add_bias_kv or add_zero_attn"):
        interop.from_torch(nn.MultiheadAttention(E, H, add_bias_kv=True))
    with pytest.raises(TypeError, match=r"module must be a torch\.nn\.MultiheadAttention, got Linear"):
        interop.from_torch(nn.Linear(2, 2))
    with pytest.raises(ValueError, match="needs d_k == d_v == embed_dim / num_heads, got d_k=5"):
        interop.to_torch(qkv.HeadWeights.random(E, H, d_k=5))


@pytest.mark.parametrize("module_class", [qkv.MultiHeadAttention, qkv.PerHeadMultiHeadAttention])
@pytest.mark.parametrize(("kdim", "vdim"), [(E, E), (KDIM, VDIM)], ids=["packed", "separate"])
@pytest.mark.parametrize("bias", [True, False])
def test_state_dicts_load_both_ways_with_equal_outputs(module_class, kdim, vdim, bias):
    torch.manual_seed(0)
    reference = nn.MultiheadAttention(E, H, kdim=kdim, vdim=vdim, bias=bias, batch_first=True).double()
    ours = module_class(E, H, kdim=kdim, vdim=vdim, bias=bias).double()
    assert ours.load_state_dict(reference.state_dict()) is not None  # strict: every key used
    x, k, v = inputs(kdim=kdim, vdim=vdim)
    torch.testing.assert_close(ours(x, k, v)[0], reference(x, k, v)[0])
    # And back: a fresh torch module (other weights) loads qkv's state dict in its own layout.
    back = nn.MultiheadAttention(E, H, kdim=kdim, vdim=vdim, bias=bias, batch_first=True).double()
    state = interop.to_torch_state_dict(ours)
    assert state.keys() == reference.state_dict().keys()
    back.load_state_dict(state)
    torch.testing.assert_close(back(x, k, v)[0], reference(x, k, v)[0])
    for name, tensor in reference.state_dict().items():
        torch.testing.assert_close(state[name], tensor)
    # qkv's own layout loads as before, and assign=True takes torch's tensors as they come.
    module_class(E, H, kdim=kdim, vdim=vdim, bias=bias).double().load_state_dict(ours.state_dict())
    assigned = module_class(E, H, kdim=kdim, vdim=vdim, bias=bias, device="meta")
    assigned.load_state_dict(reference.state_dict(), assign=True)
    torch.testing.assert_close(assigned(x, k, v)[0], reference(x, k, v)[0])


def test_state_dicts_load_both_ways_inside_a_model():
    torch.manual_seed(0)

    def model(attention):
        return nn.ModuleDict({"embed": nn.Linear(5, E), "layers": nn.ModuleList([attention])}).double()

    reference = model(nn.MultiheadAttention(E, H, kdim=KDIM, vdim=VDIM, batch_first=True))
    ours = model(qkv.MultiHeadAttention(E, H, kdim=KDIM, vdim=VDIM))
    ours.load_state_dict(reference.state_dict())  # the prefixes "layers.0." found
    x, k, v = inputs()
    torch.testing.assert_close(ours["layers"][0](x, k, v)[0], reference["layers"][0](x, k, v)[0])
    torch.testing.assert_close(ours["embed"].weight, reference["embed"].weight)
    model(nn.MultiheadAttention(E, H, kdim=KDIM, vdim=VDIM, batch_first=True)).load_state_dict(
        interop.to_torch_state_dict(ours)
    )


def test_state_dicts_that_do_not_fit_are_named():
    grouped = qkv.MultiHeadAttention(16, 4, num_kv_heads=2)
    torchs = nn.MultiheadAttention(16, 4).state_dict()
    other_kdim = qkv.MultiHeadAttention(16, 4, kdim=8)
    in_a_model = nn.ModuleDict({"layers": nn.ModuleList([nn.Identity(), other_kdim])})
    cases = [
        (
            lambda: interop.to_torch_state_dict(grouped),
            r"module \(MultiHeadAttention\): .* 2 K/V heads among 4.*expand_kv_heads",
        ),
        (
            lambda: interop.to_torch_state_dict(nn.Sequential(nn.Linear(16, 16), grouped)),
            r"module\.1 \(MultiHeadAttention\): torch\.nn\.MultiheadAttention has one K/V head",
        ),
        (lambda: grouped.load_state_dict(torchs), r"this module has num_kv_heads=2 for num_heads=4"),
        (
            lambda: in_a_model.load_state_dict({f"layers.1.{name}": t for name, t in torchs.items()}),
            r"at 'layers\.1\.'\) holds torch.* in_proj_weight \(48, 16\).* but this module",
        ),
        (
            lambda: grouped.load_state_dict(nn.MultiheadAttention(16, 4, add_bias_kv=True).state_dict()),
            r"holds bias_k and bias_v, from torch\.nn\.MultiheadAttention\(add_bias_kv",
        ),
        (lambda: qkv.MultiHeadAttention(16, 4, d_k=2).load_state_dict(torchs), r"d_k=2, d_v=2 and embed_dim"),
    ]
    for call, message in cases:
        with pytest.raises(ValueError, match=message):
            call()
    expanded = qkv.MultiHeadAttention.from_heads(grouped.to_heads().expand_kv_heads())
    nn.MultiheadAttention(16, 4).load_state_dict(interop.to_torch_state_dict(expanded))  # the fix it names


# --- Hugging Face BERT -------------------------------------------------------------------


def bert_attention(dtype=torch.float64):
    from transformers import BertConfig
    from transformers.models.bert.modeling_bert import BertAttention

    config = BertConfig(
        hidden_size=E, num_attention_heads=H, intermediate_size=16,
        attention_probs_dropout_prob=0.0, hidden_dropout_prob=0.0,
    )  # fmt: skip
    config._attn_implementation = "eager"
    torch.manual_seed(0)
    return BertAttention(config).to(dtype).eval()


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_from_bert_matches_bert_attention_outputs_weights_and_gradients(dtype):
    bert = bert_attention(dtype)
    hw = interop.from_bert(bert)
    assert (hw.num_heads, hw.d_k) == (H, E // H)
    ours = qkv.MultiHeadAttention.from_heads(hw)
    keep = qkv.padding_mask([4, 2])  # (B, 1, 1, T): True = real token
    additive = qkv.additive_mask(keep, dtype).clamp(min=torch.finfo(dtype).min)
    x_bert, _, _ = inputs(dtype)
    x_ours = x_bert.clone()
    x_bert.requires_grad_()
    x_ours.requires_grad_()
    expected, expected_weights = bert(x_bert, attention_mask=additive)  # HF adds a float mask
    attended, weights = ours(x_ours, mask=keep, need_weights=True)
    # BertAttention = LayerNorm(x + MultiHead(x, x, x)): the residual and LayerNorm sit in bert.output.
    output = bert.output.LayerNorm(attended + x_ours)
    tol = {"atol": 1e-5, "rtol": 1e-5} if dtype == torch.float32 else {"atol": 1e-12, "rtol": 1e-12}
    torch.testing.assert_close(output, expected, **tol)
    torch.testing.assert_close(weights, expected_weights, **tol)
    expected.square().sum().backward()
    output.square().sum().backward()
    torch.testing.assert_close(x_ours.grad, x_bert.grad, **tol)


def test_from_bert_rejects_the_inner_self_attention():
    bert = bert_attention()
    with pytest.raises(TypeError, match="looks like a BertSelfAttention: pass its parent BertAttention"):
        interop.from_bert(bert.self)


# --- Keras 3 ------------------------------------------------------------------------------


def keras_layer(key_dim=4, value_dim=5, use_bias=True):
    import keras

    keras.utils.set_random_seed(0)
    layer = keras.layers.MultiHeadAttention(
        num_heads=H, key_dim=key_dim, value_dim=value_dim, use_bias=use_bias
    )
    return keras, layer


@pytest.mark.parametrize("use_bias", [True, False])
@pytest.mark.parametrize("kind", ["padding", "causal"])
def test_from_keras_matches_keras_outputs_weights_and_gradients(use_bias, kind):
    _, layer = keras_layer(use_bias=use_bias)
    x, k, v = inputs(torch.float32)
    if kind == "padding":
        keep = qkv.padding_mask([6, 3])[:, 0].expand(B, T, S)  # (B, T, S) for Keras: 1 = attend
    else:
        keep = qkv.causal_mask(T, S).expand(B, T, S)
    keras_inputs = [t.clone().requires_grad_() for t in (x, k, v)]
    expected, expected_weights = layer(
        query=keras_inputs[0], value=keras_inputs[2], key=keras_inputs[1],
        attention_mask=keep, return_attention_scores=True,
    )  # fmt: skip
    # Keras's torch backend computes on the GPU where there is one; from_keras reads the
    # weights to the CPU (its contract), where `x` and the module are.
    expected, expected_weights = expected.to(x.device), expected_weights.to(x.device)
    hw = interop.from_keras(layer)
    assert (hw.d_k, hw.d_v, hw.kdim, hw.vdim, hw.bias) == (4, 5, KDIM, VDIM, use_bias)
    module = qkv.MultiHeadAttention.from_heads(hw)  # d_k·h != embed_dim is fine for qkv
    our_inputs = [t.clone().requires_grad_() for t in (x, k, v)]
    output, weights = module(*our_inputs, mask=keep[:, None], need_weights=True)  # (B, 1, T, S)
    torch.testing.assert_close(output, expected, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(weights, expected_weights, atol=1e-5, rtol=1e-5)
    functional, _ = qkv.multi_head_attention(x, k, v, hw, mask=keep[:, None])
    torch.testing.assert_close(functional, expected, atol=1e-5, rtol=1e-5)
    expected.square().sum().backward()
    output.square().sum().backward()
    for ours, theirs in zip(our_inputs, keras_inputs, strict=True):
        torch.testing.assert_close(ours.grad, theirs.grad, atol=1e-5, rtol=1e-4)


def test_keras_errors():
    _, layer = keras_layer()
    with pytest.raises(ValueError, match="not built yet"):
        interop.from_keras(layer)
    with pytest.raises(TypeError, match=r"layer must be a keras\.layers\.MultiHeadAttention, got Linear"):
        interop.from_keras(nn.Linear(2, 2))


def test_keras_output_shape_is_named():
    import keras

    layer = keras.layers.MultiHeadAttention(num_heads=H, key_dim=4, output_shape=9)
    layer(torch.randn(1, T, E), torch.randn(1, S, E))
    with pytest.raises(ValueError, match=r"output_shape=\(9,\), so its output is not the query's width"):
        interop.from_keras(layer)


# --- Hugging Face Llama (grouped-query attention) -------------------------------------------


def llama_attention(num_kv_heads, bias=False, implementation="eager", dtype=torch.float64, head_dim=None):
    from transformers import LlamaConfig
    from transformers.models.llama.modeling_llama import LlamaAttention

    # 6 query heads of head_dim 4 (so 6·4 != hidden_size = 18: non-square), sharing num_kv_heads K/V heads.
    config = LlamaConfig(
        hidden_size=18, num_attention_heads=6, num_key_value_heads=num_kv_heads, head_dim=head_dim or 4,
        attention_bias=bias, attention_dropout=0.0,
    )  # fmt: skip
    config._attn_implementation = implementation
    torch.manual_seed(0)
    return LlamaAttention(config, layer_idx=0).to(dtype).eval()


@pytest.mark.parametrize("num_kv_heads", [6, 2, 1])
@pytest.mark.parametrize("bias", [False, True])
@pytest.mark.parametrize("implementation", ["eager", "sdpa"])
def test_from_llama_matches_llama_attention_without_rotation(num_kv_heads, bias, implementation):
    llama = llama_attention(num_kv_heads, bias, implementation)
    hw = interop.from_llama(llama)
    assert (hw.num_heads, hw.num_kv_heads, hw.d_k, hw.d_v, hw.bias) == (6, num_kv_heads, 4, 4, bias)
    ours = qkv.MultiHeadAttention.from_heads(hw)
    batch, length = 2, 7
    x_llama = torch.randn(batch, length, 18, dtype=torch.float64)
    x_ours = x_llama.clone().requires_grad_()
    x_llama.requires_grad_()
    # Left padding in the second sequence, and the causal mask: Llama adds a float mask (B, 1, T, T).
    padding = torch.zeros(batch, length, dtype=torch.bool)
    padding[1, :2] = True
    allowed = qkv.causal_mask(length) & ~padding[:, None, None, :]  # (B, 1, T, T)
    # float32's lowest, not float64's: Llama's eager softmax runs in float32, where float64's is -inf.
    additive = qkv.additive_mask(allowed, torch.float64).clamp(min=torch.finfo(torch.float32).min)
    no_rotation = (
        torch.ones(batch, length, 4, dtype=torch.float64),
        torch.zeros(batch, length, 4, dtype=torch.float64),
    )
    expected, _ = llama(x_llama, position_embeddings=no_rotation, attention_mask=additive)
    output, _ = ours(x_ours, is_causal=True, key_padding_mask=padding)
    real = ~padding  # rows of padding queries attend nowhere here; Llama's differ, and nobody reads them
    torch.testing.assert_close(output[real], expected[real])
    expected[real].square().sum().backward()
    output[real].square().sum().backward()
    torch.testing.assert_close(x_ours.grad, x_llama.grad)


def test_from_llama_decodes_with_a_cache_like_llama_recomputing():
    llama = llama_attention(2)
    mha = qkv.MultiHeadAttention.from_heads(interop.from_llama(llama))
    x = torch.randn(1, 6, 18, dtype=torch.float64)
    no_rotation = (torch.ones(1, 6, 4, dtype=torch.float64), torch.zeros(1, 6, 4, dtype=torch.float64))
    causal = qkv.additive_mask(qkv.causal_mask(6), torch.float64)[None, None]  # (1, 1, T, T)
    expected, _ = llama(x, position_embeddings=no_rotation, attention_mask=causal)
    cache = mha.new_cache(1, 6)
    with torch.no_grad():
        steps = [mha(x[:, :3], cache=cache, is_causal=True)[0]]
        steps += [mha(x[:, t : t + 1], cache=cache)[0] for t in range(3, 6)]
    torch.testing.assert_close(torch.cat(steps, dim=1), expected)
    assert cache.keys.shape == (1, 2, 6, 4)  # only Llama's 2 K/V heads are cached


def test_from_llama_errors():
    with pytest.raises(TypeError, match=r"must be a Llama-style attention layer .* got Linear"):
        interop.from_llama(nn.Linear(3, 3))
    llama = llama_attention(2, bias=True)
    llama.o_proj.bias = None
    with pytest.raises(ValueError, match="only q_proj, k_proj, v_proj of the four projections have a bias"):
        interop.from_llama(llama)
    llama = llama_attention(2)
    llama.scaling = 0.1
    with pytest.raises(ValueError, match=r"scales its scores by 0.1, not 1/sqrt\(head_dim\)"):
        interop.from_llama(llama)


# --- Packed Q/K/V layouts: stacked (PyTorch, nanoGPT) and interleaved per head ----------------


def uva_style_attention(x, weight, bias, num_heads):
    """Self-attention with an interleaved packed projection, as the UvA tutorial's qkv_proj reads it."""
    batch, length, _ = x.shape
    packed = nn.functional.linear(x, weight, bias).reshape(batch, length, num_heads, -1)  # (B, T, h, 3·d)
    q, k, v = packed.permute(0, 2, 1, 3).chunk(3, dim=-1)  # (B, h, T, d) each
    heads = nn.functional.scaled_dot_product_attention(q, k, v)  # (B, h, T, d)
    return heads.transpose(1, 2).reshape(batch, length, -1)  # (B, T, h·d)


def stacked_style_attention(x, weight, bias, num_heads):
    """The same with a stacked packed projection, as PyTorch and nanoGPT read it."""
    q, k, v = (qkv.split_heads(t, num_heads) for t in nn.functional.linear(x, weight, bias).chunk(3, -1))
    return qkv.merge_heads(nn.functional.scaled_dot_product_attention(q, k, v))


@pytest.mark.parametrize(("num_heads", "d"), [(3, 4), (2, 5), (1, 6)])
def test_packed_layouts_convert_and_compute_the_same_attention(num_heads, d):
    g = torch.Generator().manual_seed(1)
    d_in = 7  # != h·d
    weight = torch.randn(3 * num_heads * d, d_in, generator=g, dtype=torch.float64)
    bias = torch.randn(3 * num_heads * d, generator=g, dtype=torch.float64)
    x = torch.randn(2, 5, d_in, generator=g, dtype=torch.float64)
    interleaved_w = interop.stacked_to_interleaved(weight, num_heads)
    interleaved_b = interop.stacked_to_interleaved(bias, num_heads)
    expected = stacked_style_attention(x, weight, bias, num_heads)
    torch.testing.assert_close(uva_style_attention(x, interleaved_w, interleaved_b, num_heads), expected)
    torch.testing.assert_close(interop.interleaved_to_stacked(interleaved_w, num_heads), weight)
    torch.testing.assert_close(interop.interleaved_to_stacked(interleaved_b, num_heads), bias)
    if num_heads > 1:  # loading one layout into the other is silent, and wrong
        unconverted = uva_style_attention(x, weight, bias, num_heads)
        assert unconverted.shape == expected.shape
        assert not torch.allclose(unconverted, expected)


def test_packed_layouts_put_each_row_where_its_role_and_head_say():
    h, d = 3, 2
    # Stacked rows, labelled role·100 + head·10 + feature:
    labels = torch.tensor([float(r * 100 + i * 10 + f) for r in range(3) for i in range(h) for f in range(d)])
    interleaved = interop.stacked_to_interleaved(labels, h)
    expected = [float(r * 100 + i * 10 + f) for i in range(h) for r in range(3) for f in range(d)]
    assert interleaved.tolist() == expected
    assert interleaved.data_ptr() != labels.data_ptr()  # a new tensor


def test_packed_layouts_reject_what_is_not_packed():
    message = r"must hold Q, K and V for 2 heads, a multiple of 3 · num_heads = 6"
    with pytest.raises(ValueError, match=message):
        interop.interleaved_to_stacked(torch.zeros(8, 4), 2)
    with pytest.raises(TypeError, match=r"packed must be a torch\.Tensor, got list"):
        interop.stacked_to_interleaved([1.0, 2.0, 3.0], 1)
    with pytest.raises(ValueError, match="num_heads must be positive, got 0"):
        interop.stacked_to_interleaved(torch.zeros(6), 0)
