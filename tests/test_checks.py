"""Tests for qkv.checks: every check passes on qkv's attention and catches each classic bug."""

from __future__ import annotations

import math

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from torch import Tensor

import qkv
from qkv.checks import (
    CHECKS,
    AttentionCheckError,
    CheckResult,
    check_causal,
    check_heads_independent,
    check_mask_respected,
    check_matches_reference,
    check_permutation_invariant,
    check_rows_sum_to_one,
    run_checks,
)

# ---------------------------------------------------------------------------
# Multi-head attention written by hand, and eight ways to get it wrong
# ---------------------------------------------------------------------------


class Handmade(qkv.MultiHeadAttention):
    """Correct multi-head attention in the flattened (B·h, T, S) layout, one method per step."""

    def split(self, x: Tensor) -> Tensor:
        batch, length, _ = x.shape
        return x.view(batch, length, self.num_heads, -1).transpose(1, 2)  # (B, h, L, d)

    def scale(self) -> float:
        return 1 / math.sqrt(self.d_k)

    def normalise(self, scores: Tensor) -> Tensor:
        return torch.softmax(scores, dim=-1)  # (B·h, T, S)

    def blocked(self, mask: Tensor, batch: int, T: int, S: int) -> Tensor:
        per_sequence = mask.expand(batch, 1, T, S).reshape(batch, T, S)  # (B, T, S)
        return ~per_sequence.repeat_interleave(self.num_heads, dim=0)  # (B·h, T, S)

    def fill(self, scores: Tensor, blocked: Tensor) -> Tensor:
        return scores.masked_fill(blocked, torch.finfo(scores.dtype).min)  # (B·h, T, S)

    def forward(self, query, key=None, value=None, mask=None, need_weights=False):  # type: ignore[override]
        key = query if key is None else key
        value = key if value is None else value
        batch, T, S, h = query.shape[0], query.shape[1], key.shape[1], self.num_heads
        q = self.split(self.q_proj(query)).reshape(batch * h, T, -1)  # (B·h, T, d_k)
        k = self.split(self.k_proj(key)).reshape(batch * h, S, -1)  # (B·h, S, d_k)
        v = self.split(self.v_proj(value)).reshape(batch * h, S, -1)  # (B·h, S, d_v)
        scores = q @ k.transpose(1, 2) * self.scale()  # (B·h, T, S)
        if mask is not None:
            scores = self.fill(scores, self.blocked(mask, batch, T, S))  # (B·h, T, S)
        weights = self.normalise(scores)  # (B·h, T, S)
        output = self.out_proj(qkv.merge_heads((weights @ v).view(batch, h, T, -1)))  # (B, T, embed_dim)
        return (output, weights.view(batch, h, T, S)) if need_weights else output


class NoTranspose(Handmade):
    def split(self, x: Tensor) -> Tensor:
        batch, length, _ = x.shape
        return x.view(batch, self.num_heads, length, -1)  # wrong: mixes positions into heads


class ScaleByDModel(Handmade):
    def scale(self) -> float:
        return 1 / math.sqrt(self.embed_dim)


class SoftmaxOverQueries(Handmade):
    def normalise(self, scores: Tensor) -> Tensor:
        return torch.softmax(scores, dim=-2)


class InvertedMask(Handmade):
    def blocked(self, mask: Tensor, batch: int, T: int, S: int) -> Tensor:
        return ~super().blocked(mask, batch, T, S)


class MaskWrongHeadOrder(Handmade):
    def blocked(self, mask: Tensor, batch: int, T: int, S: int) -> Tensor:
        per_sequence = mask.expand(batch, 1, T, S).reshape(batch, T, S)  # (B, T, S)
        return ~per_sequence.repeat(self.num_heads, 1, 1)  # wrong order: head by head


class FillWithZero(Handmade):
    def fill(self, scores: Tensor, blocked: Tensor) -> Tensor:
        return scores.masked_fill(blocked, 0.0)  # wrong: 0 is an ordinary score


