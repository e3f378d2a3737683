"""Two hosts made of network namespaces (tests/hosts.py): a standalone master and a 1-core
worker on each, the driver on the first; the hostname resolves to 127.0.0.1 on both.
``sparkddl.run``, TorchDistributor, fit and transform work across them; a host that drops
off the network is found within seconds and the fit goes on with fewer ranks (minWorkers)
or ends with a ClusterError naming it; a partition that heals in time costs nothing."""
from __future__ import annotations

import json
import re
import sys
import time
from pathlib import Path

import pytest

from tests import hosts as harness

SCRIPT = Path(__file__).with_name("scripts") / "multihost.py"
why = harness.unavailable()
pytestmark = pytest.mark.skipif(bool(why), reason=why or "")


def result(output: str) -> dict:
    lines = [line for line in output.splitlines() if line.startswith("RESULT ")]
    assert lines, output[-3000:]
    return json.loads(lines[-1][len("RESULT "):])


def driver(hosts: harness.Hosts, url: str, mode: str) -> tuple:
    env = {"SPARK_LOCAL_IP": hosts.addresses[0], "PYSPARK_PYTHON": sys.executable}
    return hosts.popen(0, [sys.executable, str(SCRIPT), mode, url, str(hosts.dir / "store")],
                       f"driver-{mode}", env)


def finish(proc, log: Path, timeout_s: float) -> dict:
    proc.wait(timeout_s)
    return result(log.read_text())


@pytest.fixture(scope="module")
def two_hosts():
    with harness.Hosts(2) as hosts, hosts.spark(workers=[0, 1]) as url:
        yield hosts, url
    assert not hosts.leftovers()


@pytest.mark.timeout(240)
@pytest.mark.parametrize("mode", ["run", "distributor"])
def test_collectives_run_across_hosts_on_the_executors_interface(two_hosts, mode):
    hosts, url = two_hosts
    out = finish(*driver(hosts, url, mode), 180)
    assert out["ok"], out.get("message")
    ranks = out["result"]["ranks"]
    assert [r["sum"] for r in ranks] == [3.0, 3.0]
    # each rank took the interface carrying its own executor's address, not the hostname's
    assert sorted(r["ifname"] for r in ranks) == sorted(hosts.links)


@pytest.mark.timeout(300)
def test_fit_and_transform_across_hosts(two_hosts):
    hosts, url = two_hosts
    out = finish(*driver(hosts, url, "fit"), 240)
    assert out["ok"], out.get("message")
    assert out["epochs"] == 3 and out["restarts"] == []
    assert out["accuracy"] >= 0.85


def cut_after_epoch(hosts: harness.Hosts, proc, log: Path, epoch: int = 2) -> float:
    """Take host 1 off the network once the driver has seen ``epoch``; when that was."""
    deadline = time.monotonic() + 180
    while f"EPOCH {epoch} " not in log.read_text():
        assert proc.poll() is None and time.monotonic() < deadline, log.read_text()[-3000:]
        time.sleep(0.2)
    hosts.cut(1)
    return time.monotonic()


def lost_after(hosts: harness.Hosts, log: Path, cut_at: float, proc) -> float:
    """Seconds from the cut to the driver's line naming the rank on host 1 lost (whichever
    rank Spark placed there)."""
    named = re.compile(rf"lost rank \d at {re.escape(hosts.addresses[1])} \(executor ")
    while not named.search(log.read_text()):
        assert proc.poll() is None, log.read_text()[-3000:]
        time.sleep(0.1)
    return time.monotonic() - cut_at


def lose_host_1(mode: str, heal_on: str = "") -> tuple[dict, str, float]:
    """Run the driver in ``mode`` on fresh hosts, cut host 1 after epoch 2 (and bring it back
    once the driver logs ``heal_on``); (the driver's result, host 1's address, seconds from
    the cut to the end). Asserts the loss was found within 15 s."""
    with harness.Hosts(2) as hosts, hosts.spark(workers=[0, 1]) as url:
        proc, log = driver(hosts, url, mode)
        cut_at = cut_after_epoch(hosts, proc, log)
        assert lost_after(hosts, log, cut_at, proc) <= 15
        if heal_on:
            while heal_on not in log.read_text() and proc.poll() is None:
                time.sleep(0.2)
            hosts.heal(1)
        out = finish(proc, log, 300)
        ended = time.monotonic() - cut_at
    assert not hosts.leftovers()
    return out, hosts.addresses[1], ended


@pytest.mark.timeout(400)
def test_a_lost_host_is_found_in_seconds_the_fit_goes_on_with_fewer_ranks_and_grows_back():
    out, lost_address, _ = lose_host_1("elastic", heal_on="going on with 1 of 2 ranks")
    assert out["ok"], out.get("message")
    history = out["history"]
    assert [r["epoch"] for r in history] == list(range(1, 21))  # every epoch, once
    shrink, grow = out["restarts"]
    assert shrink["world_size"] == 1 and shrink["resumed_from_step"] == 0
    assert f"at {lost_address} (executor " in shrink["reason"]
    assert grow["world_size"] == 2 and grow["reason"] == "grew back from 1 to 2 ranks"
    worlds = {r["epoch"]: r["world_size"] for r in history}
    assert {worlds[e] for e in range(1, shrink["resumed_from_epoch"] + 1)} == {2}
    assert {worlds[e] for e in range(shrink["resumed_from_epoch"] + 1,
                                     grow["resumed_from_epoch"] + 1)} == {1}
    assert {worlds[e] for e in range(grow["resumed_from_epoch"] + 1, 21)} == {2}
    # every epoch, at either world size, trains every row once but fewer than one global
    # batch (64 rows: 2 x 32, or 1 x 64 once shrunk)
    assert len({r["rows_trained"] + r["rows_skipped"] for r in history}) == 1
    assert all(0 <= r["rows_skipped"] < 64 for r in history)
    assert out["accuracy"] >= 0.85


@pytest.mark.timeout(400)
def test_without_min_workers_a_lost_host_ends_the_fit_naming_it():
    out, lost_address, ended = lose_host_1("lost")
    assert out["error"] == "ClusterError", out
    message = out["message"]
    assert re.search(rf"after losing rank \d at {re.escape(lost_address)} \(executor ",
                     message), message
    assert "1 free task slot(s) for numWorkers=2 (minWorkers=2) after waiting 10s" in message
    assert "lower minWorkers" in message
    assert ended < 15 + 10 + 30  # detection, the slot wait, the cancelled stage's end


@pytest.mark.timeout(400)
def test_a_partition_that_heals_in_time_costs_no_restart():
    with harness.Hosts(2) as hosts, hosts.spark(workers=[0, 1]) as url:
        proc, log = driver(hosts, url, "elastic")
        cut_after_epoch(hosts, proc, log)
        time.sleep(4)  # below the 10 s a rank may go unheard
        hosts.heal(1)
        out = finish(proc, log, 300)
    assert out["ok"], out.get("message")
    assert out["restarts"] == []
    assert [r["epoch"] for r in out["history"]] == list(range(1, 21))
    assert {r["world_size"] for r in out["history"]} == {2}
