"""No process outlives the test run (issue 35: two TVM popen_worker processes from test_tuning ran on for
24 minutes after pytest ended).

`Leftovers.mark` puts a variable only this session's processes inherit into pytest's environment;
`Leftovers.note` remembers, after each test body, every process below pytest, with the test that had it;
`Leftovers.finish`, at the end of the session, names those still running (pytest's children now, the ones
remembered, and any process that carries the mark: orphans re-parented away from pytest are found either
way), kills them, and the session fails.
`stop_tree` ends a started process and what it started (TVM's rpc_server and rpc_tracker serve from a
popen_worker child that a plain terminate() orphans).
"""

from __future__ import annotations

import os
import subprocess
import time
from dataclasses import dataclass, field

import psutil

# helpers that end with the interpreter by themselves: multiprocessing's resource tracker and fork server
BENIGN = ("multiprocessing.resource_tracker", "multiprocessing.forkserver")


def _describe(p: psutil.Process) -> str:
    try:
        return " ".join(p.cmdline())[:200] or p.name()
    except psutil.Error:
        return "?"


MARK = "EDGEDEPLOY_TEST_RUN"


@dataclass
class Leftovers:
    me: psutil.Process = field(default_factory=psutil.Process)
    seen: dict[tuple[int, float], tuple[psutil.Process, str]] = field(default_factory=dict)
    mark_value: str | None = None

    def mark(self) -> None:
        """From now on every process started below pytest (with its environment) carries MARK."""
        self.mark_value = f"{self.me.pid}-{time.time_ns()}"
        os.environ[MARK] = self.mark_value

    def _marked(self) -> list[psutil.Process]:
        if self.mark_value is None:
            return []
        out = []
        for p in psutil.process_iter():
            if p.pid == self.me.pid:
                continue
            try:
                if p.environ().get(MARK) == self.mark_value:
                    out.append(p)
            except psutil.Error:  # gone, a zombie, or another user's
                continue
        return out

    def _below(self) -> list[psutil.Process]:
        try:
            return list(self.me.children(recursive=True))
        except psutil.Error:
            return []

    def note(self, where: str) -> None:
        """Remember the processes below pytest now (after the test `where` ran its body)."""
        for p in self._below():
            try:
                self.seen.setdefault((p.pid, p.create_time()), (p, where))
            except psutil.Error:
                continue

    def running(self) -> list[tuple[psutil.Process, str]]:
        """Remembered processes still running (not zombies, not a reused pid) and pytest's children now."""
        found = dict(self.seen)
        for p in [*self._below(), *self._marked()]:
            try:
                found.setdefault((p.pid, p.create_time()), (p, "a test that left it (started in this session)"))
            except psutil.Error:
                continue
        out = []
        for p, where in found.values():
            try:
                alive = p.is_running() and p.status() != psutil.STATUS_ZOMBIE
            except psutil.Error:
                continue
            if alive and not any(b in _describe(p) for b in BENIGN):
                out.append((p, where))
        return out

    def finish(self, grace: float = 3.0) -> list[str]:
        """Give what is left `grace` seconds to end, kill the rest; one line each for what had to be killed."""
        left = self.running()
        if not left:
            return []
        _, alive = psutil.wait_procs([p for p, _ in left], timeout=grace)
        report = []
        for p, where in left:
            if p in alive:
                report.append(f"pid {p.pid} ({_describe(p)}), running since {where}")
                try:
                    p.kill()
                except psutil.Error:
                    pass
        psutil.wait_procs(alive, timeout=grace)
        return report


def stop_tree(proc: subprocess.Popen[bytes] | subprocess.Popen[str], timeout: float = 10) -> None:
    """Terminate `proc` and every process below it; kill what is still there after `timeout`."""
    try:
        below = psutil.Process(proc.pid).children(recursive=True)
    except psutil.Error:
        below = []
    proc.terminate()
    for p in below:
        try:
            p.terminate()
        except psutil.Error:
            pass
    try:
        proc.wait(timeout)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait(timeout)
    _, alive = psutil.wait_procs(below, timeout=timeout)
    for p in alive:
        try:
            p.kill()
        except psutil.Error:
            pass
