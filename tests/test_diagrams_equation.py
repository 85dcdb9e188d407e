"""qkv.diagrams.softmax_rows, softmax_axes, mask_conventions, empty_rows: drawn = computed."""

from __future__ import annotations

import math

import matplotlib
import pytest
import torch

import qkv
from qkv.diagrams import MASKED_COLOUR, ROLE_COLOURS, cells, patches_by_gid

matplotlib.use("Agg")


def test_softmax_rows_draws_each_weight_as_a_bar():
    g = torch.Generator().manual_seed(0)
    z = torch.randn(7, generator=g)
    rows = {f"d_k = {d}": {"none": (z * math.sqrt(d)).softmax(-1), "sqrt": z.softmax(-1)} for d in (4, 64)}
    figure = qkv.diagrams.softmax_rows(rows, title="look")
    for r, panels in enumerate(rows.values()):
        for c, weights in enumerate(panels.values()):
            heights = [bar.get_height() for bar in patches_by_gid(figure, f"row-{r}-{c}")]
            assert heights == pytest.approx(weights.tolist())
    titles = [ax.get_title() for ax in figure.axes]
    assert titles[0] == f"none: largest {rows['d_k = 4']['none'].max():.2f}"
    assert all(ax.get_ylim() == (0, 1) for ax in figure.axes)
    assert not figure.legends  # the dotted line, unlabelled by default


def test_softmax_rows_labels_the_uniform_line_when_asked():
    w = torch.tensor([0.1, 0.2, 0.3, 0.4])
    figure = qkv.diagrams.softmax_rows({"a": {"x": w}}, uniform_label="uniform 1/S = 0.25")
    (legend,) = figure.legends
    assert [t.get_text() for t in legend.get_texts()] == ["uniform 1/S = 0.25"]
    assert legend.get_lines()[0].get_linestyle() == ":"


def test_softmax_rows_refuses_rows_that_differ():
    w = torch.full((4,), 0.25)
    with pytest.raises(ValueError, match="names the scales"):
        qkv.diagrams.softmax_rows({"a": {"x": w}, "b": {"y": w}})
    with pytest.raises(ValueError, match="has 3 keys"):
        qkv.diagrams.softmax_rows({"a": {"x": w}, "b": {"x": w[:3]}})
    with pytest.raises(ValueError, match="at least one"):
        qkv.diagrams.softmax_rows({})


def test_softmax_axes_writes_the_weights_and_their_sums():
    scores = torch.randn(3, 5, generator=torch.Generator().manual_seed(1))  # T != S
    figure = qkv.diagrams.softmax_axes(scores)
    over_keys, over_queries = cells(figure, "dim=-1").text, cells(figure, "dim=-2").text
    assert [row[-1] for row in over_keys[:-1]] == ["1.00"] * 3  # every row sums to 1
    assert over_queries[-1][:-1] == ["1.00"] * 5  # every column, over the queries
    assert over_keys[0][:-1] == [f"{w:.2f}" for w in scores.softmax(-1)[0].tolist()]
    assert any(row[-1] != "1.00" for row in over_queries[:-1])  # rows do not
    for ax in figure.axes[:2]:  # each note on the axis its sums run along
        assert "column sums" in ax.get_xlabel() and "row sums" in ax.get_ylabel()
    with pytest.raises(ValueError, match=r"2 dimensions \(T, S\)"):
        qkv.diagrams.softmax_axes(torch.randn(2, 3, 5))


