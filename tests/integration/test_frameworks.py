"""The training code users already have, unmodified, under ``sparkddl.TorchDistributor``:
PyTorch Lightning (Databricks' notebook: one device per task, ``num_nodes`` = tasks),
Hugging Face ``transformers.Trainer`` and ``accelerate.Accelerator(cpu=True)``. Each runs
twice in one session, since Spark reuses Python workers and these libraries keep process-wide
state; each run's result must equal the first's (same seed, same data)."""
from __future__ import annotations

import pytest

from sparkddl import TorchDistributor
from tests.integration.frameworks import (
    accelerate_bare,
    accelerate_digits,
    independent_ranks,
    lightning_digits,
    transformers_digits,
)

pytest.importorskip("pytorch_lightning", reason="the frameworks test extra is not installed")
pytest.importorskip("accelerate", reason="the frameworks test extra is not installed")
pytest.importorskip("transformers", reason="the frameworks test extra is not installed")

pytestmark = pytest.mark.timeout(240)


def _synced(result: dict, world: int) -> None:
    assert result["world"] == world
    assert len(set(result["copies"])) == 1, result  # every rank holds the same weights


def test_lightning_one_device_per_task_num_nodes_twice(spark_local):
    first = TorchDistributor(num_processes=2, local_mode=False,
                             use_gpu=False).run(lightning_digits, 1, 2)
    _synced(first, 2)
    assert first["accuracy"] > 0.8
    second = TorchDistributor(num_processes=2, local_mode=False,
                              use_gpu=False).run(lightning_digits, 1, 2)
    assert second["checksum"] == pytest.approx(first["checksum"], rel=1e-6)
    # pyspark's own TorchDistributor (torchrun in each task) trains the same model
    from pyspark.ml.torch.distributor import TorchDistributor as PysparkDistributor
    theirs = PysparkDistributor(num_processes=2, local_mode=False,
                                use_gpu=False).run(lightning_digits, 1, 2)
    assert theirs["checksum"] == pytest.approx(first["checksum"], rel=1e-6)


def test_lightning_devices_in_local_mode(spark_local):
    result = TorchDistributor(num_processes=2, local_mode=True,
                              use_gpu=False).run(lightning_digits, 2, 1)
    _synced(result, 2)


def test_accelerate_cpu_twice(spark_local):
    first = TorchDistributor(num_processes=2, local_mode=False,
                             use_gpu=False).run(accelerate_digits)
    _synced(first, 2)
    second = TorchDistributor(num_processes=2, local_mode=False,
                              use_gpu=False).run(accelerate_digits)
    assert second["checksum"] == pytest.approx(first["checksum"], rel=1e-6)


def test_transformers_trainer_twice(spark_local):
    first = TorchDistributor(num_processes=2, local_mode=False,
                             use_gpu=False).run(transformers_digits)
    _synced(first, 2)
    second = TorchDistributor(num_processes=2, local_mode=False,
                              use_gpu=False).run(transformers_digits)
    assert second["checksum"] == pytest.approx(first["checksum"], rel=1e-6)


def test_unsynced_training_is_named_at_the_driver(spark_local):
    import sparkddl
    with pytest.warns(sparkddl.UnsyncedTrainingWarning, match=r"Accelerator\(cpu=True\)"):
        processes = TorchDistributor(num_processes=2, local_mode=False,
                                     use_gpu=False).run(accelerate_bare)
    assert processes == 1.0  # each rank thought it was alone
    with pytest.warns(sparkddl.UnsyncedTrainingWarning, match="num_nodes=2"):
        TorchDistributor(num_processes=2, local_mode=True, use_gpu=False).run(accelerate_bare)
    # Lightning checks its own world against torchrun's: a Trainer without num_nodes fails
    with pytest.raises(sparkddl.TrainingFailedError, match="does not match the world size"):
        TorchDistributor(num_processes=2, local_mode=False,
                         use_gpu=False).run(lightning_digits, 1, 1, 1)
    with pytest.warns(sparkddl.UnsyncedTrainingWarning, match="no rank called"):
        assert sparkddl.run(independent_ranks, num_workers=2) == 0


def test_synced_runs_do_not_warn(spark_local, recwarn):
    import sparkddl
    TorchDistributor(num_processes=2, local_mode=True, use_gpu=False).run(accelerate_digits, 1)
    sparkddl.run(accelerate_digits, 1, num_workers=2)
    assert not [w for w in recwarn if issubclass(w.category, sparkddl.UnsyncedTrainingWarning)]
