"""qkv.diagrams.inference: cross-attention, a decoding step with a KV cache, masked attention maps.

Every figure is read back: cells per matrix (patches_by_gid), shape labels (texts_of), colours.
"""

from __future__ import annotations

import matplotlib
import numpy as np
import pytest
import torch

import qkv
from qkv.diagrams import HEAD_COLOURS, ROLE_COLOURS, matrix_names, patches_by_gid, texts_of
from qkv.diagrams._draw import MASKED_COLOUR, MASKED_HATCH
from qkv.diagrams.inference import _fresh, attention_map, cache_growth, cross_attention, decoding_step
from qkv.models import DecoderLayer, EncoderDecoderConfig, TinyEncoderDecoder

matplotlib.use("Agg")


def grid(figure, name: str) -> list[list[str]]:
    """The face colours of the matrix drawn as ``name``, one list per row, lower case."""
    return [[c.lower() for c in row] for row in qkv.diagrams.cells(figure, name).colours]


def colours(figure, name: str) -> list[str]:
    """The same, flattened: one entry per cell."""
    return [c for row in grid(figure, name) for c in row]


def shape_of(figure, name: str) -> tuple[int, int]:
    rows = grid(figure, name)
    return len(rows), len(rows[0])


# --- cross_attention ---------------------------------------------------------------------------


@pytest.fixture(scope="module")
def model() -> TinyEncoderDecoder:
    # 3 heads of d_k = 4; the encoder (kdim = vdim = 9) narrower than the decoder (embed_dim = 12)
    config = EncoderDecoderConfig(11, 13, encoder_dim=9, decoder_dim=12, num_heads=3, decoder_layers=3)
    return TinyEncoderDecoder(config)


def test_cross_attention_draws_two_layers_to_scale_from_one_encoder_output(model):
    T, S = 4, 7
    memory = torch.randn(2, S, 9)  # a batch: the first sequence is drawn
    figure = cross_attention(model, memory, torch.randn(2, T, 12))
    assert matrix_names(figure).count("enc") == 1 and shape_of(figure, "enc") == (S, 9)  # drawn once
    for i in (0, 1):
        assert shape_of(figure, f"dec{i}") == (T, 12)
        assert shape_of(figure, f"W^Q{i}") == (12, 12)
        assert shape_of(figure, f"W^K{i}") == (9, 12)  # kdim rows, h·d_k columns
        assert shape_of(figure, f"W^V{i}") == (9, 12)
        assert shape_of(figure, f"Q{i}") == (T, 12)
        assert shape_of(figure, f"K{i}") == (S, 12) and shape_of(figure, f"V{i}") == (S, 12)
        assert shape_of(figure, f"scores{i}") == (T, S)  # T queries against S keys
        assert set(colours(figure, f"W^K{i}")) == {ROLE_COLOURS["k"].lower()}
        assert set(colours(figure, f"W^Q{i}")) == {ROLE_COLOURS["q"].lower()}
        assert set(colours(figure, f"scores{i}")) == {ROLE_COLOURS["weights"].lower()}
    assert "W^K2" not in matrix_names(figure)  # max_layers=2: the third layer is only mentioned
    texts = texts_of(figure)
    for shape in ("(7, 9)", "(4, 12)", "(12, 12)", "(9, 12)", "(7, 12)", "(4, 7)"):
        assert shape in texts
    for i in (0, 1):  # each layer's own weights; the layer is a superscript, a subscript is a head
        for letter in "QKV":
            assert f"$W^{{{letter}\\,({i})}}$" in texts and f"${letter}^{{({i})}}$" in texts
    assert r"$\mathrm{enc}$" in texts
    for i in (0, 1):  # each layer's own input, and one score map per head: three heads, a stack of three
        assert f"$\\mathrm{{dec}}^{{({i})}}$" in texts
        assert {f"scores{i}:head1", f"scores{i}:head2"} <= set(matrix_names(figure))
    assert texts.count(r"$Q_i K_i^\top$") == 2 and texts.count("one per head: 3") == 2
    for i in (0, 1):  # the weighted values of the 3 heads, through W^O, back to the decoder's width
        assert shape_of(figure, f"heads{i}") == (T, 12) and shape_of(figure, f"out{i}") == (T, 12)
        assert shape_of(figure, f"W^O{i}") == (12, 12)
        assert set(colours(figure, f"W^O{i}")) == {ROLE_COLOURS["o"].lower()}
    # The one encoder output reaches W^K and W^V of both layers: four branches, each labelled enc.
    assert texts.count(r"$\mathrm{enc}$") == 1 + 4
    assert any("after its one layer:" in t for t in texts)
    assert any("1 more decoder layer" in t for t in texts)
    assert any("T = 4 queries, S = 7 keys, 3 heads of $d_k$ = 4" in t for t in texts)


