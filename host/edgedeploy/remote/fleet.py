"""Run one operation on many devices in parallel; one bad device never hides the others."""

from __future__ import annotations

from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Generic, TypeVar

from ..errors import EdgeDeployError, fleet_exit_code
from ..inventory import Device

T = TypeVar("T")
MAX_PARALLEL = 16


@dataclass
class FleetResult(Generic[T]):
    """Per-device outcome: `succeeded` values and `failed` errors, each keyed by device name."""

    succeeded: dict[str, T] = field(default_factory=dict)
    failed: dict[str, EdgeDeployError] = field(default_factory=dict)

    @property
    def exit_code(self) -> int:
        return fleet_exit_code(len(self.succeeded), len(self.succeeded) + len(self.failed))


def run_fleet(devices: list[Device], fn: Callable[[Device], T], workers: int = MAX_PARALLEL) -> FleetResult[T]:
    """fn(device) for each device, at most `workers` at a time; unexpected errors are kept, not raised."""
    result: FleetResult[T] = FleetResult()
    if not devices:
        return result
    with ThreadPoolExecutor(max_workers=min(workers, len(devices))) as pool:
        futures = {d.name: pool.submit(fn, d) for d in devices}
    for name, fut in futures.items():
        try:
            result.succeeded[name] = fut.result()
        except EdgeDeployError as e:
            result.failed[name] = e
        except Exception as e:  # one device's surprise must not hide the rest of the fleet
            result.failed[name] = EdgeDeployError(f"{name}: {type(e).__name__}: {e}")
    return result
