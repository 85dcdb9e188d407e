"""qkv.diagrams.einsum: one cross-attention layer drawn in the einsum's letters, read back."""

from __future__ import annotations

import os

import matplotlib
import pytest
import torch
from matplotlib.backends.backend_agg import FigureCanvasAgg

import qkv
from qkv.diagrams import cells, matrix_names, texts_of
from qkv.diagrams._draw import ROLE_COLOURS
from qkv.diagrams.einsum import cross_attention_shapes

matplotlib.use("Agg")
os.environ.setdefault("KERAS_BACKEND", "torch")  # before keras is imported anywhere


def shape_of(figure, name: str) -> tuple[int, int]:
    rows = cells(figure, name).colours
    return len(rows), len(rows[0])


def test_every_block_is_drawn_to_scale_with_its_letters():
    N, M, I, I2, H, O = 4, 7, 10, 6, 2, 5  # noqa: E741 - no two sizes alike but H·O = I
    layer = qkv.MultiHeadAttention(I, H, kdim=I2, vdim=I2)
    figure = cross_attention_shapes(
        layer, torch.randn(3, N, I), torch.randn(3, M, I2), memory_name="enc_output"
    )
    assert shape_of(figure, "Q:input") == (N, I) and shape_of(figure, "K:input") == (M, I2)
    assert shape_of(figure, "W^Q") == (I, H * O) and shape_of(figure, "W^K") == (I2, H * O)
    assert shape_of(figure, "Q") == (N, H * O) and shape_of(figure, "V") == (M, H * O)
    assert shape_of(figure, "scores") == (N, M)  # one of H stacked maps
    assert {f"scores:head{j}" for j in range(1, H)} <= set(matrix_names(figure))
    assert shape_of(figure, "W^O") == (H * O, I) and shape_of(figure, "output") == (N, I)
    texts = texts_of(figure)
    for caption in ("N × I = (4, 10)", "M × I′ = (7, 6)", "I′ × H × O = (6, 2, 5)", "N × H × O = (4, 2, 5)",
                    "M × H × O = (7, 2, 5)", "H × N × M = (2, 4, 7)", "H × O × I = (2, 5, 10)"):  # fmt: skip
        assert caption in texts, caption
    for label in (r"\mathtt{query{=}query}", r"\mathtt{key{=}enc\_output}",
                  r"\mathtt{value{=}enc\_output}"):  # each input as the call passes it
        assert f"${label}$" in texts, label
    assert "$K$" in texts and "$W^K$" in texts  # K is drawn apart from key=enc_output
    rows = sorted(t for t in texts if t.startswith("rows: "))  # query, key, value, output
    assert rows == ["rows: N target positions"] + ["rows: source positions"] * 2 + [
        "rows: target positions"
    ] * 2  # the scores' rows, then the inputs' and the output's
    assert "columns: M source positions" in texts  # the scores' columns: one per key
    title = figure.axes[0].get_title() + " ".join(t.get_text() for t in figure.texts)
    assert "Addons" not in title and "O: head size" in title  # W^O is H × O × I
    legend = next(t for t in texts if t.startswith("N: query's positions"))
    assert "M: enc_output's positions" in legend and "O: head size (key_dim)" in legend
    assert "W^O" not in legend  # W^O's O means output, not the head size O
    assert "strong colours: this layer's learned weights" in legend and "grey, pale: data" in legend
    assert "biases not drawn" in legend and "no biases" not in legend  # not "the layer has none"
    strong = {name: cells(figure, name).colours[0][0] for name in ("W^Q", "W^K", "W^V", "W^O")}
    assert strong == {"W^Q": ROLE_COLOURS["q"], "W^K": ROLE_COLOURS["k"], "W^V": ROLE_COLOURS["v"],
                      "W^O": ROLE_COLOURS["o"]}  # fmt: skip
    assert "residual" not in matrix_names(figure)  # the decoder's residual is not the layer's
    assert any(t.startswith("next, the decoder\n(not this layer) adds") for t in texts)


