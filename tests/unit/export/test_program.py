"""Models saved as torch.export programs: rebuilt without their code, and without unpickling."""
from __future__ import annotations

import os
import pickle
import re

import pytest
import torch

from sparkddl.export import program as exported
from sparkddl.store import Store

SPECS = (exported.InputSpec("features", (6,), "float32"),)


def _net() -> torch.nn.Module:
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(6, 8), torch.nn.BatchNorm1d(8), torch.nn.ReLU(),
                               torch.nn.Linear(8, 3)).eval()


def _saved(tmp_path, net):
    store = Store.from_uri(str(tmp_path))
    program = exported.export(net, SPECS)
    exported.write(store, program)
    return store, program


def test_a_program_predicts_as_the_module_for_any_batch_and_takes_new_weights(tmp_path):
    net = _net()
    store, program = _saved(tmp_path, net)
    assert net.training is False  # export leaves the mode as it was
    loaded = exported.load(exported.read(store, program.parameters), net.state_dict())
    for rows in (1, 2, 37):
        x = torch.randn(rows, 6)
        assert torch.allclose(loaded(x), net(x), atol=1e-6)
    other = {k: torch.zeros_like(v) if v.is_floating_point() else v
             for k, v in net.state_dict().items()}
    zeroed = exported.load(program, other)
    assert zeroed(torch.randn(4, 6)).abs().sum().item() == 0.0  # the weights given are used


def test_weights_of_another_model_are_refused_even_where_the_operations_would_run(tmp_path):
    """A wider MLP's weights chain fine through the same linear operations (torch would run
    them); the program's own weight shapes refuse them."""
    store, program = _saved(tmp_path, _net())
    other = torch.nn.Sequential(torch.nn.Linear(6, 16), torch.nn.BatchNorm1d(16),
                                torch.nn.ReLU(), torch.nn.Linear(16, 3)).eval().state_dict()
    with pytest.raises(ValueError, match=r"weight '0\.weight' is torch\.float32 \[16, 6\], but "
                                         r"the program in .*program\.json takes torch\.float32 "
                                         r"\[8, 6\]: the weights belong to another model"):
        exported.load(exported.read(store, program.parameters), other)


def test_several_inputs_and_declared_shapes():
    class Two(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.conv = torch.nn.Conv2d(1, 2, 3)
            self.out = torch.nn.Linear(2 * 6 * 6 + 3, 1)

        def forward(self, image, extra):
            return self.out(torch.cat([self.conv(image).flatten(1), extra], 1))

    net = Two().eval()
    specs = (exported.InputSpec("image", (1, 8, 8), "float32"),
             exported.InputSpec("extra", (3,), "float32"))
    program = exported.export(net, specs)
    loaded = exported.load(program, net.state_dict())
    x, e = torch.randn(5, 1, 8, 8), torch.randn(5, 3)
    assert torch.allclose(loaded(x, e), net(x, e), atol=1e-6)


class Branchy(torch.nn.Module):
    """Data-dependent control flow: torch.export refuses it."""

    def __init__(self):
        super().__init__()
        self.a, self.b = torch.nn.Linear(6, 3), torch.nn.Linear(6, 3)

    def forward(self, x):
        return self.a(x) if x.sum() > 0 else self.b(x)


def test_data_dependent_control_flow_is_not_exportable_and_says_why():
    with pytest.raises(exported.ExportFailed) as info:
        exported.export(Branchy(), SPECS)
    assert re.search("data-dependent|control flow", str(info.value), re.I)  # 2.13, 2.7 | 2.4
    assert len(str(info.value)) <= 600
    with pytest.raises(exported.ExportFailed, match="input shapes are unknown"):
        exported.export(_net(), ())


class _Marker:
    """Unpickling this creates a file: proof that pickled code ran."""

    def __init__(self, path):
        self.path = path

    def __reduce__(self):
        return (open, (self.path, "w"))


def test_tampered_program_tensors_are_refused_not_unpickled(tmp_path):
    store, program = _saved(tmp_path / "model", _net())
    marker = tmp_path / "pwned"
    for name in (exported.CONSTANTS_FILE, exported.INPUTS_FILE):
        good = store.read_bytes(store.url(name))
        store.write_bytes(store.url(name), pickle.dumps(_Marker(str(marker))))
        with pytest.raises(pickle.UnpicklingError):
            exported.load(exported.read(store, program.parameters), _net().state_dict())
        assert not marker.exists()
        store.write_bytes(store.url(name), good)
    assert not os.path.exists(marker)


@pytest.mark.timeout(120)
def test_a_process_exports_model_after_model():
    """torch 2.6 (Databricks 16.4 LTS ML) refused a process's ninth export with
    RecompileLimitExceeded: its tracing wrapper's cache outlived the models."""
    for width in range(10):
        module = torch.nn.Sequential(torch.nn.Linear(6, 8 + width), torch.nn.ReLU(),
                                     torch.nn.Linear(8 + width, 3))
        program = exported.export(module, SPECS)
        x = torch.randn(5, 6)
        assert torch.allclose(exported.load(program, module.state_dict())(x), module(x),
                              atol=1e-6), width
