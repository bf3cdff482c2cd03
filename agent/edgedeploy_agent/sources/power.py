"""Power sensors behind one interface. No sensor is ever invented: without one, power is 'unavailable'."""

from typing import Optional, Protocol

from ..report import PowerReport


class PowerSensor(Protocol):
    name: str

    def start_window(self) -> None: ...

    def end_window(self, inferences: int) -> PowerReport: ...


class NoPowerSensor:
    """Used where the device exposes no supported sensor; reports say so instead of guessing."""

    name = "none"

    def __init__(self, reason: str = "no supported power sensor on this device") -> None:
        self.reason = reason

    def start_window(self) -> None:
        return None

    def end_window(self, inferences: int) -> PowerReport:
        return PowerReport(status="unavailable", reason=self.reason)


def discover_power_sensor(root: Optional[str] = None) -> PowerSensor:
    """Find the device's power sensor. Jetson INA3221, NVML and RAPL readers are not in this release."""
    return NoPowerSensor()
