"""The agent's log, and `edgedeploy-agent logs`: its last lines, optionally since a time, optionally followed.

In process mode the service writes ROOT/logs/agent.log (service.ProcessService); every line the agent's
Python writes to stderr there starts with an ISO-8601 UTC time (`stamp_stderr`), so `--since` can select by
it (a line without one, written by a native library straight to fd 2, belongs to the line before it). In
systemd mode the log is the unit's journal, read with journalctl; there the agent writes no time of its own
(journald stamps every line).

Following ends on SIGINT, SIGTERM or SIGHUP, and when the reader goes away (stdout hung up: the SSH
session of `edgedeploy logs --follow` closed), so no follower outlives the host that asked for it.
"""

import datetime as _dt
import io
import os
import re
import select
import signal
import subprocess
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any, BinaryIO, Callable, Optional, TextIO

from .errors import AgentError

MAX_LINES = 10000
DEFAULT_LINES = 200
MAX_SCAN_BYTES = 32 << 20  # the tail is looked for in the last 32 MiB of the file at most
_STAMP = re.compile(rb"^(\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d(?:\.\d+)?(?:Z|[+-]\d\d:\d\d))\s")
_SPAN = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*(s|m|min|h|d)\s*$")
_UNIT_S = {"s": 1, "m": 60, "min": 60, "h": 3600, "d": 86400}


class LogUnavailable(AgentError):
    """The agent's log cannot be read (no log file yet, no journalctl)."""

    code = "log-unavailable"
    exit_code = 13


def parse_since(text: str) -> float:
    """'90s', '30m', '1h', '2d' -> seconds back from now; raises ValueError naming the forms."""
    m = _SPAN.match(text)
    if not m or float(m.group(1)) <= 0:
        raise ValueError(f"--since {text!r}: expected a time span such as 90s, 30m, 1h or 2d")
    return float(m.group(1)) * _UNIT_S[m.group(2)]


def stamp() -> str:
    return _dt.datetime.now(_dt.timezone.utc).isoformat("T", "milliseconds")


class StampedLines(io.TextIOBase):
    """A text stream that starts every line with the UTC time (the agent's stderr when it is the log file)."""

    def __init__(self, inner: TextIO) -> None:
        self.inner, self._line_start = inner, True

    def write(self, s: str) -> int:
        out = []
        for piece in s.splitlines(keepends=True):
            if self._line_start:
                out.append(stamp() + " ")
            out.append(piece)
            self._line_start = piece.endswith("\n")
        self.inner.write("".join(out))
        return len(s)

    def flush(self) -> None:
        self.inner.flush()

    def fileno(self) -> int:
        return self.inner.fileno()


def stamp_stderr() -> None:
    """`run`'s stderr is its log: stamp its lines, unless journald reads it (it stamps them; JOURNAL_STREAM says so)."""
    if not os.environ.get("JOURNAL_STREAM"):
        sys.stderr = StampedLines(sys.stderr)


def _stamp(line: bytes) -> Optional[_dt.datetime]:
    m = _STAMP.match(line)
    if not m:
        return None
    try:
        return _dt.datetime.fromisoformat(m.group(1).decode().replace("Z", "+00:00"))
    except ValueError:
        return None


def tail_lines(path: Path, lines: int, since: Optional[_dt.datetime] = None) -> tuple[list[bytes], int]:
    """The last `lines` lines of the file (those at or after `since`), and the offset its end had."""
    with open(path, "rb") as f:
        end = f.seek(0, os.SEEK_END)
        start = max(0, end - MAX_SCAN_BYTES)
        f.seek(start)
        data = f.read(end - start)
    chunk = data.split(b"\n")
    if chunk and chunk[-1] == b"":
        chunk.pop()
    if start > 0 and chunk:
        chunk.pop(0)  # the first line is cut
    if since is not None:
        kept, when = [], None
        for line in chunk:
            when = _stamp(line) or when  # an unstamped line belongs to the stamped one before it
            if when is not None and when >= since:
                kept.append(line)
        chunk = kept
    return chunk[-lines:] if lines else [], end


