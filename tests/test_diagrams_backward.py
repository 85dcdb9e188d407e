"""qkv.diagrams.backward_paths: the backward pass's three paths, read back from the figure."""

from __future__ import annotations

import math

import matplotlib
import pytest
import torch

import qkv
from qkv.diagrams import ROLE_COLOURS, texts_of

matplotlib.use("Agg")


def _layer():
    torch.manual_seed(0)
    return qkv.MultiHeadAttention(6, 2, d_k=3, d_v=2, bias=False)


def test_every_gradient_is_drawn_to_scale_with_its_shape():
    layer = _layer()
    figure = qkv.diagrams.backward_paths(torch.randn(5, 6), layer, torch.randn(5, 2), head=1)
    names = qkv.diagrams.matrix_names(figure)
    assert names == ["dO", "dV", "dW^V", "dP", "dZ", "dQ", "dW^Q", "dK", "dW^K"]
    sizes = {name: (len(c.colours), len(c.colours[0])) for name in names
             for c in [qkv.diagrams.cells(figure, name)]}  # fmt: skip
    assert sizes == {"dO": (5, 2), "dV": (5, 2), "dW^V": (6, 2), "dP": (5, 5), "dZ": (5, 5),
                     "dQ": (5, 3), "dW^Q": (6, 3), "dK": (5, 3), "dW^K": (6, 3)}  # fmt: skip
    texts = texts_of(figure)
    for label in ("$dW^Q$", "$dW^K$", "$dW^V$", r"$X^\top dQ$", r"$dZ^\top Q/\sqrt{d_k}$", r"$P^\top dO$"):
        assert label in texts


def test_the_shading_follows_the_true_gradient():
    layer = _layer()
    x, upstream = torch.randn(4, 6), torch.randn(4, 2)
    figure = qkv.diagrams.backward_paths(x, layer, upstream)
    weights = layer.to_heads()
    w_q = weights.w_q[0].detach().clone().requires_grad_()
    w_k, w_v = weights.w_k[0].detach(), weights.w_v[0].detach()
    q, k, v = x @ w_q, x @ w_k, x @ w_v
    output = torch.softmax(q @ k.T / math.sqrt(3), dim=-1) @ v  # (T, d_v)
    (output * upstream).sum().backward()
    grid = qkv.diagrams.cells(figure, "dW^Q").colours
    row, col = divmod(int(w_q.grad.abs().argmax()), 3)
    assert grid[row][col].lower() == ROLE_COLOURS["q"].lower()  # the largest: full colour
    flat = [c.lower() for r in grid for c in r]
    assert flat.count(ROLE_COLOURS["q"].lower()) == 1


def test_a_zero_gradient_draws_white_and_a_mask_is_accepted():
    layer = _layer()
    causal = qkv.causal_mask(4)
    figure = qkv.diagrams.backward_paths(torch.randn(4, 6), layer, torch.zeros(4, 2), mask=causal)
    colours = {c.lower() for r in qkv.diagrams.cells(figure, "dW^K").colours for c in r}
    assert len(colours) == 1 and colours != {ROLE_COLOURS["k"].lower()}


def test_bad_inputs_are_named():
    layer = _layer()
    with pytest.raises(ValueError, match="x has 5 features, but the layer's d_model is 6"):
        qkv.diagrams.backward_paths(torch.randn(4, 5), layer, torch.randn(4, 2))
    with pytest.raises(ValueError, match=r"grad_output must have .* \(4, 2\), got \(4, 3\)"):
        qkv.diagrams.backward_paths(torch.randn(4, 6), layer, torch.randn(4, 3))
    with pytest.raises(ValueError, match=r"head must be an int in \[0, 2\), got 2"):
        qkv.diagrams.backward_paths(torch.randn(4, 6), layer, torch.randn(4, 2), head=2)
    cross = qkv.MultiHeadAttention(6, 1, kdim=4, vdim=4)
    with pytest.raises(ValueError, match=r"kdim .* must equal d_model"):
        qkv.diagrams.backward_paths(torch.randn(4, 6), cross, torch.randn(4, 6))


def test_a_sequence_first_module_draws_the_first_sequence_of_its_batch():
    # A module built with batch_first=False takes (T, B, d_model): the picture must be
    # of the first sequence, x[:, 0], not of every sequence's first position, x[0].
    torch.manual_seed(0)
    layer = qkv.MultiHeadAttention(6, 2, d_k=3, d_v=2, bias=False, batch_first=False)
    x, grad_output = torch.randn(5, 4, 6), torch.randn(5, 4, 2)  # (T, B, ·)
    drawn = qkv.diagrams.backward_paths(x, layer, grad_output)
    expected = qkv.diagrams.backward_paths(x[:, 0], layer, grad_output[:, 0])
    for name in ("dO", "dZ", "dW^Q"):
        assert qkv.diagrams.cells(drawn, name) == qkv.diagrams.cells(expected, name), name
