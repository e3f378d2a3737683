"""Metrics: ``fn(output, label) -> scalar tensor``, the mean over the batch.

Epoch values are exact means over all rows of all ranks: each batch's value is weighted
by its row count and the sums are allreduced at the end of the epoch.
"""
from __future__ import annotations

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
    return (pred == target).float().mean()


def mse(output: Any, label: Any) -> Any:
    return (output.reshape(label.shape).float() - label.float()).pow(2).mean()


def mae(output: Any, label: Any) -> Any:
    return (output.reshape(label.shape).float() - label.float()).abs().mean()


BUILTIN: dict[str, Metric] = {"accuracy": accuracy, "mse": mse, "mae": mae}
LOWER_IS_BETTER = ("loss", "mse", "mae", "rmse", "error")


def resolve_metrics(metrics: Iterable[Any] | dict[str, Metric] | None) -> dict[str, Metric]:
    """Names of built-ins, callables (named after the function), or a name -> callable dict."""
    if metrics is None:
        return {}
    if isinstance(metrics, dict):
        items = list(metrics.items())
    else:
        items = []
        for m in metrics:
            if isinstance(m, str):
                if m not in BUILTIN:
                    raise ConfigError(f"unknown metric {m!r}; choose among {', '.join(BUILTIN)} "
                                      "or pass a callable (output, label) -> scalar tensor")
                items.append((m, BUILTIN[m]))
            elif callable(m):
                items.append((getattr(m, "__name__", type(m).__name__), m))
            else:
                raise ConfigError(f"a metric must be a name or a callable, got {type(m).__name__}")
    for name, fn in items:
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
