"""qkv.rotary against Hugging Face's Llama and torch's ONNX RotaryEmbedding: float64, non-square shapes."""

from __future__ import annotations

import pytest
import torch

import qkv
from qkv import interop

F64 = torch.float64
# 2 sequences, 3 query heads sharing 1 K/V head, 5 positions, d_k = 6 (T != d_k != h).
B, H, T, D = 2, 3, 5, 6


def randn(*shape, seed=0):
    return torch.randn(*shape, generator=torch.Generator().manual_seed(seed), dtype=F64)


def exact(pairing="half", **kwargs):
    return qkv.RotaryEmbedding(D, pairing=pairing, angle_dtype=F64, **kwargs)


# --- The rotation itself, against two real implementations -----------------------------------


def test_half_split_is_hugging_faces_apply_rotary_pos_emb_and_rotary_embedding():
    from transformers import LlamaConfig
    from transformers.models.llama.modeling_llama import LlamaRotaryEmbedding, apply_rotary_pos_emb

    # rope_theta as a keyword: transformers 5 reads it into rope_parameters, 4.55 keeps it as is
    config = LlamaConfig(hidden_size=18, num_attention_heads=3, head_dim=D, rope_theta=500.0)
    q, k = randn(B, H, T, D), randn(B, 1, T, D, seed=1)
    positions = torch.tensor([[0, 1, 2, 3, 4], [7, 8, 9, 30, 31]])  # (B, T), not all from 0
    cos, sin = LlamaRotaryEmbedding(config)(q, positions)  # (B, T, D), float32 angles cast to float64
    expected_q, expected_k = apply_rotary_pos_emb(q, k, cos, sin)
    rope = interop.rotary_from_llama(config)  # float32 angles, as Hugging Face computes them
    assert (rope.base, rope.pairing, rope.d_k, rope.angle_dtype) == (500.0, "half", D, torch.float32)
    torch.testing.assert_close(rope(q, positions[:, None]), expected_q, rtol=0, atol=0)
    torch.testing.assert_close(rope(k, positions[:, None]), expected_k, rtol=0, atol=0)


HAS_ONNX_ROTARY = hasattr(getattr(torch.onnx, "ops", None), "rotary_embedding")  # torch 2.8 on


@pytest.mark.skipif(not HAS_ONNX_ROTARY, reason="this torch has no torch.onnx.ops.rotary_embedding")
@pytest.mark.parametrize("pairing", ["half", "interleaved"])
@pytest.mark.parametrize("fraction", [1.0, 2 / 3])
def test_both_pairings_and_partial_rotation_are_torchs_onnx_rotary_embedding(pairing, fraction):
    rope = exact(pairing, fraction=fraction, base=50.0)
    x = randn(B, H, T, D)  # (B, h, T, d_k), the op's 4-D layout
    positions = torch.tensor([[0, 1, 2, 3, 4], [3, 1, 4, 1, 5]])  # (B, T)
    angles = rope.angles(torch.arange(8))  # (8, r/2): the op's cos and sin caches
    expected = torch.onnx.ops.rotary_embedding(
        x, angles.cos(), angles.sin(), positions, interleaved=pairing == "interleaved",
        rotary_embedding_dim=rope.rotary_dim,
    )  # fmt: skip
    torch.testing.assert_close(rope(x, positions[:, None]), expected)
    assert rope.rotary_dim == (6 if fraction == 1 else 4)
    torch.testing.assert_close(rope(x, positions[:, None])[..., rope.rotary_dim :], x[..., rope.rotary_dim :])


@pytest.mark.parametrize("pairing", ["half", "interleaved"])
def test_scores_depend_on_positions_only_through_their_difference(pairing):
    rope = exact(pairing)
    q, k = randn(1, D), randn(1, D, seed=1)

    def score(t, s):
        return (rope(q, torch.tensor([t])) @ rope(k, torch.tensor([s])).T).item()

    for t, s in [(0, 0), (4, 1), (1, 4), (9, 2)]:
        for shift in (1, 5, 1000):
            assert score(t + shift, s + shift) == pytest.approx(score(t, s), rel=1e-12, abs=1e-12)
    assert score(4, 1) != pytest.approx(score(1, 4))  # t - s, signed: not |t - s|