def test_paper_letters_name_the_inputs_as_the_papers_q_k_and_v():
    layer = qkv.MultiHeadAttention(10, 2, kdim=6, vdim=6)
    query, memory = torch.randn(4, 10), torch.randn(7, 6)
    plain = cross_attention_shapes(layer, query, memory, memory_name="enc_output")
    paper = cross_attention_shapes(layer, query, memory, memory_name="enc_output", paper_letters=True)
    texts, plain_texts = texts_of(paper), texts_of(plain)
    for letter in "QKV":  # the input is the paper's K; the product is its K W^K
        assert f"the paper's {letter}" in texts and f"the paper's {letter}" not in plain_texts
        assert f"${letter}W^{letter}$" in texts and f"${letter}$" not in texts
        assert f"${letter}$" in plain_texts  # the default: Keras's K, the product
    assert r"$QW^Q (KW^K)^\top / \sqrt{O}$ per head" in texts  # the scores, in the same letters
    assert r"$Q K^\top / \sqrt{O}$ per head" in plain_texts
    assert "average of $VW^V$'s rows" in " ".join(texts)
    assert r"$\mathtt{key{=}enc\_output}$" in texts  # the keyword is still the input's name
    label = next(t for t in paper.axes[0].texts if t.get_gid() == "K:paper")
    (x0, y0), (rows, cols) = cells(paper, "K:input").corner, shape_of(paper, "K:input")
    x, y = label.get_position()
    assert x0 < x < x0 + cols and y0 < y < y0 + rows  # written on the key input itself
    for name in matrix_names(plain):  # the same blocks, the same sizes: only names change
        assert cells(paper, name) == cells(plain, name), name
    assert tuple(paper.get_size_inches()) == tuple(plain.get_size_inches())


def test_only_the_learned_weights_are_strong():
    layer = qkv.MultiHeadAttention(10, 2, kdim=6, vdim=6)
    figure = cross_attention_shapes(layer, torch.randn(4, 10), torch.randn(7, 6))
    alphas = {c.get_gid().removesuffix(":cells"): c.get_alpha() for c in figure.axes[0].collections
              if (c.get_gid() or "").endswith(":cells")}  # fmt: skip
    weights = {"W^Q", "W^K", "W^V", "W^O"}
    assert min(alphas[name] for name in weights) > max(alphas[name] for name in ("Q", "K", "V", "scores"))


def test_reads_a_keras_layer_through_from_keras():
    keras = pytest.importorskip("keras")
    if keras.backend.backend() != "torch":
        pytest.skip("the Keras layer's weights are read as torch tensors")
    mha = keras.layers.MultiHeadAttention(num_heads=3, key_dim=4)
    query, memory = torch.randn(1, 2, 8), torch.randn(1, 5, 7)
    mha(query=query.numpy(), value=memory.numpy())
    figure = cross_attention_shapes(qkv.interop.from_keras(mha), query, memory)
    assert "I × H × O = (8, 3, 4)" in texts_of(figure) and shape_of(figure, "W^K") == (7, 12)
    direct = cross_attention_shapes(mha, query, memory)  # the Keras layer itself
    assert texts_of(direct) == texts_of(figure)


def test_bad_inputs_name_the_argument_and_the_shapes():
    layer = qkv.MultiHeadAttention(8, 2, kdim=6, vdim=6)
    with pytest.raises(
        ValueError, match=r"query has 9 features, but the layer's embed_dim is 8 \(query has shape \(4, 9\)\)"
    ):
        cross_attention_shapes(layer, torch.randn(4, 9), torch.randn(7, 6))
    with pytest.raises(ValueError, match=r"memory has 5 features, but the layer's kdim is 6"):
        cross_attention_shapes(layer, torch.randn(4, 8), torch.randn(7, 5))
    with pytest.raises(TypeError, match=r"query must be a torch\.Tensor"):
        cross_attention_shapes(layer, [[0.0] * 8], torch.randn(7, 6))
    with pytest.raises(TypeError, match=r"layer must be a qkv\.HeadWeights"):
        cross_attention_shapes(object(), torch.randn(4, 8), torch.randn(7, 6))
    grouped = qkv.MultiHeadAttention(8, 2, num_kv_heads=1)
    with pytest.raises(ValueError, match="2 query heads of d_k = 4 and 1 K/V heads"):
        cross_attention_shapes(grouped, torch.randn(4, 8), torch.randn(7, 8))


