"""Training: one small, generic loop that the book's training chapters share.

The loop knows nothing about attention: the task's loss is the only signal,
and one ``loss.backward()`` reaches every parameter, W^Q, W^K, W^V and W^O
included. It prints nothing; it returns a :class:`TrainingLog` for the
chapter to show.

See also
--------
The chapters :doc:`training` (book/training.ipynb) and :doc:`cross_attention/abacus`
(book/cross_attention/abacus.ipynb).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

import torch
from torch import Tensor, nn

from qkv._validation import require_positive_int

__all__ = ["TrainingLog", "train"]

Batch = Sequence[Tensor]


@dataclass
class TrainingLog:
    """What happened during :func:`train`.

    Attributes
    ----------
    steps : list of int
        The steps at which the log was written (every ``log_every`` steps, and the last).
    loss : list of float
        The training loss at those steps (averaged since the previous entry).
    metrics : dict of str to list of float
        What ``evaluate`` returned at those steps, one list per name.
    """

    steps: list[int] = field(default_factory=list)
    loss: list[float] = field(default_factory=list)
    metrics: dict[str, list[float]] = field(default_factory=dict)

    def last(self, name: str = "loss") -> float:
        """The latest value of the loss or of a metric."""
        values = self.loss if name == "loss" else self.metrics.get(name)
        if not values:
            known = ", ".join(["loss", *self.metrics])
            raise KeyError(f"no values logged for {name!r}; logged: {known}")
        return values[-1]

    def rows(self) -> list[dict[str, float]]:
        """One dict per logged step, e.g. for a table."""
        return [
            {"step": step, "loss": loss, **{k: v[i] for k, v in self.metrics.items()}}
            for i, (step, loss) in enumerate(zip(self.steps, self.loss, strict=True))
        ]


def train(
    model: nn.Module,
    batch: Callable[[int], Batch],
    loss: Callable[[nn.Module, Batch], Tensor],
    *,
    steps: int,
    lr: float = 3e-3,
    weight_decay: float = 0.0,
    warmup: int = 0,
    cosine: bool = True,
    clip: float | None = 1.0,
    log_every: int = 50,
    evaluate: Callable[[nn.Module], dict[str, float]] | None = None,
    after_backward: Callable[[int, nn.Module], None] | None = None,
    stop: Callable[[TrainingLog], bool] | None = None,
) -> TrainingLog:
    """Train ``model`` with AdamW on the loss of a task; return the log.

    Parameters
    ----------
    model : nn.Module
        Put in training mode while training, evaluation mode afterwards.
    batch : callable, step -> sequence of Tensor
        Makes the batch for a step (synthetic data is made on the fly).
    loss : callable, (model, batch) -> scalar Tensor
        The task's loss. Nothing else supervises the model.
    steps : int
        Number of optimizer steps.
    lr, weight_decay : float
        AdamW's learning rate and weight decay.
    warmup : int
        Steps of linear learning-rate warm-up.
    cosine : bool
        Decay the learning rate to zero along a cosine after warm-up.
    clip : float or None
        Clip the gradients' global norm.
    log_every : int
        Write the log every this many steps (and at the last step).
    evaluate : callable, model -> dict of str to float, optional
        Held-out metrics, computed in evaluation mode without gradients when the log is written.
    after_backward : callable, (step, model) -> None, optional
        Called after ``loss.backward()``, while gradients are present (e.g.
        to record their norms), before the optimizer step.
    stop : callable, log -> bool, optional
        Checked after each log entry; training ends early when it returns True.

    Returns
    -------
    TrainingLog

    See Also
    --------
    :doc:`training/recall` : models trained with it, without attention labels.
    :doc:`cross_attention/abacus` : a tiny encoder-decoder trained with it.

    Examples
    --------
    >>> import torch, qkv
    >>> model = torch.nn.Linear(3, 1)
    >>> def batch(step):
    ...     x = torch.randn(32, 3, generator=torch.Generator().manual_seed(step))
    ...     return x, x.sum(-1, keepdim=True)
    >>> def loss(model, batch):
    ...     x, y = batch
    ...     return (model(x) - y).square().mean()
    >>> log = qkv.training.train(model, batch, loss, steps=200, lr=0.05)
    >>> log.last("loss") < 0.01
    True
    """
    steps = require_positive_int("steps", steps)
    log_every = require_positive_int("log_every", log_every)
    parameters = [p for p in model.parameters() if p.requires_grad]
    optimizer = torch.optim.AdamW(parameters, lr=lr, weight_decay=weight_decay)

    def factor(step: int) -> float:
        if step < warmup:
            return (step + 1) / warmup
        if not cosine:
            return 1.0
        progress = (step - warmup) / max(1, steps - warmup)
        return 0.5 * (1.0 + math.cos(math.pi * progress))

    schedule = torch.optim.lr_scheduler.LambdaLR(optimizer, factor)
    log = TrainingLog()
    running, count = 0.0, 0
    for step in range(steps):
        model.train()
        value = loss(model, batch(step))
        optimizer.zero_grad(set_to_none=True)
        value.backward()
        if after_backward is not None:
            after_backward(step, model)
        if clip is not None:
            nn.utils.clip_grad_norm_(parameters, clip)
        optimizer.step()
        schedule.step()
        running, count = running + float(value.detach()), count + 1
        if (step + 1) % log_every == 0 or step + 1 == steps:
            log.steps.append(step + 1)
            log.loss.append(running / count)
            running, count = 0.0, 0
            if evaluate is not None:
                model.eval()
                with torch.no_grad():
                    for name, metric in evaluate(model).items():
                        log.metrics.setdefault(name, []).append(float(metric))
            if stop is not None and stop(log):
                break
    model.eval()
    return log
