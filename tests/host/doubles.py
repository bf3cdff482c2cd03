"""Doubles for the host's side of a device: captured agent output, and a recording Transport that answers
with scripted results (no sshd, no agent process)."""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest

from edgedeploy.remote.transport import CommandResult, Progress, Sink

# captured from `edgedeploy-agent --json facts` on this machine
FACTS = {
    "ok": True,
    "agent_version": "0.1.0",
    "bundle_schema": 2,
    "python": "3.11.7",
    "arch": "x86_64",
    "root": "/tmp/dev",
    "initialised": True,
    "uid": 0,
    "free_bytes": 85899345920,
    "service": "process",
    "source": None,
    "running": True,
    "health": {"release": "toy-1-abc", "state": "ready", "pid": 42, "time": "2026-11-29T19:40:00.000+00:00"},
    "current": {"release": "toy-1-abc", "model": "toy", "version": "1", "profile": "cpu-x86_64", "bundle_id": "abc"},
    "previous": [],
    "history": [],
}


# --- a recording Transport ------------------------------------------------------------------------------

Reply = CommandResult | Callable[[tuple[str, ...]], CommandResult]


def replied(stdout: str = "", exit_code: int = 0, stderr: str = "") -> CommandResult:
    """A command's result as the device would return it (argv is filled in by the transport)."""
    return CommandResult((), exit_code, stdout, stderr)


def agent_ok(**data: Any) -> CommandResult:
    """`edgedeploy-agent --json ...` that succeeded: its one JSON line."""
    return replied(json.dumps({"ok": True, **data}) + "\n")


def agent_failed(code: str, message: str, hint: str | None = None) -> CommandResult:
    """`edgedeploy-agent --json ...` that failed: the JSON error line, exit 1 (what agent_client parses)."""
    error = {"code": code, "message": message, "hint": hint}
    return replied(json.dumps({"ok": False, "error": error}) + "\n", exit_code=1)


@dataclass(frozen=True)
class Ran:
    argv: tuple[str, ...]
    timeout: float | None


@dataclass(frozen=True)
class Put:
    local: Path
    remote: str
    size: int


class RecordingTransport:
    """remote.transport.Transport without a device: records every command (as its argv) and every upload in
    order, and answers commands from a script: `on(match, *replies)` answers the commands `match` fits (a word
    of the argv, or a predicate) with the replies in turn, the last one from then on. An unscripted command
    fails the test; a command that is not a list of strings (a shell string) too."""

    name = "recording"

    def __init__(self) -> None:
        self.log: list[Ran | Put] = []
        self.closed = False
        self._script: list[tuple[Callable[[tuple[str, ...]], bool], list[Reply]]] = []

    def on(self, match: str | Callable[[tuple[str, ...]], bool], *replies: Reply) -> RecordingTransport:
        assert replies, "script at least one reply"
        fits = match if callable(match) else (lambda argv, word=match: word in argv)
        self._script.append((fits, list(replies)))
        return self

    @property
    def runs(self) -> list[tuple[str, ...]]:
        return [e.argv for e in self.log if isinstance(e, Ran)]

    @property
    def puts(self) -> list[Put]:
        return [e for e in self.log if isinstance(e, Put)]

    def run(self, argv: Sequence[str], timeout: float | None = None) -> CommandResult:
        assert not isinstance(argv, str) and all(isinstance(a, str) for a in argv), f"not an argv list: {argv!r}"
        args = tuple(argv)
        self.log.append(Ran(args, timeout))
        for fits, replies in self._script:
            if fits(args):
                reply = replies.pop(0) if len(replies) > 1 else replies[0]
                result = reply(args) if callable(reply) else reply
                return CommandResult(args, result.exit_code, result.stdout, result.stderr)
        raise AssertionError(f"the device was asked something the test did not script: {args}")

    def put(self, local: Path, remote: str, progress: Progress | None = None) -> None:
        size = local.stat().st_size
        self.log.append(Put(local, remote, size))
        if progress:
            progress(size, size)

    def stream(self, argv: Sequence[str], out: Sink, err: Sink) -> int:
        r = self.run(argv)
        out(r.stdout.encode())
        err(r.stderr.encode())
        return r.exit_code

    def close(self) -> None:
        self.closed = True


def connect_to(monkeypatch: pytest.MonkeyPatch, transport: RecordingTransport, *modules: ModuleType) -> None:
    """`connected(...)` in each module (remote/*.py open a device's transport through it) yields `transport`."""

    @contextmanager
    def connected(*args: object, **kwargs: object) -> Iterator[RecordingTransport]:
        yield transport

    for m in modules:
        monkeypatch.setattr(m, "connected", connected)