@pytest.mark.parametrize("pairing", ["half", "interleaved"])
@pytest.mark.parametrize("fraction", [1.0, 2 / 3])
def test_the_rotation_matrix_is_orthogonal_and_composes(pairing, fraction):
    rope = exact(pairing, fraction=fraction)
    eye = torch.eye(D, dtype=F64)
    for t, s in [(0, 3), (3, 0), (7, 11)]:
        R_t, R_s = rope.matrix(t), rope.matrix(s)
        torch.testing.assert_close(R_t.T @ R_t, eye)
        torch.testing.assert_close(R_t.T @ R_s, rope.matrix(s - t))
    torch.testing.assert_close(rope.matrix(0), eye)
    x = randn(T, D)
    rows = torch.stack([rope.matrix(t) @ x[t] for t in range(T)])  # R_t q_t, one row per position
    torch.testing.assert_close(rope(x), rows)


def test_frequencies_and_wavelengths():
    rope = qkv.RotaryEmbedding(8, base=10_000.0, angle_dtype=F64)
    theta = rope.frequencies()
    torch.testing.assert_close(theta, torch.tensor([1.0, 0.1, 0.01, 0.001], dtype=F64))
    torch.testing.assert_close(rope.angles(torch.tensor([3])), 3 * theta[None])


def test_apply_rotary_is_the_class_and_defaults_positions_to_0_to_t_minus_1():
    x = randn(B, H, T, D)
    expected = exact("interleaved")(x, torch.arange(T))
    torch.testing.assert_close(qkv.apply_rotary(x, pairing="interleaved", angle_dtype=F64), expected)
    torch.testing.assert_close(qkv.apply_rotary(x)[..., 0, :], x[..., 0, :])  # position 0 turns nothing


# --- Why values are not rotated: a shift of every position ------------------------------------


def test_shifting_every_position_changes_nothing_unless_values_are_rotated():
    rope = exact()
    q, k, v = randn(B, H, T, D), randn(B, H, T, D, seed=1), randn(B, H, T, D, seed=2)
    here, there = torch.arange(T), torch.arange(T) + 17

    def output(positions, rotate_values):
        values = rope(v, positions) if rotate_values else v
        return qkv.attention(rope(q, positions), rope(k, positions), values, is_causal=True)[0]

    torch.testing.assert_close(output(here, False), output(there, False))
    assert not torch.allclose(output(here, True), output(there, True), atol=1e-3)


# --- Weights for the other pairing ----------------------------------------------------------


@pytest.mark.parametrize("rotary_dim", [None, 4])
def test_pairing_conversion_is_a_permutation_and_its_inverse(rotary_dim):
    w = randn(H * D, 7)  # (h·d_k, d_model), as nn.Linear stores W^Q
    half = qkv.interleaved_to_half(w, H, head_dim=D, rotary_dim=rotary_dim)
    torch.testing.assert_close(qkv.half_to_interleaved(half, H, head_dim=D, rotary_dim=rotary_dim), w)
    back = qkv.interleaved_to_half(qkv.half_to_interleaved(w, H, head_dim=D), H, head_dim=D)
    torch.testing.assert_close(back, w)
    r = rotary_dim or D
    order = [*range(0, r, 2), *range(1, r, 2), *range(r, D)]  # within each head
    torch.testing.assert_close(half[:D], w[order])
    torch.testing.assert_close(half[D : 2 * D], w[[D + i for i in order]])
    b = torch.arange(H * D, dtype=F64)  # a bias (h·d_k,) is reordered like the rows
    torch.testing.assert_close(qkv.interleaved_to_half(b, H, head_dim=D, rotary_dim=rotary_dim)[:D], b[order])


