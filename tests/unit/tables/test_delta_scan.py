"""What decides whether a Delta scan (Spark with Delta Lake) is read in place, on tables the
deltalake package writes and tables built after the protocol: plain ones are, and so are
tables with deletion vectors or column mapping enabled (applied on the ranks) at the version
the scan reads; a reader feature not on the allow-list, a log that cannot be read, and a
version Spark's plan does not tell while the table can have deletion vectors are
materialized, each with its reason."""
from __future__ import annotations

import numpy as np
import pyarrow as pa
import pytest

from sparkddl.tables.delta import scan_table
from tests.delta_build import DeltaBuilder
from tests.unit.tables.test_masks import table_of


def table(tmp_path, name, **configuration):
    from deltalake import write_deltalake
    ids = np.arange(30)
    write_deltalake(str(tmp_path / name), pa.table({"id": ids, "part": ids % 3}),
                    partition_by=["part"], configuration=configuration or None)
    return (tmp_path / name).as_uri()


def test_a_plain_delta_table_is_read_in_place_and_the_others_say_why(tmp_path):
    pytest.importorskip("deltalake")
    for url in (table(tmp_path, "plain"),
                table(tmp_path, "cm", **{"delta.columnMapping.mode": "name"})):
        listing, why = scan_table(url, None)
        assert why == "" and len(listing.paths) == 3
    DeltaBuilder(tmp_path / "tw", features=("typeWidening",)).add_file(table_of(0, 5))
    listing, why = scan_table((tmp_path / "tw").as_uri(), 0)
    assert listing is None and "reader feature(s) typeWidening" in why
    listing, why = scan_table((tmp_path / "nothing").as_uri(), None)
    assert listing is None and "could not be read here" in why


def test_a_table_with_deletion_vectors_is_read_at_the_version_the_scan_reads(tmp_path):
    t = DeltaBuilder(tmp_path / "dv")
    f = t.add_file(table_of(0, 50))
    t.delete({f: [1, 2]})  # version 1: same file, other rows
    url = (tmp_path / "dv").as_uri()
    before, why = scan_table(url, 0)
    assert why == "" and before.masks is None
    after, why = scan_table(url, 1)
    assert why == "" and len(after.masks.by_file) == 1
    unknown, why = scan_table(url, None)  # the same paths at both: which rows is unknown
    assert unknown is None and "could not be told" in why
    gone, why = scan_table(url, 7)
    assert gone is None and "could not be read here at version 7" in why
