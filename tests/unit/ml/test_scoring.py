"""transform's column UDFs on the executor side: Arrow columns to float rows without a
Python object per row, one forward pass shared by the output columns of a batch, and each
output derived as pyspark.ml gives it."""
from __future__ import annotations

from types import SimpleNamespace

import numpy as np
import pandas as pd
import pyarrow as pa
import pytest
import torch

from sparkddl.export.portable import outputs
from sparkddl.ml.scoring import (
    PREDICTION,
    PROBABILITY,
    RAW,
    _packing,
    _to_arrow,
    arrow_column,
    derive,
    scorer,
)
from sparkddl.problems import Problem


def test_array_columns_become_float_rows_as_the_pandas_path_makes_them():
    rows = np.arange(24, dtype=np.float32).reshape(6, 4)
    listed = pa.array(list(rows), pa.list_(pa.float32()))
    for values in (listed, listed.slice(2, 3),  # a slice: its offsets start past 0
                   pa.FixedSizeListArray.from_arrays(pa.array(rows.reshape(-1)), 4),
                   pa.chunked_array([listed.slice(0, 2), listed.slice(2, 4)])):
        got = arrow_column(values, [2, 2], "x")
        want = rows[2:5] if len(values) == 3 else rows
        assert got.dtype == np.float32 and got.shape == (len(want), 2, 2)
        assert np.array_equal(got.reshape(len(want), 4), want)
    assert arrow_column(pa.array([1.5, None, 3.0]), None, "s").tolist()[1] != \
        arrow_column(pa.array([1.5, None, 3.0]), None, "s").tolist()[1]  # null -> NaN


@pytest.mark.parametrize("values, match", [
    (pa.array([[1.0, 2.0], None], pa.list_(pa.float32())), "1 null row"),
    (pa.array([[1.0, 2.0], [1.0]], pa.list_(pa.float32())), "unequal length .1 to 2"),
    (pa.array([[1.0, 2.0, 3.0]], pa.list_(pa.float32())), "3 value.s. per row; the model takes 2"),
])
def test_bad_feature_columns_are_named(values, match):
    with pytest.raises(ValueError, match=f"feature column 'x'.*{match}"):
        arrow_column(values, [2], "x")


@pytest.mark.parametrize("kind, width", [(Problem.MULTICLASS, 3), (Problem.BINARY, 1),
                                         (Problem.REGRESSION, 1), (Problem.REGRESSION, 2)])
def test_each_output_column_is_what_the_whole_output_gives(kind, width):
    """derive() per field agrees with outputs(), which the MLflow flavor and the transformFn
    path use: the same predictions whichever path scores."""
    out = torch.randn(7, width)
    whole = outputs(kind, out)
    for field, values in whole.items():
        got = derive(kind, field, out)
        assert np.allclose(got, np.stack(values) if isinstance(values, list) else values)


class Counting(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.linear = torch.nn.Linear(4, 3)
        self.calls = 0

    def forward(self, x):
        self.calls += 1
        return self.linear(x)


def test_the_output_columns_of_one_batch_share_one_forward_pass():
    torch.manual_seed(0)
    net = Counting().eval()
    payload = SimpleNamespace(value=SimpleNamespace(module=lambda where: net))
    score = scorer(payload, ["x"], Problem.MULTICLASS, 1024, {"x": [4]}, "cpu", False, True)
    batch = (pa.array(list(np.random.default_rng(0).random((5, 4), np.float32)),
                      pa.list_(pa.float32())),)
    pred, prob, raw = (score(f, batch) for f in (PREDICTION, PROBABILITY, RAW))
    assert net.calls == 1  # one forward pass for the three columns
    assert np.array_equal(pred, prob.argmax(1)) and np.allclose(prob.sum(1), 1)
    assert np.array_equal(pred, raw.argmax(1))
    again = (pa.array(batch[0].to_pylist(), pa.list_(pa.float32())),)  # equal, not the same
    assert np.array_equal(score(PREDICTION, again), pred) and net.calls == 2
    # Spark's Arrow UDFs each get a new wrapper of the batch's column: one pass still
    record = pa.RecordBatch.from_arrays([pa.array(batch[0].to_pylist(), batch[0].type),
                                         pa.array(range(5))], ["x", "id"])
    for field in (PREDICTION, PROBABILITY, RAW):
        score(field, (record.column(0),))
    assert net.calls == 3
    score(PREDICTION, (record.column(0).slice(1),))  # other rows of the same memory
    assert net.calls == 4
    pandas = scorer(payload, ["x"], Problem.MULTICLASS, 2, {"x": [4]}, "cpu", False, False)
    assert np.array_equal(pandas(PREDICTION, (pd.Series(batch[0].to_pylist()),)), pred)


def test_two_models_scoring_one_batch_each_run_their_own_pass():
    """Two models' UDFs in one projection get the same batch: neither takes the other's
    output for its own."""
    first, second = Counting().eval(), Counting().eval()
    scores = [scorer(SimpleNamespace(value=SimpleNamespace(module=lambda where, n=net: n)),
                     ["x"], Problem.MULTICLASS, 1024, {"x": [4]}, "cpu", False, True)
              for net in (first, second)]
    batch = (pa.array(list(np.random.default_rng(1).random((5, 4), np.float32)),
                      pa.list_(pa.float32())),)
    raws = [score(RAW, batch) for score in scores]
    assert first.calls == second.calls == 1
    with torch.no_grad():
        assert np.allclose(raws[1], second(torch.from_numpy(
            arrow_column(batch[0], [4], "x"))).numpy())


def test_array_outputs_go_back_as_arrow_lists_of_the_rows():
    values = np.arange(6, dtype=np.float64).reshape(3, 2)
    assert _to_arrow(values).to_pylist() == values.tolist()
    assert _to_arrow(values[:, 0]).to_pylist() == [0.0, 2.0, 4.0]


def test_a_packed_output_of_another_width_is_named_with_the_fix():
    rows = np.zeros((3, 5))
    packing = _packing(lambda field, columns: rows, PROBABILITY, 4)
    with pytest.raises(ValueError, match="gives 5 value.s. a row for its probability where it "
                                         "gave 4 when it was trained.*fit it again"):
        packing(pd.Series([1.0, 2.0, 3.0]))
    frame = _packing(lambda field, columns: rows, PROBABILITY, 5)(pd.Series([1.0, 2.0, 3.0]))
    assert list(frame.columns) == ["_0", "_1", "_2", "_3", "_4"] and frame.shape == (3, 5)
