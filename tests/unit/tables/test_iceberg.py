"""Iceberg tables read in place (no Spark): tables in a pyiceberg SqlCatalog on SQLite, whose
current snapshot's rows, as pyiceberg reads them (the oracle), are the rows sparkddl reads;
positional delete files are applied as row masks (deleted rows carry a poison label, -1);
equality delete files and renamed columns are refused, saying why.

pyiceberg 0.12 writes data files only with pyarrow >= 18; on the pinned stack (pyarrow 14)
the same rows are written by pyarrow and committed by pyiceberg (``add_files``, an overwrite
that replaces rewritten files), so the tables are Iceberg tables either way: files with
field ids in the first case, files matched through the table's name mapping in the second.
"""
from __future__ import annotations

import os
import pickle

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
import pytest

from sparkddl.data import DataSpec
from sparkddl.data.arrow_source import read_sub_shard
from sparkddl.data.local import read_rows
from sparkddl.data.source import prepare_table
from sparkddl.errors import DataError

pytest.importorskip("pyiceberg")

from sparkddl.tables.iceberg import iceberg_table, table_url

SPEC = DataSpec.of("a", "part", extra="id")
WRITES = int(pa.__version__.split(".")[0]) >= 18  # what pyiceberg 0.12's writer needs


def catalog(tmp_path):
    from pyiceberg.catalog.sql import SqlCatalog
    tmp_path.mkdir(parents=True, exist_ok=True)
    cat = SqlCatalog("t", uri=f"sqlite:///{tmp_path}/c.db", warehouse=tmp_path.as_uri())
    cat.create_namespace("ns")
    return cat


def rows(start: int, stop: int) -> pa.Table:
    ids = np.arange(start, stop)
    return pa.table({"id": ids, "a": ids.astype(np.float32), "part": ids % 3,
                     "tag": pa.array([f"t{i % 2}" for i in ids])})


def append(table, data: pa.Table, by_pyiceberg: bool = WRITES) -> None:
    """``data`` appended: by pyiceberg's writer, or as pyarrow files pyiceberg adds (one
    per partition, as add_files wants)."""
    if by_pyiceberg:
        table.append(data)
        return
    folder = os.path.join(table.location().removeprefix("file://"), "added")
    os.makedirs(folder, exist_ok=True)
    keys = sorted(set(zip(data["part"].to_pylist(), data["tag"].to_pylist()))) \
        if table.spec().fields else [None]
    paths = []
    for key in keys:
        part = data if key is None else data.filter(
            pc.and_(pc.equal(data["part"], key[0]), pc.equal(data["tag"], key[1])))
        path = os.path.join(folder, f"{len(os.listdir(folder)):05d}.parquet")
        pq.write_table(part, path, row_group_size=7)
        paths.append("file://" + path)
    table.add_files(paths)


def delete_from(table, at_least: int, by_pyiceberg: bool = WRITES) -> None:
    """The rows with ``id >= at_least`` deleted copy-on-write: by pyiceberg, or by
    replacing each file that has such rows with a file of the others."""
    from pyiceberg.expressions import GreaterThanOrEqual
    if by_pyiceberg:
        table.delete(GreaterThanOrEqual("id", at_least))
        return
    from pyiceberg.io.pyarrow import parquet_file_to_data_file
    with table.transaction() as tx, tx.update_snapshot().overwrite() as overwrite:
        for task in table.scan().plan_files():
            path = task.file.file_path.removeprefix("file://")
            data = pq.read_table(path)
            kept = data.filter(pc.less(data["id"], at_least))
            if kept.num_rows == data.num_rows:
                continue
            overwrite.delete_data_file(task.file)
            if kept.num_rows:
                pq.write_table(kept, path.replace(".parquet", "-cow.parquet"))
                overwrite.append_data_file(parquet_file_to_data_file(
                    tx._table.io, tx.table_metadata, "file://" + path.replace(".parquet",
                                                                               "-cow.parquet")))


def build(tmp_path, partitioned: bool = True):
    """A table of three appends and a copy-on-write delete (the first appends' files stay on
    disk, not in the current snapshot), identity-partitioned by part and tag."""
    cat = catalog(tmp_path)
    table = cat.create_table("ns.t", schema=rows(0, 1).schema)
    if partitioned:
        with table.update_spec() as spec:
            spec.add_identity("part")
            spec.add_identity("tag")
    for start in (0, 100, 250):
        append(table, rows(start, start + 120))
    delete_from(table, 300)
    return cat.load_table("ns.t")


