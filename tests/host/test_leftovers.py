"""The session's leftover-process check (tests/leftovers.py, tests/conftest.py) finds orphans, and stop_tree
ends TVM's RPC tracker with the popen_worker it serves from (the processes issue 35 found alive)."""

from __future__ import annotations

import socket
import subprocess
import sys
import time

import psutil
import pytest

from tests.leftovers import MARK, Leftovers, stop_tree

SLEEPER = "import time; time.sleep(120)"


def _wait_for_children(pid: int, n: int, seconds: float = 60) -> list[psutil.Process]:
    deadline = time.monotonic() + seconds
    while True:
        kids = psutil.Process(pid).children(recursive=True)
        if len(kids) >= n or time.monotonic() > deadline:
            return kids
        time.sleep(0.1)


def test_an_orphaned_grandchild_is_named_and_killed() -> None:
    leftovers = Leftovers()
    parent = subprocess.Popen(
        [sys.executable, "-c", f"import subprocess, sys, time; subprocess.Popen([sys.executable, '-c', {SLEEPER!r}]); "
         "time.sleep(120)"]
    )  # fmt: skip
    (grandchild,) = _wait_for_children(parent.pid, 1)
    leftovers.note("test_x")
    parent.terminate()
    parent.wait(10)
    assert grandchild.is_running() and grandchild.ppid() != psutil.Process().pid  # orphaned: no child of ours
    report = leftovers.finish(grace=0.2)
    assert len(report) == 1 and f"pid {grandchild.pid}" in report[0] and "running since test_x" in report[0]
    assert SLEEPER in report[0]
    psutil.wait_procs([grandchild], timeout=5)
    assert not grandchild.is_running()
    assert Leftovers().finish(grace=0.1) == []  # nothing left: nothing to say


def test_a_process_orphaned_inside_a_test_is_found_by_the_mark(monkeypatch: pytest.MonkeyPatch) -> None:
    """Orphaned before any snapshot: not below pytest, never noted, found by the variable it inherited."""
    leftovers = Leftovers()
    monkeypatch.delenv(MARK, raising=False)
    leftovers.mark()
    parent = subprocess.Popen(
        [sys.executable, "-c", f"import subprocess, sys; subprocess.Popen([sys.executable, '-c', {SLEEPER!r}])"]
    )
    parent.wait(30)
    marked = [p for p in psutil.process_iter() if p.pid != psutil.Process().pid and _marked_by(p, leftovers)]
    assert len(marked) == 1 and marked[0].ppid() != psutil.Process().pid
    report = leftovers.finish(grace=0.2)
    assert len(report) == 1 and f"pid {marked[0].pid}" in report[0] and SLEEPER in report[0]


def _marked_by(p: psutil.Process, leftovers: Leftovers) -> bool:
    try:
        return bool(p.environ().get(MARK) == leftovers.mark_value)
    except psutil.Error:
        return False


def test_a_process_that_ends_within_the_grace_period_is_not_reported() -> None:
    leftovers = Leftovers()
    quick = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(0.5)"])
    leftovers.note("test_y")
    assert leftovers.finish(grace=10) == []
    quick.wait(10)


def test_stop_tree_ends_the_rpc_tracker_and_its_popen_worker() -> None:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    tracker = subprocess.Popen(
        [sys.executable, "-m", "tvm.exec.rpc_tracker", "--host", "127.0.0.1", "--port", str(port),
         "--port-end", str(port + 1)],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )  # fmt: skip
    workers = _wait_for_children(tracker.pid, 1)
    assert workers and "popen_worker" in " ".join(workers[0].cmdline())
    stop_tree(tracker)
    gone, alive = psutil.wait_procs(workers, timeout=5)
    assert not alive and tracker.returncode is not None
