"""One transport protocol (`run`, `put`), with a local implementation.

Commands are argv lists, never shell strings: SshTransport quotes each word, LocalTransport runs the
list directly. LocalTransport has the same semantics on a local folder, for the demo and for devices
that are this machine.
"""

from __future__ import annotations

import os
import subprocess
import threading
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

from edgedeploy_agent.durable import move_durably

Progress = Callable[[int, int], None]
Sink = Callable[[bytes], None]  # where a streamed command's output goes as it arrives


@dataclass(frozen=True)
class CommandResult:
    argv: tuple[str, ...]
    exit_code: int  # negative: killed by a signal on the device while the link stayed up
    stdout: str
    stderr: str


class Transport(Protocol):
    name: str

    def run(self, argv: Sequence[str], timeout: float | None = None) -> CommandResult: ...

    def put(self, local: Path, remote: str, progress: Progress | None = None) -> None:
        """Copy a file so that `remote` appears complete or not at all (upload to .part, then rename)."""
        ...

    def stream(self, argv: Sequence[str], out: Sink, err: Sink) -> int:
        """Run `argv`, handing its stdout (and stderr) over as it arrives; returns the exit status."""
        ...

    def close(self) -> None: ...


class LocalTransport:
    """The device is this machine."""

    name = "local"

    def run(self, argv: Sequence[str], timeout: float | None = None) -> CommandResult:
        p = subprocess.run(list(argv), capture_output=True, text=True, timeout=timeout, stdin=subprocess.DEVNULL)
        return CommandResult(tuple(argv), p.returncode, p.stdout, p.stderr)

    def put(self, local: Path, remote: str, progress: Progress | None = None) -> None:
        dst = Path(remote)
        part = dst.with_name(dst.name + ".part")
        total, done = local.stat().st_size, 0
        with open(local, "rb") as src, open(part, "wb") as out:
            while chunk := src.read(1 << 20):
                out.write(chunk)
                done += len(chunk)
                if progress:
                    progress(done, total)
        move_durably(part, dst)

    def stream(self, argv: Sequence[str], out: Sink, err: Sink) -> int:
        """Run `argv`, handing its output over as it arrives (stderr once it ends); returns its exit status."""
        proc = subprocess.Popen(list(argv), stdout=subprocess.PIPE, stderr=subprocess.PIPE, stdin=subprocess.DEVNULL)
        assert proc.stdout is not None and proc.stderr is not None
        stdout, stderr = proc.stdout, proc.stderr
        errors: list[bytes] = []
        drain = threading.Thread(target=lambda: errors.append(stderr.read()), daemon=True)
        drain.start()
        try:
            while chunk := os.read(stdout.fileno(), 1 << 16):
                out(chunk)
            drain.join()
            err(b"".join(errors))
            return proc.wait()
        finally:
            if proc.poll() is None:
                proc.terminate()
                proc.wait()
            proc.stdout.close()
            proc.stderr.close()

    def close(self) -> None:
        return None
