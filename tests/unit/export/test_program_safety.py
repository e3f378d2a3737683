"""Programs sparkddl writes load from their files (checked) and predict as the module, for
every kind of model; inputs of other shapes are refused; tensor files are checked; trusted
loading reads a program as it is; the MLflow pyfunc loader refuses a tampered program with a
ValueError. And the payloads the checks stop are live: torch itself runs them."""
from __future__ import annotations

import dataclasses
import io
import json
import os
from typing import Any

import numpy as np
import pandas as pd
import pytest
import torch

from sparkddl.errors import SparkDDLError, UntrustedArtifactError
from sparkddl.export import portable
from sparkddl.export import program as exported
from sparkddl.export.program_check import UntrustedProgramError
from sparkddl.store import Store
from tests.unit.export.program_models import (
    KINDS,
    Spec,
    code,
    exported_model,
    first_input,
    graph_of,
    inputs_for,
    load_as_read,
    nn,
    put,
    tampered,
)


def test_the_payloads_run_when_torch_reads_the_file_as_it_is(tmp_path):
    """The payloads test_program_check.py plants are live: torch itself (a trusted read)
    evaluates them."""
    marker = tmp_path / "payload-ran"
    graph = tampered("mlp", lambda d: put(first_input(d)["sizes"][0]["as_expr"],
                                          "expr_str", f"{code(marker)} or s0"))
    try:  # torch 2.13 then fails on what the payload returned; 2.7 goes on
        load_as_read("mlp", graph, trusted=True)
    except Exception:  # noqa: BLE001 - whatever torch makes of it, the payload ran first
        pass
    assert marker.exists()  # sympify ran it
    marker.unlink()
    module, program = exported_model("mlp")
    if "guards_code" not in json.loads(program.graph):
        pytest.skip(f"torch {torch.__version__} writes no guards_code")
    ep = portable.deserialize_program(
        tampered("mlp", lambda d: put(d, "guards_code", [f"{code(marker)} is None"])),
        program.constants, program.example_inputs, program.parameters, module.state_dict(),
        trusted=True)
    ep.module()(torch.zeros(2, 6))  # torch's default: guards_code runs as a guard function
    assert marker.exists()


# ---- what sparkddl writes loads, predicts as the module, and checks its inputs ----

@pytest.mark.parametrize("kind", sorted(KINDS))
def test_every_kind_of_model_loads_from_its_files_and_predicts_as_the_module(kind, tmp_path):
    module, program = exported_model(kind)
    assert program.trusted  # made here: shipping it to executors needs no check
    store = Store.from_uri(str(tmp_path))
    exported.write(store, program)
    read = exported.read(store, program.parameters)
    assert read is not None and not read.trusted and read.where.endswith(exported.GRAPH_FILE)
    loaded = exported.load(read, module.state_dict())
    with torch.no_grad():
        for rows in (1, 5):
            x = inputs_for(kind, rows)
            assert torch.allclose(loaded(*x), module(*x), atol=1e-5)
    assert not any(type(m).__name__ == "GuardsFn" for m in loaded.modules())


def test_inputs_of_another_shape_are_refused_clearly():
    loaded = load_as_read("mlp")
    with pytest.raises(RuntimeError, match=r"args\[0\]\.shape\[1\].* 6, but got 7"):
        loaded(torch.randn(3, 7))
    with pytest.raises(RuntimeError, match="number of dimensions"):
        loaded(torch.randn(3, 6, 1))
    two = load_as_read("two_inputs")  # torch >= 2.9 wrote an equal-batch guard: dropped, still held
    with pytest.raises(RuntimeError, match=r"args\[1\]\.shape\[0\].* 3, but got 4"):
        two(torch.randn(3, 1, 8, 8), torch.randn(4, 3))


def test_tensor_files_must_hold_what_sparkddl_writes():
    module, program = exported_model("mlp")

    def saved(value):
        buf = io.BytesIO()
        torch.save(value, buf)
        return buf.getvalue()
    refused = [dataclasses.replace(program, constants=saved({"w') or ('": torch.zeros(1)})),
               dataclasses.replace(program, constants=saved({"w": "text"})),
               dataclasses.replace(program, example_inputs=saved(((), {"x": torch.zeros(1)}))),
               dataclasses.replace(program, example_inputs=saved(torch.zeros(1)))]
    for bad, name in zip(refused, (exported.CONSTANTS_FILE, exported.CONSTANTS_FILE,
                                   exported.INPUTS_FILE, exported.INPUTS_FILE)):
        with pytest.raises(UntrustedArtifactError, match=f"{name} holds .*trusted=True"):
            exported.load(dataclasses.replace(bad, trusted=False), module.state_dict())


