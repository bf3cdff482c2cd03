"""`tegrastats` lines: a pure parser (tested on real captured lines) and a sampled power source.

Rails print as `NAME cur/avg` (JP4, mW implied) or `NAME curmW/avgmW` (JP5); only `cur` is used:
the `avg` column is a running average since tegrastats started and is wrong for energy.
"""

import re
import subprocess
import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Callable

from .ina3221 import total_of
from .power import SensorUnavailable, TraceSensor

_RAIL = re.compile(r"\b([A-Z][A-Z0-9_]*) (\d+)(?:mW)?/(\d+)(?:mW)?\b")
_TEMP = re.compile(r"\b([A-Za-z][A-Za-z0-9_]*)@(-?\d+(?:\.\d+)?)C\b")
# Rails of Xavier AGX / NX and the older Jetsons; anything else that looks like `X n/m` is not a rail.
KNOWN_RAILS = frozenset(
    "GPU CPU SOC CV VDDRQ SYS5V VDD_IN VDD_CPU_GPU_CV VDD_SOC VDD_CPU_CV VDD_GPU_SOC "
    "POM_5V_IN POM_5V_GPU POM_5V_CPU VDD_SYS_GPU VDD_SYS_SOC VDD_SYS_CPU VDD_SYS_DDR VDD_4V0_WIFI".split()
)


@dataclass
class TegrastatsSample:
    rails_mw: dict[str, int] = field(default_factory=dict)
    temps_c: dict[str, float] = field(default_factory=dict)


def parse_tegrastats(line: str) -> TegrastatsSample:
    """Current rail power (mW) and temperatures from one tegrastats line (JP4 or JP5 format)."""
    s = TegrastatsSample()
    for name, cur, _avg in _RAIL.findall(line):
        if name in KNOWN_RAILS:
            s.rails_mw[name] = int(cur)
    for name, temp in _TEMP.findall(line):
        s.temps_c[name] = float(temp)
    return s


class TegrastatsPower(TraceSensor):
    """Power samples from a running `tegrastats --interval MS`, timestamped as each line arrives."""

    def __init__(
        self,
        command: Sequence[str] = ("tegrastats", "--interval", "100"),
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        super().__init__("tegrastats", 0.1, clock)
        try:
            self._proc = subprocess.Popen(list(command), stdout=subprocess.PIPE, text=True, bufsize=1)
        except OSError as e:
            raise SensorUnavailable(f"cannot run {command[0]}: {e.strerror}") from None
        self._thread = threading.Thread(target=self._follow, name="tegrastats", daemon=True)
        self._thread.start()

    def _follow(self) -> None:
        assert self._proc.stdout is not None
        for line in self._proc.stdout:
            rails = parse_tegrastats(line).rails_mw
            if rails:
                self.last_rails = {k: v / 1e3 for k, v in rails.items()}
                self.trace.add(self.clock(), total_of(self.last_rails))
            if self._stop.is_set():
                break

    def close(self) -> None:
        super().close()
        self._proc.terminate()
        self._proc.wait(timeout=5)
        self._thread.join(timeout=2.0)
        if self._proc.stdout is not None:
            self._proc.stdout.close()