def test_hugging_faces_conversion_permutation_is_interleaved_to_half():
    d_model, h = 12, 3
    w = randn(d_model, d_model)

    def permute(w, n_heads, dim1=d_model, dim2=d_model):  # convert_llama_weights_to_hf.py, as written there
        return w.view(n_heads, dim1 // n_heads // 2, 2, dim2).transpose(1, 2).reshape(dim1, dim2)

    torch.testing.assert_close(qkv.interleaved_to_half(w, h, head_dim=d_model // h), permute(w, h))


@pytest.mark.parametrize("to_half", [True, False])
@pytest.mark.parametrize("num_kv_heads", [3, 1])
def test_converted_weights_compute_the_same_layer_in_the_other_pairing(to_half, num_kv_heads):
    source, target = ("interleaved", "half") if to_half else ("half", "interleaved")
    convert = qkv.interleaved_to_half if to_half else qkv.half_to_interleaved
    torch.manual_seed(0)
    before = qkv.MultiHeadAttention(10, 3, d_k=D, num_kv_heads=num_kv_heads, dtype=F64, rotary=exact(source))
    after = qkv.MultiHeadAttention(10, 3, d_k=D, num_kv_heads=num_kv_heads, dtype=F64, rotary=exact(target))
    after.load_state_dict(before.state_dict())
    x = randn(B, T, 10)
    wrong = after(x, is_causal=True)[0]  # the other pairing on unconverted weights: silently different
    assert not torch.allclose(wrong, before(x, is_causal=True)[0], atol=1e-3)
    with torch.no_grad():
        for proj, heads in ((after.q_proj, 3), (after.k_proj, num_kv_heads)):
            proj.weight.copy_(convert(proj.weight, heads, head_dim=D))
            proj.bias.copy_(convert(proj.bias, heads, head_dim=D))
    torch.testing.assert_close(after(x, is_causal=True)[0], before(x, is_causal=True)[0])
    torch.testing.assert_close(after.v_proj.weight, before.v_proj.weight)  # W^V is never permuted


# --- In MultiHeadAttention: the cache, GQA, and Llama ----------------------------------------


def module(num_kv_heads=1, pairing="half", fraction=1.0):
    torch.manual_seed(0)
    rope = exact(pairing, fraction=fraction)
    return qkv.MultiHeadAttention(10, H, d_k=D, d_v=4, num_kv_heads=num_kv_heads, rotary=rope, dtype=F64)


@pytest.mark.parametrize("num_kv_heads", [3, 1])
@pytest.mark.parametrize("pairing", ["half", "interleaved"])
def test_the_cache_holds_rotated_keys_and_raw_values_and_decodes_like_the_full_pass(num_kv_heads, pairing):
    mha = module(num_kv_heads, pairing, fraction=2 / 3)
    x = randn(B, 7, 10)
    full, _ = mha(x, is_causal=True)
    cache = mha.new_cache(B, 7)
    steps = [mha(x[:, :3], cache=cache, is_causal=True)[0]]  # a prompt of 3, then one token at a time
    steps += [mha(x[:, t : t + 1], cache=cache, is_causal=True)[0] for t in range(3, 7)]
    torch.testing.assert_close(torch.cat(steps, dim=1), full)
    raw_keys = qkv.split_heads(mha.k_proj(x), num_kv_heads)  # (B, h_kv, 7, d_k), before rotation
    raw_values = qkv.split_heads(mha.v_proj(x), num_kv_heads)  # (B, h_kv, 7, d_v)
    torch.testing.assert_close(cache.keys, mha.rotary(raw_keys))  # rotated at positions 0..6
    torch.testing.assert_close(cache.values, raw_values)  # not rotated
    assert cache.keys.shape == (B, num_kv_heads, 7, D)  # rotated once per K/V head, before sharing


def test_rotating_before_sharing_kv_heads_is_the_module_with_heads_copied():
    grouped = module(num_kv_heads=1)
    copied = qkv.MultiHeadAttention.from_heads(grouped.to_heads().expand_kv_heads())
    copied.rotary = grouped.rotary
    x = randn(B, T, 10)
    for need_weights in (False, True):
        torch.testing.assert_close(
            grouped(x, is_causal=True, need_weights=need_weights)[0],
            copied(x, is_causal=True, need_weights=need_weights)[0],
        )


def test_the_explicit_and_fused_paths_agree_with_rotation_and_batch_second():
    mha = module(pairing="interleaved")
    x = randn(B, T, 10)
    fused, _ = mha(x, is_causal=True)
    explicit, weights = mha(x, is_causal=True, need_weights=True)
    torch.testing.assert_close(fused, explicit)
    q = mha.rotary(qkv.split_heads(mha.q_proj(x), H))
    k = mha.rotary(qkv.split_heads(mha.k_proj(x), 1))
    scores = (q @ k.transpose(-2, -1) / D**0.5).masked_fill(~qkv.causal_mask(T), -torch.inf)  # (B, h, T, T)
    expected = torch.softmax(scores, dim=-1)
    torch.testing.assert_close(weights, expected)


def llama_attention(num_kv_heads, implementation):
    from transformers import LlamaConfig
    from transformers.models.llama.modeling_llama import LlamaAttention, LlamaRotaryEmbedding

    config = LlamaConfig(
        hidden_size=18, num_attention_heads=6, num_key_value_heads=num_kv_heads, head_dim=4,
        attention_dropout=0.0, rope_theta=100.0,
    )  # fmt: skip
    config._attn_implementation = implementation
    torch.manual_seed(0)
    return LlamaAttention(config, layer_idx=0).to(F64).eval(), LlamaRotaryEmbedding(config).to(F64)


@pytest.mark.parametrize("num_kv_heads", [6, 2, 1])
@pytest.mark.parametrize("implementation", ["eager", "sdpa"])
def test_from_llama_with_the_rotation_on_matches_llama_attention(num_kv_heads, implementation):
    llama, rotary_embedding = llama_attention(num_kv_heads, implementation)
    mha = qkv.MultiHeadAttention.from_heads(interop.from_llama(llama))
    mha.rotary = interop.rotary_from_llama(llama)
    x_llama = randn(2, 7, 18).requires_grad_()
    x_ours = x_llama.detach().clone().requires_grad_()
    rotation = rotary_embedding(x_llama, torch.arange(7)[None])  # Hugging Face's own cos and sin
    causal = qkv.additive_mask(qkv.causal_mask(7), F64).clamp(min=torch.finfo(torch.float32).min)
    expected, _ = llama(x_llama, position_embeddings=rotation, attention_mask=causal[None, None])
    output, _ = mha(x_ours, is_causal=True)
    torch.testing.assert_close(output, expected)
    expected.square().sum().backward()
    output.square().sum().backward()
    torch.testing.assert_close(x_ours.grad, x_llama.grad)


def test_a_llama_model_decoded_through_qkvs_cache_is_hugging_faces_forward_with_past_key_values():
    from transformers import DynamicCache, LlamaConfig, LlamaForCausalLM

    config = LlamaConfig(
        vocab_size=50, hidden_size=24, intermediate_size=40, num_hidden_layers=2, num_attention_heads=4,
        num_key_value_heads=2, head_dim=8, rope_theta=1000.0,
    )  # fmt: skip
    config._attn_implementation = "sdpa"
    torch.manual_seed(0)
    model = LlamaForCausalLM(config).to(F64).eval()
    ids = torch.randint(0, 50, (1, 9), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        past = DynamicCache()
        logits = [model(ids[:, :4], past_key_values=past, use_cache=True).logits]  # prompt, then steps
        logits += [model(ids[:, t : t + 1], past_key_values=past, use_cache=True).logits for t in range(4, 9)]
        expected = torch.cat(logits, dim=1)  # (1, 9, vocab)
        layers = model.model.layers
        attentions = []
        for layer in layers:
            mha = qkv.MultiHeadAttention.from_heads(interop.from_llama(layer.self_attn))
            mha.rotary = interop.rotary_from_llama(model)
            attentions.append((mha, mha.new_cache(1, 9)))

        def forward(chunk):  # Llama's blocks with qkv's attention; everything else is Hugging Face's
            hidden = model.model.embed_tokens(chunk)
            for layer, (mha, cache) in zip(layers, attentions, strict=True):
                hidden = hidden + mha(layer.input_layernorm(hidden), cache=cache, is_causal=True)[0]
                hidden = hidden + layer.mlp(layer.post_attention_layernorm(hidden))
            return model.lm_head(model.model.norm(hidden))

        ours = torch.cat([forward(ids[:, :4])] + [forward(ids[:, t : t + 1]) for t in range(4, 9)], dim=1)
        torch.testing.assert_close(ours, expected)
        torch.testing.assert_close(ours, model(ids).logits)  # and both are the full forward
        hf_keys = past.layers[0].keys  # Hugging Face's cache holds rotated keys too: the same ones
        torch.testing.assert_close(attentions[0][1].keys, hf_keys)


# --- Errors --------------------------------------------------------------------------------


def test_bad_input_is_named():
    with pytest.raises(ValueError, match=r"d_k must be even .* got d_k=5"):
        qkv.RotaryEmbedding(5)
    with pytest.raises(ValueError, match=r"fraction=0.5 of d_k=10 rotates int\(10 \* 0.5\) = 5 dimensions"):
        qkv.RotaryEmbedding(10, fraction=0.5)
    with pytest.raises(ValueError, match='pairing must be "half" or "interleaved", got \'gptj\''):
        qkv.RotaryEmbedding(8, pairing="gptj")
    with pytest.raises(ValueError, match="base must be a finite number above 1"):
        qkv.RotaryEmbedding(8, base=1.0)
    rope = qkv.RotaryEmbedding(D, max_positions=8)
    with pytest.raises(ValueError, match="positions go up to 9, past max_positions=8"):
        rope(randn(3, D), torch.tensor([7, 8, 9]))
    with pytest.raises(ValueError, match=r"one position per row of x, shape \(\.\.\., 3\), got \(4,\)"):
        rope(randn(3, D), torch.arange(4))
    with pytest.raises(TypeError, match=r"positions must be a tensor of integers, got dtype torch\.float32"):
        rope(randn(3, D), torch.arange(3.0))
    with pytest.raises(ValueError, match=r"x has 4 features per row, but this RotaryEmbedding is for d_k=6"):
        rope(randn(3, 4))
    with pytest.raises(ValueError, match="rotary is for d_k=8, but this module's heads have d_k=4"):
        qkv.MultiHeadAttention(12, 3, rotary=qkv.RotaryEmbedding(8))
    with pytest.raises(ValueError, match="not key_value"):
        mha = module()
        mha(randn(B, T, 10), key_value=mha.project_key_value(randn(B, T, 10)))
    with pytest.raises(ValueError, match=r"rotary_dim must be even and at most d_k=4 .* got 5"):
        qkv.interleaved_to_half(randn(12, 3), 3, head_dim=4, rotary_dim=5)
    with pytest.raises(ValueError, match=r"num_heads=3 heads of head_dim=4 need 12 rows, got 10"):
        qkv.interleaved_to_half(randn(10, 3), 3, head_dim=4)
    with pytest.raises(TypeError, match="head_dim"):  # required: no silent default
        qkv.half_to_interleaved(randn(8, 3), 4)
    k_proj = randn(2 * 4, 3)  # grouped-query: h_kv = 2 heads of d_k = 4, while h = 4
    with pytest.raises(ValueError, match=r"num_heads=4 heads of head_dim=4 need 16 rows, got 8"):
        qkv.half_to_interleaved(k_proj, 4, head_dim=4)  # h passed for a k_proj
    with pytest.raises(ValueError, match=r"\(8, 3\): num_heads=4 heads of head_dim=4"):
        qkv.interleaved_to_half(k_proj, 4, head_dim=4)
    right = qkv.half_to_interleaved(k_proj, 2, head_dim=4)  # h_kv: the check passes
    torch.testing.assert_close(qkv.interleaved_to_half(right, 2, head_dim=4), k_proj)
    with pytest.raises(ValueError, match="head_dim must be positive"):
        qkv.half_to_interleaved(k_proj, 2, head_dim=0)


def test_scaled_llama_rotations_are_refused():
    from transformers import LlamaConfig

    config = LlamaConfig(rope_parameters={"rope_type": "linear", "rope_theta": 10000.0, "factor": 2.0})
    with pytest.raises(ValueError, match="rope_type='linear'"):
        interop.rotary_from_llama(config)


def test_a_module_pickled_before_rotary_loads_without_it():
    import pickle

    mha = qkv.MultiHeadAttention(12, 3)
    state = mha.__dict__.copy()
    state.pop("_rotary", None)
    restored = qkv.MultiHeadAttention.__new__(qkv.MultiHeadAttention)
    restored.__setstate__(state)
    assert restored.rotary is None
    assert pickle.loads(pickle.dumps(module())).rotary == module().rotary


# --- The rotary diagrams added for the answer page -------------------------------------------


def test_position_scores_draws_the_scores_and_their_range_along_each_diagonal():
    import matplotlib

    matplotlib.use("Agg")
    rope = exact()
    q, k = randn(1, D), randn(1, D, seed=1)
    t = torch.arange(7)
    rotated = rope(q.expand(7, D), t) @ rope(k.expand(5, D), t[:5]).T  # (T, S) = (7, 5)
    added = randn(7, 5, seed=2)
    figure = qkv.diagrams.position_scores({"RoPE": rotated, "added": added})
    for n, (grid, ax) in enumerate(zip((rotated, added), figure.axes, strict=False)):
        (image,) = [i for i in ax.get_images() if i.get_gid() == f"scores-{n}"]
        torch.testing.assert_close(torch.as_tensor(image.get_array().data), grid)
        assert ax.get_xlabel() == "key position s" and ax.get_title()
    spread = max(float(d.max() - d.min()) for o in range(-6, 5) if (d := added.diagonal(o)).numel() > 1)
    assert figure.axes[0].get_title().endswith("largest range along a diagonal: 0.00")
    assert figure.axes[1].get_title().endswith(f"largest range along a diagonal: {spread:.2f}")
    with pytest.raises(ValueError, match="panels must map at least one title"):
        qkv.diagrams.position_scores({})


def test_position_scores_hatches_exactly_the_cells_a_causal_mask_hides():
    import matplotlib
    from matplotlib.path import Path

    matplotlib.use("Agg")
    figure = qkv.diagrams.position_scores({"a": randn(5, 7), "b": randn(5, 7, seed=1)}, causal=True)
    for n in (0, 1):
        (patch,) = [p for p in figure.axes[n].patches if p.get_gid() == f"masked-{n}"]
        outline = Path(patch.get_xy())
        inside = {(t, s) for t in range(5) for s in range(7) if outline.contains_point((s, t))}
        assert inside == {(t, s) for t in range(5) for s in range(7) if s > t}
    assert not [p for p in qkv.diagrams.position_scores({"a": randn(5, 7)}).axes[0].patches]


@pytest.mark.parametrize("d_k", [4, 8])
def test_pairings_colours_partners_alike_and_draws_the_conversion(d_k):
    import matplotlib

    matplotlib.use("Agg")
    figure = qkv.diagrams.pairings(d_k)
    patches = {p.get_gid(): p for p in figure.axes[0].patches}
    colour = {gid: matplotlib.colors.to_hex(p.get_facecolor()) for gid, p in patches.items()}
    for j in range(d_k // 2):  # the partners the text names: (2j, 2j + 1) and (j, j + d_k/2)
        assert colour[f"interleaved-{2 * j}"] == colour[f"interleaved-{2 * j + 1}"]
        assert colour[f"half-{j}"] == colour[f"half-{j + d_k // 2}"] == colour[f"interleaved-{2 * j}"]
    assert len({colour[f"half-{j}"] for j in range(d_k // 2)}) == d_k // 2
    lines = {line.get_gid(): line.get_xdata() for line in figure.axes[0].lines}
    moved = qkv.interleaved_to_half(torch.arange(float(d_k)), 1, head_dim=d_k).long().tolist()  # m: moved[m]
    for m_half, m_inter in enumerate(moved):
        assert tuple(lines[f"move-{m_inter}"]) == pytest.approx((m_inter + 0.45, m_half + 0.45))
    with pytest.raises(ValueError, match="d_k must be even"):
        qkv.diagrams.pairings(5)


def test_pairings_points_its_conversion_arrows_down_and_scores_name_their_colour_bar():
    import matplotlib

    matplotlib.use("Agg")
    figure = qkv.diagrams.pairings(4)
    heads = [a for a in figure.axes[0].texts if isinstance(a, matplotlib.text.Annotation)]
    assert len(heads) == 4 and all(a.xy[1] == 0.5 for a in heads)  # each ends on the half-split row
    moves = next(t.get_text() for t in figure.axes[0].texts if "per head" in t.get_text())
    assert "q_proj.weight" in moves and "W^Q" not in moves  # rows of the weight, not of W^Q
    scores = randn(3, 3)
    figure = qkv.diagrams.position_scores({"a": scores}, label="score q·k/√d_k")
    assert figure.axes[-1].get_ylabel() == "score q·k/√d_k"


def test_position_scores_colours_survive_the_books_palette_png():
    """The book stores figures as 256-colour palette PNGs (qkv.setup): a continuous map's
    rarest colours, at the colour bar's ends, were merged into the text's grey; the map's
    few discrete levels come through unchanged, and its scale stays centred at 0."""
    import io

    import matplotlib
    from PIL import Image

    matplotlib.use("Agg")
    rope = exact()
    t = torch.arange(16)
    rotated = rope(randn(1, D).expand(16, D), t) @ rope(randn(1, D, seed=1).expand(16, D), t).T
    figure = qkv.diagrams.position_scores({"RoPE": rotated, "added": 0.6 * randn(16, 16, seed=2)})
    image = figure.axes[0].get_images()[0]
    assert image.cmap.N == qkv.diagrams.rotary.SCORE_LEVELS and image.norm.vmin == -image.norm.vmax
    buffer = io.BytesIO()
    figure.savefig(buffer, format="png", dpi=200)
    rgb = Image.open(buffer).convert("RGB")
    stored = rgb.quantize(256, method=Image.Quantize.MEDIANCUT, dither=Image.Dither.NONE).convert("RGB")
    box = figure.axes[-1].get_window_extent()  # the colour bar, in pixels at the figure's dpi
    x, height = round(box.x0 + box.x1), rgb.size[1]  # the bar's middle column at dpi 200
    for y in range(round(height - 2 * box.y1) + 3, round(height - 2 * box.y0) - 3):
        assert stored.getpixel((x, y)) == rgb.getpixel((x, y)), f"row {y} of the colour bar changed"
