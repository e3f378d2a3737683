"""One fit at a time per run id (runs/<id>/active.json), on the local filesystem for real."""
from __future__ import annotations

import json
import os
import subprocess
import sys
import time

import pytest

from sparkddl.errors import ConfigError
from sparkddl.fit import runlock
from sparkddl.store import Store


def _holder_file(store: Store, run_id: str, **holder) -> str:
    url = store.run_url(run_id, "active.json")
    store.write_bytes(url, json.dumps({"token": "other", "since": time.time(), **holder}).encode())
    return store.fs_path(url)


def test_a_second_fit_of_a_held_run_is_refused_and_the_run_is_free_after(tmp_path):
    store = Store.from_uri(tmp_path)
    with runlock.holding(store, "r1"):
        with pytest.raises(ConfigError, match=r"run 'r1' is being fitted by another fit "
                                              r"\(this process.*leave runId unset"):
            with runlock.holding(store, "r1"):
                pass
        with runlock.holding(store, "r2"):  # another run id is another run
            pass
    assert not os.path.exists(store.fs_path(store.run_url("r1", "active.json")))
    with runlock.holding(store, "r1"):
        pass


def test_a_live_process_on_this_host_holds_the_run_a_dead_one_does_not(tmp_path):
    import socket
    store = Store.from_uri(tmp_path)
    sleeper = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        path = _holder_file(store, "r", host=socket.gethostname(), pid=sleeper.pid)
        with pytest.raises(ConfigError, match=rf"process {sleeper.pid} on "):
            with runlock.holding(store, "r"):
                pass
        old = time.time() - runlock.STALE_S - 5  # the number was reused: the file went stale
        os.utime(path, (old, old))
        with runlock.holding(store, "r"):
            pass
        _holder_file(store, "r", host=socket.gethostname(), pid=sleeper.pid)
    finally:
        sleeper.kill()
        sleeper.wait()
    with runlock.holding(store, "r"):  # its driver was killed: a resume takes the run over
        pass


def test_a_holder_on_another_host_counts_while_its_file_is_fresh(tmp_path, monkeypatch):
    store = Store.from_uri(tmp_path)
    path = _holder_file(store, "r", host="elsewhere", pid=1)
    with pytest.raises(ConfigError, match=r"process 1 on elsewhere"):
        with runlock.holding(store, "r"):
            pass
    old = time.time() - runlock.STALE_S - 5
    os.utime(path, (old, old))
    with runlock.holding(store, "r"):
        pass


def test_the_holder_refreshes_its_file(tmp_path, monkeypatch):
    monkeypatch.setattr(runlock, "REFRESH_S", 0.05)
    store = Store.from_uri(tmp_path)
    path = store.fs_path(store.run_url("r", "active.json"))
    with runlock.holding(store, "r"):
        old = time.time() - 1000
        os.utime(path, (old, old))
        time.sleep(0.5)
        assert time.time() - os.path.getmtime(path) < 1


def test_a_store_that_fails_at_release_does_not_hide_the_fits_outcome(tmp_path, monkeypatch):
    store = Store.from_uri(tmp_path)

    def broken(self, url):
        raise OSError(30, "Read-only file system")

    with pytest.raises(ValueError, match="the fit's own error"):
        with runlock.holding(store, "r"):
            monkeypatch.setattr(Store, "delete", broken)
            raise ValueError("the fit's own error")
