"""Delta column mapping read in place: the files hold columns under physical names (and
Parquet field ids), the table presents its own names, partition values come from the log;
against deltalake's own scan. A file whose field id is not the table's is refused."""
from __future__ import annotations

import numpy as np
import pytest

from sparkddl.data import DataSpec
from sparkddl.data.arrow_source import read_sub_shard
from sparkddl.data.local import read_rows
from sparkddl.data.source import prepare_parquet, prepare_table
from sparkddl.errors import DataError
from sparkddl.tables.delta import delta_table
from tests.delta_build import DeltaBuilder
from tests.unit.tables.test_masks import oracle, table_of

SPEC = DataSpec.of(["x", "part"], ["label"])


@pytest.mark.parametrize("mode", ["name", "id"])
def test_a_column_mapped_table_is_read_by_its_own_names(tmp_path, mode):
    t = DeltaBuilder(tmp_path / "d", column_mapping=mode, partition_columns=("part",))
    first = t.add_file(table_of(0, 50, {1, 30}), partition={"part": 1}, row_group_size=20)
    t.add_file(table_of(100, 30), partition={"part": 2})
    t.delete({first: [1, 30]})  # and deletion vectors with it
    expected = oracle(tmp_path / "d")
    assert len(expected) == 78
    listing = delta_table(str(tmp_path / "d"))
    assert {name for name, physical, _ in listing.renames} == {"x", "label", "part"}
    assert all(physical.startswith("col-") for _, physical, _ in listing.renames)
    data = prepare_parquet(str(tmp_path / "d"), SPEC, num_workers=2, batch_size=4)
    rows = read_rows(data.train)
    assert sorted(rows["x"].tolist()) == expected and (rows["label"] >= 0).all()
    assert (rows["part"] == np.where(rows["x"] < 100, 1, 2)).all()
    # a validation column read by the table's name; labels measured under it too
    split = prepare_table(str(tmp_path / "d"), SPEC, num_workers=2, batch_size=4,
                          validation=0.25, seed=1, table=listing)
    assert split.label_range("label") == (0, 9)
    plan = split.train.plan(2, 4, seed=2)
    seen = [x for r in range(2) for tb in read_sub_shard(plan, r, 0, 0, 1)
            for x in tb.column("x").to_pylist()]
    val = read_rows(split.val)["x"].tolist()
    assert sorted(seen + val) == expected and len(seen) == split.train.rows


def test_a_file_whose_field_id_is_not_the_tables_is_refused(tmp_path):
    t = DeltaBuilder(tmp_path / "d", column_mapping="id")
    t.add_file(table_of(0, 50))
    odd = t.add_file(table_of(50, 50), field_ids={"x": 9})  # e.g. a column dropped, re-added
    with pytest.raises(DataError, match=rf"column 'x' of the table is field id 1, and .*"
                                        rf"{odd}.* holds field id 9"):
        prepare_parquet(str(tmp_path / "d"), DataSpec.of(["x"], ["label"]), num_workers=2,
                        batch_size=4)


def test_column_mapping_as_deltalake_writes_it_with_and_without_the_feature(tmp_path):
    """deltalake writes a mapped table at reader version 2 (files by physical names); with
    deletion vectors enabled too, at version 3 without the columnMapping feature, which
    leaves the mode unused (files by the columns' own names). Both read as deltalake does."""
    import pyarrow as pa
    from deltalake import write_deltalake
    ids = np.arange(40)
    data = pa.table({"x": ids.astype(np.float64), "label": ids % 10})
    for name, extra in (("v2", {}), ("v3", {"delta.enableDeletionVectors": "true"})):
        write_deltalake(str(tmp_path / name), data,
                        configuration={"delta.columnMapping.mode": "name", **extra})
        listing = delta_table(str(tmp_path / name))
        assert bool(listing.renames) == (name == "v2")
        rows = read_rows(prepare_parquet(str(tmp_path / name), DataSpec.of(["x"], ["label"]),
                                         num_workers=2, batch_size=4).train)
        assert sorted(rows["x"].tolist()) == oracle(tmp_path / name) == ids.tolist()