def test_mask_conventions_writes_one_mask_three_ways_and_the_inverted_weights():
    mask = qkv.padding_mask([2, 4], 4)[:, 0, 0]  # (B, S), True = may attend
    weights = torch.tensor([[0.0, 0.0, 0.5, 0.5], [math.nan] * 4])
    figure = qkv.diagrams.mask_conventions(mask, weights)
    assert cells(figure, "sdpa").text[0] == ["T", "T", "F", "F"]
    assert cells(figure, "torch").text[0] == ["F", "F", "T", "T"]
    assert cells(figure, "hugging face").text[1] == ["1", "1", "1", "1"]
    for name in ("sdpa", "torch", "hugging face"):  # the same keys blocked in each
        assert cells(figure, name).hatched == (~mask).tolist()
    inverted = cells(figure, "inverted")
    assert inverted.text == [["0.00", "0.00", "0.50", "0.50"], ["NaN"] * 4]
    assert inverted.hatched[0] == [False, False, True, True][::-1]  # real tokens now blocked
    assert inverted.colours[0][2] == ROLE_COLOURS["k"] and inverted.colours[0][0] == MASKED_COLOUR
    assert not any(inverted.hatched[1])  # NaN cells are drawn as NaN, not as blocked
    (legend,) = figure.legends
    assert [text.get_text() for text in legend.get_texts()] == ["a key it may use", "blocked", "NaN"]
    assert "query 0's weights" in figure.axes[3].get_title()
    assert figure.axes[3].get_title().startswith("Unflipped")
    assert figure.axes[3].get_ylabel() == "query 0 of sequence"
    assert figure.axes[0].get_ylabel() == "sequence"
    assert "Hugging Face's mask as .bool()" in figure.axes[3].get_title()  # what is passed
    assert "as key_padding_mask" in figure.axes[3].get_title()  # and as which argument
    assert "key_padding_mask: True = blocked" in figure.axes[1].get_title()
    assert "SDPA's rule as 0/1; pass .bool()" in figure.axes[2].get_title()  # not a float
    assert "(SDPA)" in figure.axes[0].get_title()  # the abbreviation, defined where drawn
    assert "mask[:, None, None, :]" in figure.axes[0].get_title()  # the shape SDPA takes


def test_mask_conventions_can_leave_out_hugging_face_and_centre_the_mistake():
    mask = qkv.padding_mask([2, 4], 4)[:, 0, 0]  # (B, S), True = may attend
    weights = torch.tensor([[0.0, 0.0, 0.5, 0.5], [math.nan] * 4])
    figure = qkv.diagrams.mask_conventions(mask, weights, hugging_face=False)
    assert len(figure.axes) == 3  # no Hugging Face panel, and no empty fourth slot
    with pytest.raises(KeyError):
        cells(figure, "hugging face")
    assert cells(figure, "sdpa").text[0] == ["T", "T", "F", "F"]  # the others as before
    assert cells(figure, "inverted").text[1] == ["NaN"] * 4
    sdpa_title = figure.axes[0].get_title()
    assert "Hugging Face's attention_mask" in sdpa_title and ".bool()" in sdpa_title
    assert "mask[:, None, None, :]" in sdpa_title
    figure.draw_without_rendering()  # constrained layout places the axes at draw time
    top, right, mistake = (ax.get_position() for ax in figure.axes)
    assert mistake.y1 < min(top.y0, right.y0)  # the mistake below both conventions
    centre = (top.x0 + right.x1) / 2  # centred under the two
    assert abs((mistake.x0 + mistake.x1) / 2 - centre) < 0.02
    assert mistake.width == pytest.approx(top.width, rel=0.05)  # the same cell size
    default = qkv.diagrams.mask_conventions(mask, weights)  # the default: unchanged
    assert len([ax for ax in default.axes if ax.axison]) == 4
    assert cells(default, "hugging face").text[0] == ["1", "1", "0", "0"]


def test_mask_conventions_can_mark_the_padding_keys_in_every_panel():
    """masks' cold reader could not tell from the mistake's panel that its weights land on pads."""
    from qkv.diagrams._draw import contrast_ratio

    mask = qkv.padding_mask([2, 4], 4)[:, 0, 0]  # (B, S), True = may attend
    weights = torch.tensor([[0.0, 0.0, 0.5, 0.5], [math.nan] * 4])
    figure = qkv.diagrams.mask_conventions(mask, weights, hugging_face=False, mark_padding=True)
    for ax, name in zip(figure.axes, ("sdpa", "torch", "inverted"), strict=True):
        pads = [label for label in ax.texts if label.get_text() == "pad"]
        marked = sorted((round(label.get_position()[1]), round(label.get_position()[0])) for label in pads)
        assert marked == [(0, 2), (0, 3)], name  # sequence 0's keys 2 and 3, nothing else
        grid = cells(figure, name)
        for label in pads:  # as readable as the cell's own label
            s, b = (round(v) for v in label.get_position())
            under = "#FFFFFF" if grid.hatched[b][s] else grid.colours[b][s]
            assert contrast_ratio(label.get_color(), under) >= 4.5, (name, b, s)
            assert label.get_gid() == f"{name}:pad:{b}:{s}"
    inverted = cells(figure, "inverted")  # the cells themselves are drawn as before
    assert inverted.text[0] == ["0.00", "0.00", "0.50", "0.50"] and not any(inverted.hatched[0][2:])
    default = qkv.diagrams.mask_conventions(mask, weights, hugging_face=False)  # unchanged
    assert not any(label.get_text() == "pad" for ax in default.axes for label in ax.texts)
    centred = [label.get_position() for label in default.axes[2].texts]
    assert all(y == round(y) for _, y in centred)  # labels stay centred in their cells


