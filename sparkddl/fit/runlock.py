"""One fit at a time per run id: ``runs/<id>/active.json`` names the fit that holds the run.

Two fits of one run id would write over each other's checkpoints, history and fence, each
resuming from what the other wrote. The holder refreshes the file while it runs; another fit
of the same id is refused while the holder is alive: its file was refreshed within
``STALE_S`` and, on this host, its process exists (a driver killed with SIGKILL frees the
run at once). A fit that finds a dead holder's file takes the run over, so a resume by
``runId`` after a crash works as before.
"""
from __future__ import annotations

import json
import logging
import os
import socket
import threading
import time
import uuid
from contextlib import contextmanager
from typing import Any, Iterator

from sparkddl.errors import ConfigError
from sparkddl.store import Store

log = logging.getLogger(__name__)

REFRESH_S = 10.0  # how often the holder rewrites its file
STALE_S = 45.0  # a holder on another host whose file is older than this is taken as gone
_HELD: set[tuple[str, str]] = set()  # (store root, run id) held by fits of this process
_LOCK = threading.Lock()


@contextmanager
def holding(store: Store, run_id: str) -> Iterator[None]:
    """Hold ``run_id`` in ``store`` for the ``with`` block; ConfigError where another fit
    holds it."""
    url = store.run_url(run_id, "active.json")
    me = {"host": socket.gethostname(), "pid": os.getpid(), "token": uuid.uuid4().hex,
          "since": time.time()}
    with _LOCK:
        if (store.root, run_id) in _HELD:
            raise _busy(run_id, {**me, "token": "?"}, "this process")
        holder = _holder(store, url)
        if holder is not None and _alive(store, url, holder):
            raise _busy(run_id, holder, f"process {holder.get('pid')} on "
                                        f"{holder.get('host')}")
        store.write_bytes(url, json.dumps(me).encode())
        _HELD.add((store.root, run_id))
    stop = threading.Event()
    refresher = threading.Thread(target=_refresh, args=(store, url, me, stop), daemon=True,
                                 name=f"sparkddl-runlock-{run_id}")
    refresher.start()
    try:
        yield
    finally:
        stop.set()
        refresher.join()
        with _LOCK:
            _HELD.discard((store.root, run_id))
        _release(store, url, me["token"])


def _release(store: Store, url: str, token: str) -> None:
    """Remove this fit's file; a store that cannot be read or written now (the fit's own
    error says so, if any) leaves it, and it goes stale."""
    try:
        if (_holder(store, url) or {}).get("token") == token:
            store.delete(url)
    except Exception as exc:  # noqa: BLE001 - never over the fit's outcome
        log.warning("could not remove %s: %s; it goes stale in %gs", url, exc, STALE_S)


def _holder(store: Store, url: str) -> dict[str, Any] | None:
    try:
        holder = json.loads(store.read_bytes(url))
    except FileNotFoundError:
        return None
    except ValueError:  # a half-written or foreign file: no one can be shown to hold it
        return None
    return holder if isinstance(holder, dict) else None


def _alive(store: Store, url: str, holder: dict[str, Any]) -> bool:
    """A holder is alive while its file is fresh and, on this host, its process exists (a
    driver killed outright frees the run at once; a number reused by another process does
    not hold it past STALE_S)."""
    mtime = store.filesystem().get_file_info(store.fs_path(url)).mtime
    if mtime is None or time.time() - mtime.timestamp() >= STALE_S:
        return False
    if holder.get("host") == socket.gethostname() and isinstance(holder.get("pid"), int):
        if holder["pid"] == os.getpid():  # this process: only a fit of it holds the run
            return False
        try:
            os.kill(holder["pid"], 0)
        except ProcessLookupError:
            return False
        except PermissionError:  # another user's live process
            return True
    return True


def _refresh(store: Store, url: str, me: dict[str, Any], stop: threading.Event) -> None:
    while not stop.wait(REFRESH_S):
        try:
            if (_holder(store, url) or {}).get("token") != me["token"]:
                return  # taken over (this driver was presumed dead): write nothing more
            store.write_bytes(url, json.dumps(me).encode())
        except Exception as exc:  # noqa: BLE001 - the fit's own writes report a bad store
            log.debug("could not refresh %s: %s", url, exc)


def _busy(run_id: str, holder: dict[str, Any], who: str) -> ConfigError:
    since = holder.get("since")
    when = time.strftime("%H:%M:%S", time.localtime(since)) if isinstance(since, float) else "?"
    return ConfigError(f"run {run_id!r} is being fitted by another fit ({who}, since {when}); "
                       "two fits of one runId would write over each other's checkpoints: wait "
                       "for it to end (or cancel it), or leave runId unset to start a new run")
