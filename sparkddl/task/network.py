"""Which network interface a rank's collectives use, and how a rank is named.

gloo and NCCL pick their interface from the machine's hostname unless told otherwise; on
many images the hostname resolves to a loopback address, and the first collective between
two hosts then fails ("Gloo connectFullMesh failed ... remote=[127.0.0.1]"). Spark already
knows the address each executor is reached at, so each rank takes the interface carrying
its own executor's address, unless the user named one.
"""
from __future__ import annotations

import ipaddress
import logging
import os
import re
import socket
import subprocess
from typing import Mapping

log = logging.getLogger(__name__)

# the settings a user may have made: theirs win
IFNAME_VARIABLES = ("GLOO_SOCKET_IFNAME", "NCCL_SOCKET_IFNAME", "TP_SOCKET_IFNAME")
_SIOCGIFADDR = 0x8915
_IP_ADDR_LINE = re.compile(r"^\d+:\s+(\S+)\s+inet\s+([\d.]+)/")


def executor_address(address: str) -> str:
    """The host part of Spark's ``host:port`` task address."""
    return address.rsplit(":", 1)[0].strip("[]")


def interface_env(address: str, environ: Mapping[str, str] | None = None) -> dict[str, str]:
    """The interface settings to add for a rank whose executor Spark reaches at ``address``
    (host or IP): {} when the user set them, when the address is a loopback one (a single
    machine: the defaults work) or when no local interface carries it."""
    environ = os.environ if environ is None else environ
    if any(environ.get(v) for v in IFNAME_VARIABLES):
        return {}
    ip = _ipv4(address)
    if ip is None or ipaddress.ip_address(ip).is_loopback:
        return {}
    name = interface_of(ip)
    if name is None:
        log.warning("no local interface carries the executor's address %s (%s); gloo/NCCL "
                    "choose one from the hostname. Set GLOO_SOCKET_IFNAME / "
                    "NCCL_SOCKET_IFNAME (spark.executorEnv.*) if collectives fail", address, ip)
        return {}
    return {v: name for v in IFNAME_VARIABLES}


def interface_of(ip: str) -> str | None:
    """The name of the local interface with IPv4 address ``ip``."""
    for _, name in socket.if_nameindex():
        if _primary_ipv4(name) == ip:
            return name
    return _from_ip_command(ip)  # secondary addresses are not the ioctl's


def _ipv4(address: str) -> str | None:
    try:
        return socket.gethostbyname(address)
    except OSError:
        return None


def _primary_ipv4(name: str) -> str | None:
    import fcntl
    import struct
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        try:
            packed = fcntl.ioctl(s.fileno(), _SIOCGIFADDR,
                                 struct.pack("256s", name.encode()[:15]))
        except OSError:  # no IPv4 address on it
            return None
    return socket.inet_ntoa(packed[20:24])


def _from_ip_command(ip: str) -> str | None:
    try:
        out = subprocess.run(["ip", "-o", "-4", "addr", "show"], capture_output=True,
                             text=True, timeout=5).stdout
    except (OSError, subprocess.SubprocessError):
        return None
    for line in out.splitlines():
        found = _IP_ADDR_LINE.match(line)
        if found and found.group(2) == ip:
            return found.group(1)
    return None


def executor_id() -> str:
    """This executor's id where the cluster manager says it (Kubernetes: SPARK_EXECUTOR_ID;
    standalone: in the log URLs), else ''."""
    if os.environ.get("SPARK_EXECUTOR_ID"):
        return os.environ["SPARK_EXECUTOR_ID"]
    for var in ("SPARK_LOG_URL_STDERR", "SPARK_LOG_URL_STDOUT"):
        found = re.search(r"executorId=([\w-]+)", os.environ.get(var, ""))
        if found:
            return found.group(1)
    return ""


def rank_label(address: str) -> str:
    """How errors and logs name a rank's place: the executor's address and id, and the
    machine's hostname (which alone may say nothing: many hosts share 'localhost')."""
    ident = executor_id()
    return f"{address} ({f'executor {ident}, ' if ident else ''}host {socket.gethostname()})"
