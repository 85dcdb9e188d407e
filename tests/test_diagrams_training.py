"""qkv.diagrams.one_loss: one input, three matrices, one loss back to every parameter."""

from __future__ import annotations

import matplotlib
import pytest
import torch

import qkv
from qkv.diagrams import ROLE_COLOURS, texts_of

matplotlib.use("Agg")


def _layer():
    torch.manual_seed(0)
    return qkv.MultiHeadAttention(6, 2, d_k=3, d_v=2, bias=False)


def test_x_w_and_products_are_drawn_to_scale_from_the_layer():
    layer = _layer()
    x = torch.randn(5, 6)
    figure = qkv.diagrams.one_loss(x, layer, head=1)
    names = qkv.diagrams.matrix_names(figure)
    assert names == ["X", "W^Q", "Q", "W^K", "K", "W^V", "V", "W^O"]
    sizes = {name: (len(c.colours), len(c.colours[0])) for name in names
             for c in [qkv.diagrams.cells(figure, name)]}  # fmt: skip
    assert sizes == {"X": (5, 6), "W^Q": (6, 3), "W^K": (6, 3), "W^V": (6, 2), "Q": (5, 3),
                     "K": (5, 3), "V": (5, 2), "W^O": (4, 6)}  # fmt: skip
    # The shading is head 2's own matrix: its largest entry is drawn in the full colour.
    w_q = layer.to_heads().w_q[1].detach()
    row, col = divmod(int(w_q.abs().argmax()), 3)
    assert qkv.diagrams.cells(figure, "W^Q").colours[row][col].lower() == ROLE_COLOURS["q"].lower()
    assert not any(t.startswith("gradient norm") for t in texts_of(figure))


def test_each_named_gradient_is_labelled_with_its_norm():
    layer = _layer()
    grads = {"W^Q": torch.full((3, 6), 2.0), "readout": [torch.ones(4), torch.ones(5)], "W^K": None}
    figure = qkv.diagrams.one_loss(torch.randn(1, 5, 6), layer, gradients=grads)
    texts = texts_of(figure)
    assert "gradient norm 8.49" in texts  # sqrt(18 * 4)
    assert "gradient norm 3" in texts  # sqrt(9), the two parts as one vector
    assert sum(t.startswith("gradient norm") for t in texts) == 2


def test_notes_from_left_starts_the_three_matrices_labels_at_their_left_edge():
    layer, x = _layer(), torch.randn(5, 6)
    grads = {name: torch.ones(3, 6) for name in ("W^Q", "W^K")} | {"W^O": torch.ones(6, 4)}
    centred = qkv.diagrams.one_loss(x, layer, gradients=grads)
    from_left = qkv.diagrams.one_loss(x, layer, gradients=grads, notes_from_left=True)

    def notes(figure):
        return {t.get_gid(): t for t in figure.axes[0].texts if (t.get_gid() or "").endswith(":grad")}

    plain, moved = notes(centred), notes(from_left)
    assert set(plain) == set(moved) == {"W^Q:grad", "W^K:grad", "W^O:grad"}
    for gid in ("W^Q:grad", "W^K:grad"):  # W^Q, W^K: from the matrix's left edge
        assert plain[gid].get_ha() == "center" and moved[gid].get_ha() == "left"
        assert moved[gid].get_position()[0] < plain[gid].get_position()[0]
        assert moved[gid].get_position()[1] == plain[gid].get_position()[1]
    # W^O's label stays centred; the default leaves every label as it was
    assert moved["W^O:grad"].get_ha() == "center"
    assert moved["W^O:grad"].get_position() == plain["W^O:grad"].get_position()
    # the left edge: where W^Q's top-left cell starts
    left = qkv.diagrams.cells(from_left, "W^Q").corner[0]
    assert moved["W^Q:grad"].get_position()[0] == pytest.approx(left)


