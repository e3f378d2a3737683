"""Driver-side checks of the model, loss and labels on a real sample of the training data,
so that shape and dtype mistakes fail here with an explanation instead of on every rank."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable

from sparkddl.errors import ConfigError
from sparkddl.problems import Problem


@dataclass(frozen=True)
class ProblemInfo:
    """What the model predicts: ``multiclass`` (output [B, C], integer labels), ``binary``
    (one logit per row with BCEWithLogitsLoss) or ``regression`` (anything else)."""

    kind: Problem
    output_width: int


def check_sample(module: Any, loss_fn: Callable[..., Any], sample: dict[str, Any],
                 features: tuple[str, ...], label: str,
                 label_range: tuple[int | None, int | None] = (None, None)) -> ProblemInfo:
    """Run the model and the loss on ``sample``; ``label_range`` is the (min, max) of an
    integral label over the whole training data."""
    import torch

    inputs = [torch.from_numpy(sample[f].copy()) for f in features]
    target = torch.from_numpy(sample[label].copy())
    shapes = ", ".join(f"{f}: {list(t.shape)} {t.dtype}" for f, t in zip(features, inputs))
    module.eval()
    try:
        with torch.no_grad():
            output = module(*inputs)
    except Exception as exc:
        raise ConfigError(
            f"the model failed on a sample of the training data ({shapes}): "
            f"{type(exc).__name__}: {exc}. Check that the model's input size matches the "
            "feature column(s), or declare feature shapes (featureShapes)") from exc
    finally:
        module.train()
    if not isinstance(output, torch.Tensor):
        raise ConfigError(f"the model returned a {type(output).__name__}; it must return one "
                          "tensor of predictions")
    task = _task(output, target, loss_fn)
    _check_label_range(task, label, *label_range)
    try:
        loss = loss_fn(output, target)
    except Exception as exc:
        hint = ""
        if isinstance(loss_fn, torch.nn.CrossEntropyLoss) and target.is_floating_point():
            hint = (" CrossEntropyLoss needs integer class labels: make the label column an "
                    "integer type")
        raise ConfigError(
            f"the loss failed on the model's output {list(output.shape)} {output.dtype} and the "
            f"label {label!r} {list(target.shape)} {target.dtype}: {type(exc).__name__}: "
            f"{exc}.{hint}") from exc
    if not isinstance(loss, torch.Tensor) or loss.numel() != 1:
        raise ConfigError("the loss must return a single scalar tensor "
                          f"(got {type(loss).__name__} {getattr(loss, 'shape', '')})")
    return task


def _task(output: Any, target: Any, loss_fn: Any) -> ProblemInfo:
    import torch
    width = output.shape[-1] if output.dim() >= 2 else 1
    if not target.is_floating_point() and width > 1:
        return ProblemInfo(Problem.MULTICLASS, width)
    if width == 1 and isinstance(loss_fn, torch.nn.BCEWithLogitsLoss):
        return ProblemInfo(Problem.BINARY, 1)
    return ProblemInfo(Problem.REGRESSION, width)


def _check_label_range(task: ProblemInfo, label: str, low: int | None, high: int | None) -> None:
    if task.kind is Problem.MULTICLASS and low is not None and high is not None and \
            (low < 0 or high >= task.output_width):
        raise ConfigError(f"label {label!r} ranges over [{low}, {high}] but the model outputs "
                          f"{task.output_width} classes; labels must be 0..{task.output_width - 1}")