def test_mask_conventions_labels_read_at_4_5_to_1_on_their_cells():
    """WCAG AA for text: white on the key colour was 3.87:1; each label now reads at 4.5:1."""
    from qkv.diagrams._draw import contrast_ratio

    mask = qkv.padding_mask([2, 4], 4)[:, 0, 0]  # (B, S), True = may attend
    weights = torch.tensor([[0.0, 0.0, 0.5, 0.5], [math.nan] * 4])
    figure = qkv.diagrams.mask_conventions(mask, weights)
    assert contrast_ratio("#FFFFFF", ROLE_COLOURS["k"]) < 4.5  # why white had to go
    names = ("sdpa", "torch", "hugging face", "inverted")
    checked = 0
    for ax, name in zip(figure.axes, names, strict=True):
        grid = cells(figure, name)
        for label in ax.texts:
            s, b = (round(v) for v in label.get_position())
            # a blocked cell's label sits on a white box over the hatching
            under = "#FFFFFF" if grid.hatched[b][s] else grid.colours[b][s]
            assert label.get_text() == grid.text[b][s]
            assert contrast_ratio(label.get_color(), under) >= 4.5, (name, b, s)
            checked += 1
    assert checked == 4 * mask.numel()  # every cell's label


def test_mask_conventions_checks_its_inputs():
    with pytest.raises(ValueError, match="boolean tensor"):
        qkv.diagrams.mask_conventions(torch.ones(2, 3))
    with pytest.raises(ValueError, match=r"mask's shape \(2, 3\)"):
        qkv.diagrams.mask_conventions(torch.ones(2, 3, dtype=torch.bool), torch.zeros(3, 2))


def test_largest_weight_curves_draws_each_value_on_its_scale_line():
    largest = {"no scale": [0.7, 0.9, 0.95], "÷ √d_k": [0.32, 0.32, 0.33], "÷ d_k": [0.14, 0.12, 0.1]}
    figure = qkv.diagrams.largest_weight_curves([16, 64, 256], largest, uniform=0.1, title="look")
    (ax,) = figure.axes
    for name, values in largest.items():
        (line,) = [line for line in ax.lines if line.get_gid() == f"curve-{name}"]
        assert list(line.get_xdata()) == [16, 64, 256]
        assert list(line.get_ydata()) == pytest.approx(values)
    assert ax.get_xscale() == "log" and ax.get_ylim() == (0, 1)
    assert "d_k" in ax.get_xlabel() and "log scale" in ax.get_xlabel() and ax.get_title() == "look"
    labels = [text.get_text() for text in ax.get_legend().get_texts()]
    assert labels == ["no scale", "÷ √d_k", "÷ d_k", "uniform 1/S = 0.10"]


def test_largest_weight_curves_checks_its_inputs():
    with pytest.raises(ValueError, match="increasing order"):
        qkv.diagrams.largest_weight_curves([64, 16], {"a": [0.5, 0.5]})
    with pytest.raises(ValueError, match="has 1 values, but d_ks has 2"):
        qkv.diagrams.largest_weight_curves([16, 64], {"a": [0.5]})
    with pytest.raises(ValueError, match="outside"):
        qkv.diagrams.largest_weight_curves([16], {"a": [1.5]})
    with pytest.raises(ValueError, match="at least one"):
        qkv.diagrams.largest_weight_curves([16], {})