def test_memory_fan_out_draws_one_memory_and_each_layers_own_weights():
    M, I, I2, H, O = 7, 10, 6, 2, 5  # noqa: E741
    layers = [qkv.MultiHeadAttention(I, H, kdim=I2, vdim=I2) for _ in range(2)]
    figure = qkv.diagrams.memory_fan_out(layers, torch.randn(3, M, I2), memory_name="enc_output")
    names = matrix_names(figure)
    assert [n for n in names if n == "memory"] == ["memory"]  # drawn once
    assert shape_of(figure, "memory") == (M, I2)
    for n in range(2):
        assert shape_of(figure, f"W^K({n})") == shape_of(figure, f"W^V({n})") == (I2, H * O)
        assert shape_of(figure, f"K({n})") == shape_of(figure, f"V({n})") == (M, H * O)
        assert cells(figure, f"W^K({n})").colours[0][0] == ROLE_COLOURS["k"]  # strong: learned
        assert f"decoder layer {n}" in texts_of(figure)
    texts = texts_of(figure)
    assert "$K^{(1)}$" in texts and "$W^{K\\,(1)}$" in texts
    assert any(t.startswith("One enc_output feeds two decoder layers") for t in texts)
    assert sum(t == "M × H × O\n= (7, 2, 5)" for t in texts) == 4  # K and V, two layers


def test_memory_fan_out_reads_keras_layers_and_refuses_wrong_widths():
    import keras

    layers = [keras.layers.MultiHeadAttention(num_heads=2, key_dim=3) for _ in range(2)]
    memory = torch.randn(1, 5, 4)
    for layer in layers:
        layer(query=torch.randn(1, 3, 8), value=memory)  # builds W^K: (4, 2, 3)
    figure = qkv.diagrams.memory_fan_out(layers, memory)
    assert shape_of(figure, "W^K(1)") == (4, 6) and shape_of(figure, "V(0)") == (5, 6)
    with pytest.raises(ValueError, match="layer 1's kdim"):
        qkv.diagrams.memory_fan_out([qkv.MultiHeadAttention(8, 2, kdim=4, vdim=4),
                                     qkv.MultiHeadAttention(8, 2, kdim=6, vdim=6)], memory)
    with pytest.raises(ValueError, match="at least one layer"):
        qkv.diagrams.memory_fan_out([], memory)


def test_paper_inputs_mark_the_inputs_and_keep_the_products_named_as_the_code_does():
    layer = qkv.MultiHeadAttention(10, 2, kdim=6, vdim=6)
    query, memory = torch.randn(4, 10), torch.randn(7, 6)
    plain = cross_attention_shapes(layer, query, memory, memory_name="enc_output")
    marked = cross_attention_shapes(layer, query, memory, memory_name="enc_output", paper_inputs=True)
    texts = texts_of(marked)
    for letter in "QKV":  # the input is the paper's K; the product is K, as in the code
        assert f"the paper's {letter}" in texts and f"${letter}$" in texts
        assert f"${letter}W^{letter}$" not in texts
    assert r"$Q K^\top / \sqrt{O}$ per head" in texts and "average of V's rows" in " ".join(texts)
    assert set(texts) - set(texts_of(plain)) == {f"the paper's {letter}" for letter in "QKV"}
    for name in matrix_names(plain):  # the same blocks, the same sizes
        assert cells(marked, name) == cells(plain, name), name


def test_book_names_add_one_legend_line_with_the_front_pages_letters():
    layer = qkv.MultiHeadAttention(10, 2, kdim=6, vdim=6)
    query, memory = torch.randn(4, 10), torch.randn(7, 6)
    plain = cross_attention_shapes(layer, query, memory, memory_name="enc_output")
    named = cross_attention_shapes(layer, query, memory, memory_name="enc_output", book_names=True)
    legend, plain_legend = (next(t for t in f.axes[0].texts if t.get_gid() == "legend").get_text()
                            for f in (named, plain))  # fmt: skip
    assert legend.startswith(plain_legend + "\n") and legend.count("\n") == plain_legend.count("\n") + 1
    last = legend.splitlines()[-1]
    for pair in ("N = $T$", "M = $S$", "H = $h$", "O = $d_k$", r"I = $d_\mathrm{model}$",
                 r"I′ = $d_\mathrm{enc}$"):  # fmt: skip
        assert pair in last, pair
    assert "elsewhere in the book" not in plain_legend
    assert set(texts_of(named)) - {legend} == set(texts_of(plain)) - {plain_legend}
    for name in matrix_names(plain):  # the blocks keep their sizes; the figure is taller
        rows, cols = shape_of(named, name)
        assert (rows, cols) == shape_of(plain, name), name
    assert named.get_size_inches()[1] > plain.get_size_inches()[1]