def test_mark_sum_marks_where_the_three_gradients_add_at_x_and_only_then():
    layer, x = _layer(), torch.randn(5, 6)
    plain = qkv.diagrams.one_loss(x, layer)
    marked = qkv.diagrams.one_loss(x, layer, mark_sum=True)
    by_gid = {t.get_gid(): t for t in marked.axes[0].texts if t.get_gid()}
    assert by_gid["X:sum"].get_text() == "+"
    assert by_gid["X:sum-note"].get_text() == "three gradients\nadd at +"
    assert not any((t.get_gid() or "").startswith("X:sum") for t in plain.axes[0].texts)
    # The plus sits between X and the three matrices, level with X: where the dashed
    # arrows from W^Q, W^K and W^V end.
    labels = {t.get_text(): t.get_position() for t in marked.axes[0].texts}
    plus_x, plus_y = by_gid["X:sum"].get_position()
    assert labels["$X$"][0] < plus_x < labels["$W^K$"][0]
    assert plus_y > labels["$X$"][1]  # below X's name, at X's middle (y grows downwards)
    # Nothing else changes: the same matrices, and the same texts besides the mark.
    assert qkv.diagrams.matrix_names(marked) == qkv.diagrams.matrix_names(plain)
    assert sorted(texts_of(marked)) == sorted([*texts_of(plain), "+", "three gradients\nadd at +"])


@pytest.mark.parametrize(
    ("gradients", "error", "message"),
    [
        ({"W^X": torch.ones(2)}, ValueError, r"the parameters drawn are embeddings, W\^Q"),
        ({"W^Q": [1.0]}, TypeError, r"gradients\['W\^Q'\] must be a Tensor"),
        ({"W^V": torch.ones(0, 3)}, ValueError, r"is empty \(\(0, 3\)\)"),
        ([torch.ones(2)], TypeError, "gradients must be a mapping"),
    ],
)
def test_bad_gradients_are_named(gradients, error, message):
    with pytest.raises(error, match=message):
        qkv.diagrams.one_loss(torch.randn(5, 6), _layer(), gradients=gradients)


def test_bad_inputs_name_the_argument_and_the_shapes():
    layer = _layer()
    with pytest.raises(ValueError, match="x has 7 features"):
        qkv.diagrams.one_loss(torch.randn(5, 7), layer)
    with pytest.raises(ValueError, match=r"head must be an int in \[0, 2\), got 2"):
        qkv.diagrams.one_loss(torch.randn(5, 6), layer, head=2)
    cross = qkv.MultiHeadAttention(6, 2, kdim=4, bias=False)
    with pytest.raises(ValueError, match="kdim"):
        qkv.diagrams.one_loss(torch.randn(5, 6), cross)


def test_training_curves_draws_each_measure_as_given():
    figure = qkv.diagrams.training_curves(
        [0, 5, 10], {"accuracy": [0.1, 0.5, 0.9], "on the match": [0.125, 0.3, 0.8]}, chance=0.125
    )
    ax = figure.axes[0]
    lines = {line.get_gid(): list(line.get_ydata()) for line in ax.lines if line.get_gid()}
    assert lines == {"curve-accuracy": [0.1, 0.5, 0.9], "curve-on the match": [0.125, 0.3, 0.8]}
    assert ax.get_xlabel() == "training step" and ax.get_ylabel()
    assert "chance, 0.125" in [t.get_text() for t in ax.get_legend().get_texts()]


@pytest.mark.parametrize(
    ("steps", "curves", "message"),
    [
        ([5, 0], {"a": [0.1, 0.2]}, "increasing"),
        ([0, 5], {}, "at least one"),
        ([0, 5], {"a": [0.1]}, "has 1 values"),
        ([0, 5], {"a": [0.1, 1.5]}, "outside"),
    ],
)
def test_training_curves_says_what_it_expected(steps, curves, message):
    with pytest.raises(ValueError, match=message):
        qkv.diagrams.training_curves(steps, curves)