class MaskAfterSoftmax(Handmade):
    def forward(self, query, key=None, value=None, mask=None, need_weights=False):  # type: ignore[override]
        self.mask_after = mask
        return super().forward(query, key, value, None, need_weights)  # the scores pass unmasked

    def normalise(self, scores: Tensor) -> Tensor:
        weights = torch.softmax(scores, dim=-1)  # (B·h, T, S)
        if self.mask_after is None:
            return weights
        batch, T, S = weights.shape[0] // self.num_heads, weights.shape[1], weights.shape[2]
        return weights.masked_fill(self.blocked(self.mask_after, batch, T, S), 0.0)  # wrong: after


class FloatMask(Handmade):
    def fill(self, scores: Tensor, blocked: Tensor) -> Tensor:
        return scores + (~blocked).float()  # wrong: adds 1 or 0, blocks nothing


# Which checks each bug must fail, and words its message must contain.
BUGS = {
    NoTranspose: (
        {"permutation_invariant", "causal", "heads_independent", "matches_reference"},
        "heads_independent",
        "view(B, h, T, d_k) without the transpose",
    ),
    ScaleByDModel: ({"matches_reference"}, "matches_reference", "sqrt(d_model) instead of sqrt(d_k)"),
    SoftmaxOverQueries: (
        {"rows_sum_to_one", "mask_respected", "causal", "matches_reference"},
        "rows_sum_to_one",
        "over the queries (dim=-2)",
    ),
    InvertedMask: ({"mask_respected", "causal", "matches_reference"}, "mask_respected", "inverted"),
    MaskWrongHeadOrder: ({"mask_respected", "matches_reference"}, "mask_respected", "repeat_interleave"),
    # A leak is not blamed on the head order, though sequence 0 has no padding to tell apart.
    FillWithZero: ({"mask_respected", "causal", "matches_reference"}, "mask_respected", "set to 0"),
    FloatMask: ({"mask_respected", "causal", "matches_reference"}, "mask_respected", "added as floats"),
    MaskAfterSoftmax: (
        {"rows_sum_to_one", "causal", "matches_reference"},
        "rows_sum_to_one",
        "applied after the softmax",
    ),
}


@pytest.fixture
def inputs() -> tuple[qkv.HeadWeights, Tensor, Tensor, Tensor, Tensor]:
    """Non-square cross-attention: 3 heads, T=5 queries, S=7 keys, kdim=10, vdim=7, two lengths."""
    generator = torch.Generator().manual_seed(0)
    weights = qkv.HeadWeights.random(12, 3, kdim=10, vdim=7, generator=generator)
    query = torch.randn(2, 5, 12, generator=generator)
    key = torch.randn(2, 7, 10, generator=generator)
    value = torch.randn(2, 7, 7, generator=generator)
    return weights, query, key, value, qkv.padding_mask([7, 4])


def failed(report: list[CheckResult]) -> set[str]:
    return {r.name for r in report if r.passed is False}


# ---------------------------------------------------------------------------
# Correct attention passes
# ---------------------------------------------------------------------------


@pytest.mark.parametrize("module_class", [qkv.MultiHeadAttention, qkv.PerHeadMultiHeadAttention, Handmade])
def test_correct_modules_pass_every_check(module_class, inputs):
    weights, query, key, value, mask = inputs
    report = run_checks(module_class.from_heads(weights), query, key, value, mask=mask)
    assert [r.name for r in report] == list(CHECKS)
    assert all(r.passed is True for r in report), [r.message for r in report if not r.passed]


@pytest.mark.parametrize("num_kv_heads", [2, 1])
def test_grouped_query_modules_pass_every_check(num_kv_heads, inputs):
    _, query, key, value, mask = inputs
    torch.manual_seed(0)
    module = qkv.MultiHeadAttention(query.shape[-1], 4, kdim=key.shape[-1], vdim=value.shape[-1],
                                    num_kv_heads=num_kv_heads).to(query.dtype)  # fmt: skip
    report = run_checks(module, query, key, value, mask=mask)
    assert all(r.passed is True for r in report), [r.message for r in report if not r.passed]


