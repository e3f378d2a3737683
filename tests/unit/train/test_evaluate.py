"""Evaluation in parts: sums and torchmetrics states accumulated apart (the tasks of
evaluation="cluster") and merged give the metrics of one pass over the whole split."""
from __future__ import annotations

import pytest
import torch

from sparkddl.train.evaluate import accumulate, evaluate, finish, merge_parts
from sparkddl.train.metrics import resolve_metrics
from sparkddl.train.steps import LossFn


def test_parts_merged_give_the_whole_split_s_metrics():
    torch.manual_seed(0)
    model = torch.nn.Linear(8, 4)
    step = LossFn(("x",), ("y",), (torch.nn.functional.cross_entropy,))
    metrics = resolve_metrics(["accuracy", "f1", "auroc"], "multiclass", 4)
    x, y = torch.randn(1000, 8), torch.randint(0, 4, (1000,))
    batches = [{"x": x[i:i + 96], "y": y[i:i + 96]} for i in range(0, 1000, 96)]
    whole = evaluate(model, step, metrics, batches)
    # three parts, dealt out as the tasks get row groups (i % parts), in batches of their own
    parts = [accumulate(model, step, metrics, batches[p::3]) for p in range(3)]
    merged = finish(*merge_parts(parts), metrics)
    assert set(merged) == {"val_loss", "val_accuracy", "val_f1", "val_auroc"}
    for k, v in whole.items():
        assert merged[k] == pytest.approx(v, rel=1e-6), k
    # a part without rows adds nothing
    empty = accumulate(model, step, metrics, [])
    again = finish(*merge_parts([accumulate(model, step, metrics, batches), empty]), metrics)
    assert again == pytest.approx(whole, rel=1e-9)
