"""Claims the cross-attention chapter used to prove in its own cells, kept here where they check qkv.

The chapter (book/cross_attention.ipynb and its deeper pages) keeps the proofs a reader
needs; these are the checks of the package itself: one qkv.MultiHeadAttention called as
self- and cross-attention and rebuilt by hand, PyTorch's layer rebuilt from its
``in_proj_weight`` rows, the errors for the usual mistakes, a Keras layer read with
Keras's own einsum letters, and a cross-attention layer's indifference to the order of
its keys and values.
"""

from __future__ import annotations

import os

import pytest
import torch
from pins import is_pinned

import qkv
from qkv.data import AbacusBeadOrderTask
from qkv.models import EncoderDecoderConfig, TinyEncoderDecoder

os.environ.setdefault("KERAS_BACKEND", "torch")  # before keras is imported anywhere

B, T, S, d_model, h = 2, 4, 7, 18, 3  # so d_k = 6: no two sizes alike


@pytest.fixture
def inputs() -> tuple[torch.Tensor, torch.Tensor]:
    generator = torch.Generator().manual_seed(0)
    dec = torch.randn(B, T, d_model, generator=generator)  # (B, T, d_model)
    enc = torch.randn(B, S, d_model, generator=generator)  # (B, S, d_model)
    return dec, enc


def test_one_layer_as_self_and_as_cross_attention_rebuilt_by_hand(inputs):
    dec, enc = inputs
    mha = qkv.MultiHeadAttention(d_model, h)
    self_out, self_weights = mha(dec, dec, dec, need_weights=True)
    torch.testing.assert_close(mha(dec)[0], self_out)  # key and value default to the query
    assert self_weights.shape == (B, h, T, T)
    cross_out, cross_weights = mha(dec, enc, enc, need_weights=True)
    assert cross_weights.shape == (B, h, T, S) and cross_out.shape == (B, T, d_model)
    torch.testing.assert_close(cross_weights.sum(-1), torch.ones(B, h, T))
    Q = qkv.split_heads(mha.q_proj(dec), h)  # (B, h, T, d_k)
    K = qkv.split_heads(mha.k_proj(enc), h)  # (B, h, S, d_k): enc · W^K + b^K
    V = qkv.split_heads(mha.v_proj(enc), h)
    heads, weights = qkv.attention(Q, K, V)
    torch.testing.assert_close(mha.out_proj(qkv.merge_heads(heads)), cross_out)
    torch.testing.assert_close(weights, cross_weights)
    # K is not the encoder output, and enc itself as K and V gives another output:
    assert (mha.k_proj(enc) - enc).abs().max() > 0.1
    enc_heads = qkv.split_heads(enc, h)
    raw, _ = qkv.attention(Q, enc_heads, enc_heads)
    assert not torch.allclose(mha.out_proj(qkv.merge_heads(raw)), cross_out)


def test_torch_multiheadattention_rebuilt_from_its_in_proj_rows(inputs):
    dec, enc = inputs
    torch_mha = torch.nn.MultiheadAttention(d_model, h, batch_first=True)
    W_in, b_in = torch_mha.in_proj_weight, torch_mha.in_proj_bias  # (3 d_model, d_model)
    rows = [slice(i * d_model, (i + 1) * d_model) for i in range(3)]  # W^Q, W^K, W^V
    Q, K, V = (
        qkv.split_heads(x @ W_in[r].T + b_in[r], h) for x, r in zip((dec, enc, enc), rows, strict=True)
    )
    heads, _ = qkv.attention(Q, K, V)
    torch.testing.assert_close(torch_mha.out_proj(qkv.merge_heads(heads)), torch_mha(dec, enc, enc)[0])


def test_the_usual_mistakes_are_refused_with_the_shapes():
    d_dec, d_enc = 12, 9
    dec, enc = torch.randn(B, T, d_dec), torch.randn(B, S, d_enc)
    cross = qkv.MultiHeadAttention(d_dec, h, kdim=d_enc, vdim=d_enc)
    Q = qkv.split_heads(cross.q_proj(dec), h)
    with pytest.raises(ValueError, match="query has 4 features per position, but key has 9"):
        qkv.attention(Q, enc[:, None], enc[:, None])  # enc itself as K and V
    with pytest.raises(ValueError, match="value has 4 positions, but the key's length S is 7"):
        cross(dec, enc, enc[:, :4])
    bare = qkv.padding_mask(torch.tensor([S, 3]), S)[:, 0, 0]  # (B, S)
    assert bare.shape == (B, S)
    with pytest.raises(ValueError, match=r"mask of shape \(2, 7\) does not broadcast"):
        cross(dec, enc, enc, mask=bare)
    assert torch.equal(qkv.causal_mask(T).int(), torch.ones(T, T, dtype=torch.int).tril())


def test_qkvs_mask_passed_unchanged_to_torch_blocks_the_real_tokens():
    d_dec, d_enc = 12, 9
    dec, enc = torch.randn(B, T, d_dec), torch.randn(B, S, d_enc)
    cross = qkv.MultiHeadAttention(d_dec, h, kdim=d_enc, vdim=d_enc)
    torch_cross = qkv.interop.to_torch(cross.to_heads())
    flipped = qkv.padding_mask(torch.tensor([S, 3]), S)[:, 0, 0]  # True = real: the wrong way round
    wrong, wrong_weights = torch_cross(dec, enc, enc, key_padding_mask=flipped, average_attn_weights=False)
    assert wrong_weights[1, :, :, :3].abs().max() == 0  # the short source's real tokens get nothing
    assert wrong[0].isnan().all()  # the full-length source: every key blocked
    quiet, _ = torch_cross(dec, enc, enc, key_padding_mask=flipped, need_weights=False)
    if torch.__version__ >= (2, 11):  # need_weights=False: every query gets the output projection's bias
        torch.testing.assert_close(quiet[0], torch_cross.out_proj.bias.expand(T, -1))


