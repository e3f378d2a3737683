"""The barrier stage runner, shared by ``sparkddl.run``, ``TorchDistributor``,
``HorovodRunner`` and fits: preflight checks, the stage's submission and monitoring, the
ranks' failures told to the driver, local-mode processes. The fit's supervisor that uses it
is :mod:`sparkddl.fit`."""
from sparkddl.launch.runner import run

__all__ = ["run"]
