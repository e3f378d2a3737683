"""A small tmpfs to fill up or remount read-only, for tests of storage faults (root only:
they skip, saying why, where mounting is not permitted)."""
from __future__ import annotations

import errno
import os
import shutil
import subprocess
from contextlib import contextmanager
from pathlib import Path
from typing import Iterator

import pytest

MOUNT_TIMEOUT_S = 30


@contextmanager
def small_filesystem(parent: Path, size: str = "1m") -> Iterator[Path]:
    """A tmpfs of ``size`` mounted under ``parent``, unmounted however the test ends."""
    if not hasattr(os, "geteuid") or os.geteuid() != 0:
        pytest.skip("mounting a tmpfs (a filesystem to fill up) needs root")
    mnt = parent / "small-fs"
    mnt.mkdir()
    done = subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(mnt)],
                          capture_output=True, text=True, timeout=MOUNT_TIMEOUT_S)
    if done.returncode:
        pytest.skip(f"mounting a tmpfs is not permitted here: {done.stderr.strip()}")
    try:
        yield mnt
    finally:
        if subprocess.run(["umount", str(mnt)], timeout=MOUNT_TIMEOUT_S).returncode:
            # still busy (a file left open by a failing test): detach it all the same
            subprocess.run(["umount", "-l", str(mnt)], check=True, timeout=MOUNT_TIMEOUT_S)


def fill(mnt: Path, leave: int = 0) -> Path:
    """Take all but about ``leave`` bytes of the filesystem's free space with one file."""
    filler = mnt / "filler"
    want = max(shutil.disk_usage(mnt).free - leave, 0)
    fd = os.open(filler, os.O_WRONLY | os.O_CREAT)
    try:
        while want > 0:
            want -= os.write(fd, b"\0" * min(want, 1 << 16))
    except OSError as exc:  # the disk was full before ``leave`` was reached: fine
        if exc.errno != errno.ENOSPC:
            raise
    finally:
        os.close(fd)
    return filler


def make_read_only(mnt: Path) -> None:
    subprocess.run(["mount", "-o", "remount,ro", str(mnt)], check=True, capture_output=True,
                   timeout=MOUNT_TIMEOUT_S)


def free(mnt: Path) -> int:
    return shutil.disk_usage(mnt).free