def test_cross_attention_ignores_the_order_of_its_keys_and_values_the_encoder_does_not():
    d_dec, d_enc = 12, 9
    dec, enc = torch.randn(B, T, d_dec), torch.randn(B, S, d_enc)
    cross = qkv.MultiHeadAttention(d_dec, h, kdim=d_enc, vdim=d_enc)
    order = torch.randperm(S)
    mask = qkv.padding_mask(torch.tensor([S, 3]), S)  # (B, 1, 1, S)
    out, weights = cross(dec, enc, enc, mask=mask, need_weights=True)
    shuffled = enc[:, order]
    out_shuffled, weights_shuffled = cross(dec, shuffled, shuffled, mask=mask[..., order], need_weights=True)
    torch.testing.assert_close(out_shuffled, out)
    torch.testing.assert_close(weights_shuffled, weights[..., order])
    # The encoder mixes in position: its memory of a shuffled source is not its memory, shuffled.
    task = AbacusBeadOrderTask(min_digits=3, max_digits=5)
    config = EncoderDecoderConfig(
        task.source_vocab_size, task.target_vocab_size, encoder_dim=32, decoder_dim=48
    )
    model = TinyEncoderDecoder(config)
    first, swap = [7, 0, 8, 4, 6], [1, 0, 2, 3, 4]
    pair = task.from_digits([first, [first[i] for i in swap]])
    with torch.no_grad():
        memory = model.encode(pair.source, pair.source_lengths)
    assert not torch.allclose(memory[1], memory[0, swap], atol=1e-3)


def keras_layer_and_output(dec, enc, key_dim=d_model // h):
    keras = pytest.importorskip("keras")
    if keras.backend.backend() != "torch":
        pytest.skip("the Keras layer's weights are read as torch tensors")
    keras.utils.set_random_seed(0)
    layer = keras.layers.MultiHeadAttention(num_heads=h, key_dim=key_dim)
    out, weights = layer(query=dec.numpy(), value=enc.numpy(), return_attention_scores=True)
    as_torch = lambda x: torch.as_tensor(keras.ops.convert_to_numpy(x))  # noqa: E731
    return keras, layer, as_torch(out), as_torch(weights), as_torch


def test_keras_layer_in_its_own_letters_and_its_wide_heads(inputs):
    dec, enc = inputs
    keras, layer, out, weights, as_torch = keras_layer_and_output(dec, enc)
    W_q, W_k, W_v = (as_torch(d.kernel) for d in (layer.query_dense, layer.key_dense, layer.value_dense))
    b_q, b_k, b_v = (as_torch(d.bias) for d in (layer.query_dense, layer.key_dense, layer.value_dense))
    Q = torch.einsum("BNI,IHO->BNHO", dec, W_q) + b_q
    K = torch.einsum("BMI,IHO->BMHO", enc, W_k) + b_k
    V = torch.einsum("BMI,IHO->BMHO", enc, W_v) + b_v
    scores = torch.einsum("BNHO,BMHO->BHNM", Q, K) / W_q.shape[-1] ** 0.5
    heads = torch.einsum("BHNM,BMHO->BNHO", scores.softmax(dim=-1), V)
    W_o, b_o = as_torch(layer.output_dense.kernel), as_torch(layer.output_dense.bias)
    torch.testing.assert_close(torch.einsum("BNHO,HOI->BNI", heads, W_o) + b_o, out)
    torch.testing.assert_close(scores.softmax(dim=-1), weights)
    # key_dim = d_model: every head d_model wide, the output still the query's width, ~h times the parameters
    wide = keras.layers.MultiHeadAttention(num_heads=h, key_dim=d_model)
    assert as_torch(wide(query=dec.numpy(), value=enc.numpy())).shape == (B, T, d_model)
    assert tuple(wide.query_dense.kernel.shape) == (d_model, h, d_model)
    assert tuple(wide.output_dense.kernel.shape) == (h, d_model, d_model)
    assert wide.count_params() > (h - 0.5) * layer.count_params()


def test_key_and_value_inputs_of_different_widths_share_only_their_length():
    layer = qkv.MultiHeadAttention(8, 2, kdim=6, vdim=5)
    query, key, value = torch.randn(2, 4, 8), torch.randn(2, 7, 6), torch.randn(2, 7, 5)
    out, _ = layer(query, key, value)  # (B, T, 8)
    assert layer.k_proj.weight.shape == (8, 6) and layer.v_proj.weight.shape == (8, 5)
    assert out.shape == (2, 4, 8)
    with pytest.raises(ValueError, match="value has 4 positions"):
        layer(query, key, value[:, :4])


@pytest.mark.skipif(not is_pinned("keras"), reason="the page quotes the pinned Keras's source")
def test_keras_source_names_the_axes_with_its_own_letters():
    """The cross-attention page's letter table: Keras's comments call the heads N and the head size H."""
    import inspect

    keras = pytest.importorskip("keras")
    mha = keras.layers.MultiHeadAttention(num_heads=2, key_dim=5)
    mha(query=torch.randn(1, 4, 8).numpy(), value=torch.randn(1, 7, 6).numpy())
    call = inspect.getsource(type(mha).call)
    for comment in ("#   N = `num_attention_heads`", "#   H = `size_per_head`",
                    "# `query` = [B, T, N, H]", "# `key` = [B, S, N, H]"):  # fmt: skip
        assert comment in call, comment
    assert "key = self._key_dense(key)" in call  # the key input goes through W^K
    assert mha.query_dense.equation == "abc,cde->abde"  # its einsums use letters in order
