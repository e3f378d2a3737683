"""Each rank's peak memory, predicted per strategy and worker count (``sparkddl plan``).

The calibration stage measures, on a rank of the user's cluster with the user's model and
batch: the process's resident memory with its libraries and the reader loaded but no model
(``runtime``), the bytes of the parameters, gradients and optimizer state after a real
step, the activations saved for backward at the batch size, and the peak growth of resident
memory over local training steps (which adds the step's temporaries: the optimizer's
intermediate tensors, autograd's buffers, the allocator's slack). The reader's buffers
follow from the shard plan. A strategy adds what it keeps or builds beside the model
(``M`` = the model's parameters and buffers, ``G`` = its gradients, ``O`` = the optimizer
state, ``n`` = workers)::

    allreduce            + G   gradient buckets (DDP's, or the flattened ones without overlap)
      fp16 / bf16        + G/2 half-precision copies of the buckets
      powersgd           + G   error-feedback residuals
      topk, sign         + 1.25 G  the residuals (the gradient plus the residual is built in
                               them) and a bool mask (G/4 for float32): candidates, or signs
    local_sgd            + M   the flattened model while it is averaged
    dynamic_averaging    + 2M  the reference model and the flattened average
    gossip               + M (1 + peers) + bucket (2 + peers)   sent and received models
    ssp                  + 5M  the last pulled model, the update, its bytes, the answer's
                               bytes and its copy; rank 0 also serves: the server's model,
                               2M of its copies, and the run's TCPStore (in rank 0's
                               process) holding a message per worker: (3 + n) M
    fsdp                 parameters, gradients and optimizer state / n, plus the root
                         unit (gathered through backward) and the largest other unit
                         gathered with their gradients (building the whole model before
                         sharding it takes less than the epoch end's gather, below)

At an epoch's end rank 0 serializes the snapshot it hands to the driver (2M; for fsdp the
full model gathered to rank 0 and serialized, 3M) and, with ``checkpointEvery`` on (the
default), the checkpoint: the model and optimizer state serialized (2 (M + O); fsdp 3 (M +
O)) and every rank's strategy state S gathered, read back and serialized again ((4n + 3) S:
S = G for the compressions' residuals, M for dynamic_averaging's reference). That peak
comes instead of the step's activations and temporaries, so the larger of the two counts.

Host memory on CPU. With GPUs the step's parts (model, activations, temporaries from the
caching allocator's reserved bytes, strategy) are device memory and ``peak_MB`` is theirs;
whether it fits is left open (untested here: no GPU). Checked against measured peak RSS in
``benchmarks/perf_model.py``.
"""
from __future__ import annotations

import math
import weakref
from dataclasses import dataclass
from typing import Any

MB = 1e6
BUCKET_BYTES = 25 << 20  # DDP's default bucket and the gossip buckets


@dataclass(frozen=True)
class MemoryPrediction:
    strategy: str
    workers: int
    runtime_MB: float  # the process before the model: Python, torch, the task
    model_MB: float  # parameters + gradients + optimizer state this rank holds
    activations_MB: float  # saved for backward at the batch size
    temporaries_MB: float  # the step's transient tensors and allocator slack (measured)
    strategy_MB: float  # what the strategy adds (rank 0's share where ranks differ)
    reader_MB: float  # decoded row groups and batches queued ahead
    checkpoint_MB: float  # rank 0's epoch-end snapshot and checkpoint (not during a step)
    peak_MB: float  # rank 0's predicted peak: runtime + model + strategy + reader +
    # max(activations + temporaries, checkpoint); on GPUs the device's part only
    available_MB: float  # the host's memory per rank, ranks packed as at calibration (0: ?)

    @property
    def fits(self) -> bool | None:
        return None if not self.available_MB else self.peak_MB <= self.available_MB


# ---- measuring (on the ranks, in the calibration stage) ----

def tensor_bytes(tensors: Any) -> int:
    from sparkddl.strategies.comm import tensor_bytes as one
    return sum(map(one, tensors))


def optimizer_bytes(optimizer: Any) -> int:
    """Bytes of the optimizer's tensor state (after a step: Adam's moments, momentum)."""
    import torch
    return sum(v.numel() * v.element_size() for s in optimizer.state.values()
               for v in s.values() if torch.is_tensor(v))


def activation_bytes(forward: Any, params: Any) -> int:
    """Bytes autograd saves for backward while ``forward()`` runs, plus its output (each
    storage counted once: a tensor saved by two ops, or views of one, are one buffer; the
    parameters in ``params``, which ops save too, are not activations)."""
    import torch

    saved: list[Any] = []  # weak references: what a discarded branch saved is freed

    def pack(t: Any) -> Any:
        saved.append(weakref.ref(t))
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        out = forward()
    outs = out if isinstance(out, (tuple, list)) else [out]
    live = [t for t in (ref() for ref in saved) if t is not None]
    own = {_storage(p)[0] for p in params}
    seen: dict[Any, int] = {}
    for t in [*live, *(t for t in outs if torch.is_tensor(t))]:
        ptr, nbytes = _storage(t)
        if ptr is not None and ptr not in own:
            seen[ptr] = max(seen.get(ptr, 0), nbytes)
    return sum(seen.values())


