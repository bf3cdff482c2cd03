"""Test doubles for the agent: real classes behind its protocols, scripted."""

from __future__ import annotations

from edgedeploy_agent.service import write_health
from edgedeploy_agent.store import DeviceStore


class ScriptedService:
    """Acts like the agent process: on restart it 'loads' whatever `current` points at."""

    def __init__(self, store: DeviceStore, bad: set[str] | None = None) -> None:
        self.store, self.bad, self.running, self.restarts = store, bad or set(), False, 0

    def restart(self) -> None:
        self.restarts += 1
        name = self.store.current()
        self.running = name is not None and name not in self.bad
        state = "failed" if name in self.bad else "ready"
        write_health(self.store, name, state, error={"message": "library does not load"})

    def stop(self) -> None:
        self.running = False

    def is_running(self) -> bool:
        return self.running
