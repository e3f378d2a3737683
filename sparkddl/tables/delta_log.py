"""The Delta log read for what the ``deltalake`` package does not give: each file's
deletion-vector descriptor, from a replay of the log (its newest checkpoint at or before the
version, single-file, multi-part or v2 with sidecars, then the commits after it), and the
column mapping of the table's schema."""
from __future__ import annotations

import json
import posixpath
import re
from typing import Any
from urllib.parse import unquote

from sparkddl.errors import DataError
from sparkddl.store import Store
from sparkddl.tables.paths import fs_path

DELTA_LOG = "_delta_log"
_CHECKPOINT = re.compile(r"^(\d{20})\.checkpoint(?:\.(\d{10})\.(\d{10}))?\.parquet$")
_V2_CHECKPOINT = re.compile(r"^(\d{20})\.checkpoint\.[0-9a-fA-F-]{36}\.(json|parquet)$")


def column_mapping(table: Any) -> tuple[tuple[str, str, int], ...]:
    """(name, physical name, field id or 0) of each top-level column of a table with column
    mapping (mode ``name``: matched by physical name; ``id``: by physical name, and the
    files' field ids checked against the table's); () without."""
    mode = table.metadata().configuration.get("delta.columnMapping.mode", "none")
    protocol = table.protocol()
    # the mode counts where the protocol has column mapping: reader version 2, or 3 with
    # the feature listed (deltalake sets the mode on tables whose protocol lacks it, and
    # writes their files by the columns' own names)
    active = protocol.min_reader_version == 2 or \
        "columnMapping" in set(protocol.reader_features or ())
    if mode == "none" or not active:
        return ()
    out = []
    for field in table.schema().fields:
        meta = field.metadata or {}
        physical = meta.get("delta.columnMapping.physicalName")
        if not physical:
            raise DataError(f"column {field.name!r} of the Delta table has no physical name in "
                            f"its schema, which column mapping mode {mode!r} needs; the log "
                            "is damaged")
        field_id = int(meta.get("delta.columnMapping.id", 0)) if mode == "id" else 0
        out.append((field.name, str(physical), field_id))
    return tuple(out)


def logged_vectors(store: Store, version: int, files: list[str]) -> dict[str, dict | None]:
    """The deletion-vector descriptor (the log's ``deletionVector`` object, or None) of every
    file of ``version`` (paths as the log names them, %-decoded), from a replay of the log:
    its last checkpoint at or before ``version``, then the commits after it. The files must
    be those deltalake lists (``files``), or the log is not read the same way twice: a
    DataError then."""
    fs = store.filesystem()
    log_dir = store.fs_path(store.url(DELTA_LOG))
    from pyarrow import fs as pafs
    names = [posixpath.basename(i.path) for i in
             fs.get_file_info(pafs.FileSelector(log_dir, recursive=False))]
    live: dict[tuple[str, str], dict | None] = {}  # (path, DV key) -> deletionVector

    def key(action: dict) -> tuple[str, str]:
        dv = action.get("deletionVector")
        where = "" if not dv else (f"{dv.get('storageType')}{dv.get('pathOrInlineDv')}"
                                   f"@{dv.get('offset')}")
        return unquote(str(action["path"])), where

    start = _checkpoint(fs, log_dir, names, version, live, key)
    commits = sorted(int(n[:20]) for n in names if re.fullmatch(r"\d{20}\.json", n))
    for v in range(start + 1, version + 1):
        if v not in commits:
            raise DataError(f"the Delta log of {store.url()} has no commit {v} (after the "
                            f"checkpoint at {start}); the log was cleaned up under a reader, "
                            "or is damaged: read the table through Spark with Delta Lake")
        path = posixpath.join(log_dir, f"{v:020d}.json")
        actions = read_commit(fs, path)
        try:
            adds = [a["add"] for a in actions if "add" in a]
            removes = [a["remove"] for a in actions if "remove" in a]
            for r in removes:  # a commit's removes and adds are of different (path, DV)s
                live.pop(key(r), None)
            for a in adds:
                live[key(a)] = a.get("deletionVector") or None
        except (KeyError, TypeError, AttributeError) as exc:
            raise DataError(f"the Delta log's commit {path} has an add or remove action "
                            f"without what the protocol requires ({type(exc).__name__}: {exc}); "
                            "the log is damaged") from None
    out: dict[str, dict | None] = {}
    for (path, _), dv in live.items():
        if path in out:
            raise DataError(f"the Delta log of {store.url()} has {path} twice in version "
                            f"{version}; the log is damaged")
        out[path] = dv
    if set(out) != {unquote(f) for f in files}:
        odd = sorted(set(out) ^ {unquote(f) for f in files})
        raise DataError(f"the Delta log of {store.url()} replayed here names other files than "
                        f"deltalake lists for version {version} (e.g. {odd[:3]}); read the "
                        "table through Spark with Delta Lake")
    return out