def oracle(table) -> list[tuple]:
    got = table.scan().to_arrow()
    return sorted(zip(got["id"].to_pylist(), got["a"].to_pylist(), got["part"].to_pylist()))


def read(table, spec=SPEC, **options) -> list[tuple]:
    listing = iceberg_table(table)
    prepared = prepare_table(table_url(table, listing), spec, num_workers=2, batch_size=4,
                             validation=None, seed=0, table=listing, **options)
    got = read_rows(prepared.train)
    return sorted(zip(got["id"].tolist(), got["a"].tolist(), got["part"].tolist()))


def on_disk(table) -> int:
    return sum(f.endswith(".parquet") for _, _, fs in
               os.walk(table.location().removeprefix("file://")) for f in fs)


@pytest.mark.parametrize("partitioned", [True, False])
def test_the_current_snapshot_is_read_in_place_as_pyiceberg_reads_it(tmp_path, partitioned):
    table = build(tmp_path, partitioned)
    expected = oracle(table)
    # ids 100..119 are in two appends: both files' rows
    assert [i for i, _, _ in expected] == sorted([*range(120), *range(100, 220), *range(250, 300)])
    listing = iceberg_table(table)
    assert list(listing.paths) == sorted(listing.paths)
    assert on_disk(table) > len(listing.paths)  # the deleted rows' files are still there
    assert read(table) == expected
    if partitioned:
        assert listing.columns == ("part", "tag") and listing.types == ("int64", "string")
        assert {(v[0], v[1]) for v in listing.values} == {(p, f"t{t}") for p in range(3)
                                                          for t in range(2)}
    else:
        assert listing.columns == ()


def test_partition_values_come_from_the_manifests(tmp_path):
    """The listing's partition values are the table's, not read from the files: a file
    written as another partition's would show it."""
    table = build(tmp_path)
    listing = iceberg_table(table)
    for path, values in zip(listing.paths, listing.values):
        data = pq.ParquetFile(path).read(columns=["part", "tag"])  # the file alone
        assert set(data["part"].to_pylist()) == {values[0]}
        assert set(data["tag"].to_pylist()) == {values[1]}


@pytest.mark.skipif(not WRITES, reason="pyiceberg 0.12 writes with pyarrow >= 18 only")
def test_merge_on_read_asked_for_is_written_copy_on_write_and_read_in_place(tmp_path):
    table = build(tmp_path)
    with table.transaction() as tx:
        tx.set_properties({"write.delete.mode": "merge-on-read"})
    with pytest.warns(UserWarning, match="falling back to copy-on-write"):
        delete_from(table, 50)
    assert all(not t.delete_files for t in table.scan().plan_files())
    assert read(table) == oracle(table)
    assert max(i for i, _, _ in oracle(table)) == 49


def commit_delete_file(table, content: str, positions: dict[str, list[int]] | None = None,
                       name: str = "", bounds: bool = True) -> None:
    """A delete file as other writers (Spark, Flink) write them with merge-on-read, committed
    by pyiceberg: positional (``positions`` by data file path as the manifests write it,
    else the first file's rows 1 and 4) or equality (id == 3). Without ``bounds`` (of
    file_path, as Spark writes them) a positional delete file applies to every data file."""
    from pyiceberg.manifest import DataFile, DataFileContent, FileFormat
    first = sorted(table.scan().plan_files(), key=lambda t: t.file.file_path)[0].file
    path = os.path.join(table.location().removeprefix("file://"),
                        f"{name or content}-deletes.parquet")
    if content == "position":
        ids = {b"PARQUET:field_id": b"2147483546"}, {b"PARQUET:field_id": b"2147483545"}
        schema = pa.schema([pa.field("file_path", pa.string(), False, ids[0]),
                            pa.field("pos", pa.int64(), False, ids[1])])
        pairs = sorted((f, p) for f, ps in (positions or {first.file_path: [1, 4]}).items()
                       for p in ps)  # sorted by file_path and pos, as the spec asks
        deletes = pa.table({"file_path": [f for f, _ in pairs], "pos": [p for _, p in pairs]},
                           schema=schema)
        # the bounds of file_path, as Spark writes them: pyiceberg applies the delete file
        # to the data files between them only
        kind, extra = DataFileContent.POSITION_DELETES, {
            "lower_bounds": {2147483546: pairs[0][0].encode()},
            "upper_bounds": {2147483546: pairs[-1][0].encode()}} if bounds else {}
    else:
        deletes = pa.table({"id": pa.array([3], pa.int64())})
        kind, extra = DataFileContent.EQUALITY_DELETES, {"equality_ids": [1]}
    pq.write_table(deletes, path)
    delete_file = DataFile.from_args(content=kind, file_path="file://" + path,
                                     file_format=FileFormat.PARQUET, partition=first.partition,
                                     record_count=deletes.num_rows,
                                     file_size_in_bytes=os.path.getsize(path),
                                     spec_id=first.spec_id, **extra)
    with table.transaction() as tx, tx.update_snapshot().fast_append() as add:
        add.append_data_file(delete_file)


