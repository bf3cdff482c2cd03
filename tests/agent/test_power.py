"""Power readers against fixture trees and captured tegrastats lines; energy against known integrals."""

from __future__ import annotations

import math
import os
import shutil
import sys
import time
from collections.abc import Callable
from pathlib import Path

import pytest

from edgedeploy_agent.sources.ina3221 import Ina3221Hwmon, Ina3221Iio
from edgedeploy_agent.sources.nvml import NvmlEnergy
from edgedeploy_agent.sources.power import (
    CounterEnergySensor,
    NoPowerSensor,
    SampledPowerSensor,
    SensorUnavailable,
    TraceSensor,
    discover_power_sensor,
    trapezoid_energy,
)
from edgedeploy_agent.sources.rapl import RaplEnergy
from edgedeploy_agent.sources.tegrastats import TegrastatsPower, parse_tegrastats
from edgedeploy_agent.sources.thermal import ThermalZones
from tests.helpers import require, require_module

SYSFS = Path(__file__).parent / "fixtures" / "sysfs"

# Real tegrastats lines (sources in /work/shared/reference/device-ops.md §1)
AGX_JP42 = (
    "RAM 14700/15692MB (lfb 3x2MB) SWAP 898/8192MB (cached 23MB) CPU [0%@1190,0%@1190,0%@1190,0%@1190,0%@1190,"
    "0%@1190,0%@1190,0%@1190] EMC_FREQ 0% GR3D_FREQ 0% AO@30C GPU@30.5C Tboard@31C Tdiode@32C AUX@30.5C "
    "CPU@31.5C thermal@30.8C PMIC@100C GPU 463/463 CPU 618/618 SOC 2936/2936 CV 0/0 VDDRQ 309/309 SYS5V 3306/3306"
)
AGX_JP4 = (
    "RAM 407/15823MB (lfb 3702x4MB) SWAP 0/7911MB (cached 0MB) CPU [5%@2265,3%@2265,4%@2265,1%@2265,0%@2265,"
    "2%@2265,7%@2265,1%@2265] EMC_FREQ 0% GR3D_FREQ 0% AO@26.5C GPU@28C iwlwifi@30C Tdiode@31.25C PMIC@100C "
    "AUX@26.5C CPU@27.5C thermal@27.45C Tboard@27C GPU 1155/1155 CPU 385/385 SOC 2504/2503 CV 0/0 VDDRQ 192/192 "
    "SYS5V 2692/2692"
)
AGX_JP5 = (
    "[0%@1190,1%@1190,0%@1190,0%@1189,0%@1190,0%@1191,0%@1190,0%@1190] EMC_FREQ 0%@1331 GR3D_FREQ 0%@114 "
    "VIC_FREQ 115 APE 150 AUX@36C CPU@36.5C thermal@35.7C Tboard@37C AO@35C GPU@35C Tdiode@38.75C PMIC@50C "
    "GPU 467mW/467mW CPU 467mW/467mW SOC 1245mW/1245mW CV 0mW/0mW VDDRQ 311mW/311mW SYS5V 2768mW/2768mW"
)
NX_JP5 = (
    "RAM 2690/6854MB (lfb 6x1MB) SWAP 479/3427MB (cached 3MB) CPU [3%@1904,7%@1906,1%@1905,0%@1907,off,off] "
    "EMC_FREQ 0%@1600 GR3D_FREQ 0%@[510] VIC_FREQ 601 APE 150 AUX@39C CPU@39.5C AO@37.5C GPU@37.5C PMIC@50C "
    "VDD_IN 5079mW/5079mW VDD_CPU_GPU_CV 696mW/696mW VDD_SOC 1104mW/1104mW"
)


