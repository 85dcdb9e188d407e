"""qkv.diagrams: the shared drawing, and the projection diagram, read back from the figures."""

from __future__ import annotations

import matplotlib
import pytest
import torch

import qkv
from qkv.diagrams import HEAD_COLOURS, ROLE_COLOURS, texts_of

matplotlib.use("Agg")


def colours(figure, name: str) -> list[str]:
    """The face colours of the matrix drawn as ``name``, row by row, flattened."""
    return [c.lower() for row in qkv.diagrams.cells(figure, name).colours for c in row]


def test_projection_draws_every_matrix_to_scale_with_its_shape():
    # 6 query heads sharing 3 K/V heads, d_k = 5 != d_v = 3, T = 4 != d_model = 12
    mha = qkv.MultiHeadAttention(12, 6, d_k=5, d_v=3, num_kv_heads=3)
    x = torch.randn(2, 4, 12)  # a batch: the first sequence is drawn
    figure = qkv.diagrams.projection(x, mha)
    assert len(colours(figure, "X0")) == 4 * 12
    assert len(colours(figure, "W^Q")) == 12 * 6 * 5
    assert len(colours(figure, "W^K")) == 12 * 3 * 5  # only the K/V heads
    assert len(colours(figure, "W^V")) == 12 * 3 * 3
    assert len(colours(figure, "Q")) == 4 * 30 and len(colours(figure, "V")) == 4 * 9
    texts = texts_of(figure)
    for shape in ("(4, 12)", "(12, 30)", "(12, 15)", "(12, 9)", "(4, 30)", "(4, 15)", "(4, 9)"):
        assert shape in texts
    for label in ("$X$", "$W^Q$", "$W^K$", "$W^V$", "$Q$", "$K$", "$V$"):
        assert label in texts  # maths, not "W^Q" printed literally
    assert set(colours(figure, "W^K")) == {ROLE_COLOURS["k"].lower()}


def test_projection_colours_head_i_alike_in_w_and_in_its_product():
    mha = qkv.MultiHeadAttention(12, 3)
    figure = qkv.diagrams.projection(torch.randn(5, 12), mha, heads=True)
    d_k = 4
    for name in ("W^Q", "Q"):
        grid = qkv.diagrams.cells(figure, name).colours
        for head in range(3):
            block = {row[c].lower() for row in grid for c in range(head * d_k, (head + 1) * d_k)}
            assert block == {HEAD_COLOURS[head].lower()}, (name, head)


def test_projection_reads_sizes_from_per_head_weights_too():
    weights = qkv.HeadWeights.random(8, 2, kdim=8, d_k=3, d_v=5)
    figure = qkv.diagrams.projection(torch.randn(6, 8), weights)
    assert "(8, 6)" in texts_of(figure) and "(6, 10)" in texts_of(figure)


def test_bad_input_is_named():
    mha = qkv.MultiHeadAttention(12, 3)
    with pytest.raises(ValueError, match=r"x must have 2 dimensions \(T, d_model\) .* got shape \(12,\)"):
        qkv.diagrams.projection(torch.randn(12), mha)
    with pytest.raises(ValueError, match="x has 10 features, but the layer's d_model is 12"):
        qkv.diagrams.projection(torch.randn(5, 10), mha)
    with pytest.raises(TypeError, match=r"layer must be a qkv.HeadWeights or a module with to_heads\(\)"):
        qkv.diagrams.projection(torch.randn(5, 12), torch.nn.Linear(12, 12))
    with pytest.raises(TypeError, match=r"x must be a torch\.Tensor"):
        qkv.diagrams.projection([[1.0]], mha)


def test_figures_fit_the_column_and_print_nothing(capsys):
    wide = qkv.MultiHeadAttention(64, 8)
    figure = qkv.diagrams.projection(torch.randn(3, 64), wide)
    assert figure.get_size_inches()[0] <= 7.0 + 1e-9
    assert capsys.readouterr() == ("", "")


def test_projection_draws_cross_attention_inputs_of_their_own_widths():
    mha = qkv.MultiHeadAttention(12, 3, kdim=10, vdim=7, d_k=5, d_v=2)  # w_k (3, 10, 5), w_v (3, 7, 2)
    figure = qkv.diagrams.projection(torch.randn(4, 12), mha, key=torch.randn(6, 10), value=torch.randn(6, 7))
    texts = texts_of(figure)
    for shape in ("(4, 12)", "(12, 15)", "(6, 10)", "(10, 15)", "(6, 15)", "(6, 7)", "(7, 6)", "(6, 6)"):
        assert shape in texts, shape
    assert len(colours(figure, "W^K")) == 10 * 15 and len(colours(figure, "W^V")) == 7 * 6
    with pytest.raises(ValueError, match=r"the layer's kdim is 10, not d_model = 12: pass key= \(S, 10\)"):
        qkv.diagrams.projection(torch.randn(4, 12), mha)
    with pytest.raises(ValueError, match="value has 6 features, but the layer's vdim is 7"):
        qkv.diagrams.projection(torch.randn(4, 12), mha, key=torch.randn(6, 10), value=torch.randn(6, 6))


