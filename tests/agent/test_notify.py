import os
import socket
from collections.abc import Iterator
from pathlib import Path

import pytest

from edgedeploy_agent.notify import Notifier, sd_notify, watchdog_period_s


@pytest.fixture
def notify_socket(tmp_path: Path) -> Iterator[tuple[socket.socket, str]]:
    path = str(tmp_path / "notify.sock")
    s = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    s.bind(path)
    s.settimeout(2.0)
    yield s, path
    s.close()


def test_sd_notify_round_trip_path_and_abstract(notify_socket: tuple[socket.socket, str]) -> None:
    sock, path = notify_socket
    assert sd_notify("READY=1", {"NOTIFY_SOCKET": path})
    assert sock.recv(4096) == b"READY=1"
    abstract = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    name = f"edgedeploy-test-{os.getpid()}"
    abstract.bind("\0" + name)
    abstract.settimeout(2.0)
    try:
        assert sd_notify("WATCHDOG=1", {"NOTIFY_SOCKET": "@" + name})
        assert abstract.recv(4096) == b"WATCHDOG=1"
    finally:
        abstract.close()


def test_without_systemd_nothing_is_sent() -> None:
    assert sd_notify("READY=1", {}) is False
    n = Notifier({})
    n.ready("x")
    n.ping()  # no socket, no watchdog: silently nothing


def test_watchdog_period_is_half_and_only_for_our_pid() -> None:
    assert watchdog_period_s({"WATCHDOG_USEC": "30000000"}) == 15.0
    assert watchdog_period_s({"WATCHDOG_USEC": "30000000", "WATCHDOG_PID": str(os.getpid())}) == 15.0
    assert watchdog_period_s({"WATCHDOG_USEC": "30000000", "WATCHDOG_PID": "1"}) is None
    assert watchdog_period_s({}) is None


def test_pings_are_rate_limited(notify_socket: tuple[socket.socket, str]) -> None:
    sock, path = notify_socket
    now = [100.0]
    n = Notifier({"NOTIFY_SOCKET": path, "WATCHDOG_USEC": "100000"}, clock=lambda: now[0])  # 50 ms at most
    n.ready("serving")
    assert sock.recv(4096) == b"READY=1\nSTATUS=serving"
    for _ in range(20):  # within 50 ms of READY: nothing
        n.ping()
        now[0] += 0.002
    now[0] = 100.06
    n.ping()  # past 50 ms after READY: one ping
    n.ping()  # and none right after it
    now[0] = 100.2
    n.ping()
    sock.settimeout(0.2)
    got = []
    try:
        while True:
            got.append(sock.recv(4096))
    except TimeoutError:
        pass
    assert got == [b"WATCHDOG=1", b"WATCHDOG=1"]


def test_a_vanished_socket_does_not_kill_the_service(tmp_path: Path) -> None:
    n = Notifier({"NOTIFY_SOCKET": str(tmp_path / "gone.sock")})
    n.ready("x")
    assert n.enabled is False
