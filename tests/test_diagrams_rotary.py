"""qkv.diagrams' rotary figures: what is drawn is what qkv computes, read back from the figure."""

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


def test_the_angle_is_signed_and_an_unturned_arrow_is_named():
    rope = qkv.RotaryEmbedding(6, angle_dtype=torch.float64)
    q, k = torch.tensor([1.0, 0, 0, 0, 0, 0]), torch.tensor([1.0, 0, 0, 0, 0, 0])
    figure = qkv.diagrams.rotation(q, k, rope, [(1, 0), (0, 1)])  # pair 0 turns one radian per position
    degrees = round(math.degrees(1.0))
    assert figure.axes[0].get_title().endswith(f"angle from q to k: −{degrees}°")  # k behind q: clockwise
    assert figure.axes[1].get_title().endswith(f"angle from q to k: +{degrees}°")
    notes = {t.get_gid() for ax in figure.axes for t in ax.texts}
    assert {"k-unturned-0", "q-unturned-1"} <= notes and "q-unturned-0" not in notes
    assert "counter-clockwise" in figure.legends[0].get_title().get_text()


def test_before_gives_the_angle_from_q_to_k_before_rotation():
    rope = qkv.RotaryEmbedding(6, angle_dtype=torch.float64)
    q, k = torch.tensor([1.0, 0, 0, 0, 0, 0]), torch.tensor([0.0, 0, 0, 1.0, 0, 0])  # k: +90° from q
    figure = qkv.diagrams.rotation(q, k, rope, [(1, 0), (3, 1)], before=True)
    after = [round(90 - math.degrees(t - s)) for t, s in ((1, 0), (3, 1))]  # pair 0: 1 rad per position
    assert after == [33, -25]
    titles = [ax.get_title() for ax in figure.axes]
    assert titles[0].endswith("\nq to k: +90° → +33°")  # before, then after rotation
    assert titles[1].endswith("\nq to k: +90° → −25°")
    assert "before → after" in figure.legends[0].get_title().get_text()
    raw = next(p for p in figure.axes[0].patches if p.get_gid() == "q-raw")
    turned = next(p for p in figure.axes[0].patches if p.get_gid() == "q-rotated-0")
    assert matplotlib.colors.to_hex(raw.get_facecolor()) == ROLE_COLOURS["q"].lower()
    assert raw.get_alpha() is None  # as strong as the turned arrow, but thinner:
    widths = [math.dist(*p.get_xy()[[3, 4]]) for p in (raw, turned)]  # the tail's two corners
    assert widths[1] == pytest.approx(6 * widths[0])  # 0.024 and 0.004 of the reach
    legend = {h.get_label(): h.get_linewidth() for h in figure.legends[0].legend_handles}
    assert legend["q rotated by t·θ"] > legend["q before"]  # the legend: thick turned, thin before
    plain = qkv.diagrams.rotation(q, k, rope, [(1, 0)])  # the default: no angle before
    assert "→" not in plain.axes[0].get_title()
    pale = next(p for p in plain.axes[0].patches if p.get_gid() == "q-raw")
    assert pale.get_alpha() == 0.4  # the default: thin and pale


def test_a_key_after_its_query_is_marked_masked_only_when_causal():
    rope = qkv.RotaryEmbedding(6, angle_dtype=torch.float64)
    q, k = torch.randn(6, dtype=torch.float64), torch.randn(6, dtype=torch.float64)
    figure = qkv.diagrams.rotation(q, k, rope, [(2, 0), (1, 1), (0, 2)], causal=True)
    masked = ["masked in a causal model" in ax.get_title() for ax in figure.axes]
    assert masked == [False, False, True]  # only s > t
    plain = qkv.diagrams.rotation(q, k, rope, [(0, 2)])
    assert "masked" not in plain.axes[0].get_title()