def test_causal_leak_marks_one_column_sum_and_the_last_query():
    figure = qkv.diagrams.causal_leak(qkv.causal_mask(4), column=1)
    grid = cells(figure, "leak")
    assert [row[1] for row in grid.text] == ["", "Σ", "Σ", "Σ"]  # queries t >= 1
    assert all(text == "" for row in grid.text for s, text in enumerate(row) if s != 1)
    assert grid.hatched == [[s > t for s in range(4)] for t in range(4)]  # blocked: s > t
    assert grid.colours[-1] == [ROLE_COLOURS["q"]] * 4  # the last query sees every key
    assert grid.colours[0][1:] == [MASKED_COLOUR] * 3
    labels = [text.get_text() for text in figure.legends[0].get_texts()]
    assert labels[:2] == ["allowed: s ≤ t", "blocked: s > t"]  # every cell kind
    with pytest.raises(ValueError, match="square boolean"):
        qkv.diagrams.causal_leak(torch.ones(3, 4, dtype=torch.bool), column=0)
    with pytest.raises(ValueError, match="from 0 to 3"):
        qkv.diagrams.causal_leak(qkv.causal_mask(4), column=4)


def test_empty_rows_frames_each_row_with_no_key():
    left = torch.tensor([False, False, True, True])  # (S,): two pads on the left
    combined = left & qkv.causal_mask(4)  # (T, S), True = may attend
    fixed = combined | ~combined.any(-1, keepdim=True)  # empty rows see every key
    figure = qkv.diagrams.empty_rows({"left + causal": combined, "fixed": fixed}, title="look")
    assert cells(figure, "left + causal").hatched == (~combined).tolist()
    assert cells(figure, "fixed").hatched == (~fixed).tolist()
    framed = [p.get_gid() for p in patches_by_gid(figure, "left + causal:empty:0")]
    assert framed == ["left + causal:empty:0"]
    assert patches_by_gid(figure, "left + causal:empty:1") and not patches_by_gid(
        figure, "left + causal:empty:2"
    )
    assert not any(patches_by_gid(figure, f"fixed:empty:{t}") for t in range(4))
    assert [ax.get_title() for ax in figure.axes] == ["left + causal", "fixed"]
    assert all(ax.get_ylabel() == "query position t" for ax in figure.axes)
    for ax in figure.axes:  # each title centred over its grid, not over the notes
        left, right = ax.get_xlim()
        centre = left + ax.title.get_position()[0] * (right - left)
        assert centre == pytest.approx((4 - 1) / 2)  # the middle of keys 0 to 3


def test_empty_rows_marks_the_padding_queries_on_the_y_axis():
    left = torch.tensor([False, False, True, True])  # (S,): two pads on the left
    combined = left & qkv.causal_mask(4)  # (T, S): rows 0 and 1 have no key
    figure = qkv.diagrams.empty_rows(
        {"marked": combined, "plain": combined}, padding={"marked": ~left}
    )
    marked, plain = figure.axes
    assert [t.get_text() for t in marked.get_yticklabels()] == ["0 pad", "1 pad", "2", "3"]
    assert [t.get_text() for t in plain.get_yticklabels()] == ["0", "1", "2", "3"]
    with pytest.raises(ValueError, match="does not have"):
        qkv.diagrams.empty_rows({"a": combined}, padding={"b": ~left})
    with pytest.raises(ValueError, match=r"shape \(4,\)"):
        qkv.diagrams.empty_rows({"a": combined}, padding={"a": torch.ones(3, dtype=torch.bool)})


def test_empty_rows_marks_the_padding_keys_on_the_x_axis():
    real = torch.tensor([True, True, False, False])  # (S,): two pads on the right
    inverted = ~real[None].expand(4, -1)  # (T, S): real queries read the pads only
    figure = qkv.diagrams.empty_rows(
        {"marked": inverted, "plain": inverted}, padding={"marked": ~real}, key_padding={"marked": ~real}
    )
    marked, plain = figure.axes
    assert [t.get_text() for t in marked.get_xticklabels()] == ["0", "1", "2\npad", "3\npad"]
    assert [t.get_text() for t in plain.get_xticklabels()] == ["0", "1", "2", "3"]
    assert [t.get_text() for t in marked.get_yticklabels()] == ["0", "1", "2 pad", "3 pad"]
    with pytest.raises(ValueError, match="does not have"):
        qkv.diagrams.empty_rows({"a": inverted}, key_padding={"b": ~real})
    with pytest.raises(ValueError, match=r"shape \(4,\)"):
        qkv.diagrams.empty_rows({"a": inverted}, key_padding={"a": torch.ones(3, dtype=torch.bool)})


