"""The agent's log: stamped lines, the tail and --since over a real file, following it, the journalctl argv."""

from __future__ import annotations

import datetime as dt
import io
import json
import os
import sys
import threading
import time
from pathlib import Path

import pytest

from edgedeploy_agent.agentlog import (
    StampedLines,
    follow_file,
    journalctl_argv,
    parse_since,
    stamp_stderr,
    tail_lines,
)
from tests.helpers import agent

UTC = dt.timezone.utc


def test_parse_since() -> None:
    assert parse_since("90s") == 90 and parse_since("30m") == 1800 and parse_since("1h") == 3600
    assert parse_since("2d") == 172800 and parse_since("1.5h") == 5400
    for bad in ("", "1", "h", "-1h", "0s", "1 week", "1h; rm -rf /"):
        with pytest.raises(ValueError, match="time span"):
            parse_since(bad)


def test_stderr_lines_are_stamped_unless_journald_reads_them(monkeypatch: pytest.MonkeyPatch) -> None:
    out = io.StringIO()
    stamped = StampedLines(out)
    stamped.write("edgedeploy-agent: hel")
    stamped.write("lo\nTraceback (most recent call last):\n  File x\n")
    lines = out.getvalue().splitlines()
    assert [ln.split(" ", 1)[1] for ln in lines] == [
        "edgedeploy-agent: hello",
        "Traceback (most recent call last):",
        "  File x",
    ]
    assert all(dt.datetime.fromisoformat(ln.split(" ", 1)[0]).tzinfo is not None for ln in lines)
    monkeypatch.setattr(sys, "stderr", io.StringIO())
    monkeypatch.setenv("JOURNAL_STREAM", "8:12345")
    stamp_stderr()
    assert isinstance(sys.stderr, io.StringIO)  # journald stamps lines itself
    monkeypatch.delenv("JOURNAL_STREAM")
    stamp_stderr()
    assert isinstance(sys.stderr, StampedLines)


def test_tail_and_since_with_unstamped_lines(tmp_path: Path) -> None:
    log = tmp_path / "agent.log"
    log.write_text(
        "2026-12-01T08:00:00.000+00:00 edgedeploy-agent: starting r1\n"
        "Traceback (most recent call last):\n"  # belongs to the line before it
        "2026-12-01T09:30:00.000+00:00 edgedeploy-agent: starting r2\n"
        "  a library's own line\n"
        "2026-12-01T09:45:00.000+00:00 edgedeploy-agent: serving r2\n"
    )
    everything = log.read_bytes().splitlines()
    lines, end = tail_lines(log, 2)
    assert lines == everything[-2:] and end == log.stat().st_size
    recent, _ = tail_lines(log, 100, dt.datetime(2026, 12, 1, 9, 0, tzinfo=UTC))
    assert recent == everything[2:]  # the unstamped line after 09:30 is kept, the one after 08:00 is not
    assert tail_lines(log, 100, dt.datetime(2026, 12, 1, 7, 0, tzinfo=UTC))[0] == everything
    assert tail_lines(log, 100, dt.datetime(2027, 1, 1, tzinfo=UTC))[0] == []
    assert len(tail_lines(log, 100)[0]) == 5


def test_follow_prints_appends_and_survives_truncation(tmp_path: Path) -> None:
    log = tmp_path / "agent.log"
    log.write_text("old\n")
    out = io.BytesIO()
    stop = threading.Event()
    t = threading.Thread(target=follow_file, args=(log, log.stat().st_size, out, stop.is_set, 0.02))
    t.start()
    try:
        with log.open("a") as f:
            f.write("new 1\npart")
        _until(lambda: out.getvalue() == b"new 1\n")
        with log.open("a") as f:
            f.write("ial\n")
        _until(lambda: out.getvalue() == b"new 1\npartial\n")
        log.write_text("after truncation\n")  # a log rotated by copytruncate
        _until(lambda: out.getvalue().endswith(b"after truncation\n"))
    finally:
        stop.set()
        t.join(5)
    assert not t.is_alive()


def _until(cond, timeout: float = 10) -> None:
    deadline = time.monotonic() + timeout
    while not cond():
        assert time.monotonic() < deadline, "condition not met"
        time.sleep(0.02)


def test_journalctl_argv_is_a_list_of_fixed_words() -> None:
    since = dt.datetime(2026, 12, 1, 8, 0, tzinfo=UTC)
    argv = journalctl_argv("edgedeploy-agent.service", 50, since, follow=True)
    assert argv[:8] == ["journalctl", "--unit", "edgedeploy-agent.service", "--no-pager", "--output", "short-iso",
                        "--lines", "50"]  # fmt: skip
    assert argv[8] == "--since" and argv[-1] == "--follow"
    assert dt.datetime.strptime(argv[9], "%Y-%m-%d %H:%M:%S").astimezone(UTC) == since  # in the device's local time
    assert journalctl_argv("u", 5, None, follow=False) == [
        "journalctl", "--unit", "u", "--no-pager", "--output", "short-iso", "--lines", "5",
    ]  # fmt: skip


def test_systemd_mode_reads_the_journal_through_journalctl(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """No journald here: a stand-in `journalctl` on PATH prints the argv the agent gave it."""
    root = tmp_path / "root"
    assert agent("--root", str(root), "init", "--service", "systemd").code == 0
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    fake = bin_dir / "journalctl"
    fake.write_text('#!/bin/sh\nprintf "%s\\n" "$@"\n')
    fake.chmod(0o755)
    monkeypatch.setenv("PATH", f"{bin_dir}:{os.environ['PATH']}")
    r = agent("--root", str(root), "logs", "--lines", "7", "--since", "1h")
    assert r.code == 0, r.err
    argv = r.out.splitlines()
    assert argv[:7] == ["--unit", "edgedeploy-agent.service", "--no-pager", "--output", "short-iso", "--lines", "7"]
    since = dt.datetime.strptime(argv[8], "%Y-%m-%d %H:%M:%S").astimezone(UTC)
    assert argv[7] == "--since" and abs((dt.datetime.now(UTC) - since).total_seconds() - 3600) < 60
    monkeypatch.setenv("PATH", str(tmp_path / "empty"))
    r = agent("--root", str(root), "--json", "logs")
    assert r.code == 13 and json.loads(r.err)["error"]["code"] == "log-unavailable", r.err
