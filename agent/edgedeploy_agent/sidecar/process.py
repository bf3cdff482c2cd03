"""The agent's side of a sidecar worker: start it under another Python, ask it things, notice when it dies or hangs.

A worker that exits is `SidecarFailed` naming its exit status or signal; one that does not answer a request
in time is killed (SIGKILL) and `SidecarFailed` says so. Either is a runtime failure like any other: the
serving loop stops, health.json says `failed` with code `sidecar-failed`, a deploy in its health check rolls
back, and the service manager restarts the agent (and with it a new worker). A capture worker is restarted
by the capture thread's reconnect instead (sidecar/capture.py).
"""

from __future__ import annotations

import atexit
import os
import shutil
import signal
import subprocess
import tempfile
import threading
import time
from pathlib import Path
from typing import Any, Callable

from ..errors import RuntimeLoadError, SidecarFailed
from .channel import Channel, ChannelClosed, ChannelTimeout, SharedMemory

START_TIMEOUT_S = 60.0  # Python and numpy starting on a loaded Jetson
POLL_S = 0.25

_package_dir: Path | None = None
_package_lock = threading.Lock()


def _worker_path() -> Path:
    """A folder holding only this agent's package (a link), for the worker's PYTHONPATH: the agent's own
    site-packages would hand the other Python this Python's compiled numpy."""
    global _package_dir
    with _package_lock:
        if _package_dir is None:
            d = Path(tempfile.mkdtemp(prefix="edgedeploy-sidecar-"))
            (d / "edgedeploy_agent").symlink_to(Path(__file__).resolve().parent.parent, target_is_directory=True)
            atexit.register(shutil.rmtree, d, True)
            _package_dir = d
        return _package_dir


def _describe_exit(code: int) -> str:
    if code < 0:
        try:
            return f"killed by {signal.Signals(-code).name}"
        except ValueError:
            return f"killed by signal {-code}"
    return f"exited with status {code}"


class Sidecar:
    """One worker process (`python -m edgedeploy_agent.sidecar.worker --role ROLE`); one request at a time."""

    def __init__(self, python: str, role: str, timeout_s: float = 10.0) -> None:
        self.python, self.role, self.timeout_s = python, role, timeout_s
        self.hello: dict[str, Any] = {}
        self._lock = threading.Lock()
        self.shm = SharedMemory.create(f"edgedeploy-{role}")
        to_worker, from_agent = os.pipe()
        from_worker, to_agent = os.pipe()
        env = dict(os.environ)
        env["PYTHONPATH"] = os.pathsep.join(p for p in (str(_worker_path()), env.get("PYTHONPATH")) if p)
        env["PYTHONDONTWRITEBYTECODE"] = "1"  # the agent's package may be read-only to it (and is not its Python's)
        fds = f"{to_worker},{to_agent},{self.shm.fd}"
        try:
            self.proc = subprocess.Popen(
                [python, "-m", "edgedeploy_agent.sidecar.worker", "--role", role, "--fds", fds],
                stdin=subprocess.DEVNULL,
                pass_fds=(to_worker, to_agent, self.shm.fd),
                env=env,
            )
        except OSError as e:
            for fd in (to_worker, from_agent, from_worker, to_agent):
                os.close(fd)
            self.shm.close()
            raise SidecarFailed(
                f"cannot start the {role} worker with {python}: {e.strerror}",
                hint="set system_python (edgedeploy-agent init --system-python) to JetPack's python3.8",
            ) from None
        os.close(to_worker)
        os.close(to_agent)
        self.channel = Channel(from_worker, from_agent)
        self.hello = self._wait(START_TIMEOUT_S, f"start under {python}")
        if self.hello.get("event") != "hello":
            self.close()
            raise SidecarFailed(f"the {role} worker under {python} did not introduce itself: {self.hello}")

    @property
    def pid(self) -> int:
        return self.proc.pid

    def describe(self) -> dict[str, Any]:
        return {"python": self.hello.get("python"), "executable": self.hello.get("executable"), "pid": self.pid}

    def alive(self) -> bool:
        return self.proc.poll() is None

    def request(
        self,
        op: str,
        timeout: float | None = None,
        on_event: Callable[[dict[str, Any]], None] = lambda event: None,
        **fields: Any,
    ) -> dict[str, Any]:
        """Send one request and wait for its reply (events before it go to `on_event`).

        `timeout` None: the worker's default; 0: no limit (an engine build), the worker's exit still noticed."""
        with self._lock:
            try:
                self.channel.send({"op": op, **fields})
            except ChannelClosed:
                raise self._died(op) from None
            limit = self.timeout_s if timeout is None else timeout
            while True:
                reply = self._wait(limit, op)
                if "event" in reply:
                    on_event(reply)
                    continue
                error = reply.get("error")
                if isinstance(error, dict):  # the worker's own error, with its code
                    e = RuntimeLoadError(str(error.get("message")), hint=error.get("hint"))
                    e.code = str(error.get("code") or "sidecar-error")
                    raise e
                return reply

    def _wait(self, limit: float, what: str) -> dict[str, Any]:
        deadline = time.monotonic() + limit if limit else None
        while True:
            slice_s = POLL_S if deadline is None else min(POLL_S, max(deadline - time.monotonic(), 0.0))
            try:
                return self.channel.recv(timeout=slice_s)
            except ChannelClosed:
                raise self._died(what) from None
            except ChannelTimeout:
                if not self.alive():
                    raise self._died(what) from None
                if deadline is not None and time.monotonic() >= deadline:
                    self.kill()
                    raise SidecarFailed(
                        f"the {self.role} worker (Python {self.hello.get('python', '?')}, pid {self.pid}) did not "
                        f"answer {what!r} within {limit:g} s: killed",
                        hint="see the agent log for the worker's own output; sidecar_timeout_s in agent.json sets the "
                        "limit",
                    ) from None

    def _died(self, what: str) -> SidecarFailed:
        try:
            code = self.proc.wait(timeout=5)
        except subprocess.TimeoutExpired:
            self.kill()
            code = self.proc.wait()
        return SidecarFailed(
            f"the {self.role} worker (Python {self.hello.get('python', '?')}, pid {self.pid}) {_describe_exit(code)} "
            f"during {what!r}",
            hint="see the agent log for the worker's own output",
        )

    def kill(self) -> None:
        if self.alive():
            self.proc.kill()
        self.proc.wait()

    def close(self) -> None:
        """Ask the worker to exit, kill it if it does not within 2 s, free the pipes and shared memory."""
        if self.alive():
            try:
                self.channel.send({"op": "exit"})
                self.proc.wait(timeout=2)
            except (ChannelClosed, subprocess.TimeoutExpired):
                pass
        self.kill()
        self.channel.close()
        self.shm.close()
