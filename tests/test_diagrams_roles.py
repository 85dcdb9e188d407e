"""qkv.diagrams.data_flow: inputs, learned weights and products, read back from the figure."""

from __future__ import annotations

import matplotlib
import pytest
import torch

import qkv
from qkv.diagrams import HEAD_COLOURS, ROLE_COLOURS, texts_of

matplotlib.use("Agg")


def _edge(figure, gid: str) -> str:
    from matplotlib.colors import to_hex

    (patch,) = qkv.diagrams.patches_by_gid(figure, gid)
    return to_hex(patch.get_edgecolor())


def test_self_attention_draws_one_input_three_weights_three_products_with_their_shapes():
    # 6 query heads sharing 3 K/V heads, d_k = 5 != d_v = 3, T = 4, d_model = 12
    mha = qkv.MultiHeadAttention(12, 6, d_k=5, d_v=3, num_kv_heads=3)
    figure = qkv.diagrams.data_flow(torch.randn(2, 4, 12), mha)  # the first sequence's shape
    texts = texts_of(figure)
    for shape in ("(4, 12)", "(4, 6·5)", "(4, 3·5)", "(4, 3·3)"):
        assert shape in texts, shape
    assert "(4, 6·3)" in texts  # the heads' outputs side by side: h·d_v
    assert texts.count("$X$") == 1  # self-attention: one input feeds all three
    for label in ("$W^Q$ (12, 6·5)", "$W^K$ (12, 3·5)", "$W^V$ (12, 3·3)", "$Q$", "$K$", "$V$"):
        assert label in texts, label
    # the products' column blocks: 6 query heads, 3 key and value heads
    assert [len(qkv.diagrams.patches_by_gid(figure, f"heads:{p}")) for p in "QKV"] == [6, 3, 3]
    for header in (
        "input",
        "operations",
        "with their trainable weights",
        "products",
        "computed from the input",
    ):
        assert header in texts
    assert "parameters" not in texts  # the header sits over the operations too
    assert "strips: 6 heads ($Q$), 3 ($K$, $V$), one cell per head" in texts  # the strips' cells are heads
    for gid, role in (("W^Q", "q"), ("W^K", "k"), ("V", "v"), ("X", "x")):
        assert _edge(figure, gid) == ROLE_COLOURS[role].lower()


def test_cross_attention_draws_the_key_and_value_inputs_with_their_own_shapes():
    mha = qkv.MultiHeadAttention(16, 4, kdim=10, vdim=6)
    figure = qkv.diagrams.data_flow(torch.randn(3, 16), mha, key=torch.randn(5, 10), value=torch.randn(5, 6))
    texts = texts_of(figure)
    for label, shape in (("$X$", "(3, 16)"), ("$X_K$", "(5, 10)"), ("$X_V$", "(5, 6)")):
        assert label in texts and shape in texts
    assert "$W^K$ (10, 4·4)" in texts and "$W^V$ (6, 4·4)" in texts and "(5, 4·4)" in texts


def test_library_names_are_written_under_their_boxes():
    figure = qkv.diagrams.data_flow(
        torch.randn(5, 12), qkv.MultiHeadAttention(12, 3), code={"W^Q": "query.weight.T", "Q": "query(x)"}
    )
    texts = texts_of(figure)
    assert "query.weight.T" in texts and "query(x)" in texts


def test_bad_input_is_named():
    mha = qkv.MultiHeadAttention(12, 3)
    with pytest.raises(ValueError, match="x has 10 features"):
        qkv.diagrams.data_flow(torch.randn(5, 10), mha)
    with pytest.raises(ValueError, match=r"code has names \['W_Q'\]"):
        qkv.diagrams.data_flow(torch.randn(5, 12), mha, code={"W_Q": "query"})
    with pytest.raises(ValueError, match="value has 4 positions"):
        qkv.diagrams.data_flow(torch.randn(5, 12), mha, value=torch.randn(4, 12))
    with pytest.raises(ValueError, match="kdim is 10, not d_model = 12"):
        qkv.diagrams.data_flow(torch.randn(5, 12), qkv.MultiHeadAttention(12, 3, kdim=10, vdim=10))
    with pytest.raises(ValueError, match=r"value has 4 positions but the keys \(key\) have 5"):
        qkv.diagrams.data_flow(torch.randn(5, 12), mha, key=torch.randn(5, 12), value=torch.randn(4, 12))
    with pytest.raises(TypeError, match=r"x must be a torch\.Tensor"):
        qkv.diagrams.data_flow([[1.0]], mha)


