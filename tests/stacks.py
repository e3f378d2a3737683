"""What this environment has, for tests that need Petastorm or a CUDA GPU."""
from __future__ import annotations

import pytest

from sparkddl.data import petastorm_source

PETASTORM_PROBLEM = petastorm_source.unavailable_reason()
# Petastorm loads on the pinned stack (constraints.txt), so there these tests always run
needs_petastorm = pytest.mark.skipif(PETASTORM_PROBLEM is not None,
                                     reason=f"no usable Petastorm here: {PETASTORM_PROBLEM}")


def _cuda_problem() -> str | None:
    import torch
    if not torch.backends.cuda.is_built():
        return f"torch {torch.__version__} is a CPU build"
    if not torch.cuda.is_available():
        return "torch has CUDA but sees no GPU (no driver or no device)"
    return None


CUDA_PROBLEM = _cuda_problem()


def needs_gpu(test):
    """Marked ``gpu`` (``-m gpu`` selects these) and skipped, saying why, without CUDA."""
    return pytest.mark.gpu(pytest.mark.skipif(
        CUDA_PROBLEM is not None, reason=f"needs a CUDA GPU: {CUDA_PROBLEM}")(test))