def _storage(t: Any) -> tuple[Any, int]:
    """(address, bytes) of a tensor's storage; (None, 0) for tensors without one."""
    try:
        storage = t.untyped_storage()
        return storage.data_ptr(), storage.nbytes()
    except (RuntimeError, NotImplementedError):
        return None, 0


def unit_bytes(module: Any, min_params: int) -> list[int]:
    """Parameter bytes of each unit ``fsdp`` would shard (its own rule), root last."""
    from sparkddl.strategies.fsdp import shard_units
    return [tensor_bytes(params) for _, params in shard_units(module, min_params)]


# ---- predicting (on the driver) ----

def predict(fp: dict[str, Any], label: str, name: str, options: dict[str, Any],
            n: int) -> MemoryPrediction:
    """Rank 0's peak for strategy ``name`` with ``options`` on ``n`` workers, from the
    footprint ``fp`` the calibration measured (see :func:`sparkddl.perfmodel.calibrate`)."""
    params, grads, optim = fp["param_bytes"], fp["grad_bytes"], fp["optimizer_bytes"]
    model = fp["model_bytes"]  # parameters and buffers
    acts, temps = fp["activation_bytes"], fp["temporary_bytes"]
    extra, state = 0.0, 0.0  # what the strategy adds; its checkpointed state per rank
    held = params + grads + optim
    # at an epoch's end rank 0 serializes the snapshot (and the checkpoint, if on)
    snapshot, checkpoint = 2 * model, 2 * (model + optim)
    if name == "fsdp" and n > 1:
        from sparkddl.strategies.fsdp import FullyShardedDataParallel
        min_params = options.get("min_params", FullyShardedDataParallel.OPTIONS["min_params"])
        units = fp["fsdp_units"].get(str(min_params)) or [params]
        root, others = units[-1], units[:-1] or [0]
        held = held / n + 2 * (root + max(others))  # shards, and units gathered with grads
        # the full model (and optimizer state) gathered to rank 0, then serialized
        snapshot, checkpoint = 3 * model, 3 * (model + optim)
    elif name == "allreduce":
        compression = options.get("compression", "none")
        extra = grads * {"fp16": 1.5, "bf16": 1.5, "powersgd": 2.0, "topk": 2.25,
                         "sign": 2.25}.get(compression, 1.0)
        state = grads if compression in ("powersgd", "topk", "sign") else 0.0
    elif name == "local_sgd":
        extra = model
    elif name == "dynamic_averaging":
        extra, state = 2 * model, model
    elif name == "gossip":
        peers = _peers(options.get("topology", "ring"), n)
        extra = model * (1 + peers) + min(model, BUCKET_BYTES) * (2 + peers)
    elif name == "ssp":
        extra = 5 * model + (3 + n) * model  # a worker's copies; rank 0 also serves
    checkpoint += (4 * n + 3) * state
    if not fp.get("checkpoint_every", 1):
        checkpoint = snapshot
    reader = fp["reader_bytes"]
    transient = max(acts + temps, snapshot, checkpoint)
    cuda = fp.get("device") == "cuda"
    host = 0.0 if cuda else fp["runtime_bytes"] + reader
    peak = host + held + extra + transient
    return MemoryPrediction(label, n, fp["runtime_bytes"] / MB, held / MB, acts / MB,
                            temps / MB, extra / MB, reader / MB, checkpoint / MB, peak / MB,
                            0.0 if cuda else fp.get("available_bytes", 0) / MB)


def _peers(topology: str, n: int) -> int:
    if n <= 1:
        return 0
    if topology == "exponential":
        return max(1, math.ceil(math.log2(n)))
    return 1 if n == 2 else 2


def table(preds: list[MemoryPrediction]) -> str:
    lines = ["| strategy | workers | peak MB | runtime | model | activations | temporaries | "
             "strategy | reader | checkpoint | available | fits |", "|" + "---|" * 12]
    for p in preds:
        fits = {None: "?", True: "yes", False: "**no**"}[p.fits]
        lines.append(f"| {p.strategy} | {p.workers} | {p.peak_MB:,.0f} | {p.runtime_MB:,.0f} | "
                     f"{p.model_MB:,.1f} | {p.activations_MB:,.1f} | {p.temporaries_MB:,.1f} | "
                     f"{p.strategy_MB:,.1f} | {p.reader_MB:,.1f} | {p.checkpoint_MB:,.1f} | "
                     f"{p.available_MB:,.0f} | {fits} |")
    return "\n".join(lines)