def test_cross_attention_takes_one_layer_or_a_list_and_reads_their_sizes(model):
    layer = DecoderLayer(dim=12, num_heads=3, hidden=8, memory_dim=6)  # d_k = 4, kdim = 6
    figure = cross_attention(layer, torch.randn(2, 6), torch.randn(5, 12))
    assert shape_of(figure, "W^K0") == (6, 12) and shape_of(figure, "scores0") == (5, 2)
    assert "W^Q1" not in matrix_names(figure) and "(2, 6)" in texts_of(figure)
    figure = cross_attention(model.decoder, torch.randn(3, 9), torch.randn(1, 12), max_layers=3)
    assert shape_of(figure, "scores2") == (1, 3)
    assert not any("more decoder layer" in t for t in texts_of(figure))


def test_cross_attention_names_what_is_wrong(model):
    memory, target = torch.randn(7, 9), torch.randn(4, 12)
    with pytest.raises(ValueError, match="memory has 10 features, but decoder layer 0's cross_attn kdim"):
        cross_attention(model, torch.randn(7, 10), target)
    with pytest.raises(ValueError, match="target has 9 features, but decoder layer 0's cross_attn embed_dim"):
        cross_attention(model, memory, torch.randn(4, 9))
    with pytest.raises(ValueError, match=r"memory must have 2 dimensions \(S, d_enc\).*got shape \(9,\)"):
        cross_attention(model, torch.randn(9), target)
    with pytest.raises(ValueError, match="target has 3 sequences, but memory's batch size is 2"):
        cross_attention(model, torch.randn(2, 7, 9), torch.randn(3, 4, 12))
    with pytest.raises(TypeError, match=r"decoder must be a qkv\.models\.TinyEncoderDecoder.*got Linear"):
        cross_attention(torch.nn.Linear(9, 12), memory, target)
    with pytest.raises(TypeError, match=r"decoder layer 1 \(Linear\) has no cross_attn"):
        cross_attention([model.decoder[0], torch.nn.Linear(9, 12)], memory, target)
    with pytest.raises(ValueError, match="decoder has no layers"):
        cross_attention([], memory, target)
    with pytest.raises(ValueError, match="max_layers must be positive, got 0"):
        cross_attention(model, memory, target, max_layers=0)


# --- decoding_step -----------------------------------------------------------------------------


def cache_after(layer: qkv.MultiHeadAttention, tokens: int, max_length: int = 8) -> qkv.KVCache:
    cache = layer.new_cache(batch_size=1, max_length=max_length)
    if tokens:
        with torch.no_grad():
            layer(torch.randn(1, tokens, layer.embed_dim), cache=cache, is_causal=True)
    return cache


