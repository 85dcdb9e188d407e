"""The shared training loop: the task's loss is the only signal."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from qkv.training import TrainingLog, train


def regression(step):
    g = torch.Generator().manual_seed(step)
    x = torch.randn(32, 3, generator=g)
    return x, x @ torch.tensor([1.0, -2.0, 0.5])


def mse(model, batch):
    x, y = batch
    return (model(x).squeeze(-1) - y).square().mean()


def test_train_reduces_the_loss_and_logs():
    torch.manual_seed(0)
    model = nn.Linear(3, 1)
    seen = []
    log = train(
        model, regression, mse, steps=120, lr=0.05, log_every=40,
        evaluate=lambda m: {"weight_error": float((m.weight - torch.tensor([[1.0, -2.0, 0.5]])).abs().max())},
        after_backward=lambda step, m: seen.append(m.weight.grad is not None),
    )  # fmt: skip
    assert log.steps == [40, 80, 120]
    assert log.loss[-1] < 0.01 * log.loss[0]
    assert log.last("weight_error") < 0.05
    assert all(seen) and len(seen) == 120
    assert log.rows()[0].keys() == {"step", "loss", "weight_error"}
    assert not model.training


def test_stop_ends_early():
    log = train(
        nn.Linear(3, 1), regression, mse, steps=100, log_every=10, stop=lambda log: len(log.steps) == 2
    )
    assert log.steps == [10, 20]


def test_errors():
    with pytest.raises(ValueError, match="steps must be positive"):
        train(nn.Linear(3, 1), regression, mse, steps=0)
    with pytest.raises(KeyError, match="no values logged for 'accuracy'; logged: loss"):
        TrainingLog().last("accuracy")