LABELED = DataSpec.of("a", "label", extra="id")
SIZES = (40, 33, 50, 26)  # rows of the data files, row groups of 7
# positions deleted, by data file: from files 0 and 1 by one delete file, from file 1 again
# (some rows twice) by another; none from files 2 and 3
DELETED = {0: [0, 6, 7, 13, 39], 1: [1, 2, 3, 4, 5, 6, 20, 32]}
BY_FILE = ({0: [0, 6, 7, 13, 39], 1: [1, 2, 20]}, {1: [2, 3, 4, 5, 6, 32]})


def with_positional_deletes(tmp_path, by_file=BY_FILE, bounds: bool = True):
    """A table of four pyarrow-written files (several row groups each) and positional delete
    files committed by pyiceberg, one per dict of ``by_file`` (data file number ->
    positions); the rows they delete have label -1. Returns the table and its data files'
    paths as the manifests write them, by number."""
    table = catalog(tmp_path).create_table("ns.t", schema=pa.schema(
        [("id", pa.int64()), ("a", pa.float32()), ("label", pa.int64())]))
    folder = os.path.join(table.location().removeprefix("file://"), "added")
    os.makedirs(folder)
    uris, first = [], 0
    for k, n in enumerate(SIZES):
        ids = np.arange(first, first + n)
        poison = np.isin(np.arange(n), DELETED.get(k, []))
        path = os.path.join(folder, f"{k:05d}.parquet")
        pq.write_table(pa.table({"id": ids, "a": ids.astype(np.float32),
                                 "label": np.where(poison, -1, ids % 10)}), path,
                       row_group_size=7)
        uris.append("file://" + path)
        first += 1000
    table.add_files(uris)
    for i, deletes in enumerate(by_file):
        commit_delete_file(table, "position", {uris[k]: v for k, v in deletes.items()},
                           f"pos{i}", bounds)
    return table, uris


def labeled(table) -> list[tuple]:
    got = table.scan().to_arrow()
    return sorted(zip(got["id"].to_pylist(), got["a"].to_pylist(), got["label"].to_pylist()))


@pytest.mark.parametrize("bounds", [True, False], ids=["bounds", "no-bounds"])
def test_positional_delete_files_are_applied_by_the_ranks_as_pyiceberg_applies_them(tmp_path,
                                                                                  bounds):
    """With file_path bounds (as Spark writes them) a delete file applies to the files it
    names; without, to every file of the table, which keeps the rows it names for none."""
    table, uris = with_positional_deletes(tmp_path, bounds=bounds)
    expected = labeled(table)  # pyiceberg applies positional deletes: the oracle
    assert len(expected) == sum(SIZES) - sum(len(v) for v in DELETED.values())
    assert all(label >= 0 for *_, label in expected)
    listing = iceberg_table(table)
    vectors = listing.masks.by_file
    assert [len(v) for v in vectors.values()] == ([1, 2] if bounds else [2, 2, 2, 2])
    assert {v.data_file for d in vectors.values() for v in d} == set(uris[:2] if bounds else uris)
    prepared = prepare_table(table_url(table, listing), LABELED, num_workers=3, batch_size=4,
                             validation=None, seed=0, table=listing)
    assert prepared.train.rows == len(expected)
    got = read_rows(prepared.train)
    assert sorted(zip(got["id"].tolist(), got["a"].tolist(), got["label"].tolist())) == \
        expected
    # every rank its own rows, and together every row not deleted, once
    plan = prepared.train.plan(3, 4)
    seen = []
    for rank in range(3):
        mine = [row for t in read_sub_shard(plan, rank, 0, 0, 1)
                for row in zip(t.column("id").to_pylist(), t.column("a").to_pylist(),
                               t.column("label").to_pylist())]
        assert len(mine) == plan.rows_per_rank[rank]
        seen += mine
    assert sorted(seen) == expected
    # plans ship the descriptors, never the positions
    assert set(listing.masks.__getstate__()) == {"by_file"}
    assert pickle.loads(pickle.dumps(listing.masks)) == listing.masks


