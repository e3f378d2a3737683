"""What decides whether a Delta scan (Spark with Delta Lake) is read in place, on tables the
deltalake package writes: plain ones are, and so are tables with deletion vectors or column
mapping enabled (applied on the ranks); a reader feature not on the allow-list and a log that
cannot be read are materialized, each with its reason."""
from __future__ import annotations

import numpy as np
import pyarrow as pa
import pytest

from sparkddl.data.delta import scan_reason


def table(tmp_path, name, **configuration):
    from deltalake import write_deltalake
    ids = np.arange(30)
    write_deltalake(str(tmp_path / name), pa.table({"id": ids, "part": ids % 3}),
                    partition_by=["part"], configuration=configuration or None)
    return (tmp_path / name).as_uri()


def test_a_plain_delta_table_is_read_in_place_and_the_others_say_why(tmp_path):
    pytest.importorskip("deltalake")
    assert scan_reason(table(tmp_path, "plain")) == ""
    assert scan_reason(table(tmp_path, "dv", **{"delta.enableDeletionVectors": "true"})) == ""
    assert scan_reason(table(tmp_path, "cm", **{"delta.columnMapping.mode": "name"})) == ""
    from tests.delta_build import DeltaBuilder
    from tests.unit.data.test_deletes import table_of
    DeltaBuilder(tmp_path / "tw", features=("typeWidening",)).add_file(table_of(0, 5))
    assert "reader feature(s) typeWidening" in scan_reason((tmp_path / "tw").as_uri())
    assert "could not be read here" in scan_reason((tmp_path / "nothing").as_uri())
