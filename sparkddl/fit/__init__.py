"""The fit's supervisor on the driver (:func:`sparkddl.fit.supervisor.fit`): what a
``TorchEstimator.fit`` or a job does around the barrier stages it launches through
:mod:`sparkddl.launch` — checking the inputs, planning the data, retrying and shrinking
after failures (``restarts``, ``slots``, ``elastic``), evaluating snapshots (``evaluation``,
``cluster_eval``), the user's callbacks, progress lines, the run lock, and the timeout over
the driver's own Spark jobs (``bounded``). :mod:`sparkddl.launch` never imports it."""
