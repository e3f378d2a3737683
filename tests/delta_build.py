"""Delta tables written by hand, following the Delta protocol, for tests (Delta Lake's Spark
jar is not reachable here and delta-rs cannot write deletion vectors): data files with
pyarrow, deletion vectors serialized with pyroaring (an implementation independent of
sparkddl's decoder), commits as JSON lines, checkpoints as Parquet.

    t = DeltaBuilder(path, features=["deletionVectors"])
    f = t.add_file(table)                        # commit 0 (with the protocol and metaData)
    t.delete({f: [3, 5, 8]}, storage="u")        # commit 1: remove + add with its DV
"""
from __future__ import annotations

import json
import os
import struct
import time
import uuid
import zlib
from pathlib import Path
from typing import Any
from urllib.parse import quote

import pyarrow as pa
import pyarrow.compute  # pa.compute
import pyarrow.parquet as pq

Z85 = "0123456789abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ.-:+=^!/*?&<>()[]{}@%$#"
MAGIC = 1681511377


def z85_encode(data: bytes) -> str:
    data = data + b"\0" * (-len(data) % 4)
    out = []
    for i in range(0, len(data), 4):
        value = int.from_bytes(data[i:i + 4], "big")
        chars = []
        for _ in range(5):
            value, r = divmod(value, 85)
            chars.append(Z85[r])
        out.append("".join(reversed(chars)))
    return "".join(out)


def serialize(indexes: list[int]) -> bytes:
    """A RoaringBitmapArray in the portable serialization, as Delta writes it."""
    from pyroaring import BitMap
    by_key: dict[int, list[int]] = {}
    for i in sorted(set(indexes)):
        by_key.setdefault(i >> 32, []).append(i & 0xFFFFFFFF)
    out = struct.pack("<i", MAGIC) + struct.pack("<q", len(by_key))
    for key in sorted(by_key):
        bitmap = BitMap(by_key[key])
        bitmap.run_optimize()
        out += struct.pack("<I", key) + bitmap.serialize()
    return out


_DELTA_TYPES = {"int64": "long", "int32": "integer", "double": "double", "float": "float",
                "bool": "boolean", "string": "string"}


def arrow_type_name(t: pa.DataType) -> Any:
    """The Delta schema's type of an Arrow type."""
    if pa.types.is_list(t):
        return {"type": "array", "elementType": arrow_type_name(t.value_type),
                "containsNull": True}
    return _DELTA_TYPES[str(t)]


