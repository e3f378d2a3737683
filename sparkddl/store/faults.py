"""Storage faults a user can act on: a full disk, a quota, a read-only mount or a missing
permission met while writing to the Store becomes a StoreError that names the file, the
fault and (on a local filesystem) the space left there, and says what to do; the OS error
stays chained. Any other error passes through unchanged."""
from __future__ import annotations

import errno
import os
import re
import shutil
from contextlib import contextmanager
from typing import Iterator

from sparkddl.errors import StoreError

_ELSEWHERE = "or point the `store` option at another location"
FIXES = {
    errno.ENOSPC: f"free space on that filesystem {_ELSEWHERE} with room",
    errno.EDQUOT: f"free space within this user's quota, raise the quota, {_ELSEWHERE}",
    errno.EROFS: f"the filesystem is mounted read-only: remount it read-write {_ELSEWHERE}",
    errno.EACCES: f"this user may not write there: grant it write access {_ELSEWHERE}",
    errno.EPERM: f"this user may not write there: grant it write access {_ELSEWHERE}",
}
# pyarrow's filesystems carry the OS error's number in the text too ("[errno 28] No space ..."),
# and a wrapped (fsspec) filesystem may carry it only there
_ERRNO_IN_TEXT = re.compile(r"\[errno (\d+)\]", re.IGNORECASE)
# the last line of a Python traceback that ended in a StoreError, as Spark relays it
_REPORTED = re.compile(r"^sparkddl\.errors\.StoreError: (.+)$", re.MULTILINE)


def fault_errno(exc: BaseException) -> int | None:
    """The errno of ``exc`` if it is one of the storage faults in :data:`FIXES`, else None."""
    code = getattr(exc, "errno", None)
    if code is None:
        match = _ERRNO_IN_TEXT.search(str(exc))
        code = int(match.group(1)) if match else None
    if code is None and isinstance(exc, PermissionError):  # object stores: no errno
        code = errno.EACCES
    return code if code in FIXES else None


def storage_error(exc: BaseException, url: str, size: int | None = None) -> StoreError | None:
    """The StoreError explaining ``exc``, met while writing ``url`` (``size`` bytes, if
    known); None if ``exc`` is no storage fault."""
    code = fault_errno(exc)
    if code is None:
        return None
    what = f"{_human(size)} to " if size is not None else ""
    return StoreError(f"cannot write {what}{url}: {errno.errorcode[code]} "
                      f"({os.strerror(code)}){free_space(url)}; {FIXES[code]}")


@contextmanager
def explained(url: str, size: int | None = None) -> Iterator[None]:
    """Raise a storage fault met inside the block as :func:`storage_error`'s StoreError."""
    try:
        yield
    except OSError as exc:
        error = storage_error(exc, url, size)
        if error is None:
            raise
        raise error from exc


def from_executor(exc: BaseException) -> StoreError | None:
    """The StoreError an executor raised, if Spark's error ``exc`` (a PythonException, a
    Py4JJavaError, Connect's) reports one: Spark carries only its text, so it is raised
    again on the driver as the error it was; None for any other failure."""
    try:
        text = str(exc)
    except Exception:  # noqa: BLE001 - a JVM that held the message is gone
        return None
    found = _REPORTED.findall(text)
    return StoreError(found[-1].strip()) if found else None


def free_space(url: str) -> str:
    """``", 1.2 MiB free of 10.0 GiB at /mnt/store"`` for a local path or ``file://`` URL (the
    filesystem of its nearest existing folder), "" elsewhere or if it cannot be told."""
    # not urlparse: a store's paths may hold '#' and '?', which it would cut off
    path = url[len("file://"):] if url.startswith("file://") else url
    if not path.startswith("/"):
        return ""
    while path and not os.path.exists(path):
        parent = os.path.dirname(path)
        if parent == path:
            return ""
        path = parent
    try:
        usage = shutil.disk_usage(path)
    except OSError:
        return ""
    return f", {_human(usage.free)} free of {_human(usage.total)} at {path}"


def _human(size: int) -> str:
    if size < 1024:
        return f"{size} B"
    n = float(size)
    for unit in ("KiB", "MiB", "GiB", "TiB"):
        n /= 1024
        if n < 1024 or unit == "TiB":
            break
    return f"{n:.1f} {unit}"
