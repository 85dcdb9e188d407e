"""qkv at inference: the KV cache, keys and values projected once, grouped-query attention."""

from __future__ import annotations

import pickle

import pytest
import torch

import qkv
from qkv import multihead

F64 = torch.float64
# Non-square on purpose: 6 query heads, d_k != d_v, and every K/V grouping of 6 heads.
E, H, D_K, D_V = 12, 6, 5, 3
KV_HEADS = [6, 3, 2, 1]


def make(num_kv_heads: int = H, *, seed: int = 0, **kwargs: object) -> qkv.MultiHeadAttention:
    torch.manual_seed(seed)
    return qkv.MultiHeadAttention(
        E, H, d_k=D_K, d_v=D_V, num_kv_heads=num_kv_heads, dtype=F64, **kwargs
    ).eval()  # type: ignore[arg-type]


Outputs = tuple[list[torch.Tensor], list[torch.Tensor | None]]


def decode(mha: qkv.MultiHeadAttention, x: torch.Tensor, chunks: list[int], need_weights: bool,
           padding: torch.Tensor | None = None) -> Outputs:  # fmt: skip
    """Run x through mha chunk by chunk with a cache; the outputs and weights of each call."""
    cache = mha.new_cache(x.shape[0], x.shape[1])
    outputs, weights, start = [], [], 0
    for size in chunks:
        pad = None if padding is None else padding[:, : start + size]
        out, w = mha(
            x[:, start : start + size], cache=cache, is_causal=True, need_weights=need_weights,
            key_padding_mask=pad,
        )  # fmt: skip
        outputs.append(out)
        weights.append(w)
        start += size
    assert cache.length == start == x.shape[1]
    return outputs, weights


@pytest.mark.parametrize("num_kv_heads", KV_HEADS)
@pytest.mark.parametrize("need_weights", [False, True])
@pytest.mark.parametrize("chunks", [[1] * 7, [4, 1, 1, 1], [3, 2, 2]])
def test_decoding_with_the_cache_is_one_causal_pass_at_every_step(num_kv_heads, need_weights, chunks):
    mha = make(num_kv_heads)
    x = torch.randn(2, 7, E, dtype=F64)
    full, full_weights = mha(x, is_causal=True, need_weights=True)  # (B, T, E), (B, h, T, T)
    with torch.no_grad():
        outputs, weights = decode(mha, x, chunks, need_weights)
    start = 0
    for size, out, w in zip(chunks, outputs, weights, strict=True):
        torch.testing.assert_close(out, full[:, start : start + size])
        if need_weights:
            # The step's queries see every key so far: the full pass's rows, cut at the step's end.
            torch.testing.assert_close(w, full_weights[:, :, start : start + size, : start + size])
        else:
            assert w is None
        start += size


@pytest.mark.parametrize("num_kv_heads", [6, 2, 1])
def test_a_left_padded_batch_decodes_each_prompt_as_if_alone(num_kv_heads):
    """Prompts of 5, 3 and 1 tokens, left padded to 5, then 3 generated tokens each."""
    mha = make(num_kv_heads)
    lengths, width, steps = [5, 3, 1], 5, 3
    sequences = [torch.randn(n + steps, E, dtype=F64) for n in lengths]
    x = torch.zeros(3, width + steps, E, dtype=F64)
    padding = torch.zeros(3, width + steps, dtype=torch.bool)  # True = padding, torch's meaning
    for b, (n, seq) in enumerate(zip(lengths, sequences, strict=True)):
        x[b, width - n :] = seq
        padding[b, : width - n] = True
        x[b, : width - n] = 1e3  # garbage in the padding, which must not matter
    for need_weights in (False, True):
        with torch.no_grad():
            outputs, weights = decode(mha, x, [width] + [1] * steps, need_weights, padding)
        out = torch.cat(outputs, dim=1)  # (B, width + steps, E)
        for b, (n, seq) in enumerate(zip(lengths, sequences, strict=True)):
            alone, _ = mha(seq[None], is_causal=True)  # (1, n + steps, E)
            torch.testing.assert_close(out[b, width - n :], alone[0])
            if need_weights:
                last = weights[-1]
                assert last is not None
                assert not last[b, :, :, : width - n].any()  # no weight on padding


