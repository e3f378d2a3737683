"""What each of the two ranks of test_hvd_torch.py does: every hvd call, its results saved
to ``<folder>/rank<N>.pt`` for the test to check. The data and models are shared with the
test, which trains the same model in one process for reference."""
from __future__ import annotations

import sys
import traceback
import warnings

import torch

STEPS = 3
LR = 0.1


def net(seed: int = 0) -> torch.nn.Module:
    with torch.random.fork_rng():
        torch.manual_seed(seed)
        return torch.nn.Sequential(torch.nn.Linear(5, 8), torch.nn.Tanh(), torch.nn.Linear(8, 3))


def linear() -> torch.nn.Module:
    with torch.random.fork_rng():
        torch.manual_seed(1)
        return torch.nn.Linear(3, 3)


def batch(step: int, rank: int, rows: int = 6) -> tuple[torch.Tensor, torch.Tensor]:
    """Rank ``rank``'s batch at ``step`` (the test concatenates the ranks' batches)."""
    g = torch.Generator().manual_seed(100 * step + rank)
    return torch.randn(rows, 5, generator=g), torch.randint(0, 3, (rows,), generator=g)


def loss(model: torch.nn.Module, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    return torch.nn.functional.cross_entropy(model(x), y)


def params(model: torch.nn.Module) -> dict[str, torch.Tensor]:
    return {k: v.detach().clone() for k, v in model.state_dict().items()}


def collectives(hvd, r: int) -> dict:
    x = torch.tensor([float(r + 1), -2.0 * (r + 1)])
    y = x.clone()
    hvd.allreduce_(y, op=hvd.Sum)
    return {
        "layout": (hvd.rank(), hvd.size(), hvd.local_rank(), hvd.local_size(),
                   hvd.cross_rank(), hvd.cross_size()),
        "average": hvd.allreduce(x), "sum": hvd.allreduce(x, op=hvd.Sum),
        "sum_old": hvd.allreduce(x, average=False), "min": hvd.allreduce(x, op=hvd.Min),
        "max": hvd.allreduce(x, op=hvd.Max), "product": hvd.allreduce(x, op=hvd.Product),
        "x_after": x, "in_place": y,
        "int_average": hvd.allreduce(torch.tensor([3 * r + 1])),
        "scaled": hvd.allreduce(x, op=hvd.Sum, prescale_factor=2.0, postscale_factor=0.5),
        "grouped": hvd.grouped_allreduce([x, torch.tensor([r, 10])], op=hvd.Sum),
        "fp16_allreduce": hvd.allreduce(torch.tensor([1.0001]), compression=hvd.Compression.fp16),
        "allgather": hvd.allgather(torch.full((r + 1, 2), float(r))),
        "allgather_empty": hvd.allgather(torch.ones((2 * r, 3))),
        "broadcast": hvd.broadcast(torch.full((3,), float(r)), root_rank=1),
        "broadcast_object": hvd.broadcast_object({"from": r}, root_rank=1),
        "allgather_object": hvd.allgather_object(f"rank{r}"),
        "async": hvd.synchronize(hvd.allreduce_async(x, op=hvd.Sum)),
        "join": hvd.join(),
    }


def broadcasts(hvd, r: int) -> dict:
    by_state = net(seed=r)
    hvd.broadcast_parameters(by_state.state_dict(), root_rank=0)
    by_name = net(seed=r)
    hvd.broadcast_parameters(by_name.named_parameters(), root_rank=1)
    model = net(seed=0)
    # (SGD with momentum: constructing torch's Adam takes seconds, importing torch._dynamo)
    stateful = torch.optim.SGD(model.parameters(), lr=0.01 * (r + 1), momentum=0.5)
    loss(model, *batch(0, r)).backward()
    stateful.step()  # momentum buffers differ between the ranks until the broadcast
    hvd.broadcast_optimizer_state(stateful, root_rank=0)
    fresh = torch.optim.SGD(net().parameters(), lr=0.1 * (r + 1), momentum=0.9)
    hvd.broadcast_optimizer_state(fresh, root_rank=0)
    return {"by_state": params(by_state), "by_name": params(by_name),
            "stateful": stateful.state_dict(), "fresh": fresh.state_dict()}


def train(hvd, r: int, passes: int = 1, **options) -> tuple[torch.nn.Module, torch.optim.Optimizer]:
    """STEPS steps; with ``passes`` > 1 each step's batch goes through in that many parts."""
    model = net()
    opt = hvd.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=LR, momentum=0.9),
                                   named_parameters=model.named_parameters(),
                                   backward_passes_per_step=passes, **options)
    for step in range(STEPS):
        opt.zero_grad()
        x, y = batch(step, r)
        for part in range(passes):
            loss(model, x[part::passes], y[part::passes]).backward()
        opt.step()
    return model, opt


def optimizers(hvd, r: int) -> dict:
    model, opt = train(hvd, r)
    out = {"sgd": params(model), "is_sgd": isinstance(opt, torch.optim.SGD),
           "has_momentum": bool(opt.state_dict()["state"])}
    out["two_passes"] = params(train(hvd, r, passes=2)[0])
    out["fp16"] = params(train(hvd, r, compression=hvd.Compression.fp16)[0])
    out["too_many_passes"] = _too_many_passes(model, opt, r)
    # explicit synchronize, then clipping, then a step that must not reduce again
    opt.zero_grad()
    loss(model, *batch(0, r)).backward()
    opt.synchronize()
    out["synced_grad"] = model[0].weight.grad.clone()
    torch.nn.utils.clip_grad_norm_(model.parameters(), 0.5)
    with warnings.catch_warnings(record=True) as caught, opt.skip_synchronize():
        warnings.simplefilter("always")
        opt.step()
    out["skip_warnings"] = len(caught)
    out["after_clip"] = params(model)
    # a head only rank 1 uses: rank 0 sends zeros and still gets the average
    head, extra = net(), linear()
    opt = hvd.DistributedOptimizer(torch.optim.SGD([*head.parameters(), *extra.parameters()],
                                                   lr=LR))
    out_ = head(batch(1, r)[0])
    (out_ if r == 0 else extra(out_)).sum().backward()
    opt.step()
    out["unused"] = params(extra)
    return out


def _too_many_passes(model, opt, r: int) -> str:
    opt.zero_grad()
    try:
        for _ in range(2):
            loss(model, *batch(0, r)).backward()
    except RuntimeError as exc:
        return str(exc)
    return ""


def main(folder: str) -> None:
    import faulthandler

    import sparkddl.horovod.torch as hvd

    # a hang prints every thread's stack and ends the rank, well before the test's timeout
    faulthandler.dump_traceback_later(90, exit=True)

    hvd.init()
    r = hvd.rank()
    out: dict = {"errors": {}}
    for check in (collectives, broadcasts, optimizers):
        try:
            out.update(check(hvd, r))
        except Exception:  # noqa: BLE001 - reported to the test, which names the check
            out["errors"][check.__name__] = traceback.format_exc()
    hvd.shutdown()
    out["after_shutdown"] = hvd.is_initialized()
    torch.save(out, f"{folder}/rank{r}.pt")


if __name__ == "__main__":
    main(sys.argv[1])
