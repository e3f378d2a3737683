"""A tampered program.json on real Spark (local[2], digits): TorchModel.load, a forward pass
on the driver, transform on the executors and the MLflow pyfunc loader all refuse it before
torch reads it, and what it says runs nowhere."""
from __future__ import annotations

import dataclasses
import json
import os
import pickle

import pytest

mlflow = pytest.importorskip("mlflow")  # pinned in all three tested stacks

from sparkddl import TorchModel, UntrustedArtifactError  # noqa: E402
from tests.integration import test_estimator  # noqa: E402
from tests.integration.digits import digits_df  # noqa: E402


@pytest.fixture
def digits(spark_local):
    df = digits_df(spark_local)
    return df.filter("split != 0"), df.filter("split = 0")


class _Payload:
    """Unpickling this runs a shell command: what a tampered weights.pt would hold."""

    def __init__(self, marker):
        self.marker = str(marker)

    def __reduce__(self):
        return os.system, (f"touch {self.marker}",)


def _with_guard(graph: bytes, guard: str) -> bytes:
    program = json.loads(graph)
    program["guards_code"] = [guard]  # what the adversary wrote: torch compiles it
    return json.dumps(program).encode()


@pytest.mark.timeout(300)
def test_a_tampered_guard_runs_nowhere(digits, mlflow_store, tmp_path):
    train, test = digits
    with mlflow.start_run():  # logs the model too
        model = test_estimator.estimator(tmp_path / "st", epochs=1).fit(train)
    path = tmp_path / "m"
    model.save(str(path))
    marker = tmp_path / "payload-ran"  # local[2]: the executors share this filesystem
    guard = f"__import__('pathlib').Path({str(marker)!r}).touch() is None"
    original = (path / "program.json").read_bytes()
    (path / "program.json").write_bytes(_with_guard(original, guard))
    with pytest.raises(UntrustedArtifactError,
                       match=r"m/program\.json: guards_code\[0\] .*trusted=True"):
        TorchModel.load(str(path))
    # a program that reached the executors unchecked (a model put together by hand) is
    # checked there, and a forward pass on the driver checks it too
    (path / "program.json").write_bytes(original)
    loaded = TorchModel.load(str(path))
    loaded._program = dataclasses.replace(loaded._program,
                                          graph=_with_guard(original, guard))
    with pytest.raises(Exception, match=r"UntrustedArtifactError.*guards_code"):
        loaded.transform(test).select("prediction").collect()
    with pytest.raises(UntrustedArtifactError, match="guards_code"):
        loaded.module()
    # trusted loading reads what the check does not know (here harmless node metadata),
    # on the driver and, shipped as trusted, on the executors
    program = json.loads(original)
    program["graph_module"]["graph"]["nodes"][0]["metadata"]["custom"] = "{}"
    (path / "program.json").write_text(json.dumps(program))
    with pytest.raises(UntrustedArtifactError, match=r"metadata key is \"custom\""):
        TorchModel.load(str(path))
    want = model.transform(test).select("prediction").collect()
    trusted = TorchModel.load(str(path), trusted=True)
    assert trusted.transform(test).select("prediction").collect() == want
    # weights.pt is read as tensors only: a pickle that would run code is refused, naming it
    (path / "program.json").write_bytes(original)
    (path / "weights.pt").write_bytes(pickle.dumps(_Payload(marker)))
    with pytest.raises(UntrustedArtifactError, match=r"m/weights\.pt holds objects other"):
        TorchModel.load(str(path), trusted=True)
    # the logged MLflow model: its pyfunc runs the copy of sparkddl.export.portable it holds
    [logged] = list((tmp_path / "artifacts").glob("**/sparkddl/program.json"))
    logged.write_bytes(_with_guard(logged.read_bytes(), guard))
    with pytest.raises(ValueError, match=r"program\.json: guards_code\[0\]") as info:
        mlflow.pyfunc.load_model(model.mlflow_model_uri)
    assert type(info.value).__module__.startswith("sparkddl_program_check_")
    assert not marker.exists()
