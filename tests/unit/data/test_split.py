"""The validation split of tables read in place: a selection of rows inside every row group,
reproducible, complementary, and identical wherever it is applied."""
from __future__ import annotations

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from sparkddl.data.local import batches, read_rows
from sparkddl.data.schema import DataSpec
from sparkddl.data.source import prepare_table
from sparkddl.data.split import Selection, fraction_rows
from sparkddl.errors import DataError
from sparkddl.store import Store
from sparkddl.tables.parquet import check_unchanged


def table_dir(tmp_path, files: int = 3, rows: int = 900, group: int = 100) -> str:
    folder = tmp_path / "t"
    folder.mkdir()
    for f in range(files):
        ids = np.arange(f * rows, (f + 1) * rows)
        pq.write_table(pa.table({"x": ids.astype(np.float32), "id": ids, "flag": ids % 4 == 0}),
                       folder / f"part-{f}.parquet", row_group_size=group)
    return str(folder)


def test_fraction_draws_depend_on_seed_file_and_row_group_only():
    a = fraction_rows(0.3, 1, "/t", "/t/a.parquet", 2, 1000)
    assert (a == fraction_rows(0.3, 1, "/elsewhere", "/elsewhere/a.parquet", 2, 1000)).all()
    assert not (a == fraction_rows(0.3, 2, "/t", "/t/a.parquet", 2, 1000)).all()
    assert not (a == fraction_rows(0.3, 1, "/t", "/t/a.parquet", 3, 1000)).all()
    assert 250 < a.sum() < 350


