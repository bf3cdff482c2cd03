"""Temperatures from the kernel's thermal zones (`/sys/class/thermal/thermal_zone*/{type,temp}`)."""

from pathlib import Path


class ThermalZones:
    """Reads every zone that has a type and a temperature (millidegrees C)."""

    def __init__(self, sys_root: Path = Path("/sys")) -> None:
        self.zones: list[tuple[str, Path]] = []
        for z in sorted((sys_root / "class" / "thermal").glob("thermal_zone*")):
            try:
                kind = (z / "type").read_text(encoding="ascii").strip()
            except OSError:
                continue
            if (z / "temp").is_file():
                self.zones.append((kind or z.name, z / "temp"))

    def read(self) -> dict[str, float]:
        """{zone type: °C}; a zone that cannot be read now is left out, never guessed."""
        out: dict[str, float] = {}
        for kind, path in self.zones:
            try:
                out[kind] = round(int(path.read_text(encoding="ascii").strip()) / 1000.0, 2)
            except (OSError, ValueError):
                continue
        return out