def test_empty_rows_checks_its_inputs():
    with pytest.raises(ValueError, match="at least one"):
        qkv.diagrams.empty_rows({})
    with pytest.raises(ValueError, match="boolean tensor"):
        qkv.diagrams.empty_rows({"a": torch.ones(2, 3)})
    with pytest.raises(ValueError, match="share one shape"):
        qkv.diagrams.empty_rows(
            {"a": torch.ones(2, 3, dtype=torch.bool), "b": torch.ones(3, 3, dtype=torch.bool)}
        )


def test_output_hull_draws_the_values_their_hull_and_the_outputs():
    g = torch.Generator().manual_seed(2)
    values = torch.randn(5, 2, generator=g)  # (S, 2)
    scores = torch.randn(3, 5, generator=g)  # (T, S), T != S
    outputs = {"dim=-1": scores.softmax(-1) @ values, "dim=-2": scores.softmax(-2) @ values}
    figure = qkv.diagrams.output_hull(values, outputs, title="look")
    (ax,) = figure.axes
    by_gid = {c.get_gid(): c.get_offsets() for c in ax.collections}
    torch.testing.assert_close(torch.as_tensor(by_gid["values"]), values.double())
    for name, made in outputs.items():
        torch.testing.assert_close(torch.as_tensor(by_gid[f"outputs-{name}"]), made.double())
    (hull,) = [p for p in ax.patches if p.get_gid() == "hull"]
    corners = {tuple(v) for v in hull.get_xy().tolist()}
    assert 3 <= len(corners) and corners <= {tuple(v) for v in values.double().tolist()}
    path = hull.get_path()
    assert path.contains_points(outputs["dim=-1"].numpy()).all()  # averages stay inside
    outside = [v for v in values.double().tolist() if tuple(v) not in corners]
    assert path.contains_points(outside).all()  # every value not a corner lies inside
    assert [t.get_text() for t in ax.get_legend().get_texts()][-2:] == ["outputs, dim=-1", "outputs, dim=-2"]
    assert ax.get_title() == "look"


def test_output_hull_checks_its_inputs():
    with pytest.raises(ValueError, match="2 features"):
        qkv.diagrams.output_hull(torch.randn(4, 3), {"a": torch.randn(2, 2)})
    with pytest.raises(ValueError, match="at least one"):
        qkv.diagrams.output_hull(torch.randn(4, 2), {})
    with pytest.raises(ValueError, match="2 features"):
        qkv.diagrams.output_hull(torch.randn(4, 2), {"a": torch.randn(2, 3)})
    with pytest.raises(ValueError, match="numbered names"):
        qkv.diagrams.output_hull(torch.randn(4, 2), {"a": torch.randn(2, 2)}, numbered=["b"])


def test_output_hull_numbers_the_outputs_named_by_their_query():
    g = torch.Generator().manual_seed(3)
    values, outputs = torch.randn(5, 2, generator=g), torch.randn(3, 2, generator=g)  # (S, 2), (T, 2)
    figure = qkv.diagrams.output_hull(values, {"a": outputs, "b": outputs + 1}, numbered=["b"])
    labels = {t.get_gid(): t for t in figure.axes[0].texts}
    assert sorted(labels) == ["query-b-0", "query-b-1", "query-b-2"]  # only b's, one per query
    for t, point in enumerate((outputs + 1).double().tolist()):
        assert labels[f"query-b-{t}"].get_text() == str(t)
        assert list(labels[f"query-b-{t}"].xy) == point  # anchored at query t's output


def test_empty_rows_puts_four_panels_in_two_rows_of_two():
    causal = qkv.causal_mask(3)  # (T, S), True = may attend
    masks = {"a": causal, "b": ~causal, "c": causal, "d": causal.flip(-1)}
    figure = qkv.diagrams.empty_rows(masks)
    positions = [ax.get_subplotspec().get_geometry()[:2] for ax in figure.axes]
    assert positions == [(2, 2)] * 4
    assert [ax.get_title() for ax in figure.axes] == list(masks)
    assert patches_by_gid(figure, "b:empty:2")  # ~causal leaves the last query no key