def test_the_figure_fits_the_column_and_prints_nothing(capsys):
    figure = qkv.diagrams.data_flow(torch.randn(5, 12), qkv.MultiHeadAttention(12, 3))
    assert figure.get_size_inches()[0] <= 7.0
    assert capsys.readouterr().out == ""


def _arrows_into(figure, gid: str) -> int:
    """How many arrows end on the left or the top edge of the box ``gid``."""
    (patch,) = qkv.diagrams.patches_by_gid(figure, gid)
    left, top, height, width = patch.get_x(), patch.get_y(), patch.get_height(), patch.get_width()
    (ax,) = figure.axes
    ends = [a.xy for a in ax.texts if hasattr(a, "xy") and a.arrow_patch is not None]
    on_left = sum(abs(x - left) < 1e-9 and top <= y <= top + height for x, y in ends)
    return on_left + sum(abs(y - top) < 1e-9 and left < x <= left + width for x, y in ends)


def test_the_attention_weights_column_is_fed_by_q_and_k_only_and_v_goes_past_it():
    # T = 4 queries and S = T keys, 3 heads: the weights are (h, T, S) = (3, 4, 4)
    mha = qkv.MultiHeadAttention(12, 3, d_k=5, d_v=2)
    x, code = torch.randn(4, 12), {"A": "attn_weights"}
    figure = qkv.diagrams.data_flow(x, mha, attention_weights=True, code=code)
    texts = texts_of(figure)
    assert "$A$" in texts and "(3, 4, 4)" in texts and "attn_weights" in texts
    assert "(4, 3·2)" in texts  # the output: h·d_v
    assert "where to look" in texts
    assert _edge(figure, "A") == ROLE_COLOURS["weights"].lower()
    assert _arrows_into(figure, "A") == 2  # from Q and from K
    assert _arrows_into(figure, "output") == 2  # from A and from V
    assert figure.get_size_inches()[0] <= 7.0
    plain = qkv.diagrams.data_flow(torch.randn(4, 12), mha)
    assert "$A$" not in texts_of(plain) and _arrows_into(plain, "output") == 3


def test_the_operations_are_named_on_their_arrows_and_long_names_break_to_fit():
    mha = qkv.MultiHeadAttention(12, 3)
    code = {"op^Q": "self.query", "op^V": "self.value", "Q": "query(hidden_states)"}
    figure = qkv.diagrams.data_flow(torch.randn(4, 12), mha, attention_weights=True, code=code)
    texts = texts_of(figure)
    assert "self.query" in texts and "self.value" in texts and "self.key" not in texts
    assert "$XW^Q + b^Q$" in texts and "$XW^K + b^K$" not in texts
    assert "query(\nhidden_states)" in texts  # broken after "(", not shrunk
    assert "joined, before $W^O$" in texts and "heads' outputs" in texts  # the heads side by side, before W^O
    (ax,) = figure.axes
    sizes = [t.get_fontsize() for t in ax.texts if t.get_text().startswith("query(")]
    assert min(sizes) >= 7.5
    (w_q,), (q,) = (qkv.diagrams.patches_by_gid(figure, gid) for gid in ("W^Q", "Q"))
    gap = q.get_x() - (w_q.get_x() + w_q.get_width())
    assert gap >= 0.75 and figure.get_size_inches()[0] <= 7.0  # room for "self.query"


def _arrow_ends(figure) -> list[tuple[tuple[float, float], tuple[float, float]]]:
    (ax,) = figure.axes
    return [(a.xyann, a.xy) for a in ax.texts if hasattr(a, "xy") and a.arrow_patch is not None]


def _inside(point: tuple[float, float], patch) -> bool:
    x, y = point
    return patch.get_x() - 1e-9 <= x <= patch.get_x() + patch.get_width() + 1e-9 and (
        patch.get_y() - 1e-9 <= y <= patch.get_y() + patch.get_height() + 1e-9
    )