# ---- trusted loading, and programs sparkddl does not load without it ----

def test_trusted_loading_reads_a_program_as_it_is(tmp_path):
    """A benign addition the check does not know (node metadata 'custom') is refused
    without trust and read with it."""
    module, program = exported_model("mlp")
    store = Store.from_uri(str(tmp_path))
    exported.write(store, dataclasses.replace(program, graph=tampered(
        "mlp", lambda d: put(graph_of(d)["nodes"][0]["metadata"], "custom", "{}"))))
    with pytest.raises(UntrustedArtifactError, match=f"{tmp_path}.*program.json: .*custom"):
        exported.load(exported.read(store, program.parameters), module.state_dict())
    loaded = exported.load(exported.read(store, program.parameters, trusted=True),
                           module.state_dict())
    x = torch.randn(2, 6)
    assert torch.allclose(loaded(x), module(x), atol=1e-6)


def test_a_model_outside_what_the_check_knows_says_so_when_exported(caplog, tmp_path):
    if not hasattr(torch, "cond"):
        pytest.skip(f"torch {torch.__version__} has no torch.cond")

    class Branching(nn.Module):
        def __init__(self):
            super().__init__()
            self.lin = nn.Linear(4, 2)

        def forward(self, x):
            return torch.cond(x.sum() > 0, lambda x: self.lin(x), lambda x: self.lin(-x), (x,))
    module = Branching().eval()
    program = exported.export(module, (Spec("features", (4,), "float32"),))
    assert "torch.ops.higher_order.cond" in caplog.text and "trusted=True" in caplog.text
    with pytest.raises(UntrustedArtifactError, match="higher_order.cond"):
        exported.load(dataclasses.replace(program, trusted=False), module.state_dict())
    x = torch.randn(3, 4)
    assert torch.allclose(exported.load(program, module.state_dict())(x), module(x))


# ---- the MLflow pyfunc loader (portable, copied into MLflow models) ----

def _pyfunc_folder(folder: Any, graph: bytes | None = None) -> Any:
    module, program = exported_model("mlp")
    os.makedirs(folder)
    buf = io.BytesIO()
    torch.save(module.state_dict(), buf)
    meta = {"inputs": [{"name": "features", "shape": [6], "dtype": "float32"}],
            "task": "regression", "output_width": 3, "columns": {"prediction": "prediction"},
            "parameters": list(program.parameters), "batch_rows": 16}
    for name, blob in ((portable.META_FILE, json.dumps(meta).encode()),
                       (portable.WEIGHTS_FILE, buf.getvalue()),
                       (portable.GRAPH_FILE, graph or program.graph),
                       (portable.CONSTANTS_FILE, program.constants),
                       (portable.INPUTS_FILE, program.example_inputs)):
        (folder / name).write_bytes(blob)
    return folder


def test_the_pyfunc_loader_refuses_a_tampered_program_with_a_value_error(tmp_path):
    marker = tmp_path / "payload-ran"
    frame = pd.DataFrame({"features": list(np.random.default_rng(0).standard_normal((5, 6)))})
    good = portable._load_pyfunc(str(_pyfunc_folder(tmp_path / "good")))
    assert len(good.predict(frame)) == 5
    folder = _pyfunc_folder(tmp_path / "bad", tampered(
        "mlp", lambda d: put(d, "guards_code", [f"{code(marker)} is None"])))
    with pytest.raises(UntrustedProgramError, match=r"bad/program\.json: guards_code\[0\]") \
            as info:
        portable._load_pyfunc(str(folder))
    assert not isinstance(info.value, SparkDDLError) and isinstance(info.value, ValueError)
    assert "model_config={'trusted': True}" in str(info.value) and not marker.exists()
    benign = _pyfunc_folder(tmp_path / "benign", tampered(
        "mlp", lambda d: put(graph_of(d)["nodes"][0]["metadata"], "custom", "{}")))
    with pytest.raises(ValueError, match="custom"):
        portable._load_pyfunc(str(benign), {"device": "cpu"})
    trusted = portable._load_pyfunc(str(benign), {"trusted": True})
    assert np.allclose(trusted.predict(frame)["prediction"].tolist(),
                       good.predict(frame)["prediction"].tolist())