def _routes(sdpa_output, sdpa_gradient=None):
    """The three routes' outputs and two gradients, as a page measures them."""
    nan = torch.full((2, 4), math.nan)  # two empty rows, d_model = 4
    outputs = {"fast path": nan, "explicit softmax": nan, "SDPA": sdpa_output}
    gradients = {"explicit softmax": torch.full((12, 4), math.nan)}
    gradients["SDPA"] = torch.zeros(12, 4) if sdpa_gradient is None else sdpa_gradient
    return outputs, gradients


def test_mask_routes_writes_each_routes_measured_outcome():
    bias = torch.tensor([0.5, -1.0, 2.0, 0.0])
    figure = qkv.diagrams.mask_routes(*_routes(bias.expand(2, -1)), bias, title="routes")
    routes = cells(figure, "routes")
    assert routes.text == [["NaN", "none"], ["NaN", "NaN"], ["out_proj.bias", "finite"]]
    assert routes.colours[0][0] == routes.colours[1][1] == "#000000"  # NaN: black
    assert routes.colours[2][0] == ROLE_COLOURS["o"]  # the bias: the output's colour
    assert routes.colours[2][1] == MASKED_COLOUR  # finite: white
    drawn = qkv.diagrams.texts_of(figure)
    assert "none" in drawn and "routes" in drawn  # the fast path has no gradient
    assert any(text.startswith("need_weights=True?") for text in drawn)
    assert any("mha(x, x, x): one tensor" in text for text in drawn)
    assert len(patches_by_gid(figure, "routes:route:")) == 3


def test_mask_routes_names_frozen_weights_only_when_asked():
    bias = torch.ones(4)
    outputs, gradients = _routes(bias)
    plain = qkv.diagrams.texts_of(qkv.diagrams.mask_routes(outputs, gradients, bias))
    frozen = qkv.diagrams.mask_routes(outputs, gradients, bias, frozen=True)
    question = next(t for t in qkv.diagrams.texts_of(frozen) if t.startswith("Fast path"))
    assert "eval() and torch.no_grad()\n(or nothing requires grad),\n" in question
    assert not any("requires grad" in text for text in plain)  # the default: unchanged
    assert any("eval() and torch.no_grad(),\n" in text for text in plain)
    assert cells(frozen, "routes").text == cells(
        qkv.diagrams.mask_routes(outputs, gradients, bias), "routes").text


def test_mask_routes_reads_other_outcomes_from_the_tensors():
    bias = torch.ones(4)
    partly = torch.tensor([[math.nan, 0.0, 0.0, 0.0], [0.0] * 4])
    outputs, gradients = _routes(partly, torch.full((3,), math.inf))
    assert cells(qkv.diagrams.mask_routes(outputs, gradients, bias), "routes").text[2] == [
        "some NaN",
        "inf",
    ]
    outputs["SDPA"] = torch.zeros(2, 4)  # zeros are not the bias: written as zeros
    assert cells(qkv.diagrams.mask_routes(outputs, gradients, bias), "routes").text[2][0] == "zeros"
    outputs["SDPA"] = torch.full((2, 4), 3.0)
    assert cells(qkv.diagrams.mask_routes(outputs, gradients, bias), "routes").text[2][0] == "finite"


def test_mask_routes_checks_its_inputs():
    bias = torch.ones(4)
    outputs, gradients = _routes(bias)
    with pytest.raises(ValueError, match=r"routes \['fast path', 'explicit softmax', 'SDPA'\]"):
        qkv.diagrams.mask_routes({"SDPA": bias}, gradients, bias)
    with pytest.raises(ValueError, match="the fast path runs only when no gradient is needed"):
        qkv.diagrams.mask_routes(outputs, {**gradients, "fast path": bias}, bias)
    with pytest.raises(ValueError, match=r"gradients must have the routes \['explicit softmax', 'SDPA'\]"):
        qkv.diagrams.mask_routes(outputs, {"SDPA": bias}, bias)
    with pytest.raises(TypeError, match="mapping from route name to tensor"):
        qkv.diagrams.mask_routes([bias] * 3, gradients, bias)
    with pytest.raises(TypeError, match=r"outputs\['SDPA'\] must be a torch.Tensor"):
        qkv.diagrams.mask_routes({**outputs, "SDPA": [1.0]}, gradients, bias)
    with pytest.raises(ValueError, match=r"outputs\['SDPA'\] has 5 features, but bias has 4"):
        qkv.diagrams.mask_routes({**outputs, "SDPA": torch.ones(5)}, gradients, bias)
    with pytest.raises(ValueError, match=r"bias must have 1 dimensions"):
        qkv.diagrams.mask_routes(outputs, gradients, torch.ones(1, 4))


