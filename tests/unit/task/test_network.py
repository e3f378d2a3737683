"""Which interface a rank's collectives use, and how a rank is named (no Spark)."""
from __future__ import annotations

import socket

import pytest

from sparkddl.task import network


def non_loopback_address() -> tuple[str, str] | None:
    for _, name in socket.if_nameindex():
        ip = network._primary_ipv4(name)
        if ip and not ip.startswith("127."):
            return name, ip
    return None


def test_the_interface_carrying_the_executors_address_is_chosen_for_every_backend():
    found = non_loopback_address()
    if found is None:
        pytest.skip("this machine has no interface with a non-loopback IPv4 address")
    name, ip = found
    assert network.interface_env(ip, environ={}) == {
        "GLOO_SOCKET_IFNAME": name, "NCCL_SOCKET_IFNAME": name, "TP_SOCKET_IFNAME": name}


def test_the_users_setting_wins_and_loopback_needs_nothing():
    assert network.interface_env("10.0.0.1", environ={"NCCL_SOCKET_IFNAME": "ib0"}) == {}
    assert network.interface_env("127.0.0.1", environ={}) == {}
    assert network.interface_env("localhost", environ={}) == {}


def test_an_address_no_interface_carries_sets_nothing_and_says_so(caplog):
    assert network.interface_env("203.0.113.77", environ={}) == {}  # TEST-NET-3
    assert "no local interface carries the executor's address 203.0.113.77" in caplog.text


def test_ranks_are_named_by_executor_address_and_id(monkeypatch):
    monkeypatch.delenv("SPARK_EXECUTOR_ID", raising=False)
    monkeypatch.setenv("SPARK_LOG_URL_STDERR",
                       "http://10.1.2.3:8081/logPage/?appId=app-1&executorId=7&logType=stderr")
    assert network.rank_label("10.1.2.3") == f"10.1.2.3 (executor 7, host {socket.gethostname()})"
    monkeypatch.delenv("SPARK_LOG_URL_STDERR")
    monkeypatch.delenv("SPARK_LOG_URL_STDOUT", raising=False)
    assert network.rank_label("10.1.2.3") == f"10.1.2.3 (host {socket.gethostname()})"
    assert network.executor_address("10.1.2.3:41999") == "10.1.2.3"
