"""systemd readiness and watchdog notifications over NOTIFY_SOCKET, with no dependency.

The protocol is one datagram per message on the AF_UNIX socket systemd names in $NOTIFY_SOCKET
(a path, or an abstract name written with a leading '@'). Outside systemd every call is a no-op.
"""

import os
import socket
import time
from collections.abc import Callable, Mapping
from typing import Optional


def sd_notify(message: str, environ: Optional[Mapping[str, str]] = None) -> bool:
    """Send one notification; False when there is no NOTIFY_SOCKET (not run by systemd)."""
    env = os.environ if environ is None else environ
    addr = env.get("NOTIFY_SOCKET", "")
    if not addr:
        return False
    if addr[0] == "@":
        addr = "\0" + addr[1:]
    with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM | socket.SOCK_CLOEXEC) as s:
        s.connect(addr)
        s.sendall(message.encode("utf-8"))
    return True


def watchdog_period_s(environ: Optional[Mapping[str, str]] = None) -> Optional[float]:
    """Half of WATCHDOG_USEC in seconds when the watchdog is meant for this process, else None."""
    env = os.environ if environ is None else environ
    usec, pid = env.get("WATCHDOG_USEC"), env.get("WATCHDOG_PID")
    if not usec or (pid and pid != str(os.getpid())):
        return None
    try:
        return max(int(usec) / 2e6, 0.001)
    except ValueError:
        return None


class Notifier:
    """What the main loop calls: ready(), status(), and ping() as often as it likes (rate-limited)."""

    def __init__(
        self, environ: Optional[Mapping[str, str]] = None, clock: Callable[[], float] = time.monotonic
    ) -> None:
        self._env = dict(os.environ if environ is None else environ)
        self.clock = clock
        self.enabled = bool(self._env.get("NOTIFY_SOCKET"))
        self.period_s = watchdog_period_s(self._env)
        self._last_ping = 0.0
        self._last_status = ""

    def _send(self, message: str) -> None:
        if self.enabled:
            try:
                sd_notify(message, self._env)
            except OSError:
                # systemd went away (or a test closed its socket): the service keeps running
                self.enabled = False

    def ready(self, status: str) -> None:
        self._send(f"READY=1\nSTATUS={status}")
        self._last_status = status
        self._last_ping = self.clock()

    def status(self, status: str) -> None:
        if status != self._last_status:
            self._send(f"STATUS={status}")
            self._last_status = status

    def stopping(self) -> None:
        self._send("STOPPING=1")

    def ping(self) -> None:
        """WATCHDOG=1 at most every half watchdog period; call it from the main loop only."""
        if self.period_s is None:
            return
        now = self.clock()
        if now - self._last_ping >= self.period_s:
            self._send("WATCHDOG=1")
            self._last_ping = now
