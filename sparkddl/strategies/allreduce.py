"""Synchronous data parallelism: gradients averaged over all ranks every step.

``overlap=True`` (default) is DDP: gradient buckets are sent while the backward pass is
still running, through a communication hook. ``overlap=False`` averages the same buckets
after the backward pass, before ``optimizer.step()``, so the benefit of overlap can be
measured. Either way, ``compression`` picks the codec a bucket is sent with; both paths run
the same codec code, so every compression works with and without overlap.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from sparkddl.errors import ConfigError
from sparkddl.strategies.base import Strategy, option
from sparkddl.strategies.comm import tensor_bytes
from sparkddl.strategies.compression import Cast, Codec, Sign, TopK
from sparkddl.strategies.powersgd import PowerSGD
from sparkddl.strategies.tensors import (
    GradientSync,
    allreduce_mean,
    broadcast_,
    broadcast_module,
)
from sparkddl.task.context import collective, current, is_active
from sparkddl.task.host_memory import HostGroup, one_host

if TYPE_CHECKING:
    import torch
    from torch.futures import Future

COMPRESSIONS = ("none", "fp16", "bf16", "powersgd", "topk", "sign")
# options that only tune some compressions: setting them for another is a mistake
TUNES = {"rank": ("powersgd",), "ratio": ("topk",), "warmup_steps": COMPRESSIONS[1:]}


class AllReduce(Strategy):
    """Gradient averaging by allreduce (or all-gather for top-k and sign), every step.

    ``warmup_steps``: plain allreduce for that many steps before a compression starts, so
    PowerSGD's warm-started factors and the error-feedback residuals begin from the
    gradients of a model that has left its random initialization.
    """

    name = "allreduce"
    @dataclass(frozen=True)
    class Options:
        bucket_cap_mb: float = option(25, "gradient bucket size in MiB")
        overlap: bool = option(True, "send buckets while the backward pass runs (DDP); "
                               "false: average them after it")
        compression: str = option("none", "codec of each bucket: none, fp16, bf16, powersgd, "
                                  "topk or sign")
        rank: int = option(2, "PowerSGD's rank (compression=powersgd)")
        ratio: float = option(0.01, "share of entries top-k sends (compression=topk)")
        warmup_steps: int = option(10, "plain allreduce steps before a compression starts")
        shared_memory: bool = option(True, "on CPU with every rank on one host, average "
                                     "through shared memory instead of gloo (compression="
                                     "none); false: always the process group")

    def __init__(self, **options: Any):
        super().__init__(**options)
        self.steps = 0
        self.plain = Codec(self.comm)
        self.codec = self._codec()
        self.keys: dict[int, int] = {}
        self.sync: GradientSync | None = None
        self.buffers: list[Any] = []
        self.ddp: Any = None  # set when DDP reduces without a hook
        self.wrapped: Any = None  # the DDP module (overlap=True)
        self.alone = False  # one rank, no compression: nothing to average, nothing wrapped
        self._buckets: tuple[int, int] | None = None
        self.host: HostGroup | None = None  # every rank on one host: shared memory

    def check_options(self) -> None:
        self.check_number("bucket_cap_mb", 0, low_inclusive=False)
        self.check_bool("overlap")
        self.check_bool("shared_memory")
        self.check_choice("compression", COMPRESSIONS)
        self.check_int("rank", 1)
        self.check_number("ratio", 0, 1, low_inclusive=False)
        self.check_int("warmup_steps", 0)
        compression = self.options["compression"]
        for key, users in TUNES.items():
            if self.options[key] != self.OPTIONS[key] and compression not in users:
                raise ConfigError(
                    f"strategy 'allreduce' option {key} only applies with compression="
                    f"{' or '.join(users)}, but compression={compression!r}; drop {key} "
                    "or choose a compression it tunes")

    def _codec(self) -> Codec:
        import torch

        compression = self.options["compression"]
        if compression in ("fp16", "bf16"):
            return Cast(self.comm, torch.float16 if compression == "fp16" else torch.bfloat16)
        if compression == "powersgd":
            return PowerSGD(self.comm, self.options["rank"])
        if compression == "topk":
            return TopK(self.comm, self.options["ratio"])
        if compression == "sign":
            return Sign(self.comm)
        return self.plain

    def wrap(self, module: Any) -> Any:
        import torch.distributed as dist
        if dist.get_world_size() == 1 and self.options["compression"] == "none":
            # DDP on one rank still runs its reducer: +50 % per step on a small model
            # (Linear(64, 10), batch 1024: 431 us against 288 us); a compression keeps its
            # codec, whose error feedback changes the gradients even on one rank
            self.alone = True
            return module
        # parameter index: codec state is keyed by it, whichever bucket a parameter is in
        self.keys = {id(p): i for i, p in enumerate(module.parameters())}
        cap_bytes = int(self.options["bucket_cap_mb"] * (1 << 20))
        self.host = self._host_group(module)
        if self.options["overlap"]:
            from torch.nn.parallel import DistributedDataParallel as DDP

            with collective("DDP's setup (rank 0's weights broadcast to every rank)"):
                ddp = DDP(module, bucket_cap_mb=self.options["bucket_cap_mb"])
            self.wrapped = ddp
            if self.host is not None:
                ddp.register_comm_hook(self, _host_hook)
            elif self.options["compression"] == "none":
                # DDP's own C++ allreduce: a Python hook per bucket costs ~8 % of a small
                # model's step; the traffic is counted from DDP's bucket sizes instead
                self.ddp = ddp
            else:
                ddp.register_comm_hook(self, _bucket_hook)
            return ddp
        broadcast_module(module)
        self.buffers = list(module.buffers())
        self.sync = GradientSync(list(module.parameters()), cap_bytes, self.exchange)
        return module

    def _host_group(self, module: Any) -> HostGroup | None:
        """Shared memory where every rank runs on this host on the CPU. What decides it
        before the group's votes is the same on every rank; the rest is each rank's vote."""
        if not self.options["shared_memory"] or self.options["compression"] != "none" \
                or not is_active():
            return None
        ctx = current()
        if ctx.use_gpu or ctx.store is None or not one_host(ctx.world_size,
                                                             ctx.local_world_size):
            return None
        params = [p for p in module.parameters() if p.requires_grad]
        unable = "" if params and all(p.device.type == "cpu" for p in params) else \
            f"rank {ctx.rank}'s parameters are not all on the CPU"
        largest = sum(p.numel() * p.element_size() for p in params)
        with collective("the shared-memory group's setup (every rank joins it)"):
            return HostGroup.open(ctx.store, ctx.rank, ctx.world_size,
                                  ctx.collective_timeout_s, largest, unable)

    def average_here(self, flat: "torch.Tensor") -> "Future":
        """``flat`` averaged through the shared-memory group, as a finished future."""
        import torch

        assert self.host is not None
        self.comm.add(tensor_bytes(flat))
        done: Future = torch.futures.Future()
        done.set_result(self.host.average_(flat))
        return done

    def exchange(self, flat: "torch.Tensor", keys: list[int],
                 shapes: list["torch.Size"]) -> "Future":
        if self.host is not None:
            return self.average_here(flat)
        codec = self.plain if self.steps < self.options["warmup_steps"] else self.codec
        return codec.exchange(flat, keys, shapes)

    def no_sync(self) -> Any:
        """DDP's own no_sync; without overlap nothing is sent before ``step`` anyway."""
        return super().no_sync() if self.wrapped is None else self.wrapped.no_sync()

    def backward(self, loss: Any) -> None:
        if self.sync is not None or self.alone:  # exchanged after the backward pass, if at all
            loss.backward()
            return
        # DDP allreduces gradient buckets while the backward pass runs and waits for them
        # before it returns: from outside, time in autograd and time waiting for the peers
        # cannot be told apart, so the whole pass counts as inside the collective
        with collective("DDP's gradient allreduce (inside backward)"):
            loss.backward()

    def step(self, optimizer: Any) -> None:
        if self.ddp is not None:
            self.comm.add(*self._ddp_buckets())
        if self.sync is not None:
            self.sync()
            if self.buffers:  # what DDP does before each forward: rank 0's buffers win
                broadcast_(self.buffers, self.comm)
        optimizer.step()
        self.steps += 1

    def _ddp_buckets(self) -> tuple[int, int]:
        """(bytes, calls) DDP's reducer sent this step: one allreduce per bucket. Buckets are
        rebuilt once, after the first step; from then on the sizes are fixed."""
        if self._buckets is not None:
            return self._buckets
        data = self.ddp._get_ddp_logging_data()
        rebuilt = bool(data.get("has_rebuilt_buckets"))
        sizes = [int(x) for x in str(data.get("rebuilt_bucket_sizes" if rebuilt
                                              else "bucket_sizes", "")).split(",") if x.strip()]
        if not sizes:  # no logging data: every gradient went, in one call per parameter
            params = [p for p in self.ddp.module.parameters() if p.requires_grad]
            sizes = [p.numel() * p.element_size() for p in params]
        found = (sum(sizes), len(sizes))
        if rebuilt:
            self._buckets = found
        return found

    def state_dict(self) -> dict[str, Any]:
        return {"steps": self.steps, "codec": self.codec.state_dict()}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.steps = int(state["steps"])
        self.codec.load_state_dict(state["codec"])


def _host_hook(strategy, bucket):  # noqa: ANN001 - DDP checks annotations: leave them off
    """DDP communication hook: the bucket averaged through shared memory; a sparse one (an
    embedding's sparse gradients) through the process group, as DDP's own reduction does
    (every rank has the same buckets, so the ranks stay in step)."""
    import torch

    flat = bucket.buffer()
    if flat.layout is not torch.strided:
        return allreduce_mean(flat, strategy.comm)
    return strategy.average_here(flat)


def _bucket_hook(strategy, bucket):  # noqa: ANN001 - DDP checks annotations: leave them off
    """DDP communication hook: the bucket goes through the strategy's codec."""
    params = bucket.parameters()
    return strategy.exchange(bucket.buffer(), [strategy.keys[id(p)] for p in params],
                             [p.shape for p in params])
