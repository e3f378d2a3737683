"""The driver's streamed reads, and a rank's share of a validation split: the training
shards' row ranges (equal to a row), every row to exactly one rank, in batches of exactly
the size asked."""
from __future__ import annotations

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from sparkddl.data.dataset import Dataset
from sparkddl.data.local import batches, validation_batches
from sparkddl.data.plan import shard_pieces
from sparkddl.data.schema import ColumnSpec

COLUMNS = (ColumnSpec("id", "extra", "scalar", "int64"),
           ColumnSpec("x", "feature", "scalar", "float32"))


@pytest.fixture
def dataset(tmp_path) -> Dataset:
    sizes, start = [7, 30, 1, 12, 25], 0
    with pq.ParquetWriter(tmp_path / "part-0.parquet",
                          pa.schema([("id", pa.int64()), ("x", pa.float32())])) as w:
        for n in sizes:
            ids = np.arange(start, start + n)
            w.write_table(pa.table({"id": ids, "x": ids.astype(np.float32)}),
                          row_group_size=n)
            start += n
    return Dataset(f"file://{tmp_path}", COLUMNS, tuple(sizes))


@pytest.mark.parametrize("world", [1, 2, 3])
def test_every_row_in_exactly_one_ranks_share(dataset, world):
    shares = [np.concatenate([b["id"] for b in batches(dataset, 8, r, world)])
              for r in range(world)]
    assert sorted(np.concatenate(shares).tolist()) == list(range(75))
    bounds = np.cumsum([0, 7, 30, 1, 12, 25])
    pieces = shard_pieces(dataset.row_groups, world)
    for r, ids in enumerate(shares):  # rank r: the rows of its pieces, 75 // world (+1)
        assert len(ids) in (75 // world, 75 // world + 1)
        assert sorted(ids.tolist()) == sorted(
            i for p in pieces[r] for i in range(bounds[p.group] + p.start,
                                                bounds[p.group] + p.stop))


def test_validation_batches_are_tensors_of_the_size_asked(dataset):
    out = list(validation_batches(dataset, None, (), "here", 1, 2, size=10))
    assert [len(b["id"]) for b in out] == [10, 10, 10, 7]  # 37 of 75 rows for rank 1 of 2
    assert all(b["x"].dtype.is_floating_point for b in out)