def test_position_flow_turns_queries_and_keys_and_not_values():
    mha = qkv.MultiHeadAttention(12, 3)  # d_k = 4
    figure = qkv.diagrams.rotary.position_flow(torch.randn(5, 12), mha, qkv.RotaryEmbedding(4))
    boxes = {p.get_gid(): p for p in figure.axes[0].patches}
    assert {"R_t", "R_s", "no-rotation", "q", "k", "v", "score", "sum", "output"} <= set(boxes)
    assert boxes["R_t"].get_edgecolor()[:3] == matplotlib.colors.to_rgb(ROLE_COLOURS["q"])
    assert boxes["R_s"].get_edgecolor()[:3] == matplotlib.colors.to_rgb(ROLE_COLOURS["k"])
    assert boxes["no-rotation"].get_linestyle() == "--"
    texts = qkv.diagrams.texts_of(figure)
    assert {"(5, 12)", "(12, 3×4)", "t = 0…4, size 4", "no rotation", "output (5, 12)"} <= set(texts)
    assert not any(text.startswith("row ") for text in texts)  # columns only: R_t q_t
    score = r"$\tilde q_t^\top \tilde k_s\,/\sqrt{d_k}$"
    rotated = {r"$\tilde q_t = R_t q_t$", r"$\tilde k_s = R_s k_s$", score}
    assert rotated <= set(texts)  # the rotated query and key have their own symbols
    assert "mask: s ≤ t" in texts  # the mask: the second place position enters
    rope = qkv.RotaryEmbedding(4)
    unmasked = qkv.diagrams.rotary.position_flow(torch.randn(5, 12), mha, rope, causal=False)
    assert "mask: s ≤ t" not in qkv.diagrams.texts_of(unmasked)
    assert boxes["mask"].get_x() == boxes["R_t"].get_x()  # the mask: in the position column
    assert "mask" not in {p.get_gid() for p in unmasked.axes[0].patches}
    assert "per head: head 1 of 3" in texts  # one head's slice: rotation and q, k, v
    assert "split: 3 heads" in texts  # split at the weights, before the rotation
    with pytest.raises(ValueError, match="the layer's heads have d_k=4, but rotary is for d_k=8"):
        qkv.diagrams.rotary.position_flow(torch.randn(5, 12), mha, qkv.RotaryEmbedding(8))
    with pytest.raises(TypeError, match=r"rotary must be a qkv\.RotaryEmbedding"):
        qkv.diagrams.rotary.position_flow(torch.randn(5, 12), mha, None)