def read_commit(fs: Any, path: str) -> list[dict]:
    """The actions of the commit file at ``path``; DataError naming it where it is not JSON
    lines of objects (truncated, or damaged)."""
    try:
        with fs.open_input_stream(path) as f:
            text = f.read().decode()
        actions = [json.loads(line) for line in text.splitlines() if line.strip()]
    except (ValueError, UnicodeDecodeError) as exc:
        raise DataError(f"the Delta log's commit {path} is not JSON lines ({exc}); it is "
                        "truncated or damaged: repair the table (read it through Spark with "
                        "Delta Lake), or restore the commit") from None
    if not all(isinstance(a, dict) for a in actions):
        raise DataError(f"the Delta log's commit {path} holds lines that are not actions "
                        "(JSON objects); the log is damaged")
    return actions


def damaged_commit(store: Store) -> str:
    """The first commit file of the table's log that does not parse, or ""."""
    from pyarrow import fs as pafs
    fs = store.filesystem()
    log_dir = store.fs_path(store.url(DELTA_LOG))
    try:
        infos = fs.get_file_info(pafs.FileSelector(log_dir, recursive=False))
    except OSError:
        return ""
    for path in sorted(i.path for i in infos if re.fullmatch(r"\d{20}\.json",
                                                             posixpath.basename(i.path))):
        try:
            read_commit(fs, path)
        except DataError:
            return path
    return ""


def _checkpoint(fs: Any, log_dir: str, names: list[str], version: int,
                live: dict[tuple[str, str], dict | None], key: Any) -> int:
    """Fill ``live`` from the newest complete checkpoint at or before ``version``; its
    version (-1 where there is none: the replay starts at commit 0)."""
    import pyarrow.parquet as pq

    found: dict[int, list[str]] = {}
    for n in names:
        m = _CHECKPOINT.match(n) or _V2_CHECKPOINT.match(n)
        if m and int(m.group(1)) <= version:
            found.setdefault(int(m.group(1)), []).append(n)
    for v in sorted(found, reverse=True):
        files = sorted(found[v])
        classic = [n for n in files if _CHECKPOINT.match(n)]
        parts = {int(_CHECKPOINT.match(n).group(3) or 1) for n in classic}  # type: ignore
        if classic and len(parts) == 1 and len(classic) == parts.pop():
            chosen = classic
        elif any(_V2_CHECKPOINT.match(n) for n in files):
            chosen = [next(n for n in files if _V2_CHECKPOINT.match(n))]
        else:
            continue  # an incomplete multi-part checkpoint: an older one, or the commits
        rows: list[dict] = []
        sidecars: list[str] = []
        for n in chosen:
            path = posixpath.join(log_dir, n)
            if n.endswith(".json"):
                with fs.open_input_stream(path) as f:
                    actions = [json.loads(x) for x in f.read().decode().splitlines() if x]
            else:
                with fs.open_input_file(path) as f:
                    parquet = pq.ParquetFile(f)  # the add and sidecar actions only
                    table = parquet.read(columns=[c for c in ("add", "sidecar")
                                                  if c in parquet.schema_arrow.names])
                actions = table.to_pylist()
            rows += [a["add"] for a in actions if a.get("add")]
            sidecars += [a["sidecar"]["path"] for a in actions if a.get("sidecar")]
        for sidecar in sidecars:  # relative to _delta_log/_sidecars/, or an absolute URI
            where = fs_path(sidecar, posixpath.join(log_dir, "_sidecars"))
            try:
                with fs.open_input_file(where) as f:
                    table = pq.ParquetFile(f).read(columns=["add"])
            except FileNotFoundError:
                raise DataError(f"the Delta log's checkpoint {chosen[0]} names the sidecar "
                                f"{where}, which is gone; the log is damaged") from None
            rows += [r["add"] for r in table.to_pylist() if r.get("add")]
        for add in rows:
            live[key(add)] = add.get("deletionVector") or None
        return v
    return -1
