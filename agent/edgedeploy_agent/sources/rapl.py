"""CPU package energy through RAPL powercap (Intel, and AMD Zen on recent kernels)."""

from pathlib import Path

from .power import SensorUnavailable


class RaplEnergy:
    """Sum of the package domains' energy_uj, with the wrap at max_energy_range_uj undone.

    The counter wraps within minutes at high power, so it must be read at least that often; the agent
    reads it at every report window.
    """

    name = "rapl"

    def __init__(self, sys_root: Path = Path("/sys")) -> None:
        base = sys_root / "class" / "powercap"
        # packages are intel-rapl:N; their subzones (intel-rapl:N:M) are already inside the package count
        self.zones = sorted(p for p in base.glob("intel-rapl:*") if p.name.count(":") == 1)
        if not self.zones:
            raise SensorUnavailable(f"rapl: no {base}/intel-rapl:* package domains")
        try:
            self._max = [int((z / "max_energy_range_uj").read_text()) for z in self.zones]
            self._last = [int((z / "energy_uj").read_text()) for z in self.zones]
        except PermissionError:
            raise SensorUnavailable(
                "rapl: energy_uj is readable by root only; a udev/tmpfiles rule must give the agent read access"
            ) from None
        self._total_uj = 0

    def read_joules(self) -> float:
        for i, z in enumerate(self.zones):
            now = int((z / "energy_uj").read_text())
            delta = now - self._last[i]
            if delta < 0:
                delta += self._max[i] + 1  # the counter wrapped to 0 after max_energy_range_uj
            self._total_uj += delta
            self._last[i] = now
        return self._total_uj / 1e6
