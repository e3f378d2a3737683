"""Metrics: ``fn(output, label) -> scalar tensor``, the mean over the batch; and exact ones.

Epoch values of per-batch metrics are exact means over all rows of all ranks: each batch's
value is weighted by its row count and the sums are allreduced at the end of the epoch.
That is right for accuracy, mse and mae, and wrong for metrics that are not means over rows
(F1, AUROC, precision, R², ...): those are named from torchmetrics (:data:`EXACT`) and
computed by the driver over the whole validation set, its state accumulated batch by batch
(``val_f1``, ``val_auroc``, ...); they have no ``train_`` column.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable, Iterable

from sparkddl.errors import ConfigError

Metric = Callable[[Any, Any], Any]


def predicted_class(output: Any) -> Any:
    """argmax over the last dim for [B, C>1] outputs; ``logit > 0`` for one logit per row."""
    if output.dim() >= 2 and output.shape[-1] > 1:
        return output.argmax(-1)
    return (output.reshape(-1) > 0).long()


def accuracy(output: Any, label: Any) -> Any:
    pred = predicted_class(output)
    target = label.reshape(pred.shape)
    if target.is_floating_point():
        target = (target > 0.5).long()
    # counted in float64: an exact share (90 % is 0.9, not float32's 0.8999999761...)
    return (pred == target).double().mean()


def mse(output: Any, label: Any) -> Any:
    return (output.reshape(label.shape).float() - label.float()).pow(2).mean()


def mae(output: Any, label: Any) -> Any:
    return (output.reshape(label.shape).float() - label.float()).abs().mean()


BUILTIN: dict[str, Metric] = {"accuracy": accuracy, "mse": mse, "mae": mae}
LOWER_IS_BETTER = ("loss", "mse", "mae", "rmse", "mape", "error")


# name -> (torchmetrics class, for classifiers (else regression), takes an average)
EXACT: dict[str, tuple[str, bool, bool]] = {
    "f1": ("F1Score", True, True), "precision": ("Precision", True, True),
    "recall": ("Recall", True, True), "specificity": ("Specificity", True, True),
    "auroc": ("AUROC", True, True), "average_precision": ("AveragePrecision", True, True),
    "mcc": ("MatthewsCorrCoef", True, False), "cohen_kappa": ("CohenKappa", True, False),
    "r2": ("R2Score", False, False), "pearson": ("PearsonCorrCoef", False, False),
    "spearman": ("SpearmanCorrCoef", False, False),
    "explained_variance": ("ExplainedVariance", False, False),
    "mape": ("MeanAbsolutePercentageError", False, False),
}
AVERAGES = ("macro", "micro", "weighted")


@dataclass(frozen=True)
class ExactMetric:
    """A torchmetrics metric over a whole dataset: ``make()`` a fresh one, ``update`` it
    with each batch's ``inputs(output, label)``, ``compute()`` at the end. Multiclass
    metrics average over classes with ``average`` (macro unless the name says otherwise:
    ``f1_micro``, ``auroc_weighted``)."""

    name: str
    cls: str
    kind: str  # multiclass | binary | regression
    num_classes: int
    average: str | None = None

    def make(self) -> Any:
        import torchmetrics
        if self.kind == "regression":
            return getattr(torchmetrics, self.cls)()
        kwargs: dict[str, Any] = {"task": self.kind}
        if self.kind == "multiclass":
            kwargs["num_classes"] = self.num_classes
            if self.average is not None:
                kwargs["average"] = self.average
        return getattr(torchmetrics, self.cls)(**kwargs)

    def inputs(self, output: Any, label: Any) -> tuple[Any, Any]:
        """The model's raw output and the labels as torchmetrics takes them: class scores
        [B, C] and class indices for multiclass, a probability per row and 0/1 for binary,
        values per row for regression."""
        import torch
        output = output.detach().float()
        if self.kind == "multiclass":
            return output.reshape(len(output), -1), label.reshape(-1).long()
        if self.kind == "binary":
            target = label.reshape(-1)
            target = (target > 0.5).long() if target.is_floating_point() else target.long()
            return torch.sigmoid(output.reshape(-1)), target
        return output.reshape(-1), label.reshape(-1).float()


def exact_metric(name: str, kind: str, num_classes: int) -> ExactMetric:
    """``name`` (a key of EXACT, optionally with _macro/_micro/_weighted) for this problem;
    ConfigError when it does not fit the problem or torchmetrics is missing."""
    base, _, average = name.rpartition("_") if name.rpartition("_")[2] in AVERAGES \
        else (name, "", "")
    cls, for_classifiers, averaged = EXACT[base]
    classifier = kind in ("multiclass", "binary")
    if for_classifiers != classifier:
        raise ConfigError(f"metric {name!r} is for "
                          f"{'classifiers' if for_classifiers else 'regression'}"
                          f", but this model is a {kind} model; choose among "
                          f"{', '.join(k for k, v in EXACT.items() if v[1] == classifier)}")
    if not classifier and num_classes > 1:
        raise ConfigError(f"metric {name!r} is computed over one output per row, and this model "
                          f"has {num_classes}; use mse/mae or a callable for several outputs")
    if average and not averaged:
        raise ConfigError(f"metric {base!r} takes no average; use {base!r}")
    try:
        import torchmetrics  # noqa: F401
    except ImportError as exc:
        raise ConfigError(f"metric {name!r} is computed with torchmetrics, which is not "
                          "installed; pip install torchmetrics (sparkddl's metrics extra)") from exc
    return ExactMetric(name, cls, kind, num_classes,
                       (average or "macro") if averaged and kind == "multiclass" else None)


def is_exact_name(name: str) -> bool:
    base = name.rpartition("_")[0] if name.rpartition("_")[2] in AVERAGES else name
    return base in EXACT


def per_batch(metrics: dict[str, Any]) -> dict[str, Metric]:
    """The metrics the ranks compute per batch (every one but the exact ones)."""
    return {k: v for k, v in metrics.items() if not isinstance(v, ExactMetric)}


def resolve_metrics(metrics: Iterable[Any] | dict[str, Metric] | None,
                    kind: str | None = None, num_classes: int = 0) -> dict[str, Any]:
    """Names of built-ins, names of exact metrics (for a problem of ``kind``), callables
    (named after the function), or a name -> callable dict."""
    if metrics is None:
        return {}
    if isinstance(metrics, dict):
        items = list(metrics.items())
    else:
        items = []
        for m in metrics:
            if isinstance(m, str):
                if is_exact_name(m) and kind is not None:
                    items.append((m, exact_metric(m, kind, num_classes)))
                    continue
                if m not in BUILTIN and not is_exact_name(m):
                    raise ConfigError(f"unknown metric {m!r}; choose among "
                                      f"{', '.join([*BUILTIN, *EXACT])} (exact, from "
                                      "torchmetrics) or pass a callable (output, label) -> "
                                      "scalar tensor")
                items.append((m, BUILTIN.get(m, m)))
            elif callable(m):
                items.append((getattr(m, "__name__", type(m).__name__), m))
            else:
                raise ConfigError(f"a metric must be a name or a callable, got {type(m).__name__}")
    for name, fn in items:
        if isinstance(fn, (ExactMetric, str)):  # a str: an exact name checked once the
            continue                            # problem is known
        if not callable(fn) or not isinstance(name, str) or not name.isidentifier():
            raise ConfigError(f"metric {name!r} needs an identifier name and a callable")
    return dict(items)




def best_mode(name: str, mode: str = "auto") -> str:
    """``mode`` when given; for "auto", 'min' for losses and errors (names ending in loss,
    mse, mae, rmse, error), 'max' for everything else (accuracy, ...). Set the mode for
    metrics named otherwise (perplexity, mape, ...)."""
    if mode != "auto":
        return mode
    return "min" if name.endswith(LOWER_IS_BETTER) else "max"