def test_the_input_feeds_the_operations_and_the_weights_enter_them_from_the_side():
    # The parameters are not made from X: no arrow runs from X into W^Q; X's arrows end
    # on the operations, and each W's one arrow ends on its own operation.
    code = {"op^Q": "self.query", "op^K": "self.key", "op^V": "self.value"}
    figure = qkv.diagrams.data_flow(torch.randn(4, 12), qkv.MultiHeadAttention(12, 3), code=code)
    ends = _arrow_ends(figure)
    (x_box,) = qkv.diagrams.patches_by_gid(figure, "X")
    from_x = [end for start, end in ends if _inside(start, x_box)]
    assert len(from_x) == 3
    for role in "QKV":
        gids = (f"W^{role}", f"op^{role}", role)
        (w_box,), (op,), (product,) = (qkv.diagrams.patches_by_gid(figure, g) for g in gids)
        assert not any(_inside(end, w_box) for _, end in ends)  # nothing flows into a weight
        assert sum(_inside(end, op) for end in from_x) == 1  # X -> the operation
        (w_end,) = [end for start, end in ends if _inside(start, w_box)]
        assert _inside(w_end, op)  # W^Q enters self.query
        assert any(_inside(start, op) and _inside(end, product) for start, end in ends)  # -> Q
    assert "self.query" in texts_of(figure) and "$XW^Q + b^Q$" in texts_of(figure)


def test_the_attention_weights_are_labelled_with_their_formula():
    figure = qkv.diagrams.data_flow(torch.randn(4, 12), qkv.MultiHeadAttention(12, 3), attention_weights=True,
                                    code={"A": "attn_weights"})  # fmt: skip
    texts = texts_of(figure)
    assert r"$\mathrm{softmax}(Q_i K_i^\top/\sqrt{d_k})$" in texts and "joined, before $W^O$" in texts
    # The formula sits above A, where Q's and K's arrows come in; A's arrow to the output
    # ends on the output's top edge, clear of the shape text under A.
    (ax,) = figure.axes
    (formula,) = [t for t in ax.texts if t.get_gid() == "A-formula"]
    (a_box,) = qkv.diagrams.patches_by_gid(figure, "A")
    assert formula.get_position()[1] < a_box.get_y()  # y grows downwards
    (out_box,) = qkv.diagrams.patches_by_gid(figure, "output")
    ends = [a.xy for a in ax.texts if hasattr(a, "xy") and a.arrow_patch is not None]
    assert any(abs(y - out_box.get_y()) < 1e-9 for _, y in ends)


def test_the_headers_tell_operations_from_learned_weights_and_the_strips_are_heads():
    # The second column's header says it holds operations with their learned
    # weights, not parameters alone; the strips are labelled heads,
    # and A's shape is read as one T x S matrix per head.
    code = {"op^Q": "self.query", "op^K": "self.key", "op^V": "self.value", "A": "attn_weights"}
    mha = qkv.MultiHeadAttention(12, 3)  # d_k = d_v = 4
    figure = qkv.diagrams.data_flow(torch.randn(4, 12), mha, attention_weights=True, code=code)
    texts = texts_of(figure)
    assert "operations" in texts and "with their trainable weights" in texts
    assert "parameters" not in texts and "learned" not in texts  # not over the operations
    assert "strips: heads 1 to 3, 4 columns each" in texts
    numbers = [t.get_text() for t in figure.axes[0].texts if (t.get_gid() or "").startswith("head-number:")]
    assert numbers == ["1", "2", "3"] * 3  # each strip's cells numbered: heads 1 and 3 differ
    from qkv.diagrams._draw import contrast_ratio

    for label in (t for t in figure.axes[0].texts if (t.get_gid() or "").startswith("head-number:")):
        assert contrast_ratio(label.get_color(), HEAD_COLOURS[int(label.get_text()) - 1]) >= 4.5
    many = qkv.diagrams.data_flow(torch.randn(4, 48), qkv.MultiHeadAttention(48, 12), attention_weights=True)
    assert not [t for t in many.axes[0].texts if (t.get_gid() or "").startswith("head-number:")]  # no room
    # 12 heads: too narrow for digits, and head 10 takes head 1's colour: the label says so
    assert "strips: heads 1 to 12, 4 columns each (colours repeat after 9)" in texts_of(many)
    assert "strips: heads 1 to 3, 4 columns each" in texts  # 3 heads: no colour repeats
    assert r"$(h, T, S)$: $T \times S$ per head" in texts and "(3, 4, 4)" in texts
    plain = texts_of(qkv.diagrams.data_flow(torch.randn(4, 12), mha, attention_weights=True))
    assert "operations" in plain and r"$\times\,W^Q + b^Q$" in plain  # unnamed, the node says what it does
    assert "$XW^Q$" not in plain  # not the product's formula: the product's box names it


