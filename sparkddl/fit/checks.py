"""Driver-side checks of the model, loss and labels on a real sample of the training data,
so that shape and dtype mistakes fail here with an explanation instead of on every rank."""
from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Any

from sparkddl.errors import ConfigError, DataError
from sparkddl.export.program import InputSpec
from sparkddl.problems import Problem
from sparkddl.train.steps import LossFn, takes_class_indices

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class ProblemInfo:
    """What the model predicts: ``multiclass`` (output [B, C], integer labels), ``binary``
    (one logit per row with BCEWithLogitsLoss) or ``regression`` (anything else); and what
    it takes (one input per feature column, as the sample fed it)."""

    kind: Problem
    output_width: int
    inputs: tuple[InputSpec, ...] = ()
    note: str = ""  # what the user should know about how the problem was inferred


def check_sample(module: Any, step: LossFn, sample: dict[str, Any],
                 label_range: tuple[int | None, int | None] = (None, None)) -> ProblemInfo:
    """Run the model and the loss (or the trainStep) on ``sample``; ``label_range`` is the
    (min, max) of the first label over the whole training data, if integral."""
    import torch

    batch = {c: torch.from_numpy(sample[c].copy()) for c in step.columns}
    inputs = [batch[f] for f in step.features]
    label = step.labels[0]
    target = batch[label]
    shapes = ", ".join(f"{f}: {list(t.shape)} {t.dtype}" for f, t in zip(step.features, inputs))
    if step.train_step is not None:
        return _check_train_step(module, step, batch, shapes)
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
    several = len(step.labels) > 1
    first = output[0] if several and isinstance(output, (tuple, list)) and output else output
    if not isinstance(first, torch.Tensor):
        raise ConfigError(f"the model returned a {type(output).__name__}; it must return one "
                          "tensor of predictions" + (", or a tuple of them, one per label"
                                                     if several else ""))
    task = _task(first, target, step.losses[0], label)
    _check_label_range(task, label, *label_range)
    try:
        with torch.no_grad():
            loss = step(_Fixed(output), batch)[0]
    except ConfigError:
        raise
    except Exception as exc:
        hint = ""
        if isinstance(step.losses[0], torch.nn.CrossEntropyLoss) and target.is_floating_point():
            hint = (" CrossEntropyLoss needs integer class labels: make the label column an "
                    "integer type")
        raise ConfigError(
            f"the loss failed on the model's output {list(first.shape)} {first.dtype} and the "
            f"label {label!r} {list(target.shape)} {target.dtype}: {type(exc).__name__}: "
            f"{exc}.{hint}") from exc
    if not isinstance(loss, torch.Tensor) or loss.numel() != 1:
        raise ConfigError("the loss must return a single scalar tensor "
                          f"(got {type(loss).__name__} {getattr(loss, 'shape', '')})")
    return task


class _Fixed:
    """A stand-in model returning an output already computed (the loss is checked apart)."""

    def __init__(self, output: Any):
        self.output = output

    def __call__(self, *inputs: Any) -> Any:
        return self.output


def _check_train_step(module: Any, step: LossFn, batch: dict[str, Any],
                      shapes: str) -> ProblemInfo:
    import torch
    try:
        step(module, batch)
    except ConfigError:
        raise
    except Exception as exc:
        raise ConfigError(f"the trainStep failed on a sample of the training data ({shapes}): "
                          f"{type(exc).__name__}: {exc}") from exc
    finally:
        module.zero_grad(set_to_none=True)
    try:  # what transform will predict, if the model takes the features alone
        with torch.no_grad():
            output = module(*[batch[f] for f in step.features])
    except Exception:  # noqa: BLE001 - a model with other inputs: transform's own concern
        return ProblemInfo(Problem.REGRESSION, 0)
    if not isinstance(output, torch.Tensor):
        return ProblemInfo(Problem.REGRESSION, 0)
    return _task(output, batch[step.labels[0]], step.losses[0], step.labels[0])


def check_finite(sample: dict[str, Any], features: tuple[str, ...], policy: str) -> None:
    """NaN/inf in the sampled feature values: an error with onNonFiniteLoss='raise' (every
    step touching such a row would fail), a warning with 'skip_batch'."""
    import numpy as np
    found = []
    for f in features:
        values = np.asarray(sample[f])
        if values.dtype.kind == "f":
            rows = ~np.isfinite(values.reshape(len(values), -1)).all(axis=1)
            if rows.any():
                found.append(f"{f!r} ({int(rows.sum())} of {len(values)} sampled rows)")
    if not found:
        return
    what = (f"feature column(s) {', '.join(found)} hold NaN or infinite values; clean them "
            "(e.g. DataFrame.na.drop / na.fill, or filter with isnan)")
    if policy == "raise":
        raise DataError(f"{what}, or set onNonFiniteLoss='skip_batch' to skip the batches "
                        "whose loss is not finite")
    log.warning("%s; batches whose loss is not finite will be skipped", what)


def _task(output: Any, target: Any, loss_fn: Any, label: str) -> ProblemInfo:
    import torch
    width = output.shape[-1] if output.dim() >= 2 else 1
    per_row = target.dim() == output.dim() - 1  # one value per row, several outputs
    if width > 1 and (not target.is_floating_point() or per_row and
                      takes_class_indices(loss_fn)):  # float class indices: cast to int64
        return ProblemInfo(Problem.MULTICLASS, width)
    if width == 1 and isinstance(loss_fn, torch.nn.BCEWithLogitsLoss):
        return ProblemInfo(Problem.BINARY, 1)
    note = ""
    if width > 1 and per_row:
        note = (f"label {label!r} is floating point with {width} model outputs: this fit is "
                f"a regression of {width} values (transform writes them as the prediction), "
                f"not a classifier. For a classifier, cast the label to an integer type "
                f"(df.withColumn({label!r}, df[{label!r}].cast('long'))) or pass "
                "CrossEntropyLoss/NLLLoss as the loss")
        log.warning(note)
    return ProblemInfo(Problem.REGRESSION, width, note=note)


def _check_label_range(task: ProblemInfo, label: str, low: int | None, high: int | None) -> None:
    if task.kind is Problem.MULTICLASS and low is not None and high is not None and \
            (low < 0 or high >= task.output_width):
        raise ConfigError(f"label {label!r} ranges over [{low}, {high}] but the model outputs "
                          f"{task.output_width} classes; labels must be 0..{task.output_width - 1}")