def test_step_changes_draws_each_part_the_sum_and_all_together():
    figure = qkv.diagrams.step_changes(
        {0.1: [-0.01, -0.02, -0.029], 30: [-0.5, -0.25, 1.25]}, ["a", "b"], title="t"
    )
    assert len(figure.axes) == 2
    bars = {p.get_gid(): p.get_width() for ax in figure.axes for p in ax.patches}
    assert bars == pytest.approx({
        "bar-0.1-a": -0.01, "bar-0.1-b": -0.02, "bar-0.1-sum of parts": -0.03,
        "bar-0.1-all together": -0.029, "bar-30-a": -0.5, "bar-30-b": -0.25,
        "bar-30-sum of parts": -0.75, "bar-30-all together": 1.25})  # fmt: skip
    labels = [text.get_text() for text in figure.axes[0].texts]
    assert labels == ["-0.01", "-0.02", "-0.03", "-0.029"]  # each bar's value, written
    titles = [ax.get_title() for ax in figure.axes]
    assert titles == ["η = 0.1\nsum -0.03, together -0.029", "η = 30\nsum -0.75, together +1.2"]
    assert all(ax.get_xlabel() for ax in figure.axes)  # each panel's own scale, named
    names = [tick.get_text() for tick in figure.axes[0].get_yticklabels()]
    assert names == ["a", "b", "sum of parts", "all together"]  # level, top to bottom
    assert figure.axes[0].yaxis_inverted()


@pytest.mark.parametrize(
    ("changes", "parts", "message"),
    [
        ({}, ["a"], "at least one step size"),
        ({1: [0.1, 0.2]}, [], "at least one part"),
        ({1: [0.1, 0.2, 0.3]}, ["a"], r"changes\[1\] has 3 values, but 1 parts need 2"),
    ],
)
def test_step_changes_says_what_it_expected(changes, parts, message):
    with pytest.raises(ValueError, match=message):
        qkv.diagrams.step_changes(changes, parts)


def test_self_mask_adds_m_to_the_formula_and_notes_it_and_only_then():
    layer, x = _layer(), torch.randn(5, 6)

    def texts(figure):
        return {t.get_gid(): t.get_text() for t in figure.axes[0].texts}

    plain = texts(qkv.diagrams.one_loss(x, layer))
    masked = texts(qkv.diagrams.one_loss(x, layer, self_mask=True))
    assert plain["attention:text"] == r"softmax$(QK^\top/\sqrt{d_k})V$"
    assert masked["attention:text"] == r"softmax$(QK^\top/\sqrt{d_k}+M)V$"
    assert masked["attention:mask-note"] == r"$M$: $-\infty$ on the diagonal"
    assert "attention:mask-note" not in plain
    assert set(masked) - set(plain) == {"attention:mask-note"}


def test_gradient_rows_outlines_the_rows_reached_and_only_when_asked():
    layer, x = _layer(), torch.randn(5, 6)
    plain = qkv.diagrams.one_loss(x, layer)
    marked = qkv.diagrams.one_loss(x, layer, gradient_rows={"Q": [4], "K": [0, 1, 2, 3]})
    outlines = [p for p in marked.axes[0].patches if (p.get_gid() or "").endswith(":grad-rows")]
    assert [p.get_gid() for p in outlines] == ["Q:grad-rows", "K:grad-rows"]  # one run each
    q_corner = qkv.diagrams.cells(marked, "Q").corner
    assert outlines[0].get_xy() == pytest.approx((q_corner[0], q_corner[1] + 4))
    assert (outlines[0].get_height(), outlines[1].get_height()) == (1, 4)
    assert "gradient in 1 of 5 rows" in texts_of(marked)
    assert "gradient in 4 of 5 rows" in texts_of(marked)
    # the default draws no outline and no note; the rest is unchanged
    assert not any((p.get_gid() or "").endswith(":grad-rows") for p in plain.axes[0].patches)
    assert sorted(texts_of(marked)) == sorted(
        [*texts_of(plain), "gradient in 1 of 5 rows", "gradient in 4 of 5 rows"]
    )


@pytest.mark.parametrize(
    ("rows", "message"),
    [({"W^Q": [0]}, "the products drawn are Q, K, V"), ({"Q": [5]}, r"rows in \[0, 5\)")],
)
def test_bad_gradient_rows_are_named(rows, message):
    with pytest.raises(ValueError, match=message):
        qkv.diagrams.one_loss(torch.randn(5, 6), _layer(), gradient_rows=rows)