@pytest.mark.parametrize(
    ("line", "rails", "temps"),
    [
        (AGX_JP42, {"GPU": 463, "CPU": 618, "SOC": 2936, "CV": 0, "VDDRQ": 309, "SYS5V": 3306}, {"GPU": 30.5}),
        (AGX_JP4, {"GPU": 1155, "CPU": 385, "SOC": 2504, "CV": 0, "VDDRQ": 192, "SYS5V": 2692}, {"Tdiode": 31.25}),
        (AGX_JP5, {"GPU": 467, "CPU": 467, "SOC": 1245, "CV": 0, "VDDRQ": 311, "SYS5V": 2768}, {"thermal": 35.7}),
        (NX_JP5, {"VDD_IN": 5079, "VDD_CPU_GPU_CV": 696, "VDD_SOC": 1104}, {"CPU": 39.5}),
    ],
)
def test_tegrastats_lines(line: str, rails: dict[str, int], temps: dict[str, float]) -> None:
    s = parse_tegrastats(line)
    assert s.rails_mw == rails  # RAM/SWAP "a/bMB" and EMC/GR3D frequencies are never taken for rails
    for k, v in temps.items():
        assert s.temps_c[k] == v


def test_tegrastats_with_leading_timestamp() -> None:
    assert parse_tegrastats("11-29-2026 19:00:01 " + NX_JP5).rails_mw["VDD_IN"] == 5079


def test_hwmon_agx_sums_six_rails_on_two_chips() -> None:
    r = Ina3221Hwmon(SYSFS / "xavier-agx-jp5" / "sys")
    rails = r.read_rails()
    assert set(rails) == {"GPU", "CPU", "SOC", "CV", "VDDRQ", "SYS5V"}  # "sum of shunt voltages" skipped
    assert rails["GPU"] == pytest.approx(19.0 * 0.5)  # mV x mA
    assert r.total_watts(rails) == pytest.approx(9.5 + 5.7 + 13.3 + 0.0 + 1.9 + 3.0)


def test_hwmon_nx_uses_vdd_in() -> None:
    r = Ina3221Hwmon(SYSFS / "xavier-nx-jp5" / "sys")
    rails = r.read_rails()
    assert r.total_watts(rails) == pytest.approx(5.0 * 1.016)


def test_iio_jp4_layout() -> None:
    r = Ina3221Iio(SYSFS / "xavier-agx-jp4" / "sys")
    rails = r.read_rails()
    assert rails["SOC"] == pytest.approx(2.936)
    assert r.total_watts(rails) == pytest.approx((463 + 618 + 2936 + 0 + 309 + 3306) / 1000)


def test_readers_refuse_a_tree_without_their_sensor(tmp_path: Path) -> None:
    for cls in (Ina3221Hwmon, Ina3221Iio, RaplEnergy):
        with pytest.raises(SensorUnavailable):
            cls(tmp_path)


def test_rapl_counts_packages_only_and_undoes_the_wrap(tmp_path: Path) -> None:
    shutil.copytree(SYSFS / "x86-rapl", tmp_path / "rapl")
    sys_root = tmp_path / "rapl" / "sys"
    rapl = RaplEnergy(sys_root)
    assert [z.name for z in rapl.zones] == ["intel-rapl:0", "intel-rapl:1"]
    sensor = CounterEnergySensor(rapl)
    sensor.start_window()
    pc = sys_root / "class" / "powercap"
    (pc / "intel-rapl:0" / "energy_uj").write_text("2000000\n")  # wrapped past 262143328850
    (pc / "intel-rapl:1" / "energy_uj").write_text("9000000\n")
    r = sensor.end_window(7)
    assert r.status == "measured" and r.energy_source == "counter"
    joules = (2_000_000 + 262143328850 + 1 - (262143328850 - 1_000_000) + 4_000_000) / 1e6
    assert r.energy_per_inference_mj == pytest.approx(joules * 1e3 / 7, rel=1e-6)