def test_memory_fan_out_branch_at_starts_the_arrows_clear_of_the_note():
    from matplotlib.text import Annotation

    layers = [qkv.MultiHeadAttention(12, 2, kdim=8, vdim=8) for _ in range(2)]
    memory = torch.randn(7, 8)  # a memory narrower than its note

    def arrow_starts_and_note_right(figure):
        ax = figure.axes[0]
        figure.canvas.draw()
        note = next(t for t in ax.texts if t.get_text().startswith("M × I′ ="))
        box = note.get_window_extent().transformed(ax.transData.inverted())
        starts = [a.xyann for a in ax.texts if isinstance(a, Annotation) and a.arrow_patch]
        lines = [line for line in ax.lines if line.get_gid() == "branch"]
        return starts, max(box.x0, box.x1), lines

    plain_starts, plain_note, plain_lines = arrow_starts_and_note_right(
        qkv.diagrams.memory_fan_out(layers, memory))
    starts, note, lines = arrow_starts_and_note_right(
        qkv.diagrams.memory_fan_out(layers, memory, branch_at=0.45))
    first, middle = min(plain_starts)  # the memory's right edge, at its middle
    fanned = [x for x, y in plain_starts if y == middle]  # 2 layers × (W^K, W^V)
    assert fanned == [first] * 4 and first < plain_note  # the default: from the edge
    assert not plain_lines  # and no branch line
    fanned = [x for x, y in starts if y == middle]
    assert len(lines) == 1 and len(fanned) == 4  # one line, then the four arrows
    assert lines[0].get_xdata()[0] == first  # the line starts at the memory
    assert min(fanned) > note  # every arrow starts right of the note


def test_product_names_say_which_input_made_each_product_and_change_nothing_else():
    layer = qkv.MultiHeadAttention(10, 2, kdim=6, vdim=6)
    query, memory = torch.randn(4, 10), torch.randn(7, 6)
    names = {"query_name": "out1", "memory_name": "enc_output"}
    plain = cross_attention_shapes(layer, query, memory, **names)
    named = cross_attention_shapes(layer, query, memory, **names, product_names=True)
    added = {r"$Q = \mathtt{out1}{\cdot}W^Q$", r"$K = \mathtt{enc\_output}{\cdot}W^K$",
             r"$V = \mathtt{enc\_output}{\cdot}W^V$"}  # fmt: skip
    assert set(texts_of(named)) - set(texts_of(plain)) == added
    assert set(texts_of(plain)) - set(texts_of(named)) == {"$Q$", "$K$", "$V$"}
    assert matrix_names(named) == matrix_names(plain)
    for name in matrix_names(plain):  # the same blocks, the same sizes (the scores move right)
        assert shape_of(named, name) == shape_of(plain, name), name
    default = cross_attention_shapes(layer, query, memory, **names, product_names=False)
    assert texts_of(default) == texts_of(plain)  # the default draws what it drew before


def test_product_names_keep_the_arrows_off_the_k_title():
    layer = qkv.MultiHeadAttention(10, 2, kdim=6, vdim=6)
    query, memory = torch.randn(4, 10), torch.randn(7, 6)
    names = {"query_name": "out1", "memory_name": "enc_output"}
    figure = cross_attention_shapes(layer, query, memory, **names, product_names=True)
    agg = FigureCanvasAgg(figure)
    agg.draw()  # the arrows take their places when drawn
    renderer = agg.get_renderer()
    ax = figure.axes[0]
    title = next(t for t in ax.texts if t.get_text() == r"$K = \mathtt{enc\_output}{\cdot}W^K$")
    title_box = title.get_window_extent(renderer)
    arrows = [t.arrow_patch for t in ax.texts if getattr(t, "arrow_patch", None) is not None]
    assert len(arrows) >= 2  # Q's and K's, at least
    for arrow in arrows:  # none runs through K's title (its W^K), as K's used to
        assert not title_box.overlaps(arrow.get_window_extent(renderer))


def test_the_heads_block_takes_its_colour_and_defaults_to_the_old_green():
    layer = qkv.MultiHeadAttention(10, 2, kdim=6, vdim=6)  # H = 2 heads of O = 5
    query, memory = torch.randn(4, 10), torch.randn(7, 6)
    plain = cross_attention_shapes(layer, query, memory)
    grey = cross_attention_shapes(layer, query, memory, heads_colour="#C8C8C8")
    assert cells(plain, "heads").colours[0][0] == "#8FD3BE"  # unchanged by default
    assert {c for row in cells(grey, "heads").colours for c in row} == {"#C8C8C8"}
    assert cells(grey, "V").colours == cells(plain, "V").colours  # only the heads change
    assert shape_of(grey, "heads") == shape_of(plain, "heads") == (4, 10)  # N × H·O
