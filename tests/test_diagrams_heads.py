"""qkv.diagrams.heads: W^Q cut into heads, the reshape into heads, and W^O, read back from the figures."""

from __future__ import annotations

import matplotlib
import pytest
import torch

import qkv
from qkv.diagrams import HEAD_COLOURS, ROLE_COLOURS, cells, matrix_names, patches_by_gid, texts_of
from qkv.diagrams.heads import heads_from_one_matrix, multi_head, reshape

matplotlib.use("Agg")


def grid(figure, name: str) -> list[list[str]]:
    """The colours of the matrix drawn as ``name``, row by row (as it was drawn, read back)."""
    return [[c.lower() for c in row] for row in cells(figure, name).colours]


def size(figure, name: str) -> int:
    """How many cells the matrix ``name`` has."""
    return sum(len(row) for row in grid(figure, name))


def block_colours(figure, name: str, columns: range) -> set[str]:
    """The colours of the cells in ``columns`` of the matrix ``name``."""
    return {row[c] for row in grid(figure, name) for c in columns}


def everywhere(figure, name: str) -> set[str]:
    return {c for row in grid(figure, name) for c in row}


def numbers(figure, name: str) -> list[list[str]]:
    """The numbers written in the cells of the grid ``name``, row by row."""
    return cells(figure, name).text


# 3 heads, T = 4 != d_model = 12, d_k = 5 != d_v = 2, kdim = 10 != vdim = 7 != embed_dim
MHA = qkv.MultiHeadAttention(12, 3, kdim=10, vdim=7, d_k=5, d_v=2)
HEADS = [c.lower() for c in HEAD_COLOURS]


@pytest.mark.parametrize(
    ("projection", "d_in", "d"), [("q", 12, 5), ("k", 10, 5), ("v", 7, 2)], ids=["q", "k", "v"]
)
def test_one_matrix_is_the_heads_side_by_side_to_scale(projection, d_in, d):
    x = torch.randn(2, 4, d_in)  # a batch: the first sequence is drawn
    figure = heads_from_one_matrix(x, MHA, projection=projection)
    L = projection.upper()
    assert size(figure, "X") == 4 * d_in
    assert size(figure, f"W^{L}") == d_in * 3 * d and len(grid(figure, f"W^{L}")) == d_in
    assert size(figure, L) == 4 * 3 * d and len(grid(figure, L)) == 4
    for i in (1, 2, 3):
        assert size(figure, f"X_{i}") == 4 * d_in
        assert size(figure, f"W_{i}^{L}") == d_in * d
        assert size(figure, f"{L}_{i}") == 4 * d
    assert f"W_4^{L}" not in matrix_names(figure)
    texts = texts_of(figure)
    for shape in (f"(4, {d_in})", f"({d_in}, {3 * d})", f"(4, {3 * d})", f"({d_in}, {d})", f"(4, {d})"):
        assert shape in texts, shape
    for label in (f"$W^{L}$", f"${L}$", f"$W_1^{L}$", f"$W_3^{L}$", f"${L}_3$"):
        assert label in texts, label  # maths, heads numbered from 1
    assert f"$W_4^{L}$" not in texts and f"$W_0^{L}$" not in texts


def test_head_i_has_one_colour_in_w_in_its_product_and_in_its_own_row():
    figure = heads_from_one_matrix(torch.randn(4, 12), MHA)
    d_k = 5
    for head in range(3):
        block = range(head * d_k, (head + 1) * d_k)
        in_w, in_q = block_colours(figure, "W^Q", block), block_colours(figure, "Q", block)
        alone = everywhere(figure, f"W_{head + 1}^Q") | everywhere(figure, f"Q_{head + 1}")
        assert in_w == in_q == alone == {HEADS[head]}, head
    assert len(set(HEADS[:3])) == 3  # three heads, three colours
    frames = patches_by_gid(figure, "W^Q:frame") + patches_by_gid(figure, "Q_2:frame")
    assert {matplotlib.colors.to_hex(p.get_edgecolor()) for p in frames} == {ROLE_COLOURS["q"].lower()}