def test_a_padding_query_row_attends_nowhere_and_gives_zero():
    mha = make()
    x = torch.randn(1, 3, E, dtype=F64)
    padding = torch.tensor([[True, False, False]])
    cache = mha.new_cache(1, 3)
    out, weights = mha(x, cache=cache, is_causal=True, key_padding_mask=padding, need_weights=True)
    assert weights[0, :, 0].abs().max() == 0  # the padding position itself sees no key
    fused, _ = make()(x, is_causal=True, key_padding_mask=padding)
    torch.testing.assert_close(out, fused)
    # no value reaches it: its output is W^O applied to zeros, the output bias alone
    torch.testing.assert_close(out[0, 0], mha.out_proj.bias.detach())
    assert torch.isfinite(out).all()


@pytest.mark.parametrize("batch_first", [True, False])
def test_sequence_first_layout_with_a_cache(batch_first):
    mha = make(2, batch_first=batch_first)
    x = torch.randn(2, 5, E, dtype=F64)  # batch first
    full, _ = mha(x if batch_first else x.transpose(0, 1), is_causal=True)
    cache = mha.new_cache(2, 5)
    steps = []
    for t in range(5):
        token = x[:, t : t + 1] if batch_first else x[:, t : t + 1].transpose(0, 1)
        steps.append(mha(token, cache=cache)[0])
    torch.testing.assert_close(torch.cat(steps, dim=1 if batch_first else 0), full)


def test_gradients_flow_through_the_cache_in_prefill_and_in_steps():
    mha = make(2)
    x = torch.randn(2, 6, E, dtype=F64, requires_grad=True)
    full, _ = mha(x, is_causal=True)
    expected = torch.autograd.grad(full.square().sum(), [x, *mha.parameters()])

    cache = mha.new_cache(2, 6)
    prefill, _ = mha(x[:, :4], cache=cache, is_causal=True)  # training-style: one chunk
    steps = [mha(x[:, t : t + 1], cache=cache)[0] for t in (4, 5)]  # then steps, still recording
    out = torch.cat([prefill, *steps], dim=1)
    got = torch.autograd.grad(out.square().sum(), [x, *mha.parameters()])
    for g, e in zip(got, expected, strict=True):
        torch.testing.assert_close(g, e)


def test_no_reallocation_when_not_recording_and_inference_mode_works():
    mha = make(3)
    cache = mha.new_cache(1, 8)
    memory = cache._keys.data_ptr(), cache._values.data_ptr()
    with torch.no_grad():
        for _ in range(4):
            mha(torch.randn(1, 1, E, dtype=F64), cache=cache)
    with torch.inference_mode():
        mha(torch.randn(1, 2, E, dtype=F64), cache=cache, is_causal=True)
    assert (cache._keys.data_ptr(), cache._values.data_ptr()) == memory
    assert cache.length == 6


def test_a_full_cache_is_a_clear_error_and_stays_as_it_was():
    mha = make()
    cache = mha.new_cache(1, 4)
    mha(torch.randn(1, 3, E, dtype=F64), cache=cache, is_causal=True)
    keys = cache.keys.clone()
    with pytest.raises(
        ValueError, match=r"cache is full: it holds 3 of max_length=4 tokens and cannot take 2 more"
    ):
        mha(torch.randn(1, 2, E, dtype=F64), cache=cache, is_causal=True)
    assert cache.length == 3 and torch.equal(cache.keys, keys)
    cache.reset()
    assert cache.length == 0 and len(cache) == 0
    mha(torch.randn(1, 4, E, dtype=F64), cache=cache, is_causal=True)
    assert cache.length == 4


def test_cache_from_another_module_or_batch_is_named():
    mha = make(2)
    x = torch.randn(2, 1, E, dtype=F64)
    wrong = {
        "cache has num_kv_heads=6, but this module needs 2": make(6).new_cache(2, 4),
        "cache has d_k=4, but this module needs 5": qkv.KVCache(2, 2, 4, 3, max_length=4, dtype=F64),
        "cache has d_v=5, but this module needs 3": qkv.KVCache(2, 2, 5, 5, max_length=4, dtype=F64),
        "cache has batch_size=3, but the batch needs 2": mha.new_cache(3, 4),
        "cache is on meta, but query is on cpu": mha.new_cache(2, 4, device="meta"),
    }
    for message, cache in wrong.items():
        with pytest.raises(ValueError, match=message):
            mha(x, cache=cache)
    with pytest.raises(
        TypeError, match=r"the new keys have dtype torch\.float64, but the cache holds torch\.float32"
    ):
        mha(x, cache=mha.new_cache(2, 4, dtype=torch.float32))
    with pytest.raises(TypeError, match=r"cache must be a qkv\.KVCache, got tuple"):
        mha(x, cache=(torch.zeros(1), torch.zeros(1)))  # type: ignore[arg-type]