@pytest.mark.parametrize(("num_kv_heads", "d_k", "d_v"), [(2, 4, 4), (3, 5, 3)])
def test_decoding_step_groups_query_heads_over_their_kv_head(num_kv_heads, d_k, d_v):
    h, cached = 6, 5
    mha = qkv.MultiHeadAttention(24, h, num_kv_heads=num_kv_heads, d_k=d_k, d_v=d_v)
    figure = decoding_step(mha, cache_after(mha, cached))
    group = h // num_kv_heads
    for j in range(num_kv_heads):
        assert shape_of(figure, f"K{j}") == (cached + 1, d_k)  # the cache after the step
        assert shape_of(figure, f"V{j}") == (cached + 1, d_v)
    for i in range(h):
        assert shape_of(figure, f"q{i}") == (1, d_k)  # one query row of one head
        mine = set(grid(figure, f"K{i // group}")[cached])  # the new row of the K/V head it reads
        assert set(colours(figure, f"q{i}")) == mine == {_fresh(HEAD_COLOURS[i // group]).lower()}
        for j in set(range(num_kv_heads)) - {i // group}:
            assert set(grid(figure, f"K{j}")[cached]) != mine
    # q_t: head i's block of d_k columns in the colour of the K/V head it reads
    (q_t,) = grid(figure, "q_t")
    assert q_t == [_fresh(HEAD_COLOURS[(c // d_k) // group]).lower() for c in range(h * d_k)]
    (k_t,) = grid(figure, "k_t")
    assert k_t == [_fresh(HEAD_COLOURS[c // d_k]).lower() for c in range(num_kv_heads * d_k)]
    texts = texts_of(figure)
    shared = ", ".join(str(i) for i in range(group + 1, 2 * group + 1))  # numbered from 1
    for text in (f"(1, {h * d_k})", f"(1, {num_kv_heads * d_k})", f"(1, {num_kv_heads * d_v})",
                 f"({cached + 1}, {d_k})", f"({cached + 1}, {d_v})", "(1, 24)",
                 f"K/V head 2: query heads {shared}", f"$q_{{t,{h}}}$", "$K_1$", "$V_1$",
                 f"$K_{num_kv_heads}$"):  # fmt: skip
        assert text in texts


def luminance(colour: str) -> float:
    red, green, blue = matplotlib.colors.to_rgb(colour)
    return 0.2126 * red + 0.7152 * green + 0.0722 * blue


def test_decoding_step_draws_the_new_row_apart_from_the_cached_ones():
    mha = qkv.MultiHeadAttention(12, 3)  # h_kv = h: one query head per K/V head
    figure = decoding_step(mha, cache_after(mha, 4, max_length=10))
    for name in ("K0", "V0", "K1", "V1", "K2"):
        rows = grid(figure, name)
        cached, new = {c for row in rows[:4] for c in row}, set(rows[4])
        assert len(cached) == len(new) == 1 and cached != new  # cached rows lighter, the new row in full
        (light,), (full,) = cached, new
        assert luminance(light) - luminance(full) > 0.15, name  # apart by fill, not only outline
        (outline,) = patches_by_gid(figure, f"new-row:{name}")
        top = qkv.diagrams.cells(figure, name).corner[1]
        assert outline.get_y() == pytest.approx(top + 4) and outline.get_height() == 1  # the last row only
    assert "K/V head 3: query head 3" in texts_of(figure)  # heads numbered from 1
    assert "$q_{t,0}$" not in texts_of(figure) and "$K_0$" not in texts_of(figure)
    assert any("4 earlier tokens, in a cache allocated for 10" in t for t in texts_of(figure))
    assert "$q_t = x_t W^Q + b^Q$" in texts_of(figure)  # the layer has biases: drawn
    unbiased = qkv.MultiHeadAttention(12, 3, num_kv_heads=3, bias=False)
    plain = texts_of(decoding_step(unbiased, cache_after(unbiased, 4, max_length=5)))
    assert "$q_t = x_t W^Q$" in plain and not any("allocated" in t for t in plain)  # a full fit
    pieces = {p.get_gid(): p.get_facecolor() for p in figure.axes[0].patches}
    for state in ("cached", "new"):  # the legend's swatch shows each K/V head's colour
        assert len({pieces[f"legend:{state}:{j}"] for j in range(3)}) == 3
    assert any("average V's rows" in t for t in texts_of(figure))  # the arrow from K to V
    assert any("each head's own" in t for t in texts_of(figure))  # queries are not shared
    first = decoding_step(mha, cache_after(mha, 0))  # the first token: nothing cached yet
    assert shape_of(first, "K0") == (1, 4) and patches_by_gid(first, "new-row:K0")


def test_decoding_step_refuses_a_cache_of_another_shape():
    mha = qkv.MultiHeadAttention(24, 6, num_kv_heads=2)
    with pytest.raises(ValueError, match=r"cache holds 3 K/V heads, but layer\.num_kv_heads is 2"):
        decoding_step(mha, qkv.KVCache(1, 3, 4, max_length=8))
    with pytest.raises(ValueError, match=r"cache holds keys of size d_k = 5, but layer\.d_k is 4"):
        decoding_step(mha, qkv.KVCache(1, 2, 5, 4, max_length=8))
    with pytest.raises(ValueError, match=r"cache holds values of size d_v = 3, but layer\.d_v is 4"):
        decoding_step(mha, qkv.KVCache(1, 2, 4, 3, max_length=8))
    with pytest.raises(ValueError, match="cache is full: it holds 3 of max_length=3 tokens"):
        decoding_step(mha, cache_after(mha, 3, max_length=3))
    with pytest.raises(TypeError, match=r"layer must be a qkv\.MultiHeadAttention .* got PerHeadMulti"):
        decoding_step(qkv.PerHeadMultiHeadAttention(24, 6), qkv.KVCache(1, 6, 4, max_length=8))
    with pytest.raises(TypeError, match=r"cache must be a qkv\.KVCache .* got Tensor"):
        decoding_step(mha, torch.zeros(1, 2, 5, 4))


# --- cache_growth ------------------------------------------------------------------------------


@pytest.mark.parametrize("cached", [1, 4, 9])
def test_cache_growth_adds_a_row_and_a_column_masked_for_earlier_rows(cached):
    figure = cache_growth(cached)
    before, after = qkv.diagrams.cells(figure, "before"), qkv.diagrams.cells(figure, "after")
    assert len(before.colours) == cached and len(after.colours) == cached + 1
    causal = qkv.causal_mask(cached + 1).numpy()  # True: may attend
    assert after.hatched == (~causal).tolist()  # the causal triangle, new column included
    assert before.hatched == [row[:cached] for row in after.hatched[:cached]]  # old rows kept
    assert [row[cached] for row in after.hatched] == [True] * cached + [False]  # new key
    assert after.colours[:cached] == [[*row[:cached], MASKED_COLOUR] for row in before.colours]
    assert set(after.colours[cached]).isdisjoint(after.colours[0])  # the new row stands out
    assert {p.get_gid() for p in figure.axes[0].patches} >= {"new-row", "new-column"}
    assert any("not kept" in t and "only K and V are cached" in t for t in texts_of(figure))
    assert any("not computed in a cached step" in t for t in texts_of(figure))
    assert any("all a cached step computes" in t for t in texts_of(figure))  # the new row
    assert any(f"a new row, 1 × {cached + 1}" in t for t in texts_of(figure))  # T = 1 query
    assert any(f"a cached step, T = 1, S = {cached + 1}" in t for t in texts_of(figure))
    assert "attention scores" in figure.axes[0].get_title() or any(
        "Causal attention scores" in t for t in texts_of(figure))  # fmt: skip
    with pytest.raises(ValueError):
        cache_growth(0)


def test_cache_growth_names_its_axes_only_when_asked():
    plain, named = cache_growth(4), cache_growth(4, axis_labels=True)
    assert not any("key $s$" in t or "query $t$" in t for t in texts_of(plain))  # default
    labels = [t for t in named.axes[0].texts if t.get_gid() in ("axis-query", "axis-key")]
    assert sorted(t.get_text() for t in labels) == ["key $s$", "key $s$", "query $t$"]
    assert [t.get_rotation() for t in labels if t.get_gid() == "axis-query"] == [90.0]
    after = qkv.diagrams.cells  # the same matrices, labelled or not
    assert after(named, "after") == after(plain, "after")

def test_cache_growth_can_show_the_row_the_step_before_computed():
    plain, shown = cache_growth(4), cache_growth(4, previous_row=True)
    before, old = qkv.diagrams.cells(shown, "before"), qkv.diagrams.cells(plain, "before")
    assert before.colours[:3] == old.colours[:3]  # earlier rows: pale, as by default
    full = qkv.diagrams.cells(shown, "after").colours[4][0]  # the new row's colour
    assert before.colours[3][0] == full != old.colours[3][0]  # its last row: full colour
    assert before.hatched == old.hatched  # the same mask
    assert qkv.diagrams.cells(shown, "after") == qkv.diagrams.cells(plain, "after")
    assert any("the one row each cached step computes" in t for t in texts_of(shown))
    assert not any("the one row each cached step computes" in t for t in texts_of(plain))
    assert any("only K and V are cached" in t for t in texts_of(shown))


# --- attention_map -----------------------------------------------------------------------------


def hatched(figure) -> set[tuple[int, int]]:
    """The (row, column) of every cell drawn as masked, and check how it is drawn."""
    drawn = qkv.diagrams.cells(figure, "map")
    found = {(t, s) for t, row in enumerate(drawn.hatched) for s, masked in enumerate(row) if masked}
    for t, s in found:
        assert drawn.colours[t][s] == MASKED_COLOUR
    (collection,) = [c for c in figure.axes[0].collections if c.get_gid() == "map:masked"] or [None]
    if found:
        assert collection.get_hatch() == MASKED_HATCH
        assert {matplotlib.colors.to_hex(c) for c in collection.get_facecolor()} == {MASKED_COLOUR.lower()}
        covered = set()  # the cells under the hatched rectangles (runs of masked cells along a row)
        for path in collection.get_paths():
            row = round(path.vertices[:, 1].min() + 0.5)
            first, last = round(path.vertices[:, 0].min() + 0.5), round(path.vertices[:, 0].max() - 0.5)
            covered |= {(row, s) for s in range(first, last + 1)}
        assert covered == found  # the hatching lies on those cells, and on no other
    return found


def test_attention_map_hatches_masked_cells_and_keeps_them_off_the_colour_scale():
    T = 6
    mask = qkv.causal_mask(T)  # (T, T), True = may attend
    weights = torch.softmax(torch.randn(2, 3, T, T).masked_fill(~mask, float("-inf")), dim=-1)
    weights[~mask.expand(2, 3, T, T)] = 5.0  # whatever sits in a masked cell must not show
    figure = attention_map(weights, mask, head=1, sequence=1, title="each row looks back")
    assert hatched(figure) == {(t, s) for t in range(T) for s in range(T) if s > t}  # 15 cells
    ax = figure.axes[0]
    image = ax.images[0]
    shown = image.get_array()  # one row per query
    assert shown.shape == (T, T) and np.array_equal(np.ma.getmaskarray(shown), ~mask.numpy())
    np.testing.assert_allclose(shown.compressed(), weights[1, 1][mask].numpy())
    assert image.get_clim() == (0.0, pytest.approx(weights[1, 1][mask].max().item()))  # not 5.0
    assert image.get_cmap().get_bad()[3] == 0.0  # the colour map paints nothing under a masked cell
    assert matplotlib.colors.to_hex(image.get_cmap()(0.0)) != MASKED_COLOUR.lower()  # a small weight is dark
    assert MASKED_COLOUR.lower() not in grid(figure, "map")[T - 1]  # the last query may attend to every key
    assert ax.get_xlabel() == "key position" and ax.get_ylabel() == "query position"
    assert "each row looks back" in texts_of(figure) and len(figure.axes) == 2  # the map and its colour bar
    assert figure.axes[1].get_ylabel() == "attention weight"


def test_attention_map_of_a_padded_batch_averages_heads_and_labels_tokens():
    torch.manual_seed(0)  # the draw must not depend on which tests ran before
    lengths = torch.tensor([7, 5])
    pad = qkv.padding_mask(lengths, 7)  # (B, 1, 1, S)
    cross = qkv.MultiHeadAttention(16, 4, kdim=10, vdim=10)
    _, weights = cross(torch.randn(2, 4, 16), torch.randn(2, 7, 10), mask=pad, need_weights=True)
    tokens = ["the", "black", "cat", "sat", ".", "<pad>", "<pad>"]
    figure = attention_map(weights, pad, sequence=1, queries=["<s>", "le", "chat", "noir"], keys=tokens)
    assert hatched(figure) == {(t, s) for t in range(4) for s in (5, 6)}  # T = 4 queries, S = 7 keys
    mean = weights[1].mean(0).detach().numpy()  # (T, S)
    # float32 weights drawn as float64: one float32 rounding apart (rtol 1e-7 failed 19 of 300 draws)
    np.testing.assert_allclose(figure.axes[0].images[0].get_array()[:, :5], mean[:, :5], rtol=1e-6)
    ax = figure.axes[0]
    assert [t.get_text() for t in ax.get_xticklabels()] == tokens and ax.get_ylabel() == "query"
    assert figure.axes[1].get_ylabel() == "attention weight (mean of 4 heads)"
    assert hatched(attention_map(weights[0], pad[0])) == set()  # (h, T, S), a (1, 1, S) mask: no padding


def test_attention_map_reads_an_additive_mask_and_numpy():
    mask = qkv.additive_mask(qkv.causal_mask(3, 5))  # -inf blocks
    figure = attention_map(np.full((3, 5), 0.2), mask.numpy())
    blocked = qkv.causal_mask(3, 5).logical_not().nonzero().tolist()
    assert hatched(figure) == {tuple(cell) for cell in blocked}


def test_attention_map_names_what_is_wrong():
    weights = torch.softmax(torch.randn(4, 7), -1)
    with pytest.raises(ValueError, match=r"mask of shape \(5, 5\) does not broadcast to the weights' shape "
                                         r"\(T, S\) = \(4, 7\)"):  # fmt: skip
        attention_map(weights, torch.ones(5, 5, dtype=torch.bool))
    with pytest.raises(ValueError, match=r"mask of shape \(2, 1, 1, 7\) does not broadcast .* = \(4, 7\)"):
        attention_map(weights, qkv.padding_mask(torch.tensor([7, 5]), 7))
    with pytest.raises(TypeError, match=r"mask must be boolean .* got dtype int64"):
        attention_map(weights, torch.ones(4, 7, dtype=torch.long))
    with pytest.raises(ValueError, match=r"weights must have 2, 3 or 4 dimensions.*got shape \(7,\)"):
        attention_map(weights[0])
    with pytest.raises(ValueError, match=r"head=3 is out of range: weights \(h, T, S\) have 3 heads"):
        attention_map(torch.rand(3, 4, 7), head=3)
    with pytest.raises(ValueError, match=r"head=0 was given, but weights \(T, S\) have no head axis"):
        attention_map(weights, head=0)
    with pytest.raises(ValueError, match=r"sequence=2 is out of range: weights \(B, h, T, S\) have 2 seq"):
        attention_map(torch.rand(2, 3, 4, 7), sequence=2)
    with pytest.raises(ValueError, match="queries has 3 labels, but the weights have 4 query positions"):
        attention_map(weights, queries=["a", "b", "c"])
    with pytest.raises(TypeError, match=r"weights must be a torch\.Tensor or a NumPy array, got list"):
        attention_map([[1.0]])


def test_figures_fit_the_column_and_print_nothing(capsys, model):
    wide = qkv.MultiHeadAttention(64, 8, num_kv_heads=2)
    figures = [
        cross_attention(model, torch.randn(30, 9), torch.randn(20, 12)),
        decoding_step(wide, cache_after(wide, 12, max_length=16)),
        attention_map(torch.rand(40, 60), qkv.causal_mask(40, 60), title="a long map with a long title"),
    ]
    for figure in figures:
        assert figure.get_size_inches()[0] <= 7.0 + 1e-9
    assert capsys.readouterr() == ("", "")


def test_labels_of_ten_or_more_heads_keep_their_subscripts_whole():
    layer = qkv.MultiHeadAttention(48, 12)
    texts = qkv.diagrams.texts_of(qkv.diagrams.decoding_step(layer, layer.new_cache(1, 4)))
    assert any("_{10}" in t for t in texts) and not any("_10" in t for t in texts)


def test_attention_map_masks_in_runs_and_names_bad_arguments():
    figure = qkv.diagrams.attention_map(torch.rand(64, 64), qkv.causal_mask(64))
    masked = next(c for ax in figure.axes for c in ax.collections if c.get_gid() == "map:masked")
    assert len(masked.get_paths()) == 63  # one run per row that has masked cells, not 2016 cells
    assert sum(map(sum, qkv.diagrams.cells(figure, "map").hatched)) == 64 * 63 // 2
    with pytest.raises(ValueError, match="weights have 0 queries and 3 keys: nothing to draw"):
        qkv.diagrams.attention_map(torch.rand(0, 3))
    with pytest.raises(ValueError, match="vmax must be a positive number or None, got -1"):
        qkv.diagrams.attention_map(torch.rand(2, 3), vmax=-1)
    with pytest.raises(TypeError, match="title must be a str, got int"):
        qkv.diagrams.attention_map(torch.rand(2, 3), title=5)


def test_attention_map_annotates_the_cells_the_mask_allows_and_leaves_masked_cells_blank():
    T = 4
    mask = qkv.causal_mask(T)  # (T, T), True = may attend
    weights = torch.softmax(torch.randn(T, T).masked_fill(~mask, float("-inf")), dim=-1)
    figure = attention_map(weights, mask, annotate=True)
    written = qkv.diagrams.cells(figure, "map").text
    expected = [[f"{weights[t, s]:.2f}" if mask[t, s] else "" for s in range(T)] for t in range(T)]
    assert written == expected  # every allowed cell its weight, every masked cell blank
    ax = figure.axes[0]
    drawn = {(round(text.get_position()[1]), round(text.get_position()[0])): text for text in ax.texts}
    assert {cell: text.get_text() for cell, text in drawn.items()} == {
        (t, s): expected[t][s] for t in range(T) for s in range(T) if mask[t, s]
    }
    assert drawn[(0, 0)].get_color() == "black"  # weight 1, the scale's bright end: dark ink
    faint = min(((t, s) for t in range(T) for s in range(T) if mask[t, s]), key=lambda c: weights[c])
    assert drawn[faint].get_color() == "white"  # the smallest weight, on the dark end: white ink
    plain = attention_map(weights, mask)  # annotate=False by default: nothing written
    assert len(plain.axes[0].texts) == 0
    assert not any(any(row) for row in qkv.diagrams.cells(plain, "map").text)
    with pytest.raises(TypeError, match="annotate must be a bool, got str"):
        attention_map(weights, mask, annotate="yes")


# --- kv_sharing --------------------------------------------------------------------------------


def test_kv_sharing_draws_each_query_head_reading_its_kv_head():
    from qkv.diagrams.inference import kv_sharing

    layers = [qkv.MultiHeadAttention(24, 6, num_kv_heads=n) for n in (6, 3, 1)]
    figure = kv_sharing(layers, title="three layers")
    for n, layer in enumerate(layers):
        assert len(patches_by_gid(figure, f"kv:{n}:")) == layer.num_kv_heads
        queries = patches_by_gid(figure, f"query:{n}:")
        assert len(queries) == 6
        group = 6 // layer.num_kv_heads
        for i, query in enumerate(queries):  # a query head takes its K/V head's colour
            kv = patches_by_gid(figure, f"kv:{n}:{i // group}")[0]
            assert np.allclose(query.get_facecolor()[:3], kv.get_facecolor()[:3])
    texts = texts_of(figure)
    titles = [ax.get_title() for ax in figure.axes]
    assert titles == ["multi-head (MHA)", "grouped-query (GQA)", "multi-query (MQA)"]
    assert any("= 8 numbers (1/6)" in t for t in texts)  # h_kv · (d_k + d_v) = 1 · (4 + 4)
    assert any("$h_{kv} (d_k + d_v)$" in t for t in texts)
    odd = kv_sharing([qkv.MultiHeadAttention(24, 6, num_kv_heads=2, d_k=4, d_v=3)])
    assert any("$d_v$ = 3" in t and "= 14 numbers (2/6)" in t for t in texts_of(odd))
    assert any("per token per layer" in t for t in texts)
    assert "$Q_{1}$" in texts and "$Q_{6}$" in texts and "$Q_{0}$" not in texts  # from 1
    assert any("$K_{1}$" in t for t in texts) and not any("$K_{0}$" in t for t in texts)
    # Per-head weights draw the same:
    assert len(patches_by_gid(kv_sharing([layers[1].to_heads()]), "kv:0:")) == 3


def test_kv_sharing_errors_name_the_argument():
    from qkv.diagrams.inference import kv_sharing

    with pytest.raises(ValueError, match="layers must be a non-empty sequence"):
        kv_sharing([])
    with pytest.raises(TypeError, match=r"layer must be a qkv\.HeadWeights"):
        kv_sharing([torch.nn.Linear(2, 2)])


# --- bytes_per_step ----------------------------------------------------------------------------


def test_bytes_per_step_stacks_weights_and_each_texts_cache():
    from qkv.diagrams.inference import bytes_per_step

    weights, cache = [15.48, 13.98, 13.5], [4.0, 1.0, 0.125]  # GiB: 32, 8 and 1 K/V heads
    figure = bytes_per_step((32, 8, 1), weights, cache, texts=(1, 4, 32), title="fewer heads")
    assert [ax.get_title() for ax in figure.axes] == ["1 text", "4 texts", "32 texts"]
    for ax, texts in zip(figure.axes, (1, 4, 32), strict=True):
        for n, w, c in zip((32, 8, 1), weights, cache, strict=True):
            (low,) = patches_by_gid(figure, f"weights:{texts}:{n}")
            (high,) = patches_by_gid(figure, f"cache:{texts}:{n}")
            assert low.get_y() == 0 and low.get_height() == pytest.approx(w)
            assert high.get_y() == pytest.approx(w)  # the cache sits on the weights
            assert high.get_height() == pytest.approx(texts * c)
            total = [t for t in ax.texts if t.get_gid() == f"total:{texts}:{n}"]
            assert [t.get_text() for t in total] == [f"{round(w + texts * c, 1):.1f}"]
        labels = [t.get_text() for t in ax.texts]
        assert f"{texts * cache[0]:.1f}" in labels  # each part's value
        assert ax.get_xlabel() == "K/V heads"
        assert [t.get_text() for t in ax.get_xticklabels()] == ["32", "8", "1"]
        assert ax.get_ylim()[1] > max(w + texts * c for w, c in zip(weights, cache, strict=True))
    assert figure.axes[0].get_ylabel() == "GiB read per step"
    assert [t.get_text() for t in figure.axes[0].get_legend().get_texts()] == ["weights", "K/V cache"]
    assert figure._suptitle.get_text() == "fewer heads"
    assert figure.get_size_inches()[0] <= 7.0 + 1e-9
    assert "0.1" in texts_of(bytes_per_step([1], [2.0], [0.1]))  # a thin part: labelled beside


def test_bytes_per_step_names_what_is_wrong():
    from qkv.diagrams.inference import bytes_per_step

    with pytest.raises(ValueError, match=r"weights has 1 values, but kv_heads has 2"):
        bytes_per_step((32, 8), [15.5], [4.0, 1.0])
    with pytest.raises(ValueError, match=r"cache has 3 values, but kv_heads has 2"):
        bytes_per_step((32, 8), [15.5, 14.0], [4.0, 1.0, 0.5])
    with pytest.raises(ValueError, match=r"cache\[1\] must be a finite number of GiB, at least 0, got -1"):
        bytes_per_step((32, 8), [15.5, 14.0], [4.0, -1.0])
    with pytest.raises(TypeError, match=r"weights\[0\] must be a number \(GiB\), got str"):
        bytes_per_step((32,), ["15"], [4.0])
    with pytest.raises(ValueError, match="kv_heads must be a non-empty sequence"):
        bytes_per_step((), [], [])
    with pytest.raises(ValueError, match=r"texts\[1\] must be positive, got 0"):
        bytes_per_step((32,), [1.0], [1.0], texts=(1, 0))
    with pytest.raises(TypeError, match="title must be a str, got int"):
        bytes_per_step((32,), [1.0], [1.0], title=3)
