"""The notebook set-up helper: reproducible, silent."""

from __future__ import annotations

import os
import random
import subprocess
import sys
import warnings

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
    assert torch.is_deterministic_algorithms_warn_only_enabled()  # warns, never fails


def test_setup_does_not_import_inductor_to_ask_for_determinism():
    # torch.use_deterministic_algorithms imports torch._inductor.config (about 2 s in
    # every notebook); setup sets the same eager flag without it, in a fresh interpreter.
    code = "import sys, qkv; qkv.setup(); print('torch._inductor.config' in sys.modules)"
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert result.stdout.strip() == "False"


def test_setup_puts_keras_on_torch_and_the_cpu_unless_told_otherwise(monkeypatch):
    monkeypatch.delenv("KERAS_BACKEND", raising=False)
    monkeypatch.setenv("KERAS_TORCH_DEVICE", "cuda")  # a reader's own choice stays
    qkv.setup()
    assert os.environ["KERAS_BACKEND"] == "torch" and os.environ["KERAS_TORCH_DEVICE"] == "cuda"
    monkeypatch.delenv("KERAS_TORCH_DEVICE")
    qkv.setup()
    assert os.environ["KERAS_TORCH_DEVICE"] == "cpu"  # where the book measured Keras


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


def _displayed(function, *args, **kwargs) -> list[tuple[dict, dict]]:
    """What a call sends to IPython's display, as (data, metadata) pairs."""
    from unittest import mock

    calls = []
    with mock.patch("IPython.display.display", lambda data, raw, metadata: calls.append((data, metadata))):
        function(*args, **kwargs)
    return calls


@pytest.mark.parametrize("display", [True, False])
@pytest.mark.parametrize("value", [0.7071, 25_165_824, "text", torch.tensor([1.0, 2.0])])
def test_glue_writes_what_myst_nb_writes(value, display):
    myst_glue = pytest.importorskip("myst_nb.ext.glue")
    assert qkv.notebook.GLUE_PREFIX == myst_glue.GLUE_PREFIX
    from unittest import mock

    ours = _displayed(qkv.glue, "x", value, display=display)
    with mock.patch.object(
        myst_glue, "ipy_display", lambda data, raw, metadata: theirs.append((data, metadata))
    ):
        theirs: list[tuple[dict, dict]] = []
        myst_glue.glue("x", value, display=display)
    assert ours == theirs
    ((data, _),) = ours
    assert any(key.startswith(myst_glue.GLUE_PREFIX) for key in data) is not display


def test_glue_needs_a_name():
    with pytest.raises(TypeError, match="name must be a non-empty str, got ''"):
        qkv.glue("", 1)


def test_restart_notice_names_imported_packages_that_changed(monkeypatch, capsys):
    from importlib import metadata

    installed = {d.name: d.version for d in metadata.distributions()}
    assert qkv.restart_notice(installed, set(sys.modules)) == ""
    assert capsys.readouterr() == ("", "")
    before = {**installed, "numpy": "1.0.0", "Pygments": "0.1"}  # as if pip had changed both
    notice = qkv.restart_notice(before, {"numpy.linalg", "os"})  # numpy imported, pygments not
    assert f"numpy 1.0.0 -> {np.__version__}" in notice
    assert "ygments" not in notice and "restart the runtime" in notice
    assert capsys.readouterr().err.strip() == notice


def test_restart_notice_ignores_packages_new_to_the_session():
    from importlib import metadata

    before = {d.name: d.version for d in metadata.distributions() if d.name != "numpy"}
    assert qkv.restart_notice(before, set(sys.modules)) == ""


def test_setup_keeps_the_no_cuda_runtime_line_out(monkeypatch, capfd, caplog, tmp_path):
    """A CUDA build of torch without a GPU, beside a CUDA toolkit (Colab's CPU runtime)."""
    import importlib
    import logging

    logger = logging.getLogger("torch.utils.cpp_extension")
    monkeypatch.setattr(logger, "level", logging.NOTSET)
    monkeypatch.setattr(torch.version, "cuda", "12.1")
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    monkeypatch.setattr(torch.cuda, "_is_compiled", lambda: True, raising=False)  # a CUDA build
    monkeypatch.setenv("CUDA_HOME", str(tmp_path))
    monkeypatch.delitem(sys.modules, "torch.utils.cpp_extension", raising=False)
    importlib.import_module("torch.utils.cpp_extension")  # what a chapter's import does
    # A log record on recent torch, a print on torch 2.4:
    assert "No CUDA runtime is found" in caplog.text + capfd.readouterr().err
    caplog.clear()
    del sys.modules["torch.utils.cpp_extension"]
    qkv.setup()  # imports it quietly, and keeps its logger quiet afterwards
    assert "torch.utils.cpp_extension" in sys.modules
    importlib.import_module("torch.utils.cpp_extension")  # a chapter imports it later
    assert capfd.readouterr() == ("", "")
    assert "No CUDA runtime" not in caplog.text


def test_setup_silences_only_keras_30s_einsumdense_mask_warning():
    message = (
        "Layer 'key' (of type EinsumDense) was passed an input with a mask attached to it. However, this "
        "layer does not support masking and will therefore destroy the mask information."
    )
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        qkv.setup()
        warnings.warn(message, UserWarning, stacklevel=1)
        other = "Layer 'key' (of type Dense) was passed an input with a mask"
        warnings.warn(other, UserWarning, stacklevel=1)
    assert [str(w.message) for w in caught] == [other]


def _retina_png(figure, transparent: bool = False) -> tuple[str, dict[str, int]]:
    """What IPython's retina formatter hands over: base64 PNG text and the shown size."""
    import base64
    import io

    buffer = io.BytesIO()
    figure.savefig(buffer, format="png", dpi=200, transparent=transparent)
    return base64.b64encode(buffer.getvalue()).decode("ascii"), {"width": 250, "height": 200}


def test_inline_figures_are_stored_with_a_palette_and_the_same_pixels_size():
    import base64
    import io

    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from PIL import Image

    from qkv.notebook import _fewer_colours

    figure, ax = plt.subplots(figsize=(2.5, 2.0))
    ax.plot(range(10), [x * x for x in range(10)], label="a line")
    ax.imshow(torch.rand(8, 8).numpy(), extent=(0, 4, 0, 40))  # a colour map too
    ax.legend()
    formatted = _retina_png(figure)
    data, size = _fewer_colours(formatted)
    before = Image.open(io.BytesIO(base64.b64decode(formatted[0])))
    after = Image.open(io.BytesIO(base64.b64decode(data)))
    assert after.mode == "P" and after.size == before.size and size == formatted[1]
    assert len(data) < len(formatted[0]) / 2  # the point: far fewer bytes
    assert _fewer_colours(formatted) == (data, size)  # deterministic
    # Close to the original, pixel by pixel (a palette of the most used colours).
    pixels_after = np.asarray(after.convert("RGB"), dtype=np.float32)
    pixels_before = np.asarray(before.convert("RGB"), dtype=np.float32)
    assert np.abs(pixels_after - pixels_before).mean() < 2.0  # out of 255
    # Transparent figures, and nothing at all, are passed on as they are.
    transparent = _retina_png(figure, transparent=True)
    assert _fewer_colours(transparent) == transparent
    assert _fewer_colours(None) is None
    plt.close(figure)