def test_an_unnamed_operation_says_what_it_does_with_the_bias_only_where_the_layer_has_one():
    x = torch.randn(4, 12)
    no_bias = texts_of(qkv.diagrams.data_flow(x, qkv.MultiHeadAttention(12, 3, bias=False)))
    for role in "QKV":
        assert rf"$\times\,W^{role}$" in no_bias and rf"$\times\,W^{role} + b^{role}$" not in no_bias
    named = texts_of(qkv.diagrams.data_flow(x, qkv.MultiHeadAttention(12, 3), code={"op^Q": "self.query"}))
    assert "self.query" in named and r"$\times\,W^Q + b^Q$" not in named  # a library's name wins
    assert r"$\times\,W^K + b^K$" in named  # the others still say what they do


def test_the_weights_carry_their_heads_blocks_in_the_strips_colours():
    from matplotlib.colors import to_hex

    # 6 query heads, 3 key and value heads: W^Q cut into 6 blocks, W^K and W^V into 3
    mha = qkv.MultiHeadAttention(12, 6, d_k=5, d_v=3, num_kv_heads=3)
    figure = qkv.diagrams.data_flow(torch.randn(4, 12), mha, attention_weights=True)
    for weight, product, count in (("W^Q", "Q", 6), ("W^K", "K", 3), ("W^V", "V", 3)):
        blocks = qkv.diagrams.patches_by_gid(figure, f"heads:{weight}")
        cells = qkv.diagrams.patches_by_gid(figure, f"heads:{product}")
        assert len(blocks) == count
        # block i is head i's colour, as strip i of the product, at the same opacity
        assert [to_hex(b.get_facecolor()) for b in blocks] == [to_hex(c.get_facecolor()) for c in cells]
        assert [b.get_alpha() for b in blocks] == [c.get_alpha() for c in cells]
        (box,) = qkv.diagrams.patches_by_gid(figure, weight)
        assert all(_inside((b.get_x(), b.get_y()), box) for b in blocks)  # inside W's own box
    names = [t.get_text() for t in figure.axes[0].texts if t.get_gid() == "head-name:W^K"]
    assert names == ["$W_{1}^K$", "$W_{2}^K$", "$W_{3}^K$"]  # three blocks: room for their names
    for label in (t for t in figure.axes[0].texts if (t.get_gid() or "").startswith("head-name:")):
        colour = HEAD_COLOURS[int(label.get_text().strip("$W_{")[0]) - 1] if "_" in label.get_text() else None
        if colour is not None:
            from qkv.diagrams._draw import contrast_ratio

            assert contrast_ratio(label.get_color(), colour) >= 4.5
    six = [t.get_text() for t in figure.axes[0].texts if t.get_gid() == "head-name:W^Q"]
    assert six == ["1", "2", "3", "4", "5", "6"]  # six narrow blocks: numbers only


