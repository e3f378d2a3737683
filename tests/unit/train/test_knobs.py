"""The optimizer step's knobs and the loss computation, without Spark."""
from __future__ import annotations

import pytest
import torch

from sparkddl.errors import ConfigError
from sparkddl.fit.callbacks import Callbacks
from sparkddl.strategies.base import Strategy
from sparkddl.train.optimization import (
    OptimizerStep,
    autocast,
    check_scheduler,
    optimizer_steps,
    scaler,
    scheduler_recipe,
)
from sparkddl.train.steps import LossFn, loss_fn
from tests.stacks import needs_gpu


def _optimizer(lr: float = 0.1):
    torch.manual_seed(0)
    model = torch.nn.Linear(4, 3)
    return model, torch.optim.SGD(model.parameters(), lr=lr)


def test_clipping_bounds_the_norm_and_the_values_before_the_step():
    model, opt = _optimizer()
    params = list(model.parameters())
    for p in params:
        p.grad = torch.full_like(p, 10.0)
    before = torch.sqrt(sum((p.grad ** 2).sum() for p in params)).item()
    step = OptimizerStep(opt, Strategy(), params, clip_norm=1.0, clip_value=None,
                         grad_scaler=None)
    start = [p.detach().clone() for p in params]
    step.step()
    assert step.last_norm == pytest.approx(before)
    moved = torch.sqrt(sum(((p - s) ** 2).sum() for p, s in zip(params, start))).item()
    assert moved == pytest.approx(0.1 * 1.0, rel=1e-4)  # lr x the clipped norm
    for p in params:
        p.grad = torch.full_like(p, -3.0)
    OptimizerStep(opt, Strategy(), params, None, 0.5, None).step()
    assert all((p.grad == -0.5).all() for p in params)


@pytest.mark.parametrize("name, options, interval, expected", [
    ("step", {"step_size": 2, "gamma": 0.5}, "epoch", [0.1, 0.1, 0.05, 0.05]),
    ("exponential", {"gamma": 0.5}, "epoch", [0.1, 0.05, 0.025, 0.0125]),
    ("cosine", {}, "epoch", [0.1, 0.1 * (1 + 0.5 ** 0.5) / 2, 0.05, 0.1 * (1 - 0.5 ** 0.5) / 2]),
])
def test_named_schedules_follow_their_formula(name, options, interval, expected):
    _, opt = _optimizer()
    sched = scheduler_recipe(name, options, interval).build(opt, epochs=4,
                                                             optimizer_steps_per_epoch=10)
    seen = []
    for _ in range(4):
        seen.append(opt.param_groups[0]["lr"])
        opt.step()
        sched.step()
    assert seen == pytest.approx(expected)


def test_onecycle_spans_the_whole_fit_in_optimizer_steps():
    _, opt = _optimizer()
    recipe = scheduler_recipe("onecycle", {}, "step")
    sched = recipe.build(opt, epochs=3, optimizer_steps_per_epoch=optimizer_steps(21, 2))
    assert sched.total_steps == 3 * 11


def test_scheduler_mistakes_are_config_errors():
    _, opt = _optimizer()
    with pytest.raises(ConfigError, match="unknown lrScheduler 'saw'"):
        scheduler_recipe("saw", {}, "epoch")
    with pytest.raises(ConfigError, match="ReduceLROnPlateau needs a metric"):
        check_scheduler(scheduler_recipe(torch.optim.lr_scheduler.ReduceLROnPlateau, {},
                                         "epoch"), opt, 3, 1)
    with pytest.raises(ConfigError, match="returned a int, not a torch LR scheduler"):
        check_scheduler(scheduler_recipe(lambda o: 3, {}, "epoch"), opt, 3, 1)


def test_bf16_autocast_runs_linear_layers_in_bfloat16_on_cpu():
    model = torch.nn.Linear(4, 2)
    with autocast("bf16-mixed", torch.device("cpu")):
        out = model(torch.randn(3, 4))
    assert out.dtype == torch.bfloat16 and model.weight.dtype == torch.float32
    with pytest.raises(ConfigError, match="'16-mixed' needs a CUDA device"):
        autocast("16-mixed", torch.device("cpu"))


def test_sample_weights_weight_the_per_row_loss():
    fn = loss_fn(torch.nn.CrossEntropyLoss(), ("x",), ("y",), "w", None)
    model = torch.nn.Identity()
    logits = torch.tensor([[5.0, 0.0], [0.0, 5.0], [5.0, 0.0]])
    batch = {"x": logits, "y": torch.tensor([0, 0, 1]), "w": torch.tensor([1.0, 0.0, 1.0])}
    loss, _, _ = fn(model, batch)
    rows = torch.nn.functional.cross_entropy(logits, batch["y"], reduction="none")
    assert loss.item() == pytest.approx(((rows[0] + rows[2]) / 2).item())


def test_several_labels_sum_their_losses_and_need_one_output_each():
    fn = LossFn(("x",), ("a", "b"), (torch.nn.MSELoss(), torch.nn.L1Loss()))
    batch = {"x": torch.zeros(2, 1), "a": torch.ones(2, 1), "b": torch.full((2, 1), 3.0)}
    loss, out, target = fn(lambda x: (x, x), batch)
    assert loss.item() == pytest.approx(1.0 + 3.0) and target is batch["a"]
    with pytest.raises(ConfigError, match="must return a tuple of 2 outputs.*got a Tensor"):
        fn(lambda x: x, batch)


def test_callbacks_need_a_hook_and_their_errors_do_not_stop_training():
    with pytest.raises(ConfigError, match="has none of the hooks"):
        Callbacks([object()])

    class Bad:
        def on_epoch_end(self, row):
            raise ValueError("boom")

    class Stop:
        def on_epoch_end(self, row):
            return row["epoch"] == 2

    cbs = Callbacks([Bad(), Stop()])
    assert cbs.epoch_end({"epoch": 1}) is False
    assert cbs.epoch_end({"epoch": 2}) is True  # the failing one does not silence the other
    assert cbs.errors == ["callback Bad.on_epoch_end: ValueError: boom"] * 2
    assert Callbacks(Stop()).epoch_end({"epoch": 2}) is True


def test_a_callback_that_fails_the_fit_raises_its_own_error_naming_it():
    class Gate:
        def on_fit_start(self, estimator):
            raise RuntimeError("refused to start")

    with pytest.raises(RuntimeError, match="refused to start") as info:
        Callbacks([Gate()]).fit_start(None)
    assert info.value.__notes__ == [
        "(raised by callback Gate.on_fit_start, which sparkddl ran on the driver)"]


@needs_gpu
@pytest.mark.timeout(60)
def test_fp16_mixed_on_cuda_scales_the_loss_and_steps_in_float32():
    dev = torch.device("cuda")
    torch.manual_seed(0)
    model = torch.nn.Linear(8, 2).to(dev)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    grad_scaler = scaler("16-mixed")
    step = OptimizerStep(opt, Strategy(), list(model.parameters()), 1.0, None, grad_scaler)
    before = model.weight.detach().clone()
    with autocast("16-mixed", dev):
        out = model(torch.randn(4, 8, device=dev))
        loss = torch.nn.functional.cross_entropy(out, torch.tensor([0, 1, 0, 1], device=dev))
    assert out.dtype == torch.float16 and model.weight.dtype == torch.float32
    grad_scaler.scale(loss).backward()
    step.step()
    assert step.last_norm is not None and step.last_norm < 1e4  # unscaled before clipping
    assert not torch.equal(model.weight, before) and grad_scaler.get_scale() > 1
