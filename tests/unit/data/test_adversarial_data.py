"""Tables damaged before or during a fit, and validation settings out of range: sparkddl
errors naming the file or the value, not pyarrow's or a DataError for a bad argument.
No Spark."""
from __future__ import annotations

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from sparkddl.config import TrainConfig
from sparkddl.data.local import read_rows
from sparkddl.data.materialize import validation_setting
from sparkddl.data.reader import epoch_batches
from sparkddl.data.schema import DataSpec
from sparkddl.data.source import open_parquet, prepare_table
from sparkddl.errors import ConfigError, DataError
from tests.stacks import needs_petastorm

SPEC = DataSpec.of("x", "y")
FILES = 12


@pytest.fixture
def table(tmp_path):
    """12 files of 2 row groups of 50 rows."""
    root = tmp_path / "table"
    root.mkdir()
    for i in range(FILES):
        ids = np.arange(i * 100, (i + 1) * 100)
        pq.write_table(pa.table({"x": ids.astype(np.float32), "y": ids}),
                       root / f"part-{i:05d}.parquet", row_group_size=50)
    return root


def truncate(path) -> None:
    data = path.read_bytes()
    path.write_bytes(data[:len(data) // 2])


@pytest.mark.parametrize("damage", ["truncated", "not parquet"])
def test_a_damaged_part_file_is_named_when_the_table_is_planned(table, damage):
    bad = table / "part-00007.parquet"
    truncate(bad) if damage == "truncated" else bad.write_text("id,x\n1,2\n")
    for plan in (lambda url: open_parquet(url, SPEC),
                 lambda url: prepare_table(url, SPEC, num_workers=2, batch_size=10,
                                           validation=0.2, seed=0)):
        with pytest.raises(DataError) as info:
            plan(f"file://{table}")
        text = str(info.value)
        assert str(bad) in text and "cannot be read" in text
        assert "Repair or rewrite the table" in text
        assert isinstance(info.value.__cause__, (OSError, pa.ArrowException))


@pytest.mark.parametrize("reader", [pytest.param("petastorm", marks=needs_petastorm), "arrow"])
@pytest.mark.parametrize("when", ["during the epoch", "before the epoch"])
def test_a_part_file_deleted_under_the_fit_is_named_on_the_rank(table, tmp_path, reader, when):
    data = prepare_table(f"file://{table}", SPEC, num_workers=2, batch_size=10,
                         validation=None, seed=0)
    plan = data.train.plan(2, 10, reader=reader, reader_workers=1, reader_pool="dummy",
                           shuffle_buffer=0)
    batches = epoch_batches(plan, 0, 1)
    reading = int(next(batches)["y"][0]) // 100 if when == "during the epoch" else -1
    # a file of rank 0's pieces (row groups of 50 rows, 2 per file) it is not reading: with
    # no shuffle buffer and one reader thread it has read one piece so far
    files = sorted({p.group // 2 for p in plan.pieces(0)} - {reading})
    assert len(files) >= 2
    gone = table / f"part-{files[0]:05d}.parquet"
    gone.rename(tmp_path / "elsewhere.parquet")
    with pytest.raises(DataError) as info:
        list(batches)
    assert str(info.value).startswith("rank 0, epoch 1: ")
    assert str(gone) in str(info.value)


def test_a_part_file_deleted_before_the_driver_streams_it_is_named(table):
    data = prepare_table(f"file://{table}", SPEC, num_workers=2, batch_size=10,
                         validation=0.2, seed=0)
    gone = table / "part-00003.parquet"
    gone.unlink()
    with pytest.raises(DataError, match=str(gone)):
        read_rows(data.val)


@pytest.mark.parametrize("value", [1.5, 1, -0.1, True, ""])
def test_validation_out_of_range_is_a_config_error_naming_it(value):
    with pytest.raises(ConfigError) as info:
        TrainConfig(validation=value).validate()
    assert f"validation={value!r}" in str(info.value)
    assert "strictly between 0 and 1" in str(info.value)
    with pytest.raises(ConfigError, match=r"strictly between 0 and 1"):  # data.prepare's path
        validation_setting(value, {"y": "integral"})


@pytest.mark.parametrize("value", [None, 0, 0.2, "is_val"])
def test_validation_in_range_is_accepted(value):
    TrainConfig(validation=value).validate()
