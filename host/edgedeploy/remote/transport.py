"""One transport protocol (`run`, `put`), with a local implementation.

Commands are argv lists, never shell strings: SshTransport quotes each word, LocalTransport runs the
list directly. LocalTransport has the same semantics on a local folder, for the demo and for devices
that are this machine.
"""

from __future__ import annotations

import os
import subprocess
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

Progress = Callable[[int, int], None]


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
            out.flush()
            os.fsync(out.fileno())
        os.replace(part, dst)

    def close(self) -> None:
        return None