def test_masks_with_a_cache_cover_cached_and_new_keys():
    mha = make()
    cache = mha.new_cache(2, 8)
    mha(torch.randn(2, 4, E, dtype=F64), cache=cache, is_causal=True)
    x = torch.randn(2, 2, E, dtype=F64)
    with pytest.raises(
        ValueError,
        match=r"key_padding_mask must have shape \(B, S\) = \(2, 6\), "
        r"with S = 4 cached \+ 2 new keys, got \(2, 2\)",
    ):
        mha(x, cache=cache, key_padding_mask=torch.zeros(2, 2, dtype=torch.bool))
    with pytest.raises(ValueError, match=r"\(B, h, T, S = 4 cached \+ 2 new\) = \(2, 6, 2, 6\)"):
        mha(x, cache=cache, mask=torch.ones(2, 2, dtype=torch.bool))
    assert cache.length == 4  # nothing appended by a refused call
    out, _ = mha(x, cache=cache, mask=torch.ones(2, 6, dtype=torch.bool).tril(4))
    assert out.shape == (2, 2, E) and cache.length == 6


def test_kv_cache_on_its_own():
    cache = qkv.KVCache(2, 3, 4, 5, max_length=6, dtype=F64)
    assert (cache.batch_size, cache.num_kv_heads, cache.d_k, cache.d_v, cache.max_length) == (2, 3, 4, 5, 6)
    assert cache.dtype == F64 and cache.device == torch.device("cpu") and cache.length == 0
    assert cache.keys.shape == (2, 3, 0, 4) and cache.values.shape == (2, 3, 0, 5)
    assert cache.nbytes == 2 * 3 * 6 * (4 + 5) * 8
    k, v = torch.randn(2, 3, 2, 4, dtype=F64), torch.randn(2, 3, 2, 5, dtype=F64)
    keys, values = cache.append(k, v)
    keys, values = cache.append(k + 1, v + 1)
    torch.testing.assert_close(keys, torch.cat([k, k + 1], dim=2))
    torch.testing.assert_close(values, torch.cat([v, v + 1], dim=2))
    assert "length=4, max_length=6" in repr(cache)
    with pytest.raises(
        ValueError,
        match=r"keys must have shape \(B, h_kv, T, d\) = \(2, 3, T, 4\) to fit this cache, "
        r"got \(2, 2, 1, 4\)",
    ):
        cache.append(k[:, :2, :1], v[:, :2, :1])
    with pytest.raises(ValueError, match="keys have 2 positions, but values have 1"):
        cache.append(k, v[:, :, :1])
    with pytest.raises(
        ValueError, match="cache is full: it holds 4 of max_length=6 tokens and cannot take 3 more"
    ):
        cache.append(torch.randn(2, 3, 3, 4, dtype=F64), torch.randn(2, 3, 3, 5, dtype=F64))
    with pytest.raises(ValueError, match="max_length must be positive, got 0"):
        qkv.KVCache(1, 1, 1, max_length=0)
    with pytest.raises(TypeError, match=r"dtype must be a floating-point torch\.dtype"):
        qkv.KVCache(1, 1, 1, max_length=1, dtype=torch.int64)


