"""Run one operation on many devices in parallel; one bad device never hides the others."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor, wait
from dataclasses import dataclass, field
from typing import Any, Generic, TypeVar

from ..errors import EdgeDeployError, fleet_exit_code

T = TypeVar("T")
D = TypeVar("D")
MAX_PARALLEL = 16


@dataclass
class FleetResult(Generic[T]):
    """Per-device outcome: `succeeded` values and `failed` errors, each keyed by device name."""

    succeeded: dict[str, T] = field(default_factory=dict)
    failed: dict[str, EdgeDeployError] = field(default_factory=dict)

    @property
    def exit_code(self) -> int:
        return fleet_exit_code(len(self.succeeded), len(self.succeeded) + len(self.failed))


def _device_name(d: Any) -> str:
    return str(d.name)


def run_fleet(
    devices: Sequence[D],
    fn: Callable[[D], T],
    workers: int = MAX_PARALLEL,
    name: Callable[[D], str] = _device_name,
    on_interrupt: Callable[[], None] = lambda: None,
) -> FleetResult[T]:
    """fn(device) for each device, at most `workers` at a time; unexpected errors are kept, not raised.
    The one fan-out over devices (push, status, keys, facts, rollout waves). `devices` may be names (with
    `name=str`) where a name the inventory lacks must fail on its own, not stop the others. Ctrl-C:
    `on_interrupt` runs first (it may tell the calls in flight to stop waiting and those still queued to
    return at once, as the rollout runner does), then every call ends, then it is raised."""
    result: FleetResult[T] = FleetResult()
    if not devices:
        return result
    pool = ThreadPoolExecutor(max_workers=min(workers, len(devices)))
    try:
        futures = {name(d): pool.submit(fn, d) for d in devices}
        pending = set(futures.values())
        while pending:  # in slices: SIGINT may reach another thread, and only bytecode here notices it
            _, pending = wait(pending, timeout=0.2)
    except KeyboardInterrupt:
        on_interrupt()
        pool.shutdown(wait=True)
        raise
    pool.shutdown()
    for key, fut in futures.items():
        try:
            result.succeeded[key] = fut.result()
        except EdgeDeployError as e:
            result.failed[key] = e
        except Exception as e:  # one device's surprise must not hide the rest of the fleet
            result.failed[key] = EdgeDeployError(f"{key}: {type(e).__name__}: {e}")
    return result