def test_projection_colours_a_group_of_query_heads_as_the_kv_head_they_read():
    gqa = qkv.MultiHeadAttention(24, 6, num_kv_heads=2)  # query head i reads K/V head i // 3
    figure = qkv.diagrams.projection(torch.randn(5, 24), gqa, heads=True)
    q_row = qkv.diagrams.cells(figure, "Q").colours[0]
    k_row = qkv.diagrams.cells(figure, "K").colours[0]
    d_k = 4
    for i in range(6):
        assert q_row[i * d_k] == k_row[(i // 3) * d_k], i


def test_projection_reads_a_sequence_first_batch_as_its_module_does():
    seq_first = qkv.MultiHeadAttention(12, 3, batch_first=False)
    figure = qkv.diagrams.projection(torch.randn(7, 2, 12), seq_first)  # (T, B, d_model)
    assert "(7, 12)" in texts_of(figure) and "(2, 12)" not in texts_of(figure)


def test_large_matrices_are_drawn_as_blocks_quickly_and_keep_their_colours():
    wide = qkv.MultiHeadAttention(128, 4)  # W^Q: 128 · 128 = 16384 cells, more than LARGE
    figure = qkv.diagrams.projection(torch.randn(3, 128), wide, heads=True)
    collection = next(c for c in figure.axes[0].collections if c.get_gid() == "W^Q:cells")
    assert len(collection.get_paths()) == 4  # one block per head, not one per cell
    grid = qkv.diagrams.cells(figure, "W^Q").colours
    assert [grid[0][32 * i] for i in range(4)] == list(HEAD_COLOURS[:4])


def test_empty_inputs_are_named():
    mha = qkv.MultiHeadAttention(12, 3)
    with pytest.raises(ValueError, match=r"x is an empty batch, shape \(0, 5, 12\)"):
        qkv.diagrams.projection(torch.randn(0, 5, 12), mha)
    with pytest.raises(TypeError, match="heads must be True or False"):
        qkv.diagrams.projection(torch.randn(5, 12), mha, heads="yes")


def _texts_outside(figure) -> list[str]:
    """The texts of ``figure`` that stick out of it, as a saved image would cut them."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg

    renderer = FigureCanvasAgg(figure).get_renderer()
    width, height = figure.bbox.width, figure.bbox.height
    texts = [*figure.texts, *(t for ax in figure.axes for t in ax.texts)]
    outside = []
    for text in texts:
        box = text.get_window_extent(renderer)
        if text.get_text() and (box.x0 < 0 or box.x1 > width or box.y0 < 0 or box.y1 > height):
            outside.append(text.get_text())
    return outside


def _small_cache_layer():
    layer = qkv.MultiHeadAttention(4, 2, num_kv_heads=1)
    cache = layer.new_cache(batch_size=1, max_length=4)
    with torch.no_grad():
        layer(torch.randn(1, 1, 4), cache=cache, is_causal=True)
    return layer, cache


@pytest.mark.parametrize(
    "draw",
    [
        lambda: qkv.diagrams.packed_layouts(1, 1),
        lambda: qkv.diagrams.packed_layouts(3, 2),
        lambda: qkv.diagrams.reshape(1, 2, 1),
        lambda: qkv.diagrams.reshape(2, 1, 1),
        lambda: qkv.diagrams.weight_storage(torch.nn.Linear(1, 1), 1),
        lambda: qkv.diagrams.heads_from_one_matrix(torch.randn(3, 4), qkv.MultiHeadAttention(4, 1)),
        lambda: qkv.diagrams.multi_head(qkv.MultiHeadAttention(4, 1), torch.randn(3, 4)),
        lambda: qkv.diagrams.projection(torch.randn(2, 4), qkv.MultiHeadAttention(4, 1), heads=True),
        lambda: qkv.diagrams.backward_paths(
            torch.randn(2, 4), qkv.MultiHeadAttention(4, 1), torch.randn(2, 4)
        ),
        lambda: qkv.diagrams.decoding_step(*_small_cache_layer()),
        lambda: qkv.diagrams.kv_sharing([qkv.MultiHeadAttention(4, 2, num_kv_heads=1)]),
        lambda: qkv.diagrams.cache_growth(1),
        lambda: qkv.diagrams.bytes_per_step([1], [2.0], [0.1], texts=[1000]),
        lambda: qkv.diagrams.one_loss(torch.randn(2, 4), qkv.MultiHeadAttention(4, 1)),
    ],
    ids=[
        "packed-1-1",
        "packed-3-2",
        "reshape-1-2-1",
        "reshape-2-1-1",
        "weight-storage-1-1",
        "heads-from-one",
        "multi-head",
        "projection",
        "backward",
        "decoding-step",
        "kv-sharing",
        "cache-growth",
        "bytes-per-step",
        "one-loss",
    ],
)
def test_small_diagrams_keep_every_text_inside_the_figure(draw):
    # Texts do not shrink with the cells: with few cells a title is wider than the
    # drawing, and the figure must grow to hold it (a saved PNG would cut it off).
    assert _texts_outside(draw()) == []


def test_canvas_outline_frames_a_region_unfilled_solid_or_dashed():
    from qkv.diagrams._draw import EDGE_COLOUR, Canvas

    canvas = Canvas(4, 3)
    canvas.outline(1, 0.5, 2, 1, gid="solid")
    canvas.outline(0, 2, 3, 1, colour="#C00000", width=1.2, dashed=True, zorder=3, gid="dashed")
    solid, dashed = (next(p for p in canvas.ax.patches if p.get_gid() == gid) for gid in ("solid", "dashed"))
    assert not solid.get_fill() and solid.get_xy() == (1, 0.5)
    assert (solid.get_width(), solid.get_height()) == (2, 1)
    assert matplotlib.colors.to_hex(solid.get_edgecolor()) == matplotlib.colors.to_hex(EDGE_COLOUR)
    assert solid.get_linestyle() == "-" and solid.get_zorder() == 1
    assert dashed.get_linestyle() == "--" and dashed.get_zorder() == 3 and dashed.get_linewidth() == 1.2