@pytest.mark.parametrize("num_kv_heads", [6, 2])
@pytest.mark.parametrize("need_weights", [False, True])
@pytest.mark.parametrize("batch_first", [True, False])
def test_keys_and_values_projected_once_equal_passing_the_encoder_output(
    num_kv_heads, need_weights, batch_first
):
    torch.manual_seed(1)
    cross = qkv.MultiHeadAttention(
        E, H, kdim=7, vdim=4, d_k=D_K, d_v=D_V, num_kv_heads=num_kv_heads, dtype=F64, batch_first=batch_first
    )
    y, key, value = (
        torch.randn(2, 3, E, dtype=F64),
        torch.randn(2, 9, 7, dtype=F64),
        torch.randn(2, 9, 4, dtype=F64),
    )
    if not batch_first:
        y, key, value = y.transpose(0, 1), key.transpose(0, 1), value.transpose(0, 1)
    padding = torch.zeros(2, 9, dtype=torch.bool)
    padding[0, 6:] = True
    expected = cross(y, key, value, key_padding_mask=padding, need_weights=need_weights)
    kv = cross.project_key_value(key, value)
    assert kv.keys.shape == (2, num_kv_heads, 9, D_K) and kv.values.shape == (2, num_kv_heads, 9, D_V)
    got = cross(y, key_value=kv, key_padding_mask=padding, need_weights=need_weights)
    torch.testing.assert_close(got[0], expected[0])
    if need_weights:
        torch.testing.assert_close(got[1], expected[1])


def test_project_key_value_defaults_value_to_key_and_names_bad_input():
    cross = qkv.MultiHeadAttention(E, H, kdim=7, vdim=7, dtype=F64)
    memory = torch.randn(2, 9, 7, dtype=F64)
    kv = cross.project_key_value(memory)
    torch.testing.assert_close(kv.values, qkv.split_heads(cross.v_proj(memory), H))
    with pytest.raises(ValueError, match="key has 6 features, but kdim is 7"):
        cross.project_key_value(memory[..., :6])
    with pytest.raises(ValueError, match=r"key and value must agree on batch and length"):
        cross.project_key_value(memory, memory[:, :8])


def test_bad_precomputed_keys_and_values_are_named():
    cross = make(2)
    y = torch.randn(2, 3, E, dtype=F64)
    keys, values = torch.randn(2, 2, 9, D_K, dtype=F64), torch.randn(2, 2, 9, D_V, dtype=F64)
    cases = {
        r"key_value\.keys must have shape \(B, h_kv, S, d_k\) = \(2, 2, S, 5\) for this module "
        r"and a batch of 2, got \(2, 6, 9, 5\)": (
            torch.randn(2, 6, 9, D_K, dtype=F64), values),
        r"key_value\.values must have shape \(B, h_kv, S, d_v\) = \(2, 2, S, 3\) .* got \(1, 2, 9, 3\)": (
            keys,
            values[:1],
        ),
        r"key_value.keys have 9 positions, but key_value.values have 8": (keys, values[:, :, :8]),
    }  # fmt: skip
    for message, kv in cases.items():
        with pytest.raises(ValueError, match=message):
            cross(y, key_value=qkv.KeyValue(*kv))
    with pytest.raises(
        TypeError, match=r"key_value\.keys has dtype torch\.float32, but query has dtype torch\.float64"
    ):
        cross(y, key_value=qkv.KeyValue(keys.float(), values))
    with pytest.raises(TypeError, match="key_value must be a KeyValue"):
        cross(y, key_value=keys)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match=r"pass key_value .* or key and value, not both"):
        cross(y, y, key_value=qkv.KeyValue(keys, values))
    with pytest.raises(ValueError, match="cache and key_value do not combine"):
        cross(y, key_value=qkv.KeyValue(keys, values), cache=cross.new_cache(2, 4))
    with pytest.raises(ValueError, match=r"key_padding_mask must have shape \(B, S\) = \(2, 9\)"):
        cross(y, key_value=qkv.KeyValue(keys, values), key_padding_mask=torch.zeros(2, 8, dtype=torch.bool))


def test_grouped_query_with_as_many_kv_heads_is_todays_module():
    torch.manual_seed(0)
    plain = qkv.MultiHeadAttention(E, H, d_k=D_K, d_v=D_V, dtype=F64)
    same = qkv.MultiHeadAttention(E, H, d_k=D_K, d_v=D_V, num_kv_heads=H, dtype=F64)
    same.load_state_dict(plain.state_dict())
    x = torch.randn(2, 5, E, dtype=F64)
    for need_weights in (False, True):
        a, b = plain(x, need_weights=need_weights), same(x, need_weights=need_weights)
        assert torch.equal(a[0], b[0])
        if need_weights:
            assert torch.equal(a[1], b[1])
    assert repr(plain) == repr(same)
    # and both are still torch's multi-head attention, an implementation qkv does not share
    torch_mha = qkv.interop.to_torch(
        qkv.HeadWeights.random(E, H, dtype=F64, generator=torch.Generator().manual_seed(3))
    )
    ours = qkv.MultiHeadAttention.from_heads(qkv.interop.from_torch(torch_mha))
    assert ours.num_kv_heads == H
    torch.testing.assert_close(ours(x)[0], torch_mha(x, x, x, need_weights=False)[0])