@pytest.mark.parametrize("validation", [0.25, "flag"])
def test_train_and_validation_sides_are_complementary_and_counted_exactly(tmp_path, validation):
    url = table_dir(tmp_path)
    data = prepare_table(url, DataSpec.of("x", extra="id"), num_workers=2, batch_size=8,
                         validation=validation, seed=9)
    train, val = read_rows(data.train)["id"], read_rows(data.val)["id"]
    assert sorted(np.concatenate([train, val]).tolist()) == list(range(2700))
    assert (len(train), len(val)) == (data.train.rows, data.val.rows)
    assert sum(data.train.row_groups) + sum(data.val.row_groups) == 2700
    if validation == "flag":
        assert sorted(val.tolist()) == list(range(0, 2700, 4))
    # batches of a fixed size whatever the row-group boundaries, in read order
    cut = np.concatenate([b["id"] for b in batches(data.val, 64)])
    assert (cut == val).all()
    assert [len(b["id"]) for b in batches(data.val, 64)][:-1] == [64] * (len(val) // 64)


def test_a_split_that_selects_nothing_is_refused(tmp_path):
    url = table_dir(tmp_path, files=1, rows=300)
    with pytest.raises(DataError, match="selected no rows"):
        prepare_table(url, DataSpec.of("x"), num_workers=1, batch_size=8, validation=1e-9,
                      seed=0)


def test_a_table_of_one_row_group_is_shared_by_row_ranges_in_place(tmp_path):
    url = table_dir(tmp_path, files=1, rows=900, group=900)  # one row group for two ranks
    data = prepare_table(url, DataSpec.of("x"), num_workers=2, batch_size=8, validation=None,
                         seed=0)
    assert data.in_place
    plan = data.train.plan(2, 8)
    assert [[(p.group, p.start, p.stop) for p in plan.pieces(r)] for r in range(2)] == \
        [[(0, 0, 450)], [(0, 450, 900)]]


def test_changed_added_and_removed_files_are_named(tmp_path):
    url = table_dir(tmp_path)
    store = Store.from_uri(url)
    fs, root = store.filesystem(), store.fs_path(url)
    data = prepare_table(url, DataSpec.of("x"), num_workers=2, batch_size=8, validation=None,
                         seed=0)
    check_unchanged(fs, root, data.train.files, "here")  # unchanged: no error
    pq.write_table(pa.table({"x": np.zeros(5, np.float32)}), f"{root}/part-9.parquet")
    (tmp_path / "t" / "part-0.parquet").unlink()
    with pytest.raises(DataError, match=r"here: the Parquet table at .* changed after the fit "
                                        r"planned it \(removed: .*part-0.parquet; added: "
                                        r".*part-9.parquet\)"):
        check_unchanged(fs, root, data.train.files, "here")


def test_selection_keeps_only_the_requested_columns():
    table = pa.table({"x": [1.0, 2.0], "flag": [True, False]})
    sel = Selection("train", column="flag")
    assert sel.read_columns(["x"]) == ["x", "flag"]
    out = sel.apply("/t", "/t/a", 0, table, ["x"])
    assert out.column_names == ["x"] and out.column("x").to_pylist() == [2.0]


@pytest.mark.parametrize("validation", [0.25, "flag"])
def test_streaming_a_row_group_in_parts_selects_the_same_rows(tmp_path, monkeypatch,
                                                             validation):
    from sparkddl.data import local
    url = table_dir(tmp_path)
    data = prepare_table(url, DataSpec.of("x", extra="id"), num_workers=2, batch_size=8,
                         validation=validation, seed=3)
    whole = {side.selection.take: read_rows(side) for side in (data.train, data.val)}
    monkeypatch.setattr(local, "STREAM_ROWS", 7)  # row groups of 100 rows read 7 at a time
    for side in (data.train, data.val):
        parts = read_rows(side)
        assert (parts["id"] == whole[side.selection.take]["id"]).all()
        streamed = np.concatenate([b["id"] for b in batches(side, 16)])
        assert (streamed == parts["id"]).all()


def test_a_table_with_many_row_groups_splits_by_whole_groups_and_skips_the_rest(tmp_path,
                                                                                  monkeypatch):
    url = table_dir(tmp_path)  # 27 row groups of 100 rows
    data = prepare_table(url, DataSpec.of("x", extra="id"), num_workers=2, batch_size=8,
                         validation=0.3, seed=4)
    assert data.val.selection.groups and data.train.selection.groups
    held = [r for r in data.val.row_groups if r]
    assert set(held) == {100} and abs(sum(held) - 0.3 * 2700) <= 50  # whole groups, 30 %
    assert [t + v for t, v in zip(data.train.row_groups, data.val.row_groups)] == [100] * 27
    read: list[int] = []
    original = pq.ParquetFile.iter_batches

    def recording(self, *args, **kwargs):
        read.extend(kwargs.get("row_groups") or [])
        return original(self, *args, **kwargs)
    monkeypatch.setattr(pq.ParquetFile, "iter_batches", recording)
    val = read_rows(data.val)["id"]
    assert len(read) == len(held)  # the training side's row groups were not read
    assert sorted(set((val // 100).tolist())) == [i for i, r in enumerate(data.val.row_groups)
                                                  if r]
    again = prepare_table(url, DataSpec.of("x", extra="id"), num_workers=2, batch_size=8,
                          validation=0.3, seed=4)
    assert again.val.row_groups == data.val.row_groups  # reproducible


def test_a_table_with_few_row_groups_splits_per_row(tmp_path, caplog):
    url = table_dir(tmp_path, files=1, rows=900, group=100)  # 9 row groups
    with caplog.at_level("INFO", logger="sparkddl"):
        data = prepare_table(url, DataSpec.of("x", extra="id"), num_workers=2, batch_size=8,
                             validation=0.3, seed=4)
    assert not data.val.selection.groups
    assert all(0 < r < 100 for r in data.val.row_groups)  # rows chosen inside every group
    assert "split per row inside each row group: the table has 9 row group(s)" in caplog.text


def test_ranks_read_only_their_sides_whole_row_groups(tmp_path, monkeypatch):
    import torch

    from sparkddl.data.reader import epoch_batches
    url = table_dir(tmp_path)
    data = prepare_table(url, DataSpec.of("x", extra="id"), num_workers=2, batch_size=10,
                         validation=0.3, seed=4)
    plan = data.train.plan(2, 10, reader="arrow", reader_pool="dummy")
    read: list[int] = []
    original = pq.ParquetFile.read_row_group

    def recording(self, i, *args, **kwargs):
        read.append(i)
        return original(self, i, *args, **kwargs)
    monkeypatch.setattr(pq.ParquetFile, "read_row_group", recording)
    ids = torch.cat([b["id"] for r in range(2) for b in epoch_batches(plan, r, 0)]).tolist()
    train_groups = sum(1 for r in data.train.row_groups if r)
    # each training group once, no validation group; the one the two ranks share, twice
    shared = {p.group for p in plan.pieces(0)} & {p.group for p in plan.pieces(1)}
    assert len(shared) <= 1 and len(read) == train_groups + len(shared)
    val_groups = {i for i, r in enumerate(data.val.row_groups) if r}
    assert not {i // 100 for i in ids} & val_groups
    assert len(ids) == len(set(ids)) >= 0.9 * data.train.rows  # equal steps drop a few