def test_attention_function_with_a_head_axis_passes_every_check():
    generator = torch.Generator().manual_seed(1)
    q, k, v = (torch.randn(2, 3, n, d, generator=generator) for n, d in ((5, 4), (7, 4), (7, 6)))
    report = run_checks(qkv.attention, q, k, v, mask=qkv.padding_mask([7, 3]))
    assert all(r.passed is True for r in report), [r.message for r in report if not r.passed]


def test_torch_multihead_attention_wrapped_in_a_function_passes(inputs):
    weights, query, key, value, mask = inputs
    torch_mha = qkv.interop.to_torch(weights).eval()

    def attend(q, k, v, mask=None):  # qkv's mask convention -> torch's (True = blocked)
        blocked = None if mask is None else ~mask.expand(q.shape[0], 3, q.shape[1], k.shape[1])
        blocked = None if blocked is None else blocked.reshape(-1, q.shape[1], k.shape[1])
        return torch_mha(q, k, v, attn_mask=blocked, average_attn_weights=False)

    reference = qkv.MultiHeadAttention.from_heads(weights)
    report = run_checks(attend, query, key, value, mask=mask, reference=reference)
    assert failed(report) == set()
    assert {r.name for r in report if r.passed is None} == {"heads_independent"}


def test_module_in_training_mode_is_checked_without_dropout_and_left_training(inputs):
    weights, query, key, value, mask = inputs
    module = qkv.MultiHeadAttention.from_heads(weights, dropout=0.5).train()
    assert failed(run_checks(module, query, key, value, mask=mask)) == set()
    assert module.training


def test_checks_that_do_not_apply_are_reported_as_not_run():
    report = run_checks(qkv.attention, torch.randn(1, 8), torch.randn(1, 8))
    status = {r.name: r.passed for r in report}
    assert status == {
        "rows_sum_to_one": True,
        "mask_respected": None,
        "permutation_invariant": None,
        "causal": None,
        "heads_independent": None,
        "matches_reference": True,
    }
    assert next(r for r in report if r.name == "mask_respected").message == "not run: no mask given"


# ---------------------------------------------------------------------------
# Every bug is caught
# ---------------------------------------------------------------------------


@pytest.mark.parametrize("bug", list(BUGS), ids=lambda bug: bug.__name__)
def test_each_bug_fails_exactly_the_expected_checks(bug, inputs):
    weights, query, key, value, mask = inputs
    expected, name, words = BUGS[bug]
    report = run_checks(bug.from_heads(weights), query, key, value, mask=mask)
    assert failed(report) == expected
    message = next(r.message for r in report if r.name == name)
    assert words in " ".join(message.split())  # the message is wrapped to 88 columns
    assert "expected:" in message and "measured:" in message and "usual cause:" in message
    assert max(len(line) for line in message.splitlines()) <= 88, message


def test_failure_message_is_wrapped_with_continuations_indented():
    # Plain textwrap would break one of these shapes across two lines.
    measured = " ".join(f"value {i} of shape (B, h, T, S)," for i in range(9))
    error = AttentionCheckError("some_check", "a claim", "exactly 0", measured, "a cause")
    lines = str(error).splitlines()
    fields = [line.split(":")[0] for line in lines if not line.startswith("    ")]
    assert fields == ["some_check failed", "  expected", "  measured", "  usual cause"]
    assert all(len(line) <= 88 for line in lines), lines
    wrapped = lines[2 : lines.index("  usual cause: a cause")]
    assert len(wrapped) > 1
    assert all(line.startswith("    ") and line[4] != " " for line in wrapped[1:]), wrapped
    assert " ".join(line.strip() for line in wrapped) == f"measured: {measured}"
    assert str(error).count("(B, h, T, S)") == 9  # no line breaks inside a shape
    assert error.measured == measured  # the attribute keeps the text unwrapped


