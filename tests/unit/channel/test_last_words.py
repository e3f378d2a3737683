"""A rank's last words: sys.exit, os._exit and fatal signals reach the driver as failures
naming the rank, where it ran, and how it died; the worker is left as it was. No Spark:
a real driver channel and monitor, and real rank processes."""
from __future__ import annotations

import faulthandler
import os
import posix
import subprocess
import sys
import textwrap
import time

import pytest

from sparkddl.channel import DriverChannel
from sparkddl.launch.monitor import StageMonitor
from sparkddl.task.last_words import exit_message, failure, fatal_signals, reported_exits

WHERE = "10.1.2.3 (executor 7)"
# a rank: its channel, its last words, and the function it runs (its body filled in)
RANK = textwrap.dedent("""
    import ctypes, faulthandler, functools, os, signal, sys
    from sparkddl.channel import RankChannel
    from sparkddl.channel.client import open_last_words
    from sparkddl.task.last_words import fatal_signals
    host, port, secret = sys.argv[1], int(sys.argv[2]), sys.argv[3]
    channel = RankChannel(host, port, secret, 1, label={where!r})

    def user_function():
        {death}

    {before}
    with fatal_signals(functools.partial(open_last_words, host, port, secret, 1, {where!r})):
        user_function()
    {after}
    channel.close()
""")


@pytest.fixture
def driver():
    monitor = StageMonitor()
    with DriverChannel(monitor.handle, bind_host="127.0.0.1",
                       advertise_host="127.0.0.1") as channel:
        yield monitor, channel


def run_rank(channel: DriverChannel, death: str, before: str = "", after: str = ""
             ) -> subprocess.CompletedProcess:
    code = RANK.format(where=WHERE, death=death, before=before, after=after)
    return subprocess.run([sys.executable, "-c", code, "127.0.0.1", str(channel.port),
                           channel.secret], capture_output=True, text=True, timeout=60,
                          cwd=os.path.dirname(os.path.dirname(os.path.dirname(
                              os.path.dirname(os.path.abspath(__file__))))))


def closed(monitor: StageMonitor, rank: int, timeout: float = 10.0) -> None:
    deadline = time.monotonic() + timeout
    while rank not in monitor.closed and time.monotonic() < deadline:
        time.sleep(0.01)
    assert rank in monitor.closed


@pytest.mark.timeout(60)
@pytest.mark.parametrize("death, signal_text", [
    ("ctypes.string_at(0)", "SIGSEGV (11)"),
    ("os.kill(os.getpid(), signal.SIGSEGV)", "SIGSEGV (11)"),
    ("os.abort()", "SIGABRT (6)"),
])
def test_a_rank_killed_by_a_signal_is_named_with_the_signal_and_its_stack(driver, death,
                                                                        signal_text):
    monitor, channel = driver
    done = run_rank(channel, death)
    assert done.returncode < 0, done.stderr
    closed(monitor, 1)
    got = monitor.failures[1]
    assert got.message.startswith(f"killed by signal {signal_text}")
    assert got.host == WHERE
    assert got.traceback.startswith("Current thread")  # the crashing thread first
    assert "in user_function" in got.traceback and "Extension modules" not in got.traceback
    # handed over before the rank's channel closed: not taken for a silent death
    assert monitor.died_silently(time.monotonic()) == []


@pytest.mark.timeout(60)
def test_a_rank_that_ends_normally_leaves_no_last_words(driver):
    monitor, channel = driver
    started = time.monotonic()
    done = run_rank(channel, "pass")
    assert done.returncode == 0, done.stderr
    closed(monitor, 1)
    assert monitor.failures == {}
    assert time.monotonic() - started < 30


@pytest.mark.timeout(60)
def test_fatal_signals_restores_faulthandler(driver):
    """In a process of its own: pytest enables faulthandler in this one."""
    monitor, channel = driver
    done = run_rank(channel, "\n    ".join([
        "assert faulthandler.is_enabled()",
        "pid = os.fork()",
        "if pid == 0:  # a DataLoader worker, say: its crash is not the rank's",
        "    os._exit(3 if faulthandler.is_enabled() else 0)",
        "assert os.waitpid(pid, 0)[1] == 0"]), before="assert not faulthandler.is_enabled()",
        after="assert not faulthandler.is_enabled()")
    assert done.returncode == 0, done.stderr
    closed(monitor, 1)
    assert monitor.failures == {}


def test_fatal_signals_leaves_a_faulthandler_someone_else_enabled():
    def must_not_open():
        raise AssertionError("opened a last-words connection")

    assert faulthandler.is_enabled()  # pytest's, as Spark's would be
    with fatal_signals(must_not_open):
        pass
    assert faulthandler.is_enabled()


def test_os_exit_reports_before_it_exits_and_is_restored():
    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:  # the rank: its report goes into the pipe
        os.close(read)
        with reported_exits(lambda message, stack: os.write(write, f"{message}\n{stack}"
                                                           .encode())):
            os._exit(9)
    os.close(write)
    with os.fdopen(read) as f:
        report = f.read()
    assert os.waitstatus_to_exitcode(os.waitpid(pid, 0)[1]) == 9
    assert report.startswith("called os._exit(9) in the rank's code")
    assert "test_os_exit_reports_before_it_exits_and_is_restored" in report
    with reported_exits(lambda message, stack: None):
        assert os._exit is not posix._exit
    assert os._exit is posix._exit


def test_os_exit_in_a_forked_child_does_not_report():
    reports = []
    with reported_exits(lambda message, stack: reports.append(message)):
        pid = os.fork()
        if pid == 0:
            os._exit(0 if not reports else 5)  # the child's copy of the list is empty
        assert os.waitstatus_to_exitcode(os.waitpid(pid, 0)[1]) == 0
    assert reports == []


@pytest.mark.parametrize("code, text", [(3, "exited with code 3 (sys.exit(3) "),
                                        ("bye", "exited with code 1 (sys.exit('bye') ")])
def test_sys_exit_is_reported_with_its_code(code, text):
    assert text in exit_message(SystemExit(code))
    assert exit_message(ValueError("x")) is None


def test_last_words_without_a_known_signal_still_fail_the_rank():
    got = failure(2, "something odd", "h")
    assert got.message.startswith("died of a fatal error") and got.traceback == "something odd"
