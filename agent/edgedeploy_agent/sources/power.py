"""Power sensors behind one interface, and energy per inference. No number is ever invented.

Energy for a measurement window comes from a hardware energy counter where one exists (NVML total
energy, RAPL), read exactly at the window edges; otherwise from timestamped power samples (INA3221,
tegrastats) taken by a thread and integrated with the trapezoid rule, interpolated at the edges.
The idle baseline is measured once, before serving, and reported beside the gross numbers.
"""

import bisect
import threading
import time
from collections import deque
from collections.abc import Sequence
from pathlib import Path
from typing import Callable, Optional, Protocol

from ..report import PowerReport

MIN_SAMPLES_PER_WINDOW = 3
TRACE_SECONDS = 600.0


class SensorUnavailable(Exception):
    """A sensor cannot be used on this device; the message says why (it reaches the report)."""


class PowerReader(Protocol):
    """Instantaneous power, total and per rail."""

    name: str

    def read_rails(self) -> dict[str, float]:
        """Watts per rail."""
        ...

    def total_watts(self, rails: dict[str, float]) -> float: ...


class EnergyCounter(Protocol):
    """A monotonically increasing energy counter (wrap-around handled by the implementation)."""

    name: str

    def read_joules(self) -> float: ...


class PowerSensor(Protocol):
    name: str

    def start_window(self) -> None: ...

    def end_window(self, inferences: int) -> PowerReport: ...

    def measure_idle(self, seconds: float, wait: Callable[[float], None]) -> None: ...

    def close(self) -> None: ...


class NoPowerSensor:
    """Used where the device exposes no supported sensor; reports say so instead of guessing."""

    name = "none"

    def __init__(self, reason: str = "no supported power sensor on this device") -> None:
        self.reason = reason

    def start_window(self) -> None:
        return None

    def end_window(self, inferences: int) -> PowerReport:
        return PowerReport(status="unavailable", reason=self.reason)

    def measure_idle(self, seconds: float, wait: Callable[[float], None]) -> None:
        return None

    def close(self) -> None:
        return None


class PowerTrace:
    """Timestamped power samples (monotonic seconds, watts), bounded in age."""

    def __init__(self, keep_s: float = TRACE_SECONDS) -> None:
        self._t: deque[float] = deque()
        self._w: deque[float] = deque()
        self._keep_s = keep_s
        self._lock = threading.Lock()

    def add(self, t: float, watts: float) -> None:
        with self._lock:
            if self._t and t <= self._t[-1]:
                return  # out of order or duplicate timestamps carry no information
            self._t.append(t)
            self._w.append(watts)
            while self._t and self._t[0] < t - self._keep_s:
                self._t.popleft()
                self._w.popleft()

    def integrate(self, t0: float, t1: float) -> tuple[Optional[float], int]:
        """(joules over [t0, t1] by the trapezoid rule, samples inside), None if not covered by samples."""
        with self._lock:
            ts, ws = list(self._t), list(self._w)
        return trapezoid_energy(ts, ws, t0, t1)


def _interp(ts: Sequence[float], ws: Sequence[float], i: int, t: float) -> float:
    """Power at time t between samples i-1 and i."""
    ta, tb, wa, wb = ts[i - 1], ts[i], ws[i - 1], ws[i]
    return wa + (wb - wa) * (t - ta) / (tb - ta)


def trapezoid_energy(ts: Sequence[float], ws: Sequence[float], t0: float, t1: float) -> tuple[Optional[float], int]:
    """Integral of the piecewise-linear power trace over [t0, t1]; None when samples do not span it."""
    if t1 <= t0 or len(ts) < 2 or ts[0] > t0 or ts[-1] < t1:
        return None, 0
    lo = bisect.bisect_right(ts, t0)  # first sample after t0
    hi = bisect.bisect_left(ts, t1)  # first sample at or after t1
    points_t = [t0] + list(ts[lo:hi]) + [t1]
    points_w = [_interp(ts, ws, lo, t0)] + list(ws[lo:hi]) + [_interp(ts, ws, hi, t1) if ts[hi] != t1 else ws[hi]]
    energy = 0.0
    for i in range(1, len(points_t)):
        energy += (points_t[i] - points_t[i - 1]) * (points_w[i] + points_w[i - 1]) / 2.0
    return energy, hi - lo


class _Windowed:
    """Window bookkeeping shared by both sensor kinds: gross, idle and dynamic energy."""

    name = "power"
    idle_watts: Optional[float] = None

    def _report(
        self, joules: Optional[float], seconds: float, inferences: int, samples: Optional[int], source: str
    ) -> PowerReport:
        if joules is None or seconds <= 0:
            return PowerReport(status="unavailable", sensor=self.name, reason="no samples cover the window")
        if samples is not None and samples < MIN_SAMPLES_PER_WINDOW:
            return PowerReport(
                status="unavailable",
                sensor=self.name,
                reason=f"only {samples} power samples in a {seconds:.2f} s window (need {MIN_SAMPLES_PER_WINDOW})",
            )
        mean_w = joules / seconds
        per_inf = joules * 1e3 / inferences if inferences > 0 else None
        dynamic = None
        if self.idle_watts is not None and inferences > 0:
            dynamic = (joules - self.idle_watts * seconds) * 1e3 / inferences
        return PowerReport(
            status="measured",
            sensor=self.name,
            mean_watts=round(mean_w, 4),
            energy_per_inference_mj=None if per_inf is None else round(per_inf, 4),
            energy_source=source,  # type: ignore[arg-type]
            window_s=round(seconds, 4),
            samples=samples,
            idle_watts=None if self.idle_watts is None else round(self.idle_watts, 4),
            dynamic_energy_per_inference_mj=None if dynamic is None else round(dynamic, 4),
        )