def test_check_error_is_an_assertion_error_with_its_parts(inputs):
    weights, query, key, value, mask = inputs
    with pytest.raises(AttentionCheckError) as caught:
        check_rows_sum_to_one(SoftmaxOverQueries.from_heads(weights), query, key, value, mask=mask)
    error = caught.value
    assert isinstance(error, AssertionError)
    assert error.check == "rows_sum_to_one"
    assert "row sums range from" in error.measured
    assert str(error).startswith("rows_sum_to_one failed: each query's weights")


def test_scale_diagnosis_names_the_factor(inputs):
    weights, query, key, value, mask = inputs
    with pytest.raises(AttentionCheckError, match=r"multiplied by 0\.577"):
        check_matches_reference(ScaleByDModel.from_heads(weights), query, key, value, mask=mask)


def test_heads_independent_names_the_changed_head(inputs):
    weights, query, key, value, _ = inputs
    with pytest.raises(AttentionCheckError, match=r"changing head \d changed the other heads' weights"):
        check_heads_independent(NoTranspose.from_heads(weights), query, key, value)


def test_causal_check_catches_attention_without_a_mask():
    def ignores_mask(q, k, v, mask=None):
        return qkv.attention(q, k, v)

    with pytest.raises(AttentionCheckError, match="future key"):
        check_causal(ignores_mask, torch.randn(2, 6, 4))


def test_permutation_check_catches_a_position_dependent_score():
    def position_bias(q, k, v, mask=None):
        scores = q @ k.transpose(-2, -1) + torch.arange(k.shape[-2])  # (..., T, S)
        weights = torch.softmax(scores, dim=-1)
        return weights @ v, weights

    with pytest.raises(AttentionCheckError, match="permutation_invariant"):
        check_permutation_invariant(position_bias, torch.randn(3, 4), torch.randn(5, 4))


def test_checks_on_a_bug_free_input_return_what_they_measured(inputs):
    weights, query, key, value, mask = inputs
    module = qkv.MultiHeadAttention.from_heads(weights)
    assert check_rows_sum_to_one(module, query, key, value).startswith("every row sums to 1")
    assert check_mask_respected(module, query, key, value, mask=mask).startswith("blocked keys get")
    assert "each of 3 heads" in check_heads_independent(module, query, key, value)


# ---------------------------------------------------------------------------
# Properties on random shapes
# ---------------------------------------------------------------------------

sizes = st.integers(min_value=1, max_value=5)


@settings(max_examples=20, deadline=None)
@given(
    lead=st.lists(sizes, max_size=2),
    T=sizes,
    S=st.integers(2, 6),
    d_k=sizes,
    d_v=sizes,
    seed=st.integers(0, 99),
)
def test_attention_rows_sum_to_one_and_ignore_key_order(lead, T, S, d_k, d_v, seed):
    generator = torch.Generator().manual_seed(seed)
    q = torch.randn(*lead, T, d_k, generator=generator)
    k = torch.randn(*lead, S, d_k, generator=generator)
    v = torch.randn(*lead, S, d_v, generator=generator)
    check_rows_sum_to_one(qkv.attention, q, k, v)
    check_permutation_invariant(qkv.attention, q, k, v, seed=seed)


@settings(max_examples=10, deadline=None)
@given(
    heads=st.integers(1, 3),
    d_k=st.integers(1, 3),
    T=st.integers(2, 5),
    extra=st.integers(0, 3),
    batch=st.integers(1, 2),
    seed=st.integers(0, 99),
)
def test_multi_head_attention_passes_on_random_shapes(heads, d_k, T, extra, batch, seed):
    generator = torch.Generator().manual_seed(seed)
    weights = qkv.HeadWeights.random(heads * d_k + 1, heads, d_k=d_k, kdim=5, vdim=3, generator=generator)
    S = T + extra
    query = torch.randn(batch, T, heads * d_k + 1, generator=generator)
    key, value = torch.randn(batch, S, 5, generator=generator), torch.randn(batch, S, 3, generator=generator)
    mask = qkv.padding_mask(torch.randint(1, S + 1, (batch,), generator=generator), S)
    report = run_checks(qkv.MultiHeadAttention.from_heads(weights), query, key, value, mask=mask, seed=seed)
    assert failed(report) == set(), [r.message for r in report if r.passed is False]