def test_empty_rows_draws_what_a_repair_added_in_a_third_colour():
    from qkv.diagrams.equation import ADDED_COLOUR

    left = torch.tensor([False, False, True, True])  # (S,): two pads on the left
    combined = left & qkv.causal_mask(4)  # (T, S): rows 0 and 1 have no key
    fixed = combined | ~combined.any(-1, keepdim=True)  # empty rows see every key
    figure = qkv.diagrams.empty_rows({"before": combined, "fixed": fixed}, added={"fixed": fixed & ~combined})
    colours = cells(figure, "fixed").colours
    assert [row.count(ADDED_COLOUR) for row in colours] == [4, 4, 0, 0]  # only the empty rows
    assert colours[3][2:] == [ROLE_COLOURS["k"]] * 2  # a real row keeps the key colour
    assert not any(ADDED_COLOUR in row for row in cells(figure, "before").colours)
    labels = [t.get_text() for t in figure.legends[0].get_texts()]
    assert "added by the repair" in labels
    plain = qkv.diagrams.empty_rows({"before": combined})
    assert "added by the repair" not in [t.get_text() for t in plain.legends[0].get_texts()]
    with pytest.raises(ValueError, match="blocks"):
        qkv.diagrams.empty_rows({"a": combined}, added={"a": fixed})
    with pytest.raises(ValueError, match="does not have"):
        qkv.diagrams.empty_rows({"a": combined}, added={"b": combined})


def test_weighted_sum_writes_the_weights_the_values_and_their_product():
    g = torch.Generator().manual_seed(2)
    weights = torch.randn(3, 5, generator=g).softmax(dim=-1)  # (T, S): T != S
    values = torch.randn(5, 2, generator=g)  # (S, d_v)
    figure = qkv.diagrams.weighted_sum(weights, values, query=1, title="look")
    written = {name: cells(figure, name) for name in ("A", "V", "output")}
    assert written["A"].text == [[f"{w:.2f}" for w in row] for row in weights.tolist()]
    assert written["V"].text == [[f"{x:.2f}" for x in row] for row in values.tolist()]
    outputs = [[f"{x:.2f}" for x in row] for row in (weights @ values).tolist()]
    assert written["output"].text == outputs  # o_t = sum over s of a_ts v_s
    for name, role in (("A", "weights"), ("output", "o")):  # only query 1's rows in colour
        assert [row[0] == ROLE_COLOURS[role] for row in written[name].colours] == [False, True, False]
    sums = [t.get_text() for t in figure.axes[0].texts if str(t.get_gid()).startswith("row-sum-")]
    assert sums == ["1.00"] * 3  # each row of weights, over the keys
    assert any(t.startswith("$o_{1} = \\sum_s") for t in qkv.diagrams.texts_of(figure))  # the formula
    columns = torch.randn(3, 5, generator=g).softmax(dim=-2)  # over the queries: drawn as it is
    figure = qkv.diagrams.weighted_sum(columns, values)
    sums = [t.get_text() for t in figure.axes[0].texts if str(t.get_gid()).startswith("row-sum-")]
    assert sums == [f"{total:.2f}" for total in columns.sum(dim=-1).tolist()] and "1.00" not in sums


def test_weighted_sum_draws_every_number_it_writes_negative_ones_too():
    # A cell's number is left out only when it cannot fit at a readable size; a
    # five-character "-0.19" in this figure's cells fits, and a reader checking o_t by
    # hand needs every entry (a reader found V's negative entries blank).
    weights = torch.tensor([[0.5, 0.25, 0.25, 0.0], [0.1, 0.2, 0.3, 0.4], [0.25] * 4])  # (T, S)
    values = torch.tensor([[0.8, 0.5], [1.0, 0.2], [-0.19, 1.2], [-1.35, 0.3]])  # (S, d_v)
    figure = qkv.diagrams.weighted_sum(weights, values, query=0, query_labels=True, title="t")
    drawn = set(qkv.diagrams.texts_of(figure))
    for name in ("A", "V", "output"):
        written = [text for row in cells(figure, name).text for text in row if text]
        assert written and all(text in drawn for text in written), (name, set(written) - drawn)
    assert "-0.19" in drawn and "-1.35" in drawn