def test_tied_preference_shades_where_the_token_prefers_another_outside_its_circle():
    g = torch.Generator().manual_seed(4)
    queries = torch.randn(6, 2, generator=g)  # (T, 2)
    token = 1
    figure = qkv.diagrams.tied_preference(queries, token=token, title="look")
    (ax,) = figure.axes
    patches = {p.get_gid(): p for p in ax.patches}
    circle, region = patches["circle"], patches["prefers"]
    q_t = queries[token].double()
    assert circle.get_radius() == pytest.approx(float(q_t.norm()))
    for s, q_s in enumerate(queries.double()):
        prefers = s != token and float(q_t @ (q_s - q_t)) > 0  # score(t, s) > score(t, t)
        assert region.get_path().contains_point(q_s.tolist()) == prefers
        if prefers:
            assert q_s.norm() > q_t.norm()  # only a longer query: outside the circle
        colour = patches[f"query-{s}"].get_facecolor()
        assert (colour == matplotlib.colors.to_rgba(qkv.diagrams.ROLE_COLOURS["k"])) == prefers
    own = patches[f"query-{token}"].get_facecolor()  # t's arrow: its circle's ink, no role
    assert own == matplotlib.colors.to_rgba(circle.get_edgecolor())
    inside = torch.tensor([[0.5 * float(q_t.norm()), 0.0]]).double()  # any point in the circle
    assert not region.get_path().contains_points(inside.numpy()).any()
    assert ax.get_title() == "look"
    assert "$W^K = W^Q$" in ax.get_xlabel()  # the picture says it is the tied case


def test_tied_preference_checks_its_inputs():
    with pytest.raises(ValueError, match="2 features"):
        qkv.diagrams.tied_preference(torch.randn(4, 3))
    with pytest.raises(ValueError, match="token must be"):
        qkv.diagrams.tied_preference(torch.randn(4, 2), token=4)
    with pytest.raises(ValueError, match="names has 1"):
        qkv.diagrams.tied_preference(torch.randn(4, 2), names=["a"])
    with pytest.raises(ValueError, match="zero"):
        qkv.diagrams.tied_preference(torch.zeros(2, 2))


def test_tied_preference_draws_one_panel_per_token_on_one_scale():
    from matplotlib.backends.backend_agg import FigureCanvasAgg

    queries = torch.tensor([[1.0, 0.6], [1.9, 0.4], [-0.2, 1.5]])  # (T, 2)
    figure = qkv.diagrams.tied_preference(queries, token=(0, 1), title="both")
    assert len(figure.axes) == 2 and [t.get_text() for t in figure.texts] == ["both"]  # the suptitle
    for ax, token in zip(figure.axes, (0, 1), strict=True):
        patches = {p.get_gid(): p for p in ax.patches}
        assert patches["circle"].get_radius() == pytest.approx(float(queries[token].norm()))
        assert ax.get_xlim() == figure.axes[0].get_xlim()  # the same scale
        texts = [t.get_text() for t in ax.get_legend().get_texts()]
        assert texts[1] == rf"radius $\Vert q_{token + 1} \Vert$"  # the norm, as the text
    # each legend sits below its panel, so it covers no circle, arrow or label
    renderer = FigureCanvasAgg(figure).get_renderer()
    figure.draw(renderer)  # lays out the panels and their legends
    for ax in figure.axes:
        legend_box, axes_box = ax.get_legend().get_window_extent(renderer), ax.get_window_extent(renderer)
        assert legend_box.y1 <= axes_box.y0
    # token 1 prefers token 2 to itself; token 2's circle holds q_1: no mutual pair
    second = {p.get_gid(): p for p in figure.axes[1].patches}
    assert second["circle"].contains_point(figure.axes[1].transData.transform(queries[0].tolist()))
    assert not second["prefers"].get_path().contains_point(queries[0].tolist())
    with pytest.raises(ValueError, match="token must be"):
        qkv.diagrams.tied_preference(queries, token=(0, 3))


def test_the_output_projection_carries_the_picture_through_w_o_to_the_layer_output():
    # 3 heads of d_v = 2 into d_model = 12: W^O is (3·2, 12), the layer's output (4, 12)
    mha = qkv.MultiHeadAttention(12, 3, d_k=5, d_v=2)
    for attention_weights in (False, True):
        figure = qkv.diagrams.data_flow(
            torch.randn(4, 12), mha, attention_weights=attention_weights, output_projection=True
        )
        texts = texts_of(figure)
        assert "$W^O$ (3·2, 12)" in texts and "layer's output" in texts and "(4, 12)" in texts
        assert r"$\times\,W^O$" in texts and r"$\mathrm{MultiHead}(X, X, X)$" in texts
        assert not [t for t in texts if "Concat" in t]  # the box above is already joined
        assert len(qkv.diagrams.patches_by_gid(figure, "heads:output")) == 3  # its strip
        assert _edge(figure, "W^O") == _edge(figure, "layer output") == ROLE_COLOURS["o"].lower()
        assert _arrows_into(figure, "op^O") == 2  # the joined heads from above, W^O from the side
        assert _arrows_into(figure, "layer output") == 1
        assert figure.get_size_inches()[0] <= 7.0
    (w_o,) = qkv.diagrams.patches_by_gid(figure, "W^O")
    (node,) = qkv.diagrams.patches_by_gid(figure, "op^O")
    assert w_o.get_x() + w_o.get_width() < node.get_x()  # beside its operation, on the left
    cross = qkv.diagrams.data_flow(torch.randn(3, 12), mha, key=torch.randn(5, 12), output_projection=True)
    assert r"$\mathrm{MultiHead}(X, X_K, X_K)$" in texts_of(cross) and "(3, 12)" in texts_of(cross)