def test_grouped_query_keys_are_cut_into_the_kv_heads_only():
    gqa = qkv.MultiHeadAttention(12, 6, kdim=10, d_k=3, num_kv_heads=2)
    figure = heads_from_one_matrix(torch.randn(5, 10), gqa, projection="k")
    assert size(figure, "W^K") == 10 * 2 * 3  # h_kv·d_k columns, not h·d_k
    assert size(figure, "W_2^K") == 10 * 3 and "W_3^K" not in matrix_names(figure)
    texts = texts_of(figure)
    assert "(10, 6)" in texts and "(5, 6)" in texts and "(10, 3)" in texts
    assert any("2 small" in t and "K/V head" in t for t in texts)


def test_reshape_right_keeps_each_head_whole_and_wrong_mixes_it():
    h, T, d_k = 3, 5, 2  # h·d_k = 6 != T
    figure = reshape(h, T, d_k, batch=2)
    assert size(figure, "right.input") == T * h * d_k
    for t in range(1, T + 1):  # (B, T, h, d_k): T slices of (h, d_k), one position each
        assert numbers(figure, f"right.position{t}") == [[str(t - 1)] * d_k] * h
        assert grid(figure, f"right.position{t}") == [[HEADS[i]] * d_k for i in range(h)]
    texts = texts_of(figure)
    for shape in ("(5, 6)", "(5, 3, 2)", "(3, 5, 2)"):  # the drawn sequence's shapes
        assert shape in texts, shape
    for shape in ("(2, 5, 6)", "(2, 5, 3, 2)", "(2, 3, 5, 2)"):  # not the batch's
        assert shape not in texts, shape
    assert any(t.startswith("Right:") for t in texts) and any(t.startswith("Wrong:") for t in texts)
    assert not any(t.startswith("Correct:") for t in texts)  # beside "Wrong:", "Right:" stays
    # The input: feature column c belongs to head c // d_k, row t is position t.
    assert grid(figure, "wrong.input") == [[HEADS[c // d_k] for c in range(h * d_k)]] * T
    assert numbers(figure, "wrong.input") == [[str(t)] * (h * d_k) for t in range(T)]
    for head in range(1, h + 1):
        # Right: one head's colour, and positions 0..T-1 in order, one per row.
        assert everywhere(figure, f"right.head{head}") == {HEADS[head - 1]}
        assert numbers(figure, f"right.head{head}") == [[str(t)] * d_k for t in range(T)]
        # Wrong: the same shape, but features of several heads, and not every position.
        assert len(grid(figure, f"wrong.head{head}")) == T and size(figure, f"wrong.head{head}") == T * d_k
        assert len(everywhere(figure, f"wrong.head{head}")) > 1
        positions = [row[0] for row in numbers(figure, f"wrong.head{head}")]
        assert positions != [str(t) for t in range(T)]
    # The first wrong "head" is the first T·d_k entries in memory: position 0's features, then 1's.
    assert [row[0] for row in numbers(figure, "wrong.head1")] == ["0", "0", "0", "1", "1"]


def test_reshape_without_the_wrong_one():
    figure = reshape(3, 4, 2, wrong=False)
    assert not [name for name in matrix_names(figure) if name.startswith("wrong.")]
    assert not any(t.startswith("Wrong:") for t in texts_of(figure))
    # Alone, the right split is titled "Correct:", not "Right:" (which reads as a side).
    assert any(t.startswith("Correct:") for t in texts_of(figure))
    assert not any(t.startswith("Right:") for t in texts_of(figure))


def test_reshape_the_wrong_one_alone():
    figure = reshape(3, 4, 2, right=False)
    names = matrix_names(figure)
    assert not [name for name in names if name.startswith("right.")]
    assert "wrong.input" in names and "wrong.head1" in names
    texts = texts_of(figure)
    assert any(t.startswith("Wrong:") for t in texts) and not any(t.startswith("Right:") for t in texts)
    both = reshape(3, 4, 2)  # the wrong grids are the same as beside the right ones
    for head in (1, 2, 3):
        assert numbers(figure, f"wrong.head{head}") == numbers(both, f"wrong.head{head}")
        assert grid(figure, f"wrong.head{head}") == grid(both, f"wrong.head{head}")
    assert figure.get_figheight() < both.get_figheight()  # one row, not two
    with pytest.raises(ValueError, match="reshape draws nothing with right=False and wrong=False"):
        reshape(3, 4, 2, right=False, wrong=False)
    with pytest.raises(TypeError, match="right must be True or False, got str"):
        reshape(3, 4, 2, right="no")


def test_multi_head_concatenates_the_heads_and_multiplies_by_w_o():
    figure = multi_head(MHA, torch.randn(2, 4, 12))
    for i in (1, 2, 3):
        assert len(grid(figure, f"head_{i}")) == 4 and size(figure, f"head_{i}") == 4 * 2  # (T, d_v)
        assert everywhere(figure, f"head_{i}") == {HEADS[i - 1]}
        assert block_colours(figure, "concat", range(2 * (i - 1), 2 * i)) == {HEADS[i - 1]}
    assert size(figure, "concat") == 4 * 6
    assert len(grid(figure, "W^O")) == 6 and size(figure, "W^O") == 6 * 12
    assert size(figure, "output") == 4 * 12
    assert everywhere(figure, "W^O") | everywhere(figure, "output") == {ROLE_COLOURS["o"].lower()}
    texts = texts_of(figure)
    for shape in ("(4, 2)", "(4, 6)", "(6, 12)", "(4, 12)"):
        assert shape in texts, shape
    assert "$\\mathrm{head}_3$" in texts and "$W^O$" in texts


def test_multi_head_can_colour_w_o_rows_by_head():
    figure = multi_head(MHA, torch.randn(4, 12), head_rows=True)
    rows = grid(figure, "W^O")  # (h·d_v, d_model): head i's rows in its colour
    for i in (1, 2, 3):
        assert {colour for row in rows[2 * (i - 1) : 2 * i] for colour in row} == {HEADS[i - 1]}
    texts = texts_of(figure)
    assert {"$W_1^O$", "$W_2^O$", "$W_3^O$"} <= set(texts)  # each block named inside it
    assert any("\\sum_i \\mathrm{head}_i" in t for t in texts)  # and the sum in the title
    assert "$W_1^O$" not in texts_of(multi_head(MHA, torch.randn(4, 12)))  # only with head_rows


def test_bad_input_is_named():
    x = torch.randn(4, 12)
    with pytest.raises(ValueError, match=r"x must have 2 dimensions \(T, d_model\) .* got shape \(12,\)"):
        heads_from_one_matrix(torch.randn(12), MHA)
    with pytest.raises(ValueError, match="x has 12 features, but the layer's kdim is 10"):
        heads_from_one_matrix(x, MHA, projection="k")
    with pytest.raises(ValueError, match="x has 12 features, but the layer's vdim is 7"):
        heads_from_one_matrix(x, MHA, projection="v")
    with pytest.raises(ValueError, match=r"projection must be \"q\", \"k\" or \"v\", got 'o'"):
        heads_from_one_matrix(x, MHA, projection="o")
    with pytest.raises(TypeError, match=r"layer must be a qkv.HeadWeights or a module with to_heads\(\)"):
        heads_from_one_matrix(x, torch.nn.Linear(12, 12))
    with pytest.raises(ValueError, match="num_heads must be positive, got 0"):
        reshape(0, 5, 4)
    with pytest.raises(TypeError, match="length must be an int, got float"):
        reshape(3, 5.0, 4)
    with pytest.raises(TypeError, match="wrong must be True or False, got str"):
        reshape(3, 5, 4, wrong="yes")
    with pytest.raises(ValueError, match="x has 10 features, but the layer's d_model is 12"):
        multi_head(MHA, torch.randn(4, 10))
    with pytest.raises(ValueError, match=r"x must have 2 dimensions .* got shape \(1, 2, 4, 12\)"):
        multi_head(MHA, torch.randn(1, 2, 4, 12))
    with pytest.raises(TypeError, match=r"layer must be a qkv\.HeadWeights"):
        multi_head(object(), x)


def test_figures_fit_the_column_and_print_nothing(capsys):
    wide = qkv.MultiHeadAttention(24, 2)  # 80 cells wide: the cells shrink to fit 7 inches
    x = torch.randn(3, 24)
    for figure in (heads_from_one_matrix(x, wide), multi_head(wide, x), reshape(4, 6, 6)):
        assert figure.get_size_inches()[0] <= 7.0 + 1e-9
    assert capsys.readouterr() == ("", "")


def test_reshape_refuses_sizes_too_big_to_read_and_says_when_both_agree():
    with pytest.raises(ValueError, match=r"8 · 32 · 32 = 8192 entries is more than 1024"):
        qkv.diagrams.reshape(8, 32, 32)
    texts = qkv.diagrams.texts_of(qkv.diagrams.reshape(3, 1, 4))  # one position: the two agree
    assert any("the same here" in t for t in texts)
    assert not any("mixes heads and positions" in t for t in texts)


def test_multi_head_labels_only_the_ends_when_heads_are_many():
    texts = qkv.diagrams.texts_of(qkv.diagrams.multi_head(qkv.MultiHeadAttention(64, 16), torch.randn(5, 64)))
    heads = [t for t in texts if "head" in t and "Concat" not in t]
    assert len(heads) == 2, heads  # head_1 and head_16, not sixteen overlapping labels


def test_packed_layouts_colour_each_feature_by_role_and_number_it_by_head():
    from qkv.diagrams.heads import packed_layouts

    h, d = 4, 2  # h != 3: the grids are (3, h·d) and (h, 3·d)
    figure = packed_layouts(h, d)
    q, k, v = (ROLE_COLOURS[r].lower() for r in ("q", "k", "v"))
    stacked = [(role, str(i + 1)) for role in (q, k, v) for i in range(h) for _ in range(d)]
    interleaved = [(role, str(i + 1)) for i in range(h) for role in (q, k, v) for _ in range(d)]
    assert len(grid(figure, "stacked")) == 3 and len(grid(figure, "interleaved")) == h
    for name, expected in (("stacked", stacked), ("interleaved", interleaved)):
        drawn = [pair for c, n in zip(grid(figure, name), numbers(figure, name), strict=True)
                 for pair in zip(c, n, strict=True)]  # fmt: skip
        assert drawn == expected, name  # memory order, row after row
    texts = texts_of(figure)
    assert {"Q", "K", "V", "head 1", "head 4"} <= set(texts) and "head 5" not in texts


def test_packed_layouts_reject_bad_sizes():
    from qkv.diagrams.heads import packed_layouts

    with pytest.raises(ValueError, match="num_heads must be positive, got 0"):
        packed_layouts(0, 2)
    with pytest.raises(ValueError, match=r"3 · num_heads · d_k = 3 · 8 · 8 = 192 is more than 96"):
        packed_layouts(8, 8)


def test_cut_draws_one_row_and_the_heads_stacked_as_the_products_they_are():
    x = torch.randn(2, 4, 12)  # a batch: the first sequence is drawn
    figure = heads_from_one_matrix(x, MHA, cut=True)
    names = matrix_names(figure)
    assert names == ["X", "W^Q", "Q", "Q_1", "Q_2", "Q_3"]  # no per-head X_i or W_i^Q rows
    for i in (1, 2, 3):
        assert size(figure, f"Q_{i}") == 4 * 5 and everywhere(figure, f"Q_{i}") == {HEADS[i - 1]}
    texts = texts_of(figure)
    assert "$Q_2 = X\\,W_2^Q$" in texts and "$W_3^Q$" in texts and "each (4, 5)" in texts
    assert {"Method 1: one product", "each is Method 3's product:"} <= set(texts)
    assert any("Method 2: the cut" in t and ".transpose(1, 2)" in t for t in texts)
    with pytest.raises(TypeError, match="cut"):
        heads_from_one_matrix(x, MHA, cut="yes")  # type: ignore[arg-type]


def test_wide_head_draws_each_heads_softmax_and_the_summed_scores_softmax():
    torch.manual_seed(0)
    q, k = torch.randn(2, 3, 4, 5), torch.randn(2, 3, 6, 5)  # T = 4 queries, S = 6 keys
    figure = qkv.diagrams.wide_head(q, k, sequence=1)
    maps = [torch.as_tensor(ax.images[0].get_array().data) for ax in figure.axes[:4]]
    scores = q[1].double() @ k[1].double().mT  # (h, T, S)
    for i in range(3):
        torch.testing.assert_close(maps[i], (scores[i] / 5**0.5).softmax(-1))
    torch.testing.assert_close(maps[3], (scores.sum(0) / 15**0.5).softmax(-1))
    titles = [ax.get_title() for ax in figure.axes[:4]]
    assert titles == ["head 1", "head 2", "head 3", "no cut: one wide head"]
    assert all(m.shape == (4, 6) for m in maps)


@pytest.mark.parametrize(
    ("q", "k", "message"),
    [
        (torch.randn(3, 4, 5), torch.randn(3, 4, 5), r"\(B, h, T, d_k\)"),
        (torch.randn(1, 3, 4, 5), torch.randn(1, 2, 4, 5), "share q's batch, heads and d_k"),
        (torch.randn(1, 1, 4, 5), torch.randn(1, 1, 4, 5), "h >= 2"),
    ],
)
def test_wide_head_refuses_shapes_it_cannot_draw(q, k, message):
    with pytest.raises(ValueError, match=message):
        qkv.diagrams.wide_head(q, k)


def test_wide_head_names_a_sequence_out_of_range():
    with pytest.raises(ValueError, match="sequence must be an int from 0 to 1"):
        qkv.diagrams.wide_head(torch.randn(2, 3, 4, 5), torch.randn(2, 3, 4, 5), sequence=2)


def test_weight_storage_draws_head_blocks_as_columns_of_w_then_rows_of_the_weight():
    from qkv.diagrams.heads import weight_storage

    linear = torch.nn.Linear(12, 15)  # d_in = 12 != h·d_k = 15: the two shapes differ
    figure = weight_storage(linear, 3)
    paper, stored = grid(figure, "W"), grid(figure, "weight")
    assert (len(paper), len(paper[0])) == (12, 15) and (len(stored), len(stored[0])) == (15, 12)
    for i in range(3):  # head i: columns 5i..5i+4 of W^Q, rows 5i..5i+4 of .weight, one colour
        assert block_colours(figure, "W", range(5 * i, 5 * i + 5)) == {HEADS[i]}
        assert {c for row in stored[5 * i : 5 * i + 5] for c in row} == {HEADS[i]}
    texts = texts_of(figure)
    assert {"(12, 15)", "(15, 12)", "[0:5]", "[5:10]", "[10:15]", "$W_3^Q$", "$(W_3^Q)^\\top$"} <= set(texts)
    assert "$W_4^Q$" not in texts and "[15:20]" not in texts
    keys = texts_of(weight_storage(torch.nn.Linear(7, 4), 2, projection="k"))  # W^K, blocks of 2
    assert {"$W^K$", "$W_2^K$", "[2:4]"} <= set(keys)


def test_weight_storage_rejects_what_it_cannot_cut():
    from qkv.diagrams.heads import weight_storage

    with pytest.raises(ValueError, match="15 output features do not split into num_heads = 4"):
        weight_storage(torch.nn.Linear(12, 15), 4)
    with pytest.raises(ValueError, match="num_heads must be positive, got 0"):
        weight_storage(torch.nn.Linear(12, 15), 0)
    with pytest.raises(TypeError, match=r"linear must be an nn.Linear or a module with a 2-D \.weight"):
        weight_storage(torch.randn(15, 12), 3)
    with pytest.raises(ValueError, match=r"projection must be \"q\", \"k\" or \"v\", got 'o'"):
        weight_storage(torch.nn.Linear(12, 15), 3, projection="o")


def test_beside_draws_method_3_per_head_beside_the_one_product_cut_into_the_same_blocks():
    x = torch.randn(2, 4, 12)  # a batch: the first sequence is drawn
    figure = heads_from_one_matrix(x, MHA, beside=True)
    names = matrix_names(figure)
    per_head = [f"{m}_{i}" if m == "X" else f"W_{i}^Q" if m == "W" else f"Q_{i}"
                for i in (1, 2, 3) for m in ("X", "W", "Q")]  # fmt: skip
    assert names == [*per_head, "X", "W^Q", "Q", "cut Q_1", "cut Q_2", "cut Q_3"]
    for i in (1, 2, 3):  # the left's products and the right's pieces: one head, one size, one colour
        for name in (f"Q_{i}", f"cut Q_{i}"):
            assert size(figure, name) == 4 * 5 and everywhere(figure, name) == {HEADS[i - 1]}
        assert size(figure, f"W_{i}^Q") == 12 * 5 and everywhere(figure, f"W_{i}^Q") == {HEADS[i - 1]}
        assert block_colours(figure, "Q", range(5 * (i - 1), 5 * i)) == {HEADS[i - 1]}
    texts = texts_of(figure)
    assert {"Method 3: each head alone", "Method 1: one product, then Method 2's cut"} <= set(texts)
    assert any(".view(B, T, h, d_k)" in t and ".transpose(1, 2)" in t for t in texts)
    with pytest.raises(TypeError, match="beside"):
        heads_from_one_matrix(x, MHA, beside=1)  # type: ignore[arg-type]
