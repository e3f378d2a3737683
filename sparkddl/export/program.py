"""Architectures saved as programs: ``torch.export``, loaded without unpickling anything.

A fitted model is exported with its batch dimension dynamic and its feature shapes taken
from the training data. What is stored is torch.export's own serialization taken apart: the
graph as JSON, and the tensors it needs (constants, example inputs) written by
``torch.save`` and read back with ``weights_only=True``; the weights are the model's
``weights.pt``. ``torch.export.load`` is not used to read it: it falls back to full
unpickling when a file does not load with ``weights_only`` (and torch < 2.6 always
unpickles), so a tampered file would run code. Nor does torch read the graph as it is:
torch's deserializer compiles or evaluates some of its text, so a program read from a file
is first checked against what sparkddl writes (:mod:`sparkddl.export.program_check`) and refused
with UntrustedArtifactError otherwise, unless it was read with trusted loading.

A model that cannot be exported (data-dependent control flow, unsupported operations) is
saved as before, and the export error is kept to say why it needs trusted loading.
"""
from __future__ import annotations

import contextlib
import logging
from dataclasses import dataclass
from typing import Any, Iterable, Iterator

from sparkddl.errors import UntrustedArtifactError
from sparkddl.export.portable import (
    CONSTANTS_FILE,
    GRAPH_FILE,
    INPUTS_FILE,
    UntrustedProgramError,
    deserialize_program,
    load_program,
)
from sparkddl.export.program_check import refusal

log = logging.getLogger(__name__)

EXAMPLE_ROWS = 2  # torch.export specializes sizes 0 and 1; the program still takes any batch


@dataclass(frozen=True)
class InputSpec:
    """One positional input of the model: a feature column, per row."""

    name: str
    shape: tuple[int, ...]
    dtype: str  # numpy's name, e.g. float32

    def to_json(self) -> dict[str, Any]:
        return {"name": self.name, "shape": list(self.shape), "dtype": self.dtype}

    @classmethod
    def from_json(cls, d: dict[str, Any]) -> "InputSpec":
        return cls(str(d["name"]), tuple(int(x) for x in d["shape"]), str(d["dtype"]))


def input_specs(sample: dict[str, Any], features: Iterable[str]) -> tuple[InputSpec, ...]:
    """The model's inputs, shaped and typed as a sample of the training data feeds them
    (float32 features, or what a transformFn made of them)."""
    return tuple(InputSpec(f, tuple(int(d) for d in sample[f].shape[1:]),
                           str(getattr(sample[f], "dtype", "float32")))
                 for f in features)


@dataclass(frozen=True)
class Program:
    """An exported model without its weights: what is written next to weights.pt."""

    graph: bytes  # the ExportedProgram as torch.export's JSON
    constants: bytes  # torch.save bytes
    example_inputs: bytes  # torch.save bytes
    parameters: tuple[str, ...]  # which state-dict entries are parameters (not buffers)
    # made by this process, or read with trusted loading: torch reads it unchecked
    trusted: bool = False
    where: str = GRAPH_FILE  # the graph's file, for errors


class ExportFailed(Exception):
    """The model could not be exported; the message says why."""


def export(module: Any, inputs: tuple[InputSpec, ...]) -> Program:
    """Export ``module`` (eval mode) with a dynamic batch dimension; ExportFailed if it
    cannot be."""
    import numpy as np
    import torch

    if not inputs:
        raise ExportFailed("the model's input shapes are unknown (saved by an older sparkddl)")
    try:
        from torch._export.serde.serialize import serialize
        from torch.export import Dim
        from torch.export import export as torch_export
    except ImportError as exc:  # a torch without torch.export
        raise ExportFailed(f"torch {torch.__version__} has no torch.export ({exc})") from exc
    examples = tuple(torch.from_numpy(np.zeros((EXAMPLE_ROWS, *s.shape), dtype=s.dtype))
                     for s in inputs)
    # bounded below sys.maxsize: torch 2.7 guards recurrent layers' batch against it
    # ("Constraints violated (batch)") where the default range reaches it
    batch = Dim("batch", max=2**31 - 1)
    was_training = module.training
    module.eval()
    _forget_earlier_exports()
    try:
        program = torch_export(module, examples,
                               dynamic_shapes=tuple({0: batch} for _ in examples))
        artifact = serialize(program)
    except Exception as exc:  # torch raises many kinds; all mean "not exportable"
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else ""
        raise ExportFailed(f"{type(exc).__name__}: {first[:500]}") from exc
    finally:
        module.train(was_training)
    why = refusal(artifact.exported_program)
    if why is not None:  # saving it still works; loading it from a file will need trust
        log.warning("the model's torch.export program holds what sparkddl only loads from a "
                    "file with trusted loading (%s); a saved copy will need "
                    "TorchModel.load(path, trusted=True)", why)
    return Program(artifact.exported_program, artifact.constants, artifact.example_inputs,
                   tuple(n for n, _ in module.named_parameters()), trusted=True)


def _forget_earlier_exports() -> None:
    """torch.export traces every module through one wrapper frame (dynamo's ``wrap_inline``);
    torch 2.6 keeps that frame's cache entries after the exported modules are gone, so the
    ninth export of a process fails with ``RecompileLimitExceeded: cache_size_limit reached``
    (seen on Databricks 16.4 LTS ML's torch: a notebook's ninth fit saved no program). Its
    entries belong to exports only: cleared before each, nothing else is recompiled."""
    try:
        from torch._dynamo import reset_code  # pyright: ignore[reportPrivateImportUsage] - there on 2.6-2.13
        from torch._dynamo.external_utils import wrap_inline
    except ImportError:  # a torch without them keeps no such cache
        return
    reset_code(wrap_inline(lambda: None).__code__)


def load(program: Program, state: dict[str, Any], device: Any = "cpu") -> Any:
    """The exported model holding ``state``, as a callable torch module (it was exported in
    eval mode); no pickled code is run, and an untrusted program is checked first
    (UntrustedArtifactError)."""
    with _refusals():
        return load_program(program.graph, program.constants, program.example_inputs,
                            program.parameters, state, device, program.trusted, program.where)


def program_of(program: Program, state: dict[str, Any]) -> Any:
    """The ``torch.export.ExportedProgram`` holding ``state`` (e.g. for torch.export.save)."""
    with _refusals():
        return deserialize_program(program.graph, program.constants, program.example_inputs,
                                   program.parameters, state, program.trusted, program.where)


@contextlib.contextmanager
def _refusals() -> Iterator[None]:
    """portable cannot import sparkddl, so its refusal becomes sparkddl's error here."""
    try:
        yield
    except UntrustedProgramError as exc:
        raise UntrustedArtifactError(str(exc)) from exc


# ---- on disk, in a model's folder ----

def write(store: Any, program: Program) -> None:
    for name, data in ((GRAPH_FILE, program.graph), (CONSTANTS_FILE, program.constants),
                       (INPUTS_FILE, program.example_inputs)):
        store.write_bytes(store.url(name), data)


def read(store: Any, parameters: Iterable[str], trusted: bool = False) -> Program | None:
    """The program saved in ``store``'s folder, or None; ``trusted``: from trusted loading,
    so it is read as it is rather than checked."""
    if not store.exists(store.url(GRAPH_FILE)):
        return None
    return Program(store.read_bytes(store.url(GRAPH_FILE)),
                   store.read_bytes(store.url(CONSTANTS_FILE)),
                   store.read_bytes(store.url(INPUTS_FILE)), tuple(parameters), trusted,
                   store.url(GRAPH_FILE))
