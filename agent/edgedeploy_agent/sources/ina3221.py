"""Jetson INA3221 power monitors: the JetPack 5 hwmon driver and the legacy JetPack 4 iio driver.

Both readers take the sysfs root (`/sys` on a device, a fixture tree in tests).
JP5 hwmon: inN_label, inN_input (bus mV), currN_input (mA); P = V x I, there is no powerN_input.
JP4 iio:   rail_name_N, in_powerN_input (mW).
AGX Xavier has no total rail: its six rails (two chips) are summed. Xavier NX has VDD_IN, the module
input, which is the total.
"""

from pathlib import Path

from .power import SensorUnavailable

TOTAL_RAILS = ("VDD_IN", "POM_5V_IN")
SKIPPED_LABELS = ("sum of shunt voltages",)


def _read_int(path: Path) -> int:
    return int(path.read_text(encoding="ascii").strip())


def total_of(rails: dict[str, float]) -> float:
    """The module input rail where the board has one, else the sum of all rails (AGX Xavier)."""
    for name in TOTAL_RAILS:
        if name in rails:
            return rails[name]
    return sum(rails.values())


class Ina3221Hwmon:
    """JetPack 5 (kernel 5.10) mainline `ina3221` hwmon driver; hwmonN differs per unit, so it is globbed."""

    name = "ina3221-hwmon"

    def __init__(self, sys_root: Path = Path("/sys")) -> None:
        self.channels: list[tuple[str, Path, Path]] = []
        for hw in sorted((sys_root / "bus" / "i2c" / "drivers" / "ina3221").glob("*/hwmon/hwmon*")):
            for n in (1, 2, 3):
                label_file = hw / f"in{n}_label"
                if not label_file.is_file():
                    continue  # a channel without a label is not connected
                label = label_file.read_text(encoding="ascii").strip()
                if label in SKIPPED_LABELS or label.startswith("NC"):
                    continue
                self.channels.append((label, hw / f"in{n}_input", hw / f"curr{n}_input"))
        if not self.channels:
            raise SensorUnavailable(f"no INA3221 hwmon rails under {sys_root}/bus/i2c/drivers/ina3221")

    def read_rails(self) -> dict[str, float]:
        return {label: _read_int(mv) * _read_int(ma) / 1e6 for label, mv, ma in self.channels}

    def total_watts(self, rails: dict[str, float]) -> float:
        return total_of(rails)


class Ina3221Iio:
    """JetPack 4 NVIDIA `ina3221x` iio driver (older images)."""

    name = "ina3221-iio"

    def __init__(self, sys_root: Path = Path("/sys")) -> None:
        self.channels: list[tuple[str, Path]] = []
        for dev in sorted((sys_root / "bus" / "i2c" / "drivers" / "ina3221x").glob("*/iio:device*")):
            for name_file in sorted(dev.glob("rail_name_*")):
                n = name_file.name.rsplit("_", 1)[1]
                label = name_file.read_text(encoding="ascii").strip()
                power = dev / f"in_power{n}_input"
                if power.is_file() and not label.startswith("NC"):
                    self.channels.append((label, power))
        if not self.channels:
            raise SensorUnavailable(f"no INA3221 iio rails under {sys_root}/bus/i2c/drivers/ina3221x")

    def read_rails(self) -> dict[str, float]:
        return {label: _read_int(mw) / 1e3 for label, mw in self.channels}

    def total_watts(self, rails: dict[str, float]) -> float:
        return total_of(rails)