def test_position_gaps_draws_zeros_at_the_floor_and_refuses_bad_gaps():
    gaps = {"rotation": torch.tensor([0.0, 2.0**-10, 2.0**-9]), "mask": torch.tensor([0.5, 0.25, 0.0])}
    figure = qkv.diagrams.position_gaps(gaps, floor=1e-12)
    lines = {line.get_gid(): line for line in figure.axes[0].get_lines()}
    assert lines["gap-0"].get_ydata().tolist() == [1e-12, 2.0**-10, 2.0**-9]  # the zero at the floor
    assert lines["gap-1"].get_ydata().tolist() == [0.5, 0.25, 1e-12]
    assert figure.axes[0].get_yscale() == "log"
    assert figure.axes[0].get_ylabel() == "largest gap from the reference"
    title = figure.axes[0].get_title()  # the rule: what position 0 reads and returns
    assert title.startswith("Exact at t = 0: what position 0 reads") and "no mask" in title
    named = qkv.diagrams.position_gaps(gaps, floor=1e-12, reference="the unchanged model")
    assert named.axes[0].get_ylabel() == "largest gap from the unchanged model"
    zeros = {c.get_gid(): c for c in figure.axes[0].collections}
    assert zeros["zeros-0"].get_offsets()[:, 0].tolist() == [0]  # hollow, at t itself
    assert zeros["zeros-1"].get_offsets()[:, 0].tolist() == [2]
    ticks = figure.axes[0].get_yticks().tolist()
    labels = [t.get_text() for t in figure.axes[0].get_yticklabels()]
    assert ticks[0] == 1e-12 and labels[0] == "0" and min(ticks[1:]) >= 1e-4  # 0 apart from the scale
    two = {"a": torch.tensor([0.0, 2e-5, 0.3]), "b": torch.tensor([0.0, 0.0, 0.1])}
    auto = qkv.diagrams.position_gaps(two)
    zero = auto.axes[0].get_lines()[0].get_ydata().tolist()[0]
    assert zero == pytest.approx(1e-7)  # two powers of ten below 10^-5
    side = {c.get_gid(): c.get_offsets()[:, 0].tolist() for c in auto.axes[0].collections}
    assert side["zeros-0"][0] < 0 < side["zeros-1"][0] and side["zeros-1"][1] == 1  # side by side at t = 0
    legend = [t.get_text() for t in figure.axes[0].get_legend().get_texts()]
    assert legend == ["rotation", "mask", 'hollow, at "0" (below\nthe scale): exactly 0']
    shapes = r"every gap must have one shape \(T,\), got 'a': \(3,\), 'b': \(2,\)"
    with pytest.raises(ValueError, match=shapes):
        qkv.diagrams.position_gaps({"a": torch.zeros(3), "b": torch.zeros(2)})
    with pytest.raises(ValueError, match=r"gaps\['a'\] must be finite and not negative"):
        qkv.diagrams.position_gaps({"a": torch.tensor([-1.0])})
    with pytest.raises(ValueError, match=r"floor=0\.1 must be below every nonzero gap"):
        qkv.diagrams.position_gaps({"a": torch.tensor([0.05])}, floor=0.1)
    with pytest.raises(TypeError, match="gaps must be a non-empty mapping"):
        qkv.diagrams.position_gaps([torch.zeros(3)])


def test_position_gaps_breaks_its_lines_at_zeros_when_asked():
    gaps = {"rotation": torch.tensor([0.0, 2.0**-10, 2.0**-9]), "mask": torch.tensor([0.5, 0.25, 0.0])}
    broken = qkv.diagrams.position_gaps(gaps, floor=1e-12, join_zeros=False)
    lines = {line.get_gid(): list(line.get_ydata()) for line in broken.axes[0].get_lines()}
    assert math.isnan(lines["gap-0"][0]) and lines["gap-0"][1:] == [2.0**-10, 2.0**-9]  # no segment to 0
    assert lines["gap-1"][:2] == [0.5, 0.25] and math.isnan(lines["gap-1"][2])
    zeros = {c.get_gid(): c.get_offsets().tolist() for c in broken.axes[0].collections}
    assert zeros["zeros-0"] == [[0, 1e-12]] and zeros["zeros-1"] == [[2, 1e-12]]  # markers kept


def _value_shift_inputs(T=6, d_k=8, seed=0):
    g = torch.Generator().manual_seed(seed)
    q, k, v = torch.randn(3, T, d_k, generator=g, dtype=torch.float64)
    return q, k, v, qkv.RotaryEmbedding(d_k, angle_dtype=torch.float64)


def test_value_shift_draws_the_outputs_qkv_computes():
    q, k, v, rope = _value_shift_inputs()
    figure = qkv.diagrams.value_shift(q, k, v, rope, 100)
    lines = {line.get_gid(): line for ax in figure.axes for line in ax.lines if line.get_gid()}
    for n, rotate_values in enumerate((False, True)):
        for name, first in (("before", 0), ("after", 100)):
            positions = torch.arange(first, first + 6)
            values = rope(v, positions) if rotate_values else v
            o = qkv.attention(rope(q, positions), rope(k, positions), values, is_causal=True)[0]
            drawn = torch.as_tensor(lines[f"{name}-{n}"].get_xydata())  # (T, 2)
            torch.testing.assert_close(drawn, o[:, [0, 4]])  # pair 0 of half-split: dimensions 0 and 4
    before, after = (torch.as_tensor(lines[gid].get_xydata()) for gid in ("before-0", "after-0"))
    torch.testing.assert_close(before, after)  # raw values: the shift moves nothing
    turn = round(math.degrees(100 * 1.0) + 180) % 360 - 180  # pair 0 turns one radian per position
    assert figure.axes[1].get_title().endswith(f"= 100 rad ≡ {turn:+d}°".replace("-", "−"))


