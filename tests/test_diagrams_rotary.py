"""qkv.diagrams.rotation: the arrows drawn are the rotations qkv computes, read back from the figure."""

from __future__ import annotations

import math

import matplotlib
import pytest
import torch

import qkv
from qkv.diagrams import ROLE_COLOURS

matplotlib.use("Agg")


def tip(figure, gid):
    """The end point of the arrow ``gid``: its vertex farthest from the origin."""
    (arrow,) = [p for ax in figure.axes for p in ax.patches if p.get_gid() == gid]
    xy = arrow.get_xy()
    return max(map(tuple, xy), key=lambda p: math.hypot(*p)), arrow.get_facecolor()


@pytest.mark.parametrize("pairing", ["half", "interleaved"])
def test_the_arrows_are_the_rotated_query_and_key(pairing):
    rope = qkv.RotaryEmbedding(6, pairing=pairing, angle_dtype=torch.float64)
    g = torch.Generator().manual_seed(0)
    q, k = torch.randn(6, generator=g, dtype=torch.float64), torch.randn(6, generator=g, dtype=torch.float64)
    figure = qkv.diagrams.rotation(q, k, rope, [(3, 1), (9, 7)], pair=1)
    a, b = (1, 4) if pairing == "half" else (2, 3)
    for n, (t, s) in enumerate([(3, 1), (9, 7)]):
        for name, x, position in (("q", q, t), ("k", k, s)):
            (x_end, y_end), colour = tip(figure, f"{name}-rotated-{n}")
            turned = rope(x[None], torch.tensor([position]))[0]
            assert (x_end, y_end) == pytest.approx((turned[a].item(), turned[b].item()), abs=1e-9)
            assert matplotlib.colors.to_hex(colour) == ROLE_COLOURS[name].lower()
    titles = [ax.get_title().split("angle from q to k")[1] for ax in figure.axes]
    assert titles[0] == titles[1]  # the same t - s leaves the same angle
    assert all(ax.get_xlabel() and ax.get_ylabel() for ax in figure.axes)


def test_bad_input_is_named():
    rope = qkv.RotaryEmbedding(6)
    with pytest.raises(ValueError, match=r"query has shape \(4,\), but rotary is for d_k=6"):
        qkv.diagrams.rotation(torch.randn(4), torch.randn(6), rope, [(1, 0)])
    with pytest.raises(ValueError, match="pair must be between 0 and 2, got 3"):
        qkv.diagrams.rotation(torch.randn(6), torch.randn(6), rope, [(1, 0)], pair=3)
