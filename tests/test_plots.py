"""Attention maps: one row per query, labelled axes, a colour bar."""

from __future__ import annotations

import matplotlib

matplotlib.use("Agg")

import matplotlib.pyplot as plt
import pytest
import torch

import qkv


def test_plot_attention_labels_rows_as_queries():
    weights = torch.softmax(torch.randn(3, 5), dim=-1)
    ax = qkv.plot_attention(weights, title="look at the diagonal")
    assert ax.get_ylabel() == "query position" and ax.get_xlabel() == "key position"
    assert ax.get_title() == "look at the diagonal"
    assert ax.images[0].get_array().shape == (3, 5)  # rows are queries
    assert len(ax.figure.axes) == 2  # the map and its colour bar
    plt.close(ax.figure)


def test_plot_attention_with_tokens_and_annotations():
    ax = qkv.plot_attention(torch.eye(2), queries=["a", "b"], keys=["x", "y"], annotate=True, colorbar=False)
    assert [t.get_text() for t in ax.get_yticklabels()] == ["a", "b"]
    assert len(ax.texts) == 4
    plt.close(ax.figure)


def test_plot_heads_draws_one_map_per_head():
    figure = qkv.plot_heads(torch.softmax(torch.randn(3, 4, 6), -1), title="three heads")
    maps = [ax for ax in figure.axes if ax.images and ax.get_visible()]
    assert len(maps) == 3 and len(figure.axes) == 5  # 3 maps, 1 hidden place, 1 shared colour bar
    rows = sorted({round(ax.get_position().y0, 3) for ax in maps})
    assert len(rows) == 2  # two to a row by default: readable at phone width
    plt.close(figure)
    figure = qkv.plot_heads(torch.softmax(torch.randn(3, 4, 6), -1), ncols=3)
    assert len({round(ax.get_position().y0, 3) for ax in figure.axes if ax.images}) == 1
    plt.close(figure)


def test_plot_errors():
    with pytest.raises(ValueError, match=r"weights must have 2 dimensions \(T, S\), got shape \(2, 3, 4\)"):
        qkv.plot_attention(torch.zeros(2, 3, 4))
    with pytest.raises(ValueError, match="keys has 2 labels, but weights have 3 key positions"):
        qkv.plot_attention(torch.zeros(2, 3), keys=["a", "b"])
