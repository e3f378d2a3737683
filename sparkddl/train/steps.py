"""How a batch becomes a loss: the model's forward pass and the loss, or the user's own step.

One picklable object (:class:`LossFn`) serves the ranks' training loop, the driver's check on
a sample and the driver's validation of snapshots, so all three compute the same thing:

* default: ``output = model(*features)``, ``loss(output, label)``;
* several label columns: the model returns one output per label, the loss (one callable, or
  one per label) is summed over the (output, label) pairs; metrics use the first pair;
* ``sampleWeightCol``: the loss per row, weighted: ``sum(w * loss_i) / sum(w)``;
* ``trainStep``: ``fn(model, batch) -> scalar loss`` replaces all of the above (``batch``
  is the dict column -> tensor); there is no output, so no metrics.
"""
from __future__ import annotations

import copy
from dataclasses import dataclass
from typing import Any, Callable

from sparkddl.errors import ConfigError


@dataclass
class LossFn:
    features: tuple[str, ...]
    labels: tuple[str, ...]
    losses: tuple[Callable[..., Any], ...]  # one per label (the same one repeated)
    weight: str | None = None  # the sample-weight column; losses then reduce per row
    train_step: Callable[..., Any] | None = None

    @property
    def columns(self) -> tuple[str, ...]:
        """Every column a batch must hold for this computation."""
        return self.features + self.labels + ((self.weight,) if self.weight else ())

    def __call__(self, model: Any, batch: dict[str, Any],
                 forward_done: Callable[[], None] | None = None) -> tuple[Any, Any, Any]:
        """(loss, output, target): output and target of the first label, for metrics
        (None with a trainStep). ``forward_done`` is called between the model and the loss
        (the ranks mark their phase with it)."""
        if self.train_step is not None:
            return check_scalar(self.train_step(model, batch), "trainStep"), None, None
        output = model(*[batch[f] for f in self.features])
        if forward_done is not None:
            forward_done()
        outputs = (output,) if len(self.labels) == 1 else _several(output, len(self.labels))
        weight = batch[self.weight] if self.weight else None
        total, targets = None, []
        for out, label, fn in zip(outputs, self.labels, self.losses):
            targets.append(class_target(fn, out, batch[label], label))
            part = fn(out, targets[-1])
            if weight is not None:
                part = _weighted(part, weight)
            total = part if total is None else total + part
        return total, outputs[0], targets[0]


def takes_class_indices(fn: Any) -> bool:
    """Whether ``fn`` is a loss whose target is class indices (CrossEntropyLoss, NLLLoss)."""
    import torch
    fn = getattr(fn, "class_loss", fn)  # a wrapper (Horovod's loss_weights) names its loss
    return isinstance(fn, (torch.nn.CrossEntropyLoss, torch.nn.NLLLoss)) or any(
        fn is f for f in (torch.nn.functional.cross_entropy, torch.nn.functional.nll_loss))


def class_target(fn: Any, output: Any, target: Any, label: str) -> Any:
    """A floating-point label of one class index per row (what libsvm files give) for a loss
    that takes class indices: as int64; a value that is not a whole number is an error."""
    if not getattr(target, "is_floating_point", lambda: False)() or \
            getattr(output, "dim", lambda: 0)() != target.dim() + 1 or not takes_class_indices(fn):
        return target
    if not bool((target == target.round()).all()):
        raise ConfigError(f"label {label!r} holds values that are not whole numbers, but "
                          f"{getattr(fn, '__name__', type(fn).__name__)} takes class indices; "
                          "give it integer class labels (0..classes-1)")
    return target.long()


def _several(output: Any, n: int) -> tuple[Any, ...]:
    if not isinstance(output, (tuple, list)) or len(output) != n:
        got = (f"{type(output).__name__} of {len(output)}" if isinstance(output, (tuple, list))
               else type(output).__name__)
        raise ConfigError(f"with {n} label columns the model must return a tuple of {n} "
                          f"outputs, one per label, got a {got}")
    return tuple(output)


def _weighted(per_row: Any, weight: Any) -> Any:
    rows = weight.shape[0]
    if per_row.dim() == 0 or per_row.shape[0] != rows:
        raise ConfigError(f"sampleWeightCol needs the loss per row, got a loss of shape "
                          f"{list(per_row.shape)} for {rows} rows")
    per_row = per_row.reshape(rows, -1).float().mean(1)
    w = weight.reshape(rows).to(per_row.dtype)
    return (per_row * w).sum() / w.sum().clamp_min(1e-12)


def check_scalar(loss: Any, what: str) -> Any:
    import torch
    if not isinstance(loss, torch.Tensor) or loss.numel() != 1:
        shape = list(loss.shape) if isinstance(loss, torch.Tensor) else type(loss).__name__
        raise ConfigError(f"{what} must return a scalar loss tensor, got {shape}")
    return loss.reshape(())


def per_row(loss: Any) -> Any:
    """A copy of a torch loss module that returns one value per element (reduction='none'),
    for sample weights; other callables cannot be weighted."""
    if getattr(loss, "reduction", None) is None:
        raise ConfigError(
            f"sampleWeightCol needs a torch loss module or a loss name, whose reduction can be "
            f"set to 'none'; {type(loss).__name__} has none. Use trainStep to weight rows "
            "yourself")
    unreduced = copy.deepcopy(loss)
    unreduced.reduction = "none"
    return unreduced


def loss_fn(loss: Any, features: tuple[str, ...], labels: tuple[str, ...],
            weight: str | None, train_step: Callable[..., Any] | None) -> LossFn:
    """The LossFn of a fit from resolved losses (one callable, or a list of one per label)."""
    losses = tuple(loss) if isinstance(loss, (list, tuple)) else (loss,) * len(labels)
    if len(losses) != len(labels):
        raise ConfigError(f"{len(losses)} losses for {len(labels)} label columns; give one "
                          "loss, or one per label")
    if weight is not None and train_step is None:
        losses = tuple(per_row(fn) for fn in losses)
    return LossFn(features, labels, losses, weight, train_step)
