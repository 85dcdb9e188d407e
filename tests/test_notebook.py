"""The notebook set-up helper: reproducible, silent."""

from __future__ import annotations

import random

import numpy as np
import pytest
import torch

import qkv


def test_setup_makes_every_generator_repeat(capsys):
    qkv.setup(seed=3)
    first = (random.random(), np.random.rand(), torch.rand(1).item())  # noqa: NPY002
    qkv.setup(seed=3)
    second = (random.random(), np.random.rand(), torch.rand(1).item())  # noqa: NPY002
    assert first == second
    assert capsys.readouterr() == ("", "")  # prints nothing
    assert torch.are_deterministic_algorithms_enabled()


def test_setup_applies_the_plot_style():
    import matplotlib as mpl

    qkv.setup()
    assert mpl.rcParams["figure.dpi"] == qkv.notebook.PLOT_STYLE["figure.dpi"]


def test_seed_must_be_an_int():
    with pytest.raises(TypeError, match="seed must be an int, got str"):
        qkv.setup("0")


def test_get_device_is_cuda_only_when_available():
    assert qkv.get_device().type == ("cuda" if torch.cuda.is_available() else "cpu")


def test_version_and_public_names():
    assert qkv.__version__.count(".") == 2
    for name in qkv.__all__:
        assert hasattr(qkv, name), name
