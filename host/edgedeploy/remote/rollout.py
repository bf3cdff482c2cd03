"""Rollouts: the pure planner (devices + facts -> canary and waves) and the state kept on disk.

The planner does no I/O. The executors (rollout_runner.py over SSH, mqtt_rollout.py over MQTT) run a plan
wave by wave and write the state file after every device, so an interrupted rollout can be shown and resumed.
"""

from __future__ import annotations

import datetime as dt
import json
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from edgedeploy_agent.durable import write_atomic

from ..errors import InputError, fleet_exit_code
from .facts import DeviceFacts

OK_OUTCOMES = ("committed", "unchanged")
FINAL_OUTCOMES = (*OK_OUTCOMES, "failed")


def parse_fraction(spec: str, what: str) -> float:
    """'10%' or '0.1' -> 0.1."""
    try:
        value = float(spec[:-1]) / 100 if spec.endswith("%") else float(spec)
    except ValueError:
        raise InputError(f"{what} must be a number or a percentage, got {spec!r}") from None
    if not 0 <= value <= 1:
        raise InputError(f"{what} must be between 0% and 100%, got {spec!r}")
    return value


def wave_size(spec: str | None, remaining: int) -> int:
    """'N' devices or 'P%' of the devices after the canary; None: all of them in one wave."""
    if spec is None:
        return max(remaining, 1)
    if spec.endswith("%"):
        return max(1, round(remaining * parse_fraction(spec, "--wave")))
    try:
        n = int(spec)
    except ValueError:
        raise InputError(f"--wave must be N or P%, got {spec!r}") from None
    if n < 1:
        raise InputError("--wave must be at least 1")
    return n


@dataclass(frozen=True)
class Waves:
    """How a rollout is cut and when it halts, the same over SSH and over MQTT: `canary` devices first, then
    waves of `wave` devices ('N' or 'P%'; None: the rest at once), halting once more than `max_fail` of them failed."""

    canary: int = 1
    wave: str | None = None
    max_fail: float = 0.0


DEFAULT_WAVES = Waves()


@dataclass
class DeviceState:
    wave: int
    status: str = "pending"  # pending | running | committed | unchanged | failed | skipped
    detail: str = ""  # what the plan expects, then the outcome's reason
    code: str | None = None
    release_after: str | None = None  # what the device runs after its step, as it reported
    seconds: float | None = None


@dataclass
class RolloutState:
    id: str
    bundle: str
    release: str
    canary: int
    wave: str | None
    max_fail: float
    concurrency: int
    devices: dict[str, DeviceState]
    status: str = "planned"  # planned | running | halted | done
    halted_reason: str | None = None
    options: dict[str, Any] = field(default_factory=dict)

    @property
    def waves(self) -> list[list[str]]:
        n = max((d.wave for d in self.devices.values()), default=-1) + 1
        return [sorted(name for name, d in self.devices.items() if d.wave == w) for w in range(n)]

    @property
    def succeeded(self) -> list[str]:
        return sorted(n for n, d in self.devices.items() if d.status in OK_OUTCOMES)

    @property
    def failed(self) -> list[str]:
        return sorted(n for n, d in self.devices.items() if d.status == "failed")

    @property
    def untouched(self) -> list[str]:
        return sorted(n for n, d in self.devices.items() if d.status in ("pending", "skipped"))

    @property
    def fail_budget(self) -> int:
        """How many devices may fail before the rollout halts: floor(max_fail x devices)."""
        return int(self.max_fail * len(self.devices) + 1e-9)

    def exit_code(self) -> int:
        return fleet_exit_code(len(self.succeeded), len(self.devices))

    def to_json(self) -> dict[str, Any]:
        data = asdict(self)
        data.update(
            waves=self.waves, succeeded=self.succeeded, failed=self.failed, untouched=self.untouched,
            exit_code=self.exit_code(),
        )  # fmt: skip
        return data

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> RolloutState:
        fields = {k: v for k, v in data.items() if k in cls.__dataclass_fields__}
        fields["devices"] = {n: DeviceState(**d) for n, d in data["devices"].items()}
        return cls(**fields)

    def save(self, path: Path) -> None:
        path.parent.mkdir(parents=True, exist_ok=True)
        write_atomic(path, json.dumps(self.to_json(), indent=1, default=str))


def new_rollout_id(bundle_id: str) -> str:
    """When the rollout started (UTC) and which bundle it rolls out: ids sort by start time."""
    return dt.datetime.now(dt.timezone.utc).strftime("%Y%m%dT%H%M%S") + f"-{bundle_id[:8]}"


def plan_rollout(
    rollout_id: str,
    bundle: str,
    release: str,
    devices: list[str],
    facts: dict[str, DeviceFacts | str],
    *,
    canary: int = 1,
    wave: str | None = None,
    max_fail: float = 0.0,
    concurrency: int = 4,
) -> RolloutState:
    """Pure: canary devices first (wave 0), then waves of the rest, in name order.

    `facts` maps each device to its facts, or to the reason they could not be read; devices already
    running `release` healthily are planned as no-ops in the canary's place.
    """
    if not devices:
        raise InputError("no devices selected", hint="use --group TAG or --devices a,b,c")
    if canary < 0 or concurrency < 1:
        raise InputError("--canary must be >= 0 and --concurrency >= 1")
    names = sorted(set(devices))
    todo = []
    states: dict[str, DeviceState] = {}
    for name in names:
        f = facts.get(name)
        if isinstance(f, DeviceFacts) and f.current_release == release and f.healthy_release == release:
            states[name] = DeviceState(wave=0, detail="already runs this bundle (no-op)")
        else:
            todo.append(name)
    first = todo[:canary]
    rest = todo[canary:]
    size = wave_size(wave, len(rest))
    for name in first:
        states[name] = DeviceState(wave=0, detail=_expect(facts.get(name), "canary"))
    offset = 1 if first else 0
    for i, name in enumerate(rest):
        states[name] = DeviceState(wave=offset + i // size, detail=_expect(facts.get(name), "wave"))
    return RolloutState(rollout_id, bundle, release, canary, wave, max_fail, concurrency, dict(sorted(states.items())))


def _expect(f: DeviceFacts | str | None, role: str) -> str:
    if isinstance(f, DeviceFacts):
        return f"{role}: replace {f.current_release or 'nothing'}"
    if f is None:
        return f"{role}: push"
    return f"{role}: unreachable now ({f})"