@settings(max_examples=15, deadline=None)
@given(T=st.integers(2, 5), S=st.integers(2, 6), seed=st.integers(0, 99))
def test_softmax_over_queries_never_sums_rows_to_one(T, S, seed):
    generator = torch.Generator().manual_seed(seed)
    weights = qkv.HeadWeights.random(6, 2, generator=generator)
    query, key = torch.randn(1, T, 6, generator=generator), torch.randn(1, S, 6, generator=generator)
    with pytest.raises(AttentionCheckError, match="rows_sum_to_one"):
        check_rows_sum_to_one(SoftmaxOverQueries.from_heads(weights), query, key)


# ---------------------------------------------------------------------------
# Arguments are checked at the boundary
# ---------------------------------------------------------------------------


def test_attend_must_be_callable():
    with pytest.raises(TypeError, match="attend must be an attention function or module"):
        run_checks("attention", torch.randn(3, 4))


def test_mask_must_be_boolean():
    with pytest.raises(TypeError, match="mask must be boolean"):
        run_checks(qkv.attention, torch.randn(3, 4), mask=torch.ones(3, 3))


def test_mask_must_fit_the_scores():
    with pytest.raises(ValueError, match="does not broadcast"):
        check_rows_sum_to_one(
            qkv.attention, torch.randn(3, 4), torch.randn(5, 4), mask=torch.ones(3, 4).bool()
        )


def test_value_must_pair_with_key():
    with pytest.raises(ValueError, match="value has 4 positions, but the key's length S is 5"):
        run_checks(qkv.attention, torch.randn(3, 4), torch.randn(5, 4), torch.randn(4, 4))


def test_attend_must_return_output_and_weights():
    with pytest.raises(TypeError, match=r"attend must return \(output, weights\)"):
        run_checks(qkv.fused_attention, torch.randn(3, 4))


def test_returned_weights_must_have_shape_t_by_s():
    def transposed(q, k, v, mask=None):
        output, weights = qkv.attention(q, k, v)
        return output, weights.transpose(-2, -1)

    with pytest.raises(ValueError, match=r"must have shape \(\.\.\., T, S\) = \(\.\.\., 3, 5\)"):
        check_rows_sum_to_one(transposed, torch.randn(3, 4), torch.randn(5, 4))


def test_causal_needs_as_many_keys_as_queries():
    with pytest.raises(ValueError, match="T=4, S=3"):
        check_causal(qkv.attention, torch.randn(4, 2), torch.randn(3, 2))


def test_mask_respected_needs_a_mask():
    with pytest.raises(ValueError, match="needs a mask"):
        check_mask_respected(qkv.attention, torch.randn(3, 4), mask=None)


def test_heads_independent_needs_heads():
    with pytest.raises(ValueError, match="at least 2 heads"):
        check_heads_independent(qkv.attention, torch.randn(3, 4))


def test_tolerances_must_be_non_negative():
    with pytest.raises(ValueError, match="atol must be a non-negative number"):
        run_checks(qkv.attention, torch.randn(3, 4), atol=-1.0)


def test_module_without_to_heads_needs_a_reference():
    class Plain(torch.nn.Module):
        def forward(self, q, k, v, mask=None):
            return qkv.attention(q, k, v, mask)

    report = run_checks(Plain(), torch.randn(3, 4), torch.randn(5, 4))
    assert next(r for r in report if r.name == "matches_reference").passed is None
    with pytest.raises(ValueError, match="pass reference="):
        check_matches_reference(Plain(), torch.randn(3, 4))