def test_a_partitioned_table_with_a_positional_delete_file_reads_as_pyiceberg(tmp_path):
    table = build(tmp_path)
    before = oracle(table)
    commit_delete_file(table, "position")  # the first file's rows 1 and 4, its partition's
    assert len(oracle(table)) == len(before) - 2
    assert read(table) == oracle(table)


def test_a_validation_split_holds_no_deleted_row(tmp_path):
    table, _ = with_positional_deletes(tmp_path)
    expected = labeled(table)
    listing = iceberg_table(table)
    data = prepare_table(table_url(table, listing), LABELED, num_workers=2, batch_size=4,
                         validation=0.3, seed=2, table=listing)
    train, val = read_rows(data.train), read_rows(data.val)
    assert data.train.rows == len(train["id"]) and data.val.rows == len(val["id"])
    assert (train["label"] >= 0).all() and (val["label"] >= 0).all()
    ids = train["id"].tolist() + val["id"].tolist()
    assert sorted(ids) == [i for i, _, _ in expected] and len(set(ids)) == len(ids)


def test_a_positional_delete_changes_the_fingerprint(tmp_path):
    table, uris = with_positional_deletes(tmp_path, by_file=BY_FILE[:1])

    def fingerprint():
        listing = iceberg_table(table)
        return prepare_table(table_url(table, listing), LABELED, num_workers=2, batch_size=4,
                             validation=None, seed=0, table=listing).fingerprint
    before = fingerprint()
    commit_delete_file(table, "position", {uris[1]: BY_FILE[1][1]}, "later")
    assert fingerprint() != before


@pytest.mark.parametrize("damage,match", [
    ("gone", r"positional delete file .*pos1-deletes.parquet, for the data file "
             r".*00001.parquet: the delete file is gone"),
    ("beyond", r"positional delete file .*pos1-deletes.parquet, for the data file "
               r".*00001.parquet deletes row 33, beyond the file's 33 rows"),
])
def test_a_positional_delete_file_that_does_not_fit_names_both_files(tmp_path, damage, match):
    by_file = BY_FILE if damage == "gone" else (BY_FILE[0], {1: [2, 33]})
    table, _ = with_positional_deletes(tmp_path, by_file)
    if damage == "gone":
        os.remove(os.path.join(table.location().removeprefix("file://"), "pos1-deletes.parquet"))
    listing = iceberg_table(table)
    with pytest.raises(DataError, match=match):
        prepare_table(table_url(table, listing), LABELED, num_workers=2, batch_size=4,
                      validation=None, seed=0, table=listing)


def test_equality_delete_files_are_refused_saying_why(tmp_path):
    table = build(tmp_path, partitioned=False)
    commit_delete_file(table, "equality")
    with pytest.raises(DataError, match=r"has equality delete files, which sparkddl does not "
                                        r"apply; sparkddl applies positional delete files"):
        iceberg_table(table)


@pytest.mark.parametrize("by_pyiceberg", [
    pytest.param(True, marks=pytest.mark.skipif(not WRITES, reason="pyarrow < 18")), False],
    ids=["field-ids", "name-mapping"])
def test_a_renamed_column_is_refused_naming_it(tmp_path, by_pyiceberg):
    table = catalog(tmp_path).create_table("ns.t", schema=rows(0, 1).schema)
    append(table, rows(0, 50), by_pyiceberg)
    with table.update_schema() as update:
        update.rename_column("a", "b")
    assert table.scan().to_arrow().column_names == ["id", "b", "part", "tag"]
    with pytest.raises(DataError, match=r"column 'a' of .* is the Iceberg table ns.t's column "
                                        r"'b' \(field id 2\), renamed"):
        iceberg_table(table)


@pytest.mark.skipif(not WRITES, reason="pyiceberg 0.12 writes with pyarrow >= 18 only")
def test_a_column_dropped_and_added_again_is_refused(tmp_path):
    from pyiceberg.types import FloatType
    table = catalog(tmp_path).create_table("ns.t", schema=rows(0, 1).schema)
    append(table, rows(0, 50))
    with table.update_schema() as update:
        update.delete_column("a")
    with table.update_schema() as update:
        update.add_column("a", FloatType())
    assert table.scan().to_arrow()["a"].null_count == 50  # Iceberg: not the old values
    with pytest.raises(DataError, match=r"column 'a' of .* \(field id 2\) is not the Iceberg "
                                        r"table ns.t's column 'a'"):
        iceberg_table(table)