class TraceSensor(_Windowed):
    """Energy by integrating the power samples that a subclass adds to `self.trace`."""

    def __init__(self, name: str, interval_s: float, clock: Callable[[], float] = time.monotonic) -> None:
        self.name, self.interval_s, self.clock = name, interval_s, clock
        self.trace = PowerTrace()
        self.last_rails: dict[str, float] = {}
        self._stop = threading.Event()
        self._t0: Optional[float] = None
        self.last_window: Optional[tuple[float, float]] = None  # clock() at the edges of the last window

    def start_window(self) -> None:
        self._t0 = self.clock()

    def _window(self, inferences: int) -> PowerReport:
        t1 = self.clock()
        t0 = t1 if self._t0 is None else self._t0
        self.last_window = (t0, t1)
        # the first sample after t1 arrives within about one interval: wait so the edge is interpolated
        deadline = t1 + 5 * self.interval_s + 0.5
        energy, n = self.trace.integrate(t0, t1)
        while energy is None and self.clock() < deadline and not self._stop.is_set():
            time.sleep(self.interval_s / 2)
            energy, n = self.trace.integrate(t0, t1)
        return self._report(energy, t1 - t0, inferences, n, "samples")

    def end_window(self, inferences: int) -> PowerReport:
        report = self._window(inferences)
        if report.status == "measured" and self.last_rails:
            report.rails_watts = {k: round(v, 4) for k, v in self.last_rails.items()}
        return report

    def measure_idle(self, seconds: float, wait: Callable[[float], None]) -> None:
        self.start_window()
        wait(seconds)
        self.idle_watts = self._window(0).mean_watts

    def close(self) -> None:
        self._stop.set()


class SampledPowerSensor(TraceSensor):
    """A thread polls `reader` every `interval_s` (the INA3221 readers)."""

    def __init__(self, reader: PowerReader, interval_s: float = 0.02, clock: Callable[[], float] = time.monotonic):
        super().__init__(reader.name, interval_s, clock)
        self.reader = reader
        self.reader.read_rails()  # fails here, with the reason, if the sensor cannot be read at all
        self._thread = threading.Thread(target=self._poll, name=f"power {self.name}", daemon=True)
        self._thread.start()

    def _poll(self) -> None:
        while not self._stop.is_set():
            try:
                rails = self.reader.read_rails()
                self.trace.add(self.clock(), self.reader.total_watts(rails))
                self.last_rails = rails
            except (OSError, ValueError, SensorUnavailable):
                pass  # a missed sample shows up as fewer samples in the window, never as a made-up value
            self._stop.wait(self.interval_s)

    def close(self) -> None:
        super().close()
        self._thread.join(timeout=2.0)


class CounterEnergySensor(_Windowed):
    """Energy from a hardware counter read at the window edges (NVML total energy, RAPL)."""

    def __init__(self, counter: EnergyCounter, clock: Callable[[], float] = time.monotonic) -> None:
        self.counter, self.name, self.clock = counter, counter.name, clock
        self._start: Optional[tuple[float, float]] = None
        self.counter.read_joules()

    def start_window(self) -> None:
        self._start = (self.clock(), self.counter.read_joules())

    def end_window(self, inferences: int) -> PowerReport:
        if self._start is None:
            return PowerReport(status="unavailable", sensor=self.name, reason="window was not started")
        t1, e1 = self.clock(), self.counter.read_joules()
        t0, e0 = self._start
        return self._report(e1 - e0, t1 - t0, inferences, None, "counter")

    def measure_idle(self, seconds: float, wait: Callable[[float], None]) -> None:
        self.start_window()
        wait(seconds)
        self.idle_watts = self.end_window(0).mean_watts

    def close(self) -> None:
        return None


def discover_power_sensor(root: Path = Path("/"), interval_s: float = 0.02) -> PowerSensor:
    """The best sensor this device has: INA3221 (hwmon, then legacy iio), NVML, RAPL; else 'none' with why."""
    from .ina3221 import Ina3221Hwmon, Ina3221Iio
    from .nvml import NvmlEnergy
    from .rapl import RaplEnergy

    reasons: list[str] = []
    for make_reader in (lambda: Ina3221Hwmon(root / "sys"), lambda: Ina3221Iio(root / "sys")):
        try:
            return SampledPowerSensor(make_reader(), interval_s=interval_s)
        except (SensorUnavailable, OSError, ValueError) as e:
            reasons.append(str(e))
    for make_counter in (NvmlEnergy, lambda: RaplEnergy(root / "sys")):
        try:
            return CounterEnergySensor(make_counter())
        except (SensorUnavailable, OSError, ValueError) as e:
            reasons.append(str(e))
    return NoPowerSensor("; ".join(reasons))