@pytest.mark.parametrize("num_kv_heads", [3, 2, 1])
@pytest.mark.parametrize("need_weights", [False, True])
def test_grouped_query_is_multi_head_with_kv_heads_copied_into_each_group(num_kv_heads, need_weights):
    gqa = make(num_kv_heads)
    hw = gqa.to_heads()
    assert hw.num_kv_heads == num_kv_heads and hw.w_k.shape == (num_kv_heads, E, D_K)
    full = qkv.MultiHeadAttention.from_heads(hw.expand_kv_heads())
    assert full.num_kv_heads == H and full.k_proj.out_features == H * D_K
    x, memory = torch.randn(2, 4, E, dtype=F64), torch.randn(2, 7, E, dtype=F64)
    mask = torch.rand(2, 1, 4, 7) > 0.3
    expected = full(x, memory, mask=mask, need_weights=need_weights)
    got = gqa(x, memory, mask=mask, need_weights=need_weights)
    torch.testing.assert_close(got[0], expected[0])
    if need_weights:
        torch.testing.assert_close(got[1], expected[1])
    # and the paper's per-head equations, from the grouped weights themselves
    reference, _ = qkv.multi_head_attention(x, memory, memory, hw, mask)
    torch.testing.assert_close(got[0], reference)


@pytest.mark.parametrize("num_kv_heads", [2, 1])
def test_sdpas_enable_gqa_and_the_explicit_expansion_agree(num_kv_heads, monkeypatch):
    mha = make(num_kv_heads)
    x = torch.randn(2, 5, E, dtype=F64)
    padding = torch.tensor([[False] * 5, [True, True, False, False, False]])
    with_gqa, _ = mha(x, is_causal=True, key_padding_mask=padding)
    monkeypatch.setattr(multihead, "SDPA_HAS_GQA", False)
    expanded, _ = mha(x, is_causal=True, key_padding_mask=padding)
    explicit, _ = mha(x, is_causal=True, key_padding_mask=padding, need_weights=True)
    torch.testing.assert_close(with_gqa, expanded)
    torch.testing.assert_close(with_gqa, explicit)


def test_num_kv_heads_must_divide_num_heads():
    with pytest.raises(ValueError, match="num_kv_heads=4 does not divide num_heads=6"):
        qkv.MultiHeadAttention(12, 6, num_kv_heads=4)
    with pytest.raises(ValueError, match="num_kv_heads must be positive, got 0"):
        qkv.MultiHeadAttention(12, 6, num_kv_heads=0)
    with pytest.raises(ValueError, match="num_kv_heads=4 does not divide num_heads=6"):
        qkv.HeadWeights.random(12, 6, num_kv_heads=4)
    assert "num_kv_heads=2" in repr(qkv.MultiHeadAttention(12, 6, num_kv_heads=2))


def test_the_per_head_module_refuses_what_it_cannot_hold():
    hw = qkv.HeadWeights.random(12, 6, num_kv_heads=2)
    with pytest.raises(ValueError, match=r"weights have 2 K/V heads for 6 query heads .*expand_kv_heads"):
        qkv.PerHeadMultiHeadAttention.from_heads(hw)
    with pytest.raises(ValueError, match=r"one K/V head per query head.*expand_kv_heads"):
        qkv.interop.to_torch(hw)
    per_head = qkv.PerHeadMultiHeadAttention(12, 6)
    x = torch.randn(1, 2, 12)
    with pytest.raises(TypeError, match="PerHeadMultiHeadAttention does not take cache"):
        per_head(x, cache=qkv.KVCache(1, 6, 2, max_length=4))
    # the expanded weights are the same layer in a form both hold
    gqa = qkv.MultiHeadAttention.from_heads(hw)
    torch.testing.assert_close(
        qkv.PerHeadMultiHeadAttention.from_heads(hw.expand_kv_heads())(x)[0], gqa(x)[0]
    )
    reference = qkv.interop.to_torch(hw.expand_kv_heads())
    torch.testing.assert_close(reference(x, x, x, need_weights=False)[0], gqa(x)[0], atol=1e-6, rtol=1e-5)


