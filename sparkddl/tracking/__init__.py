"""MLflow, from the driver only: the ranks need no MLflow credentials.

``TorchEstimator(mlflow=...)``: None (the default) logs when MLflow is installed and a run is
active on the calling thread (``with mlflow.start_run():`` in a notebook); True also creates
a run when none is (and ends it); False turns logging off. A run that a fit has logged to
already gets each further fit as a child run (a loop over settings). What is logged:

- every Param of the estimator, as MLflow params;
- every history row as metrics with ``step=epoch``, as each snapshot is evaluated, so the
  MLflow UI draws the curves while training runs;
- each restart as a tag (``sparkddl.restart.<attempt>``), and the outcome as tags;
- at the end, the model (:func:`log_model`): an MLflow model whose ``pytorch`` flavor is the
  torch.export program (``mlflow.pytorch.load_model`` gives a module, with no unpickling, but
  through ``torch.export.load``, which runs what a tampered program's guards say) and whose
  ``python_function`` flavor runs that program with :mod:`sparkddl.export.portable` (which checks it
  first), so ``mlflow.pyfunc.load_model(uri).predict(df)`` returns what
  ``TorchModel.transform`` predicts, where only mlflow and torch are installed.

MLflow calls made while training run on a thread of their own, so a slow tracking server
never holds up training (the end of the fit waits for what is queued, bounded). The first
failure (an unreachable server, a deleted run) turns logging off for the rest of the fit with
one warning; training goes on.
"""
from __future__ import annotations

from sparkddl.tracking.flavor import MODEL_NAME, input_example, log_model, save_model, signature_for
from sparkddl.tracking.runs import MlflowTracking, check_setting, param_text, unreachable

__all__ = ["MODEL_NAME", "MlflowTracking", "check_setting", "input_example", "log_model",
           "param_text", "save_model", "signature_for", "unreachable"]