def test_weighted_sum_numbers_the_queries_only_when_asked():
    g = torch.Generator().manual_seed(3)
    weights = torch.randn(3, 4, generator=g).softmax(dim=-1)  # (T, S)
    values = torch.randn(4, 2, generator=g)  # (S, d_v)
    plain = qkv.diagrams.weighted_sum(weights, values)
    assert "query t" not in qkv.diagrams.texts_of(plain)  # the default is unchanged
    assert not any(str(t.get_gid()).startswith("query-") for t in plain.axes[0].texts)
    labelled = qkv.diagrams.weighted_sum(weights, values, query=2, query_labels=True)
    assert "query t" in qkv.diagrams.texts_of(labelled)
    numbers = {t.get_gid(): t for t in labelled.axes[0].texts if str(t.get_gid()).startswith("query-")}
    assert [numbers[f"query-{t}"].get_text() for t in range(3)] == ["0", "1", "2"]  # one per row of A
    assert numbers["query-2"].get_fontweight() == "bold"  # the highlighted query
    assert cells(labelled, "A").text == cells(plain, "A").text  # the same entries
    assert labelled.get_figwidth() > plain.get_figwidth()  # room for the numbers


def test_weighted_sum_checks_its_inputs():
    weights, values = torch.full((2, 4), 0.25), torch.ones(4, 3)
    with pytest.raises(ValueError, match="values has 3 rows"):
        qkv.diagrams.weighted_sum(weights, values[:3])
    with pytest.raises(ValueError, match="query must be a query position from 0 to 1"):
        qkv.diagrams.weighted_sum(weights, values, query=2)
    with pytest.raises(ValueError, match=r"2 dimensions \(T, S\)"):
        qkv.diagrams.weighted_sum(weights[None], values)


def test_weighted_sum_writes_the_column_sums_only_when_asked():
    g = torch.Generator().manual_seed(4)
    wrong = torch.randn(4, 4, generator=g).softmax(dim=-2)  # (T, S): over the queries
    values = torch.randn(4, 2, generator=g)  # (S, d_v)
    plain = qkv.diagrams.weighted_sum(wrong, values)
    assert "column sum" not in qkv.diagrams.texts_of(plain)  # the default is unchanged
    assert not any(str(t.get_gid()).startswith("column-sum-") for t in plain.axes[0].texts)
    summed = qkv.diagrams.weighted_sum(wrong, values, column_sums=True)
    assert "column sum" in qkv.diagrams.texts_of(summed)
    found = {t.get_gid(): t.get_text() for t in summed.axes[0].texts}
    assert [found[f"column-sum-{s}"] for s in range(4)] == ["1.00"] * 4  # over the queries
    assert cells(summed, "A").text == cells(plain, "A").text  # the same entries
    assert summed.get_figheight() > plain.get_figheight()  # T = S: room made for the sums
    summed.canvas.draw()  # lay the texts out, then compare where they landed
    formula, sums = (next(t for t in summed.axes[0].texts if t.get_gid() == gid).get_window_extent()
                     for gid in ("formula", "column-sum-0"))
    assert not formula.overlaps(sums)  # the formula is not written over the sums


def test_empty_rows_of_six_keys_keep_near_the_books_column():
    # The masks page's sizes: six keys, two panels. Wider than the column (720 px at
    # 1280), a figure shows its text smaller; the autouse check in conftest.py measures it.
    pads = torch.tensor([True, True, True, False, False, False])  # left padding
    left = qkv.causal_mask(6) & ~pads
    repaired = left | pads[:, None]
    panels = {"left padding, causal": left, "repaired": repaired}
    figure = qkv.diagrams.empty_rows(
        panels, padding=dict.fromkeys(panels, pads), key_padding=dict.fromkeys(panels, pads),
        added={"repaired": repaired & ~left}, title="the pads' rows have no key; repaired, none empty",
    )  # fmt: skip
    assert figure.get_size_inches()[0] <= 7.5  # cells of 0.3 in, not 0.5 (9.9 in)
    three = qkv.diagrams.empty_rows({"a": left, "b": repaired, "c": left})  # two a row, not three
    assert three.get_size_inches()[0] <= 7.5