def test_rapl_root_only_counter_is_reported_unavailable(tmp_path: Path) -> None:
    root = os.getuid() == 0
    require("NON_ROOT", "root reads any file: the permission case cannot be produced here" if root else None)
    shutil.copytree(SYSFS / "x86-rapl", tmp_path / "rapl")
    (tmp_path / "rapl/sys/class/powercap/intel-rapl:0/energy_uj").chmod(0)
    with pytest.raises(SensorUnavailable, match="root only"):
        RaplEnergy(tmp_path / "rapl" / "sys")


def test_nvml_without_a_driver_is_unavailable_not_an_error() -> None:
    require_module("pynvml", "DEV_PACKAGES", "pip install nvidia-ml-py")
    require("NO_NVIDIA", "this machine has an NVIDIA driver" if Path("/dev/nvidiactl").exists() else None)
    with pytest.raises(SensorUnavailable, match="nvml"):
        NvmlEnergy()


def test_discover_names_why_nothing_was_found(tmp_path: Path) -> None:
    s = discover_power_sensor(tmp_path)
    assert isinstance(s, NoPowerSensor)
    r = s.end_window(10)
    assert r.status == "unavailable" and r.mean_watts is None and r.energy_per_inference_mj is None
    for word in ("ina3221", "nvml", "rapl"):
        assert word in (r.reason or "")


def test_discover_finds_the_jetson_hwmon(tmp_path: Path) -> None:
    s = discover_power_sensor(SYSFS / "xavier-nx-jp5")
    try:
        assert s.name == "ina3221-hwmon"
    finally:
        s.close()


def test_trapezoid_is_exact_on_a_linear_trace_with_interpolated_edges() -> None:
    ts = [i / 10 for i in range(21)]
    ws = [3 + 2 * t for t in ts]  # P(t) = 3 + 2t; integral over [0.25, 1.75] = 4.5 + 3.0
    energy, n = trapezoid_energy(ts, ws, 0.25, 1.75)
    assert energy == pytest.approx(7.5, abs=1e-12)
    assert n == 15
    assert trapezoid_energy(ts, ws, -0.1, 1.0) == (None, 0)  # not covered: no number


class FakeClock:
    """The sensor's clock, moved by the test: windows have exact edges, no test waits for time to pass."""

    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def synthetic_watts(t: float) -> float:
    """P(t) = 10 + 2 t + 3 sin(2 pi t) watts."""
    return 10 + 2 * t + 3 * math.sin(2 * math.pi * t)


def synthetic_joules(a: float, b: float) -> float:
    def prim(t: float) -> float:
        return 10 * t + t * t - 3 / (2 * math.pi) * math.cos(2 * math.pi * t)

    return prim(b) - prim(a)


def run_for(sensor: TraceSensor, clock: FakeClock, seconds: float, watts: Callable[[float], float]) -> None:
    """What the polling thread does, at exact times: samples every interval for `seconds`, and two past
    its end (the sample after a window's edge arrives while the window is closed); the clock ends there."""
    start, t = clock.now, clock.now
    while t < start + seconds + 2 * sensor.interval_s - 1e-12:
        t = round(t + sensor.interval_s, 9)
        sensor.trace.add(t, watts(t))
    clock.now = start + seconds


def test_energy_per_inference_from_a_sampled_trace_with_known_integral() -> None:
    clock = FakeClock()
    sensor = TraceSensor("synthetic", interval_s=0.005, clock=clock)
    run_for(sensor, clock, 0.05, synthetic_watts)
    sensor.start_window()
    run_for(sensor, clock, 1.0, synthetic_watts)
    r = sensor.end_window(50)
    assert sensor.last_window == pytest.approx((0.05, 1.05))
    expected_j = synthetic_joules(0.05, 1.05)
    assert r.status == "measured" and r.energy_source == "samples"
    assert r.samples is not None and r.samples >= 199
    assert r.energy_per_inference_mj == pytest.approx(expected_j * 1e3 / 50, rel=1e-3)
    assert r.mean_watts == pytest.approx(expected_j / 1.0, rel=1e-3)


