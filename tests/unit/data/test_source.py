"""Existing Parquet datasets used in place: their row groups, plans and fingerprints. No Spark."""
from __future__ import annotations

import os

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from sparkddl.data.reader import epoch_batches
from sparkddl.data.schema import DataSpec
from sparkddl.data.source import open_parquet, prepare_parquet
from sparkddl.errors import DataError
from tests.stacks import needs_petastorm

SPEC = DataSpec.of("x", "y")


def _table(ids: np.ndarray) -> pa.Table:
    return pa.table({"x": ids.astype(np.float32), "y": ids.astype(np.int64)})


def _write(path, sizes: list[int], start: int = 0) -> None:
    """One file with row groups of the given sizes (none: an empty table); ids count up."""
    with pq.ParquetWriter(path, _table(np.arange(0)).schema) as w:
        for size in sizes or [0]:
            w.write_table(_table(np.arange(start, start + size)))
            start += size


@pytest.fixture
def with_empty_file(tmp_path) -> str:
    root = tmp_path / "data"
    root.mkdir()
    _write(root / "part-0.parquet", [20, 30])
    _write(root / "part-1.parquet", [])  # pyarrow writes one row group of 0 rows
    _write(root / "part-2.parquet", [30, 20], start=50)
    (root / "_SUCCESS").write_text("")
    return f"file://{root}"


@pytest.mark.parametrize("reader", [pytest.param("petastorm", marks=needs_petastorm), "arrow"])
def test_empty_files_count_in_the_plan_as_the_readers_count_them(with_empty_file, reader):
    dataset = open_parquet(with_empty_file, SPEC)
    assert dataset.row_groups == (20, 30, 0, 30, 20)
    plan = dataset.plan(2, 10, reader=reader)
    # rows are shared, not row groups: the empty one holds none of them
    assert plan.rows_per_rank == (50, 50) and plan.steps_per_epoch == 5
    assert all(p.group != 2 for r in range(2) for p in plan.pieces(r))
    ids = []
    for rank in range(2):
        batches = list(epoch_batches(plan, rank, 0))
        assert len(batches) == plan.steps_per_epoch
        ids += [i for b in batches for i in b["y"].tolist()]
    assert len(ids) == len(set(ids)) == plan.rows_per_epoch


def test_a_dataset_of_empty_files_is_refused(tmp_path):
    _write(tmp_path / "part-0.parquet", [])
    with pytest.raises(DataError, match=r"no Parquet rows under file://"):
        open_parquet(f"file://{tmp_path}", SPEC)


def test_too_few_rows_for_one_global_batch_is_refused(with_empty_file):
    with pytest.raises(DataError, match=r"100 training rows are fewer than num_workers × "
                                        r"batch_size = 4 × 32"):
        prepare_parquet(with_empty_file, SPEC, num_workers=4, batch_size=32)


def test_fingerprint_changes_when_a_data_file_is_rewritten(with_empty_file, tmp_path):
    def fingerprint(**validation: str) -> str:
        return prepare_parquet(with_empty_file, SPEC, num_workers=2, batch_size=10,
                               **validation).fingerprint

    first = fingerprint()
    (tmp_path / "data" / "_SUCCESS").write_text("not data")
    assert fingerprint() == first  # nothing read changed
    part = tmp_path / "data" / "part-2.parquet"
    stat = part.stat()
    os.utime(part, ns=(stat.st_atime_ns, stat.st_mtime_ns + 1_000_000_000))
    touched = fingerprint()
    assert touched != first  # same size, newer: it may hold other rows
    _write(part, [30, 21], start=50)
    assert fingerprint() not in (first, touched)

    val = tmp_path / "val"
    val.mkdir()
    _write(val / "part-0.parquet", [10])
    assert fingerprint(validation_url=f"file://{val}") != fingerprint()


def test_a_dotted_column_name_is_checked_as_one_column(tmp_path):
    root = tmp_path / "data"
    root.mkdir()
    values = pa.array([1.0, None] * 32, pa.float32())
    pq.write_table(pa.table({"f.x": values, "y": np.arange(64)}), root / "part-0.parquet")
    with pytest.raises(DataError, match=r"null values in 'f\.x' \(32 rows\)"):
        open_parquet(f"file://{root}", DataSpec.of("f.x", "y"))


def test_a_file_rewritten_with_float_labels_after_planning_is_refused_by_the_reader(tmp_path):
    root = tmp_path / "data"
    root.mkdir()
    for i in range(2):
        _write(root / f"part-{i}.parquet", [32], start=32 * i)
    prepared = prepare_parquet(f"file://{root}", SPEC, num_workers=1, batch_size=8)
    ids = np.arange(32, 64)  # the same rows, the labels now 0.5 apart: 3.5 must not read as 3
    pq.write_table(pa.table({"x": ids.astype(np.float32), "y": ids + 0.5}),
                   root / "part-1.parquet")
    plan = prepared.train.plan(1, 8, reader="arrow")
    with pytest.raises(DataError, match=r"column 'y' of .*part-1\.parquet .* is double, where "
                                        r"the fit was planned for integers"):
        list(epoch_batches(plan, 0, 0))