def test_without_the_output_projection_the_picture_stops_before_w_o():
    mha = qkv.MultiHeadAttention(12, 3, d_k=5, d_v=2)
    for attention_weights in (False, True):
        figure = qkv.diagrams.data_flow(torch.randn(4, 12), mha, attention_weights=attention_weights)
        texts = texts_of(figure)
        assert "layer's output" not in texts and not [t for t in texts if t.startswith("$W^O$")]
        for gid in ("W^O", "op^O", "layer output"):
            assert qkv.diagrams.patches_by_gid(figure, gid) == []
        assert figure.get_size_inches()[1] < 4.5  # the same height as before the option


def test_the_paper_letters_are_written_under_the_columns_they_name_and_only_when_asked():
    # paper=True: a band under the strips says what texts call Q, K, V: the paper's
    # MultiHead inputs under X, the loose use under the weights, one head's products
    # (equation 1's Q, K, V) under the products
    mha = qkv.MultiHeadAttention(12, 3)
    figure = qkv.diagrams.data_flow(torch.randn(4, 12), mha, attention_weights=True, paper=True)
    texts = [text.replace("\n", " ") for text in texts_of(figure)]  # a line wider than its column breaks
    for line in (r"$\mathrm{MultiHead}(Q, K, V)$", "(the paper): inputs,", "self-attention: $Q = K = V = X$",
                 "are these weights", "(a loose use)", r"$\mathrm{Attention}(Q, K, V)$",
                 "(the paper, head $i$): products,", "strip $i$ of $Q$, $K$, $V$"):  # fmt: skip
        assert line in texts, line
    (ax,) = figure.axes
    (strips,) = [t for t in ax.texts if t.get_gid() == "heads-label"]
    for gid, under in (("paper:X", "X"), ("paper:W", "W^V"), ("paper:Q", "V")):
        notes = [t for t in ax.texts if t.get_gid() == gid]
        (patch,) = qkv.diagrams.patches_by_gid(figure, under)
        assert len(notes) == 3
        for note in notes:  # centred under its column, below the strips' label (y grows down)
            x, y = note.get_position()
            assert x == pytest.approx(patch.get_x() + patch.get_width() / 2)
            assert y > strips.get_position()[1] > patch.get_y() + patch.get_height()
    assert figure.get_size_inches()[0] <= 7.0
    plain = qkv.diagrams.data_flow(torch.randn(4, 12), mha, attention_weights=True)
    assert not [t for t in plain.axes[0].texts if (t.get_gid() or "").startswith("paper")]
    assert "are these weights" not in texts_of(plain)
    assert figure.get_size_inches()[1] > plain.get_size_inches()[1] == pytest.approx(4.48)  # W strips
    cross = qkv.diagrams.data_flow(torch.randn(3, 12), mha, key=torch.randn(5, 12), paper=True)
    assert r"$Q = X,\ K = V = X_K$" in texts_of(cross)  # cross-attention: the inputs differ
    for gid in ("paper:X", "paper:W", "paper:Q"):  # the notes, at 11 px, never run into each other
        boxes = [t.get_window_extent() for t in figure.axes[0].texts if t.get_gid() == gid]
        others = [t.get_window_extent() for t in figure.axes[0].texts
                  if (t.get_gid() or "").startswith("paper:") and t.get_gid() != gid]  # fmt: skip
        assert not any(box.overlaps(other) for box in boxes for other in others), gid


