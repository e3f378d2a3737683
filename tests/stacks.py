"""Which of the two tested stacks this is, for tests that need Petastorm."""
from __future__ import annotations

import pytest

from sparkddl.data import petastorm_source

PETASTORM_PROBLEM = petastorm_source.unavailable_reason()
# Petastorm loads on the pinned stack (constraints.txt), so there these tests always run
needs_petastorm = pytest.mark.skipif(PETASTORM_PROBLEM is not None,
                                     reason=f"no usable Petastorm here: {PETASTORM_PROBLEM}")