class DeltaBuilder:
    """A Delta table at ``path``, commit by commit."""

    def __init__(self, path: str | os.PathLike, features: tuple[str, ...] = ("deletionVectors",),
                 partition_columns: tuple[str, ...] = (), configuration: dict | None = None,
                 reader_version: int = 3, writer_version: int = 7,
                 column_mapping: str | None = None):
        self.path = Path(path)
        (self.path / "_delta_log").mkdir(parents=True, exist_ok=True)
        self.features = list(features)
        self.partition_columns = list(partition_columns)
        self.configuration = dict(configuration or {})
        if "deletionVectors" in self.features:
            self.configuration.setdefault("delta.enableDeletionVectors", "true")
        self.versions = (reader_version, writer_version)
        # column mapping ("name" or "id"): files hold columns under physical names (and
        # Parquet field ids), partition values are keyed by physical names
        self.mapping = column_mapping
        if column_mapping:
            self.features.append("columnMapping")
            self.configuration["delta.columnMapping.mode"] = column_mapping
        self.physical: dict[str, str] = {}
        self.ids: dict[str, int] = {}
        self.version = -1
        self.files: dict[str, dict] = {}  # live add actions by path
        self.schema: pa.Schema | None = None
        self.checkpoints: list[int] = []
        self.deleted: dict[str, set[int]] = {}  # rows deleted so far, by data file

    # -- commits --------------------------------------------------------------------------
    def commit(self, actions: list[dict]) -> int:
        self.version += 1
        info = {"commitInfo": {"timestamp": int(time.time() * 1000), "operation": "TEST"}}
        lines = [json.dumps(a) for a in [info, *actions]]
        (self.path / "_delta_log" / f"{self.version:020d}.json").write_text("\n".join(lines) + "\n")
        for a in actions:
            if "add" in a:
                self.files[a["add"]["path"]] = a["add"]
            elif "remove" in a and a["remove"]["path"] in self.files and \
                    a["remove"].get("deletionVector") == \
                    self.files[a["remove"]["path"]].get("deletionVector"):
                del self.files[a["remove"]["path"]]
        return self.version

    def _head(self) -> list[dict]:
        if self.version >= 0:
            return []
        protocol: dict[str, Any] = {"minReaderVersion": self.versions[0],
                                    "minWriterVersion": self.versions[1]}
        if self.versions[0] >= 3:
            protocol["readerFeatures"] = list(self.features)
        if self.versions[1] >= 7:
            protocol["writerFeatures"] = list(self.features)
        assert self.schema is not None
        fields = [{"name": f.name, "type": arrow_type_name(f.type), "nullable": True,
                   "metadata": {"delta.columnMapping.id": self.ids[f.name],
                                "delta.columnMapping.physicalName": self.physical[f.name]}
                   if self.mapping else {}}
                  for f in self.schema]
        if self.mapping:
            self.configuration["delta.columnMapping.maxColumnId"] = str(len(fields))
        return [{"protocol": protocol},
                {"metaData": {"id": str(uuid.uuid4()), "format": {"provider": "parquet",
                                                                  "options": {}},
                              "schemaString": json.dumps({"type": "struct", "fields": fields}),
                              "partitionColumns": self.partition_columns,
                              "configuration": self.configuration,
                              "createdTime": int(time.time() * 1000)}}]

    def add_file(self, table: pa.Table, name: str | None = None, row_group_size: int | None = None,
                 partition: dict[str, Any] | None = None, stats: bool = True,
                 field_ids: dict[str, int] | None = None) -> str:
        """Write ``table`` as a data file and commit its add action; returns its path in the
        table. With column mapping, columns are written under their physical names with
        their field ids (``field_ids`` overrides some: a file that does not match)."""
        logical = table
        if self.schema is None:
            self.schema = pa.schema(list(logical.schema) + [
                pa.field(c, pa.string() if isinstance(v, str) else pa.int64())
                for c, v in (partition or {}).items()])
        if self.mapping:
            for i, f in enumerate(self.schema):
                self.physical.setdefault(f.name, f"col-{uuid.uuid4()}")
                self.ids.setdefault(f.name, i + 1)
            ids = {**self.ids, **(field_ids or {})}
            table = pa.table(table.columns, schema=pa.schema([
                pa.field(self.physical[f.name], f.type,
                         metadata={"PARQUET:field_id": str(ids[f.name])})
                for f in table.schema]))
        folder = "/".join(f"{k}={quote(str(v))}" for k, v in (partition or {}).items())
        rel = f"{folder + '/' if folder else ''}{name or 'part-' + uuid.uuid4().hex}.parquet"
        target = self.path / rel
        target.parent.mkdir(parents=True, exist_ok=True)
        pq.write_table(table, target, row_group_size=row_group_size)
        add = {"path": quote(rel, safe="/="), "partitionValues":
               {self.physical.get(k, k): str(v) for k, v in (partition or {}).items()},
               "size": target.stat().st_size, "modificationTime": int(time.time() * 1000),
               "dataChange": True}
        if stats:
            add["stats"] = json.dumps({"numRecords": table.num_rows})
        self.commit(self._head() + [{"add": add}])
        return add["path"]

    def add_existing(self, rel: str) -> str:
        """Commit the add action of a data file already under the table (written by Spark,
        say) at ``rel``; returns its path in the table."""
        target = self.path / rel
        meta = pq.ParquetFile(target).metadata
        if self.schema is None:
            self.schema = meta.schema.to_arrow_schema()
        add = {"path": quote(rel, safe="/="), "partitionValues": {},
               "size": target.stat().st_size, "modificationTime": int(time.time() * 1000),
               "dataChange": True, "stats": json.dumps({"numRecords": meta.num_rows})}
        self.commit(self._head() + [{"add": add}])
        return add["path"]

    def delete(self, rows: dict[str, list[int]], storage: str = "u", prefix: str = "ab",
               one_file: bool = True, cardinality: dict | None = None,
               corrupt_crc: bool = False) -> dict[str, dict]:
        """Commit deletion vectors deleting ``rows`` (row indexes by data file), merged with
        any the files have; all bitmaps of storage 'u'/'p' in one DV file (``one_file``)."""
        descriptors: dict[str, dict] = {}
        payloads: dict[str, bytes] = {}
        for path, new in rows.items():
            self.deleted.setdefault(path, set()).update(new)
            payloads[path] = serialize(sorted(self.deleted[path]))
        if storage == "i":
            for path, data in payloads.items():
                descriptors[path] = {"storageType": "i", "pathOrInlineDv": z85_encode(data),
                                     "sizeInBytes": len(data),
                                     "cardinality": len(self.deleted[path])}
        else:
            groups = [list(payloads)] if one_file else [[p] for p in payloads]
            for group in groups:
                file_id = uuid.uuid4()
                name = f"deletion_vector_{file_id}.bin"
                folder = self.path / prefix if prefix else self.path
                folder.mkdir(parents=True, exist_ok=True)
                blob = bytearray(b"\x01")
                for path in group:
                    data = payloads[path]
                    crc = zlib.crc32(data) ^ (1 if corrupt_crc else 0)
                    offset = len(blob)
                    blob += struct.pack(">i", len(data)) + data + struct.pack(">I", crc)
                    where = ((folder / name).as_uri() if storage == "p" else
                             prefix + z85_encode(file_id.bytes))
                    descriptors[path] = {"storageType": storage, "pathOrInlineDv": where,
                                         "offset": offset, "sizeInBytes": len(data),
                                         "cardinality": len(self.deleted[path])}
                (folder / name).write_bytes(bytes(blob))
        for path, card in (cardinality or {}).items():
            descriptors[path]["cardinality"] = card
        actions = []
        for path, dv in descriptors.items():
            old = self.files[path]
            actions.append({"remove": {"path": path, "deletionTimestamp": int(time.time() * 1000),
                                       "dataChange": True,
                                       **({"deletionVector": old["deletionVector"]}
                                          if "deletionVector" in old else {})}})
            actions.append({"add": {**old, "deletionVector": dv}})
        self.commit(actions)
        return descriptors

    def checkpoint(self, v2: bool = False) -> None:
        """A checkpoint of the current version (and _last_checkpoint): classic, one Parquet
        file; or ``v2``, a JSON file naming a Parquet sidecar that holds the adds."""
        head = self._replay_head()
        rows = [{"protocol": head["protocol"]}, {"metaData": head["metaData"]}]
        rows += [{"add": {**a, "partitionValues": list(a["partitionValues"].items())}}
                 for a in self.files.values()]
        dv_type = pa.struct([("storageType", pa.string()), ("pathOrInlineDv", pa.string()),
                             ("offset", pa.int32()), ("sizeInBytes", pa.int32()),
                             ("cardinality", pa.int64())])
        add_type = pa.struct([("path", pa.string()),
                              ("partitionValues", pa.map_(pa.string(), pa.string())),
                              ("size", pa.int64()), ("modificationTime", pa.int64()),
                              ("dataChange", pa.bool_()), ("stats", pa.string()),
                              ("deletionVector", dv_type)])
        protocol_type = pa.struct([("minReaderVersion", pa.int32()),
                                   ("minWriterVersion", pa.int32()),
                                   ("readerFeatures", pa.list_(pa.string())),
                                   ("writerFeatures", pa.list_(pa.string()))])
        meta = head["metaData"]
        meta_type = pa.struct([("id", pa.string()),
                               ("format", pa.struct([("provider", pa.string()),
                                                     ("options", pa.map_(pa.string(),
                                                                         pa.string()))])),
                               ("schemaString", pa.string()),
                               ("partitionColumns", pa.list_(pa.string())),
                               ("configuration", pa.map_(pa.string(), pa.string())),
                               ("createdTime", pa.int64())])
        meta_row = {**meta, "format": {"provider": "parquet", "options": []},
                    "configuration": list(meta["configuration"].items())}
        table = pa.table({
            "protocol": pa.array([r.get("protocol") for r in rows], protocol_type),
            "metaData": pa.array([meta_row if "metaData" in r else None for r in rows],
                                 meta_type),
            "add": pa.array([r.get("add") for r in rows], add_type)})
        log = self.path / "_delta_log"
        if v2:
            (log / "_sidecars").mkdir(exist_ok=True)
            sidecar = f"{uuid.uuid4()}.parquet"
            pq.write_table(table.select(["add"]).filter(pa.compute.is_valid(table["add"])),
                           log / "_sidecars" / sidecar)
            lines = [{"checkpointMetadata": {"version": self.version}},
                     {"protocol": head["protocol"]}, {"metaData": head["metaData"]},
                     {"sidecar": {"path": sidecar, "sizeInBytes":
                                  (log / "_sidecars" / sidecar).stat().st_size,
                                  "modificationTime": int(time.time() * 1000)}}]
            name = f"{self.version:020d}.checkpoint.{uuid.uuid4()}.json"
            (log / name).write_text("\n".join(json.dumps(x) for x in lines) + "\n")
            (log / "_last_checkpoint").write_text(json.dumps({"version": self.version,
                                                              "size": len(lines)}))
            self.checkpoints.append(self.version)
            return
        pq.write_table(table, log / f"{self.version:020d}.checkpoint.parquet")
        (log / "_last_checkpoint").write_text(json.dumps({"version": self.version,
                                                          "size": len(rows)}))
        self.checkpoints.append(self.version)

    def _replay_head(self) -> dict:
        head: dict = {}
        for v in range(self.version + 1):
            for line in (self.path / "_delta_log" / f"{v:020d}.json").read_text().splitlines():
                a = json.loads(line)
                head.update({k: a[k] for k in ("protocol", "metaData") if k in a})
        return head