def test_weights_note_replaces_only_the_lines_under_the_weights_and_defaults_to_the_loose_use():
    # weights_note: a page that cites no text calling the weights Q, K, V writes what
    # they are instead; the other notes and their places stay (a longer note, broken where
    # it is wider than its column, may make the band taller)
    mha = qkv.MultiHeadAttention(12, 3)
    x = torch.randn(4, 12)
    default = qkv.diagrams.data_flow(x, mha, attention_weights=True, paper=True)
    note = ("the weights: $W^Q$, $W^K$, $W^V$", "no row per token,", "one set for every input")
    own = qkv.diagrams.data_flow(x, mha, attention_weights=True, paper=True, weights_note=note)

    def lines(figure, gid):  # the notes with this gid, with their places
        return [(t.get_text(), t.get_position()) for t in figure.axes[0].texts if t.get_gid() == gid]

    assert [text.replace("\n", " ") for text, _ in lines(own, "paper:W")] == list(note)
    assert lines(own, "paper:W")[0][1][1] > lines(default, "paper:W")[0][1][1]  # two rows: centred lower
    assert [x for _, (x, _) in lines(own, "paper:W")] == [x for _, (x, _) in lines(default, "paper:W")]
    assert "(a loose use)" not in texts_of(own) and "(a loose use)" in texts_of(default)
    for gid in ("paper:X", "paper:Q", "paper-header"):
        assert lines(own, gid) == lines(default, gid)
    assert own.get_size_inches()[0] == default.get_size_inches()[0]
    assert own.get_size_inches()[1] > default.get_size_inches()[1]  # five rows of notes, not four
    for wrong in (("one", "two"), ("a", "b", "c", "d"), ("a", "b", 3)):
        with pytest.raises(ValueError, match="weights_note must be three lines"):
            qkv.diagrams.data_flow(x, mha, paper=True, weights_note=wrong)


def test_tied_preference_reach_and_shade_show_more_of_the_half_plane_and_default_as_before():
    from matplotlib.colors import to_rgba

    queries = torch.tensor([[1.0, 0.6], [1.9, 0.4], [-0.2, 1.5]])  # (T, 2): q_1 the longest
    longest = float(queries.norm(dim=-1).max())
    plain = qkv.diagrams.tied_preference(queries, token=1)
    wide = qkv.diagrams.tied_preference(queries, token=1, reach=1.6, shade=0.25)
    for figure, reach, shade in ((plain, 1.25, 0.12), (wide, 1.6, 0.25)):
        (ax,) = figure.axes
        assert ax.get_xlim() == pytest.approx((-reach * longest, reach * longest))
        region = {p.get_gid(): p for p in ax.patches}["prefers"]
        assert region.get_facecolor() == pytest.approx(to_rgba(ROLE_COLOURS["k"], shade))
    with pytest.raises(ValueError, match="reach must be more than 1"):
        qkv.diagrams.tied_preference(queries, reach=1.0)
    with pytest.raises(ValueError, match="shade must be an opacity"):
        qkv.diagrams.tied_preference(queries, shade=0)


def test_head_colours_give_each_head_its_own_strip_colour_and_default_as_before():
    from matplotlib.colors import to_hex

    mha = qkv.MultiHeadAttention(24, 12)  # 12 heads: more than the nine HEAD_COLOURS
    x = torch.randn(5, 24)

    def strip(figure) -> list[str]:
        return [to_hex(p.get_facecolor()) for p in qkv.diagrams.patches_by_gid(figure, "heads:Q")]

    plain = qkv.diagrams.data_flow(x, mha)
    assert strip(plain) == [HEAD_COLOURS[i % 9].lower() for i in range(12)]  # as before
    assert any("colours repeat after 9" in t for t in texts_of(plain))
    twelve = [*HEAD_COLOURS, "#ee7733", "#bbbbbb", "#000000"]
    distinct = qkv.diagrams.data_flow(x, mha, head_colours=twelve)
    assert strip(distinct) == [c.lower() for c in twelve]  # no two heads alike
    assert len(set(strip(distinct))) == 12
    assert not any("repeat" in t for t in texts_of(distinct))
    with pytest.raises(ValueError, match="at least 12 colours"):
        qkv.diagrams.data_flow(x, mha, head_colours=HEAD_COLOURS)
