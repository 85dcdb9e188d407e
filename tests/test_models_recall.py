"""The training chapter's small models: shapes, masks, tying, and that they learn."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from qkv.data import AssociativeRecall, PreviousTokenTask
from qkv.models import PreviousTokenModel, RecallModel
from qkv.training import train


def test_recall_model_shapes_and_mask():
    torch.manual_seed(0)
    task = AssociativeRecall(num_pairs=5, num_names=8, num_numbers=6)
    model = RecallModel(8, 6, embed_dim=16, num_heads=2)
    batch = task.sample(3, generator=torch.Generator().manual_seed(0))
    logits, weights = model(batch.names, batch.numbers, need_weights=True)
    assert logits.shape == (3, 6)
    assert weights.shape == (3, 2, 6, 6)
    assert weights.diagonal(dim1=-2, dim2=-1).abs().max() == 0  # no position attends to itself
    torch.testing.assert_close(weights.sum(-1), torch.ones(3, 2, 6))
    torch.testing.assert_close(model(batch.names, batch.numbers), logits)


def test_recall_model_learns_to_attend_to_the_match():
    torch.manual_seed(0)
    task = AssociativeRecall(num_pairs=4, num_names=8, num_numbers=8)
    model = RecallModel(8, 8, embed_dim=16)
    generator = torch.Generator().manual_seed(1)
    held = task.sample(256, generator=torch.Generator().manual_seed(2))

    def loss(model, batch):
        return F.cross_entropy(model(batch.names, batch.numbers), batch.target)

    def evaluate(model):
        logits, weights = model(held.names, held.numbers, need_weights=True)
        on_match = weights[:, 0, -1].gather(1, held.position[:, None]).mean()
        return {"accuracy": (logits.argmax(-1) == held.target).float().mean(), "on_match": on_match}

    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # a tiny model: extra threads only wait on each other
    try:
        log = train(model, lambda step: task.sample(32, generator=generator), loss, steps=100, lr=1e-2,
                    log_every=100, evaluate=evaluate)  # fmt: skip
    finally:
        torch.set_num_threads(threads)
    assert log.last("accuracy") > 0.95
    assert log.last("on_match") > 0.8


def test_previous_token_model_tying_shares_one_parameter():
    torch.manual_seed(0)
    tied = PreviousTokenModel(5, 7, embed_dim=8, tie_query_key=True)
    untied = PreviousTokenModel(5, 7, embed_dim=8)
    assert tied.attention.k_proj.weight is tied.attention.q_proj.weight
    assert len(list(tied.parameters())) == len(list(untied.parameters())) - 1
    tokens = PreviousTokenTask(length=7, vocab_size=5).sample(2).tokens
    logits, weights = tied(tokens, need_weights=True)
    assert logits.shape == (2, 7, 5) and weights.shape == (2, 1, 7, 7)
    assert weights.triu(1).abs().max() == 0  # causal
    x = tied.token_embedding(tokens) + tied.position_embedding.weight  # (B, T, d)
    q = tied.attention.q_proj(x)
    k = tied.attention.k_proj(x)
    scores = q @ k.transpose(-2, -1)
    torch.testing.assert_close(scores, scores.transpose(-2, -1))  # W^Q = W^K: symmetric scores


def test_model_errors():
    model = PreviousTokenModel(5, 4)
    with pytest.raises(ValueError, match="tokens has 6 positions, but the model has 4 position embeddings"):
        model(torch.zeros(1, 6, dtype=torch.long))
    with pytest.raises(ValueError, match=r"names and numbers must have one shape \(B, L\)"):
        RecallModel(4, 4)(torch.zeros(1, 3, dtype=torch.long), torch.zeros(1, 2, dtype=torch.long))
    with pytest.raises(TypeError, match="num_names must be an int"):
        RecallModel(4.0, 4)
    with pytest.raises(TypeError, match="unexpected keyword argument 'num_values'"):
        RecallModel(num_names=4, num_values=4)  # type: ignore[call-arg]


def test_recall_model_mask_self_false_lets_positions_attend_to_themselves():
    task = AssociativeRecall(num_pairs=5, num_names=8, num_numbers=6)
    batch = task.sample(3, generator=torch.Generator().manual_seed(0))
    torch.manual_seed(0)
    masked = RecallModel(8, 6, embed_dim=16)
    torch.manual_seed(0)
    unmasked = RecallModel(8, 6, embed_dim=16, mask_self=False)
    assert masked.mask_self and not unmasked.mask_self
    _, weights = unmasked(batch.names, batch.numbers, need_weights=True)
    assert weights.diagonal(dim1=-2, dim2=-1).min() > 0  # each position on itself
    torch.testing.assert_close(weights.sum(-1), torch.ones(3, 1, 6))
    with torch.no_grad():
        x = unmasked.name_embedding(batch.names) + unmasked.number_embedding(batch.numbers)
        expected = unmasked.readout(unmasked.attention(x)[0][:, -1])  # no mask at all
    torch.testing.assert_close(unmasked(batch.names, batch.numbers), expected)
