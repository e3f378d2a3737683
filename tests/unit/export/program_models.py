"""Models of the kinds sparkddl trains, exported as sparkddl exports them, and helpers to
tamper with their programs (tests/unit/export/test_program_check.py, test_program_safety.py)."""
from __future__ import annotations

import dataclasses
import functools
import json
from typing import Any, Callable

import torch

from sparkddl.export import program as exported
from sparkddl.models import CNN, MLP

nn = torch.nn
Spec = exported.InputSpec


Spec = exported.InputSpec


class Embedded(nn.Module):
    """int64 input"""

    def __init__(self):
        super().__init__()
        self.embed, self.out = nn.Embedding(20, 4), nn.Linear(4 * 5, 2)

    def forward(self, x):
        return self.out(self.embed(x).flatten(1))


class Normed(nn.Module):
    """batchnorm (buffers), dropout, view and reshape on the batch size"""

    def __init__(self):
        super().__init__()
        self.conv, self.norm = nn.Conv2d(1, 3, 3), nn.BatchNorm2d(3)
        self.drop, self.out = nn.Dropout(0.3), nn.Linear(3 * 6 * 6, 2, bias=False)

    def forward(self, x):
        x = x.view(x.shape[0], 1, 8, 8)
        return self.out(self.drop(torch.relu(self.norm(self.conv(x)))).reshape(x.size(0), -1))


class Arithmetic(nn.Module):
    """size arithmetic (2*s0, 4*s0), a buffer, tensors made in the graph"""

    def __init__(self):
        super().__init__()
        self.lin = nn.Linear(3, 2)
        self.register_buffer("scale", torch.tensor(2.0))

    def forward(self, x):
        n = x.shape[0]
        y = (self.lin(x.reshape(n * 2, 3)) * self.scale).reshape(-1)
        return y.reshape(n, 4) + torch.ones(4) + x.new_zeros(n, 4)


class Two(nn.Module):
    """two inputs sharing the batch dimension (torch >= 2.9 writes a guard for it)"""

    def __init__(self):
        super().__init__()
        self.conv, self.out = nn.Conv2d(1, 2, 3), nn.Linear(2 * 6 * 6 + 3, 1)

    def forward(self, image, extra):
        return self.out(torch.cat([self.conv(image).flatten(1), extra], 1))


class Constant(nn.Module):
    """a lifted tensor constant, a string argument (gelu's approximate), softmax"""

    def __init__(self):
        super().__init__()
        self.lin, self.weights = nn.Linear(4, 2), torch.arange(4.0)

    def forward(self, x):
        return nn.functional.gelu(self.lin(x * self.weights), approximate="tanh").softmax(-1)


class Recurrent(nn.Module):
    """embedding, GRU, layer norm, indexing"""

    def __init__(self):
        super().__init__()
        self.embed, self.rnn = nn.Embedding(30, 8), nn.GRU(8, 8, batch_first=True)
        self.norm, self.out = nn.LayerNorm(8), nn.Linear(8, 3)

    def forward(self, x):
        h, _ = self.rnn(self.embed(x))
        return self.out(self.norm(h[:, -1]))


class Attention(nn.Module):
    """a transformer encoder layer (scaled dot product attention)"""

    def __init__(self):
        super().__init__()
        self.layer = nn.TransformerEncoderLayer(8, 2, 16, batch_first=True, dropout=0.1)
        self.out = nn.Linear(8, 2)

    def forward(self, x):
        return self.out(self.layer(x.reshape(x.shape[0], 4, 8)).mean(1))


KINDS: dict[str, tuple[Callable[[], nn.Module], tuple[Spec, ...]]] = {
    "mlp": (lambda: MLP(6, (8,), 3, dropout=0.2), (Spec("features", (6,), "float32"),)),
    "cnn": (lambda: CNN(1, 8, (4, 4), 3), (Spec("features", (64,), "float32"),)),
    "cnn_image": (lambda: CNN(1, 8, (4,), 3), (Spec("features", (1, 8, 8), "float32"),)),
    "embedding": (Embedded, (Spec("ids", (5,), "int64"),)),
    "batchnorm": (Normed, (Spec("features", (64,), "float32"),)),
    "arithmetic": (Arithmetic, (Spec("features", (6,), "float32"),)),
    "two_inputs": (Two, (Spec("image", (1, 8, 8), "float32"), Spec("extra", (3,), "float32"))),
    "constant": (Constant, (Spec("features", (4,), "float32"),)),
    "recurrent": (Recurrent, (Spec("ids", (7,), "int64"),)),
    "attention": (Attention, (Spec("features", (32,), "float32"),)),
}


@functools.cache
def exported_model(kind: str) -> tuple[nn.Module, exported.Program]:
    """A model (eval mode) and its program as sparkddl exports it; once per kind."""
    torch.manual_seed(0)
    make, specs = KINDS[kind]
    module = make().eval()
    return module, exported.export(module, specs)


def inputs_for(kind: str, rows: int) -> list[torch.Tensor]:
    gen = torch.Generator().manual_seed(rows)
    return [torch.randint(0, 5, (rows, *s.shape), generator=gen) if s.dtype == "int64" else
            torch.randn((rows, *s.shape), generator=gen) for s in KINDS[kind][1]]


def load_as_read(kind: str, graph: bytes | None = None, trusted: bool = False) -> Any:
    """The program of ``kind`` (its JSON replaced by ``graph``) as read from a file."""
    module, program = exported_model(kind)
    program = dataclasses.replace(program, graph=graph or program.graph, trusted=trusted)
    return exported.load(program, module.state_dict())


def tampered(kind: str, change: Callable[[dict[str, Any]], Any]) -> bytes:
    data = json.loads(exported_model(kind)[1].graph)
    change(data)
    return json.dumps(data).encode()


def code(marker: Any) -> str:
    """Python that leaves ``marker`` behind when something evaluates it."""
    return f"__import__('pathlib').Path({str(marker)!r}).touch()"


# ---- places in a program's JSON ----

def graph_of(d):
    return d["graph_module"]["graph"]


def first_input(d):
    """The user input's tensor metadata (its batch size is a size expression)."""
    [name] = [s["user_input"]["arg"]["as_tensor"]["name"]
              for s in d["graph_module"]["signature"]["input_specs"] if "user_input" in s]
    return graph_of(d)["tensor_values"][name]


def root_call(d):
    return d["graph_module"]["module_call_graph"][0]["signature"]


def put(target: Any, key: Any, value: Any) -> None:
    target[key] = value


def append(target: list, value: Any) -> None:
    target.append(value)