@pytest.mark.parametrize("seed", range(4))
def test_value_shift_labels_overlap_no_marker_and_no_other_label(seed):
    q, k, v, rope = _value_shift_inputs(seed=seed)
    figure = qkv.diagrams.value_shift(q, k, v, rope, 100)
    renderer = figure.canvas.get_renderer()
    for n, ax in enumerate(figure.axes):
        labels = [t for t in ax.texts if (t.get_gid() or "").startswith(f"t-{n}-")]
        assert [t.get_text() for t in labels] == [f"t={t}" for t in range(6)]
        boxes = [t.get_window_extent(renderer) for t in labels]
        for i, box in enumerate(boxes):
            assert not any(box.overlaps(other) for other in boxes[i + 1 :])
            assert ax.get_window_extent(renderer).contains(*box.p0)  # inside the axes
            for marker in (line for line in ax.lines if line.get_gid()):
                points = ax.transData.transform(marker.get_xydata())
                assert not any(box.contains(x, y) for x, y in points), labels[i].get_text()


def test_value_shift_bad_input_is_named():
    q, k, v, rope = _value_shift_inputs()
    with pytest.raises(ValueError, match=r"value has shape \(6, 4\), but rotary is for d_k=8"):
        qkv.diagrams.value_shift(q, k, v[:, :4], rope, 100)
    with pytest.raises(ValueError, match="same number of rows"):
        qkv.diagrams.value_shift(q, k[:5], v, rope, 100)
    with pytest.raises(TypeError, match=r"rotary must be a qkv\.RotaryEmbedding"):
        qkv.diagrams.value_shift(q, k, v, None, 100)


def test_value_shift_draws_only_the_outputs_shown():
    q, k, v, rope = _value_shift_inputs()
    figure = qkv.diagrams.value_shift(q, k, v, rope, 100, shown=[0, 2, 5])
    positions = torch.arange(6)
    o = qkv.attention(rope(q, positions), rope(k, positions), rope(v, positions), is_causal=True)[0]
    (before,) = [line for line in figure.axes[1].lines if line.get_gid() == "before-1"]
    torch.testing.assert_close(torch.as_tensor(before.get_xydata()), o[[0, 2, 5]][:, [0, 4]])
    labels = sorted(t.get_text() for t in figure.axes[1].texts if (t.get_gid() or "").startswith("t-1-"))
    assert labels == ["t=0", "t=2", "t=5"]
    assert "(t = 0, 2, 5 drawn)" in figure.legends[0].get_texts()[0].get_text()
    assert not [line for ax in figure.axes for line in ax.lines if line.get_color() == "#dddddd"]  # no spokes
    with pytest.raises(ValueError, match="shown must name outputs t between 0 and 5, got \\[6\\]"):
        qkv.diagrams.value_shift(q, k, v, rope, 100, shown=[6])