def test_files_added_from_outside_the_location_are_read_from_their_common_folder(tmp_path):
    cat = catalog(tmp_path)
    table = cat.create_table("ns.t", schema=rows(0, 1).schema)
    outside = tmp_path / "elsewhere"
    outside.mkdir()
    pq.write_table(rows(0, 40), outside / "x.parquet")
    table.add_files([(outside / "x.parquet").as_uri()])
    listing = iceberg_table(table)
    assert table_url(table, listing) == tmp_path.as_uri()
    assert read(table) == oracle(table)


@pytest.mark.skipif(not WRITES, reason="pyiceberg 0.12 writes with pyarrow >= 18 only")
def test_a_partition_column_null_for_some_files_is_read_from_the_files(tmp_path):
    table = catalog(tmp_path).create_table("ns.t", schema=rows(0, 1).schema)
    with table.update_spec() as spec:
        spec.add_identity("part")
    data = rows(0, 30)
    table.append(data.set_column(2, "part", pa.array([None if i % 3 == 0 else i % 3
                                                      for i in range(30)], pa.int64())))
    assert iceberg_table(table).columns == ()
    got = read_rows(prepare_table(table_url(table, iceberg_table(table)),
                                  DataSpec.of("a", extra="id"), num_workers=2, batch_size=4,
                                  validation=None, seed=0,
                                  table=iceberg_table(table)).train)
    expected = table.scan().to_arrow()
    assert sorted(zip(got["id"].tolist(), got["a"].tolist())) == \
        sorted(zip(expected["id"].to_pylist(), expected["a"].to_pylist()))


def test_positional_delete_files_are_read_row_group_by_row_group_whatever_their_columns(
        tmp_path):
    """A delete file of several row groups sorted by file_path (skipped by their statistics),
    one with a nested column before file_path (statistics are per leaf), and one with a null
    position (refused: the spec requires both columns)."""
    from pyarrow import fs as pafs

    from sparkddl.tables.masks import PositionDeletes
    local = pafs.LocalFileSystem()
    pairs = sorted((f"file:///d/{k}.parquet", p) for k in range(5) for p in range(k, 40, 7))

    def delete_file(name: str, table: pa.Table, **options) -> PositionDeletes:
        pq.write_table(table, tmp_path / name, **options)
        return PositionDeletes(str(tmp_path / name), "", 0, -1)

    plain = pa.table({"file_path": [f for f, _ in pairs], "pos": [p for _, p in pairs]})
    nested = pa.table({"row": [{"x": "zzz", "y": "zzz"}] * len(pairs), **plain.to_pydict()})
    for dv in (delete_file("plain.parquet", plain, row_group_size=3),
               delete_file("nested.parquet", nested, row_group_size=4)):
        for k in range(5):
            where = f"file:///d/{k}.parquet"
            got = PositionDeletes(dv.file, where, 0, -1).deleted_rows(local, where, 40)
            assert got.tolist() == list(range(k, 40, 7))
    bad = delete_file("null.parquet", pa.table({"file_path": ["f", "f"],
                                                "pos": pa.array([5, None], pa.int64())}))
    with pytest.raises(DataError, match="null file_path or pos"):
        PositionDeletes(bad.file, "f", 0, -1).deleted_rows(local, "f", 40)


def test_a_data_file_rewritten_under_its_name_is_refused(tmp_path):
    table, uris = with_positional_deletes(tmp_path)
    path = uris[0].removeprefix("file://")
    pq.write_table(pq.read_table(path).slice(0, 39), path)  # a row short: positions shift
    listing = iceberg_table(table)
    with pytest.raises(DataError, match="holds 39 rows where the table's log says 40"):
        prepare_table(table_url(table, listing), LABELED, num_workers=2, batch_size=4,
                      validation=None, seed=0, table=listing)


@pytest.mark.parametrize("gone", ["manifest", "manifest list"])
def test_a_missing_iceberg_manifest_names_the_file(tmp_path, gone):
    table = build(tmp_path)
    snapshot = table.current_snapshot()
    path = (snapshot.manifests(table.io)[0].manifest_path if gone == "manifest"
            else snapshot.manifest_list).removeprefix("file://")
    os.remove(path)
    with pytest.raises(DataError, match="metadata file of the Iceberg table .* is gone") as info:
        iceberg_table(table)
    assert path in str(info.value)