def test_grouped_query_cache_holds_only_the_kv_heads():
    sizes = {h_kv: make(h_kv).new_cache(1, 16).nbytes for h_kv in (6, 3, 2, 1)}
    for h_kv, nbytes in sizes.items():
        assert nbytes * H == sizes[H] * h_kv  # exactly h_kv / h of the multi-head cache


def test_grouped_query_init_torch_and_reset_parameters():
    torch.manual_seed(0)
    mha = qkv.MultiHeadAttention(16, 4, num_kv_heads=2, init="torch")
    assert mha.k_proj.weight.shape == (8, 16) and mha.k_proj.bias.abs().max() == 0
    bound = (6 / (16 + 8)) ** 0.5  # Xavier over k_proj's own (h_kv·d_k, kdim)
    assert mha.k_proj.weight.abs().max() <= bound
    meta = qkv.MultiHeadAttention(16, 4, num_kv_heads=2, device="meta").to_empty(device="cpu")
    meta.reset_parameters()
    assert torch.isfinite(meta.k_proj.weight).all()


def test_project_key_value_names_a_dtype_mismatch():
    cross = qkv.MultiHeadAttention(E, H, kdim=7, vdim=7)  # float32 parameters
    memory = torch.randn(2, 9, 7, dtype=F64)
    with pytest.raises(TypeError, match=r"key has dtype torch\.float64, but the module's parameter q_proj"):
        cross.project_key_value(memory)
    with pytest.raises(TypeError, match=r"value has dtype torch\.float32, but key has dtype torch\.float64"):
        cross.project_key_value(memory, memory.float())


def test_steps_under_no_grad_or_a_reset_leave_earlier_outputs_differentiable():
    mha = make(2)
    x = torch.randn(2, 5, E, dtype=F64, requires_grad=True)
    expected = torch.autograd.grad(mha(x[:, :3], is_causal=True)[0].sum(), x)[0]
    cache = mha.new_cache(2, 8)
    prefill, _ = mha(x[:, :3], cache=cache, is_causal=True)  # recording
    with torch.no_grad():
        mha(x[:, 3:4], cache=cache)  # e.g. a sampled token, not recorded
    torch.testing.assert_close(torch.autograd.grad(prefill.sum(), x, retain_graph=True)[0], expected)
    cache.reset()
    with torch.no_grad():
        mha(x[:, :4], cache=cache, is_causal=True)  # the memory is reused for another prompt
    torch.testing.assert_close(torch.autograd.grad(prefill.sum(), x)[0], expected)


def test_a_cache_belongs_to_one_layer():
    first, second = make(2, seed=0), make(2, seed=1)
    cache = first.new_cache(1, 8)
    first(torch.randn(1, 2, E, dtype=F64), cache=cache, is_causal=True)
    with pytest.raises(ValueError, match="cache holds the keys and values of another module"):
        second(torch.randn(1, 1, E, dtype=F64), cache=cache)
    assert cache.length == 2
    cache.reset()
    second(torch.randn(1, 1, E, dtype=F64), cache=cache)  # free again after a reset
    restored = pickle.loads(pickle.dumps(cache))  # a copy is nobody's yet
    first(torch.randn(1, 1, E, dtype=F64), cache=restored)
    assert restored.length == 2


def test_new_cache_inside_autocast_takes_the_autocast_dtype():
    mha = qkv.MultiHeadAttention(16, 4, num_kv_heads=2)  # float32 parameters
    x = torch.randn(2, 5, 16)
    with torch.no_grad(), torch.autocast("cpu", dtype=torch.bfloat16):
        full, _ = mha(x, is_causal=True)
        cache = mha.new_cache(2, 5)
        assert cache.dtype == torch.bfloat16
        steps = [mha(x[:, t : t + 1], cache=cache, is_causal=True)[0] for t in range(5)]
        with pytest.raises(TypeError, match=r"create the cache with dtype=torch\.bfloat16"):
            mha(x[:, :1], cache=qkv.KVCache(2, 2, 4, max_length=5))
    torch.testing.assert_close(torch.cat(steps, dim=1), full)


