"""Which reader a rank uses, Petastorm or the Arrow reader, and why: decided on the driver
when planning (to fail before anything is launched) and again on every rank, whose Python
may differ; and the modules a rank imports ahead for it."""
from __future__ import annotations

import logging
from typing import Any
from urllib.parse import urlparse

from sparkddl.config import READERS
from sparkddl.data.petastorm_check import MODULES, unavailable_reason
from sparkddl.errors import ConfigError

log = logging.getLogger(__name__)

# what Petastorm opens itself (dbfs:/ only through the mount, which the Store gives as file://)
PETASTORM_SCHEMES = ("file", "hdfs", "s3", "s3a")


def raw_in_place(files: Any, columns: Any) -> bool:
    """A table read in place (its files are known) with binary, string or ragged columns,
    which another writer may have typed as Petastorm cannot read (large_binary, ...)."""
    return bool(files) and any(c.raw for c in columns)


def resolve_reader(choice: str, where: str = "driver", rows_selected: bool = False,
                   url: str = "", raw_in_place: bool = False, listed: bool = False) -> str:
    """The reader ``choice`` means in this Python process: "petastorm" or "arrow".

    "auto" takes Petastorm where it loads, else the Arrow reader; an explicit "petastorm"
    that cannot load here is a ConfigError. Called on the driver when planning (to fail
    before anything is launched) and on every rank before reading, because executors may
    run another Python environment than the driver. ``rows_selected``: the data keeps only
    some rows of each row group (the split of a table read in place), which only the Arrow
    reader applies. ``listed``: the table's files are named one by one (a Table), which
    only the Arrow reader takes (Petastorm lists a folder itself)."""
    if choice not in READERS:
        raise ConfigError(f"unknown reader {choice!r}; choose one of {', '.join(READERS)}")
    if choice == "arrow":
        return _chosen("arrow", "reader='arrow' was asked for", where)
    if listed:
        if choice == "petastorm":
            raise ConfigError("reader='petastorm' reads one folder, and this table's files are "
                              "listed one by one (several roots, a file list, a Delta table "
                              "or partition columns read); use reader='auto' or 'arrow'")
        return _chosen("arrow", "reader='auto' and the table's files are listed one by one, "
                       "which the Arrow reader reads", where)
    if rows_selected:
        if choice == "petastorm":
            raise ConfigError(
                "reader='petastorm' cannot read a table split in place (validation rows are "
                "selected inside row groups); use reader='auto' or 'arrow', or validation=None")
        return _chosen("arrow", "reader='auto' and the table read in place is split inside "
                       "its row groups, which the Arrow reader does", where)
    if raw_in_place:  # another writer's binary/string/list types: Petastorm drops some
        if choice == "petastorm":
            raise ConfigError("reader='petastorm' cannot read binary, string or ragged columns "
                              "of a table read in place (it ignores large_binary/"
                              "large_string); use reader='auto' or 'arrow'")
        return _chosen("arrow", "reader='auto' and the table read in place has binary, string "
                       "or ragged columns, which the Arrow reader reads whatever their type",
                       where)
    scheme = urlparse(url).scheme or "file"
    if scheme not in PETASTORM_SCHEMES:
        if choice == "petastorm":
            raise ConfigError(f"reader='petastorm' cannot read {scheme}:// (Petastorm opens "
                              f"{', '.join(PETASTORM_SCHEMES)} itself); use reader='auto' or "
                              "'arrow', which reads any filesystem the store opens")
        return _chosen("arrow", f"reader='auto' and the data is on {scheme}://, which the "
                       "Arrow reader opens through fsspec", where)
    problem = unavailable_reason()
    if choice == "petastorm" and problem:
        raise ConfigError(
            f"reader='petastorm' but Petastorm cannot be used here ({where}): {problem}. "
            "Petastorm 0.13.1 needs pyarrow < 15 and numpy < 2: install the pinned stack of "
            "constraints.txt (scripts/venv.sh does), or choose reader='arrow' (or 'auto'), "
            "which needs only pyarrow")
    if choice == "petastorm":
        return _chosen("petastorm", "reader='petastorm' was asked for", where)
    if problem:  # the usual case off the Petastorm stack: not news, so DEBUG on every rank
        return _chosen("arrow", f"reader='auto' and Petastorm cannot be used here ({problem})",
                       where, quiet=True)
    return _chosen("petastorm", "reader='auto' and Petastorm loads here", where)


def reader_modules(plan: Any) -> tuple[str, ...]:
    """The modules a rank imports to read ``plan`` (a ShardPlan) beyond pyarrow: Petastorm's where
    :func:`resolve_reader` may choose it (the ranks import them while they rendezvous)."""
    scheme = urlparse(plan.url).scheme or "file"
    if plan.reader == "arrow" or plan.selection is not None or plan.raw_in_place or \
            plan.table.listed or scheme not in PETASTORM_SCHEMES:
        return ()
    return MODULES


# choices already announced in this process: a rank resolves its reader every epoch,
# and saying it once at INFO is enough
_announced: set[tuple[str, str, str]] = set()


def _chosen(reader: str, why: str, where: str, quiet: bool = False) -> str:
    level = logging.DEBUG if quiet or (reader, why, where) in _announced else logging.INFO
    _announced.add((reader, why, where))
    log.log(level, "%s: using the %s reader: %s", where, reader, why)
    return reader