def _hung_up(fd: int) -> bool:
    """True once the reader of our stdout is gone (POLLHUP/POLLERR on a pipe or socket)."""
    p = select.poll()
    p.register(fd, select.POLLERR | select.POLLHUP)
    return any(ev & (select.POLLERR | select.POLLHUP) for _, ev in p.poll(0))


class Stop:
    """Set by SIGINT/SIGTERM/SIGHUP, or when stdout hangs up."""

    def __init__(self, out_fd: int) -> None:
        self.out_fd, self.requested = out_fd, False
        for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
            signal.signal(sig, self._set)

    def _set(self, signum: int, frame: Any) -> None:
        self.requested = True

    def __bool__(self) -> bool:
        return self.requested or _hung_up(self.out_fd)


def follow_file(path: Path, offset: int, out: BinaryIO, stop: Callable[[], bool], poll_s: float = 0.25) -> None:
    """Print what is appended to `path` from `offset` on; a truncated or replaced file is read from its start."""
    f = open(path, "rb")
    try:
        inode, pending = os.fstat(f.fileno()).st_ino, b""
        f.seek(offset)
        while not stop():
            data = f.read(1 << 16)
            if data:
                lines, _, pending = (pending + data).rpartition(b"\n")
                if lines:
                    out.write(lines + b"\n")
                    out.flush()
                continue
            try:
                st = os.stat(path)
            except FileNotFoundError:
                st = None
            if st is not None and (st.st_ino != inode or st.st_size < f.tell()):
                f.close()
                f = open(path, "rb")
                inode, pending = os.fstat(f.fileno()).st_ino, b""
            time.sleep(poll_s)
    finally:
        f.close()


def journalctl_argv(unit: str, lines: int, since: Optional[_dt.datetime], follow: bool) -> list[str]:
    """Pure: the journalctl command for the unit's last lines (since a local time), followed or not."""
    argv = ["journalctl", "--unit", unit, "--no-pager", "--output", "short-iso", "--lines", str(lines)]
    if since is not None:
        argv += ["--since", since.astimezone().strftime("%Y-%m-%d %H:%M:%S")]
    return argv + (["--follow"] if follow else [])


def run_journalctl(argv: Sequence[str], stop: Callable[[], bool]) -> int:
    """journalctl writing straight to our stdout; ended when we are asked to stop."""
    try:
        proc = subprocess.Popen(list(argv), stdin=subprocess.DEVNULL)
    except FileNotFoundError:
        raise LogUnavailable(
            "journalctl is not installed on this device", hint="systemd mode logs to the journal: install systemd"
        ) from None
    while proc.poll() is None:
        if stop():
            proc.terminate()
            try:
                proc.wait(5)
            except subprocess.TimeoutExpired:
                proc.kill()
            return 0
        time.sleep(0.2)
    return proc.returncode


def print_logs(
    log_file: Path,
    unit: Optional[str],
    lines: int,
    since_s: Optional[float],
    follow: bool,
    out: BinaryIO,
) -> int:
    """`edgedeploy-agent logs`: the journal of `unit` when given (systemd mode), else the log file."""
    if not 0 < lines <= MAX_LINES:
        raise LogUnavailable(f"--lines must be between 1 and {MAX_LINES}, got {lines}")
    since = None if since_s is None else _dt.datetime.now(_dt.timezone.utc) - _dt.timedelta(seconds=since_s)
    stop = Stop(out.fileno())
    if unit is not None:
        out.flush()
        return run_journalctl(journalctl_argv(unit, lines, since, follow), lambda: bool(stop))
    if not log_file.is_file():
        raise LogUnavailable(
            f"no agent log at {log_file} yet",
            hint="process mode writes it once the agent was started (edgedeploy push DEVICE BUNDLE)",
        )
    tail, end = tail_lines(log_file, lines, since)
    if tail:
        out.write(b"\n".join(tail) + b"\n")
        out.flush()
    if follow:
        follow_file(log_file, end, out, lambda: bool(stop))
    return 0
