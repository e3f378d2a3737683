"""What a model predicts: the kind of learning problem (named once, used everywhere)."""
from __future__ import annotations

from enum import Enum


class Problem(str, Enum):
    """Found from a sample on the driver; decides the default metrics and what ``transform``
    writes. A string enum (``enum.StrEnum`` is Python 3.11+): saved models and histories
    hold the plain string."""

    MULTICLASS = "multiclass"
    BINARY = "binary"
    REGRESSION = "regression"

    def __str__(self) -> str:
        return self.value

    def __format__(self, spec: str) -> str:
        return format(self.value, spec)

    @property
    def is_classifier(self) -> bool:
        return self is not Problem.REGRESSION
