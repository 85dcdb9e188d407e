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
    # 3 heads, d_k = 5 != d_v = 3, T = 4 != d_model = 12, 3 K/V heads shared by 6 query heads
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
