"""What a model predicts: the kind of learning problem (named once, used everywhere)."""
from __future__ import annotations

from enum import StrEnum


class Problem(StrEnum):
    """Found from a sample on the driver; decides the default metrics and what ``transform``
    writes. A StrEnum: saved models and histories hold the plain string."""

    MULTICLASS = "multiclass"
    BINARY = "binary"
    REGRESSION = "regression"

    @property
    def is_classifier(self) -> bool:
        return self is not Problem.REGRESSION