@pytest.mark.parametrize("d_k", [4, 8])
def test_pairings_matrices_draw_each_pairings_rotation(d_k):
    figure = qkv.diagrams.pairings(d_k, matrices=True)
    rows = next(ax for ax in figure.axes if ax.get_label() not in ("R-interleaved", "R-half"))
    colours = {p.get_gid(): matplotlib.colors.to_hex(p.get_facecolor()) for p in rows.patches if p.get_gid()}
    for pairing in ("interleaved", "half"):
        (ax,) = [ax for ax in figure.axes if ax.get_label() == f"R-{pairing}"]
        turning = qkv.RotaryEmbedding(d_k, pairing=pairing, angle_dtype=torch.float64).matrix(1)
        cells = {p.get_gid(): p for p in ax.patches if p.get_gid()}
        texts = {t.get_gid(): t.get_text() for t in ax.texts}
        nonzero = {(m, n) for m in range(d_k) for n in range(d_k) if turning[m, n] != 0}
        assert {f"R-{pairing}-{m}-{n}" for m, n in nonzero} == set(cells)  # zeros left blank
        for m, n in nonzero:
            sign = "c" if m == n else ("−s" if turning[m, n] < 0 else "s")
            assert texts[f"R-{pairing}-{m}-{n}:text"] == sign
            colour = matplotlib.colors.to_hex(cells[f"R-{pairing}-{m}-{n}"].get_facecolor())
            assert colour == colours[f"{pairing}-{m}"]  # the colour of row m's pair, as in the rows
    (blocks,) = [ax for ax in figure.axes if ax.get_label() == "R-interleaved"]
    drawn = {tuple(map(int, p.get_gid().split("-")[2:])) for p in blocks.patches if p.get_gid()}
    assert drawn == {(m, n) for m in range(d_k) for n in range(d_k) if m // 2 == n // 2}  # 2×2 blocks
    plain = qkv.diagrams.pairings(d_k)  # the default: the rows and arrows alone, as before
    assert len(plain.axes) == 1 and plain.get_size_inches()[1] == pytest.approx(1.9)
    with pytest.raises(TypeError, match="matrices must be a bool"):
        qkv.diagrams.pairings(d_k, matrices="yes")


def test_pairings_entries_name_cos_and_sin():
    default = qkv.diagrams.pairings(8, matrices=True)  # c and s, as before
    named = qkv.diagrams.pairings(8, matrices=True, entries=("cos", "sin"))
    for figure, (cos, sin) in ((default, ("c", "s")), (named, ("cos", "sin"))):
        (ax,) = [ax for ax in figure.axes if ax.get_label() == "R-half"]
        texts = {t.get_gid(): t.get_text() for t in ax.texts}
        assert texts["R-half-0-0:text"] == cos  # the diagonal
        assert texts["R-half-0-4:text"] == f"−{sin}" and texts["R-half-4-0:text"] == sin
    assert "c = cos" in default._supxlabel.get_text()
    assert "cos and sin of" in named._supxlabel.get_text() and "s = sin" not in named._supxlabel.get_text()
    with pytest.raises(TypeError, match="entries must be two non-empty strings"):
        qkv.diagrams.pairings(8, matrices=True, entries=("cos",))


def test_value_shift_by_token_names_tokens_not_positions():
    q, k, v, rope = _value_shift_inputs()
    figure = qkv.diagrams.value_shift(q, k, v, rope, 100, shown=[0, 2, 5], by_token=True)
    labels = sorted(t.get_text() for t in figure.axes[1].texts if (t.get_gid() or "").startswith("t-1-"))
    assert labels == ["token 0", "token 2", "token 5"]
    legend = [t.get_text() for t in figure.legends[0].get_texts()]
    assert legend == ["outputs of tokens 0, 2, 5 at positions 0 to 5",
                      "the same tokens' outputs at positions 100 to 105"]  # fmt: skip
    assert all("o_t" not in ax.get_title() for ax in figure.axes)
    default = qkv.diagrams.value_shift(q, k, v, rope, 100, shown=[0, 2, 5])  # unchanged: by t
    assert "$o_t$" in default.axes[0].get_title()
    assert "$o'_t$" in default.axes[1].get_title()  # rotated values: the page's o'_t
    assert "$o'_t$ (right)" in default.legends[0].get_texts()[0].get_text()
    assert "(t = 0, 2, 5 drawn)" in default.legends[0].get_texts()[0].get_text()
    with pytest.raises(TypeError, match="by_token must be a bool"):
        qkv.diagrams.value_shift(q, k, v, rope, 100, by_token=1)


def test_pairings_rows_draw_each_rotation_transposed_for_a_row():
    columns = qkv.diagrams.pairings(8, matrices=True)  # the default: R_t, as before
    rows = qkv.diagrams.pairings(8, matrices=True, rows=True)  # R_t^T: q R_t^T
    for pairing in ("interleaved", "half"):
        (ax,) = [ax for ax in rows.axes if ax.get_label() == f"R-{pairing}"]
        (before,) = [ax for ax in columns.axes if ax.get_label() == f"R-{pairing}"]
        turning = qkv.RotaryEmbedding(8, pairing=pairing, angle_dtype=torch.float64).matrix(1)
        texts = {t.get_gid(): t.get_text() for t in ax.texts}
        for m, n in [(m, n) for m in range(8) for n in range(8) if turning.T[m, n] != 0]:
            sign = "c" if m == n else ("−s" if turning.T[m, n] < 0 else "s")
            assert texts[f"R-{pairing}-{m}-{n}:text"] == sign  # the entry (m, n) of R_t^T
        assert ax.get_title().startswith(r"$R_t^\top$") and before.get_title().startswith("$R_t$,")
        assert (ax.get_ylabel(), ax.get_xlabel()) == ("input dimension", "output dimension")
        assert (before.get_ylabel(), before.get_xlabel()) == ("output dimension", "input dimension")
    (half,) = [ax for ax in rows.axes if ax.get_label() == "R-half"]
    texts = {t.get_gid(): t.get_text() for t in half.texts}
    assert texts["R-half-0-4:text"] == "s" and texts["R-half-4-0:text"] == "−s"  # transposed
    x = torch.randn(8, dtype=torch.float64)  # a row: x R_t^T is the rotation R_t x
    turning = qkv.RotaryEmbedding(8, angle_dtype=torch.float64).matrix(1)
    torch.testing.assert_close(x @ turning.T, turning @ x)
    assert "acts on a row" in rows._supxlabel.get_text()
    assert "acts on a column" in columns._supxlabel.get_text()
    with pytest.raises(TypeError, match="rows must be a bool"):
        qkv.diagrams.pairings(8, matrices=True, rows="yes")


def test_position_flow_rows_labels_rows_and_keeps_the_boxes():
    mha = qkv.MultiHeadAttention(12, 3)  # d_k = 4
    x, rope = torch.randn(5, 12), qkv.RotaryEmbedding(4)
    columns = qkv.diagrams.rotary.position_flow(x, mha, rope)  # the default, as before
    rows = qkv.diagrams.rotary.position_flow(x, mha, rope, rows=True)
    texts = qkv.diagrams.texts_of(rows)
    wanted = {r"$\tilde q_t = q_t R_t^\top$", r"$\tilde k_s = k_s R_s^\top$", r"$R_t^\top$", r"$R_s^\top$",
              r"$\tilde q_t \tilde k_s^\top\,/\sqrt{d_k}$"}  # fmt: skip
    assert wanted <= set(texts)
    assert not {r"$\tilde q_t = R_t q_t$", r"$\tilde q_t^\top \tilde k_s\,/\sqrt{d_k}$"} & set(texts)
    assert r"$\tilde q_t = R_t q_t$" in qkv.diagrams.texts_of(columns)
    boxes = [(p.get_gid(), p.get_x(), p.get_y()) for p in rows.axes[0].patches]
    assert boxes == [(p.get_gid(), p.get_x(), p.get_y()) for p in columns.axes[0].patches]  # same boxes
    with pytest.raises(TypeError, match="rows must be a bool"):
        qkv.diagrams.rotary.position_flow(x, mha, rope, rows=1)