def test_idle_baseline_is_reported_separately() -> None:
    clock = FakeClock()
    sensor = TraceSensor("steps", interval_s=0.005, clock=clock)
    run_for(sensor, clock, 0.05, lambda t: 4.0)  # samples before the idle window's start
    sensor.measure_idle(0.3, lambda s: run_for(sensor, clock, s, lambda t: 4.0))
    run_for(sensor, clock, 0.05, lambda t: 10.0)
    sensor.start_window()
    run_for(sensor, clock, 0.5, lambda t: 10.0)
    r = sensor.end_window(20)
    assert r.idle_watts == pytest.approx(4.0)
    assert r.mean_watts == pytest.approx(10.0)
    assert r.window_s == pytest.approx(0.5)
    assert r.idle_watts is not None
    assert r.dynamic_energy_per_inference_mj == pytest.approx((10.0 - r.idle_watts) * 0.5 * 1e3 / 20, rel=1e-3)


def test_a_window_with_too_few_samples_is_unavailable() -> None:
    clock = FakeClock()
    sensor = TraceSensor("slow", interval_s=0.2, clock=clock)
    run_for(sensor, clock, 0.2, lambda t: 5.0)
    sensor.start_window()
    run_for(sensor, clock, 0.1, lambda t: 5.0)
    r = sensor.end_window(3)
    assert r.status == "unavailable" and "samples" in (r.reason or "") and r.mean_watts is None


def test_the_polling_thread_feeds_the_trace() -> None:
    """The one part left to the real thread: it samples the reader until closed (how often: not asserted)."""

    class Rail:
        name = "rail"

        def __init__(self) -> None:
            self.reads = 0

        def read_rails(self) -> dict[str, float]:
            self.reads += 1
            return {"VDD_IN": 5.0}

        def total_watts(self, rails: dict[str, float]) -> float:
            return rails["VDD_IN"]

    rail = Rail()
    sensor = SampledPowerSensor(rail, interval_s=0.001)
    deadline = time.monotonic() + 30
    while rail.reads < 4 and time.monotonic() < deadline:  # bounded wait, not a timing claim
        time.sleep(0.01)
    sensor.close()
    assert rail.reads >= 4 and sensor.last_rails == {"VDD_IN": 5.0}  # the constructor's read, then the thread's
    reads = rail.reads
    time.sleep(0.05)
    assert rail.reads == reads  # closed: no more reads


def test_tegrastats_process_feeds_the_integrator(tmp_path: Path) -> None:
    """A real process printing captured Xavier NX lines every 20 ms stands in for tegrastats."""
    script = tmp_path / "fake_tegrastats.py"
    script.write_text(f"import time\nwhile True:\n    print({NX_JP5!r}, flush=True)\n    time.sleep(0.02)\n")
    sensor = TegrastatsPower(command=(sys.executable, str(script)))
    try:
        time.sleep(0.3)
        sensor.start_window()
        time.sleep(0.5)
        r = sensor.end_window(10)
    finally:
        sensor.close()
    assert r.status == "measured" and r.sensor == "tegrastats"
    assert r.mean_watts == pytest.approx(5.079)  # VDD_IN, the module input, not the sum of rails
    assert r.rails_watts == {"VDD_IN": 5.079, "VDD_CPU_GPU_CV": 0.696, "VDD_SOC": 1.104}


def test_thermal_zones() -> None:
    t = ThermalZones(SYSFS / "xavier-agx-jp5" / "sys").read()
    assert t == {"CPU-therm": 31.5, "GPU-therm": 30.5, "AUX-therm": 30.0, "Tboard_tegra": 31.0}
    assert ThermalZones(Path("/nonexistent")).read() == {}


def test_missing_tegrastats_is_unavailable() -> None:
    with pytest.raises(SensorUnavailable, match="tegrastats-not-here"):
        TegrastatsPower(command=("tegrastats-not-here",))