def test_cropping_goes_back_to_a_shared_prompt():
    mha = make()
    x, other = torch.randn(1, 6, E, dtype=F64), torch.randn(1, 2, E, dtype=F64)
    cache = mha.new_cache(1, 6)
    with torch.no_grad():
        mha(x, cache=cache, is_causal=True)
        cache.crop(4)  # keep the 4-token prompt, drop the 2 generated tokens
        out, _ = mha(other, cache=cache, is_causal=True)
        expected, _ = mha(torch.cat([x[:, :4], other], dim=1), is_causal=True)
    torch.testing.assert_close(out, expected[:, 4:])
    with pytest.raises(ValueError, match="length must be between 0 and the cache's length 6, got 7"):
        cache.crop(7)


def test_hugging_face_attention_masks_are_pointed_the_right_way():
    mha = make()
    with pytest.raises(TypeError, match="attention_mask == 0"):
        mha(torch.randn(1, 2, E, dtype=F64), key_padding_mask=torch.ones(1, 2, dtype=torch.long))


def test_a_trained_query_with_frozen_keys_and_values_still_back_propagates():
    mha = make(2)
    mha.k_proj.requires_grad_(False)
    mha.v_proj.requires_grad_(False)  # e.g. fine-tuning W^Q only: the new keys need no grad
    x = torch.randn(1, 5, E, dtype=F64)
    full, _ = mha(x, is_causal=True)
    expected = torch.autograd.grad(full.sum(), mha.q_proj.weight)[0]
    cache = mha.new_cache(1, 6)
    prefill, _ = mha(x[:, :3], cache=cache, is_causal=True)
    steps = [mha(x[:, t : t + 1], cache=cache)[0] for t in (3, 4)]
    with torch.no_grad():
        mha(torch.randn(1, 1, E, dtype=F64), cache=cache)  # a step that is not recorded
    got = torch.autograd.grad(torch.cat([prefill, *steps], dim=1).sum(), mha.q_proj.weight)[0]
    torch.testing.assert_close(got, expected)


def test_inference_mode_after_a_recorded_step_then_no_grad():
    mha = make()
    x = torch.randn(1, 6, E, dtype=F64)
    cache = mha.new_cache(1, 6)
    mha(x[:, :2], cache=cache, is_causal=True)  # recorded: the parameters require grad
    with torch.inference_mode():
        mha(x[:, 2:3], cache=cache)
    with torch.no_grad():
        out, _ = mha(x[:, 3:4], cache=cache)
        cache.reset()
        mha(x[:, :4], cache=cache, is_causal=True)
        expected, _ = mha(x[:, :4], is_causal=True)
    torch.testing.assert_close(out, expected[:, 3:])


def test_a_refused_call_does_not_claim_the_cache_and_batch_errors_blame_the_input():
    first, second = make(seed=0), make(seed=1)
    cache = first.new_cache(2, 8)
    with pytest.raises(ValueError, match="mask of shape"):
        first(torch.randn(2, 2, E, dtype=F64), cache=cache, mask=torch.ones(3, 3, dtype=torch.bool))
    second(torch.randn(2, 2, E, dtype=F64), cache=cache, is_causal=True)  # still nobody's
    with pytest.raises(ValueError, match="key has 3 sequences in the batch, but the query's batch size is 2"):
        second(torch.randn(2, 1, E, dtype=F64), torch.randn(3, 1, E, dtype=F64), cache=cache)


def test_float64_module_under_autocast_gets_a_float64_cache():
    mha = make()
    with torch.no_grad(), torch.autocast("cpu", dtype=torch.bfloat16):
        cache = mha.new_cache(1, 4)
        assert cache.dtype == F64  # autocast leaves float64 alone
        mha(torch.randn(1, 3, E, dtype=F64), cache=cache, is_causal=True)


def test_a_module_pickled_before_grouped_query_attention_still_loads():
    mha = make()
    state = dict(mha.__dict__)
    del state["num_kv_heads"]  # what a whole-module pickle from before the attribute holds
    old = qkv.MultiHeadAttention.__new__(qkv.MultiHeadAttention)
    old.__setstate__(state)
    x = torch.randn(1, 2, E, dtype=F64)
    assert old.num_kv_heads == H
    torch.testing.assert_close(old(x)[0], mha(x)[0])
