"""The self-test's checks on fixture trees, real video files and small real classes (no device needed)."""

from __future__ import annotations

import datetime as dt
import subprocess
from pathlib import Path

import cv2
import numpy as np
import pytest

from edgedeploy_agent.bundle import Target
from edgedeploy_agent.config import AgentConfig
from edgedeploy_agent.errors import RuntimeLoadError
from edgedeploy_agent.gpu import CudaDevice
from edgedeploy_agent.runtime.engine_cache import EngineCache
from edgedeploy_agent.selftest import (
    FAILED,
    OK,
    WARNING,
    Check,
    check_clock,
    check_disk,
    check_health,
    check_keys,
    check_release_files,
    check_service,
    guarded,
    judge_unit,
    parse_systemctl_show,
    run_selftest,
    worst,
)
from edgedeploy_agent.selftest_hardware import (
    check_bundle_fit,
    check_camera,
    check_power,
    check_runtime,
    check_tensorrt,
    check_thermal,
)
from edgedeploy_agent.service import write_health
from edgedeploy_agent.sources.power import SensorUnavailable
from edgedeploy_agent.store import DeviceStore
from edgedeploy_agent.trust import TrustStore
from tests.agent.bundles import make_manifest
from tests.helpers import agent

FIXTURES = Path(__file__).parent / "fixtures"
SYSFS = FIXTURES / "sysfs"
SYSTEMCTL = FIXTURES / "systemctl"
KEY = "ed25519:" + "A" * 43 + "="  # 32 zero bytes


def _no_nvml() -> object:
    raise SensorUnavailable("nvml: no driver here")


def _manifest(**target: object):
    fields = {"arch": "x86_64", "device": "cpu", "runtime": "tvm", "runtime_abi": "tvm-ffi-0.1", **target}
    lib = Path(__file__)  # any file: only its description is used
    role = "tvm-library" if fields["runtime"] == "tvm" else "other"
    return make_manifest({"model.so": (lib, role)}, target=Target(**fields))  # type: ignore[arg-type]


@pytest.fixture
def store(tmp_path: Path) -> DeviceStore:
    s = DeviceStore(tmp_path / "root")
    s.init(AgentConfig(device_name="t", source=None))
    return s


def test_power_on_jetson_and_x86_trees_and_nothing(tmp_path: Path) -> None:
    nx = check_power(SYSFS / "xavier-nx-jp5", nvml=_no_nvml)
    assert nx.status == OK and nx.detail.startswith("ina3221-hwmon") and "VDD_IN" in nx.detail
    agx_jp4 = check_power(SYSFS / "xavier-agx-jp4", nvml=_no_nvml)
    assert agx_jp4.status == OK and agx_jp4.data["sensor"] == "ina3221-iio"
    rapl = check_power(SYSFS / "x86-rapl", nvml=_no_nvml)
    assert rapl.status == OK and rapl.data["sensor"] == "rapl"
    none = check_power(tmp_path, nvml=_no_nvml)
    assert none.status == WARNING and "nvml: no driver here" in none.detail and "RAPL" in str(none.fix)


def test_thermal_reads_zones_and_warns_when_hot(tmp_path: Path) -> None:
    agx = check_thermal(SYSFS / "xavier-agx-jp5")
    assert agx.status == OK and "hottest CPU-therm 31.5 C" in agx.detail
    zone = tmp_path / "sys" / "class" / "thermal" / "thermal_zone0"
    zone.mkdir(parents=True)
    (zone / "type").write_text("GPU-therm\n")
    (zone / "temp").write_text("91500\n")
    hot = check_thermal(tmp_path)
    assert hot.status == WARNING and "throttle" in hot.detail and "fan" in str(hot.fix)
    assert check_thermal(tmp_path / "nothing").status == WARNING


def test_bundle_vs_gpu_sm_driver_and_cpu_flags(tmp_path: Path) -> None:
    t4_bundle = _manifest(device="cuda", cuda_sm=75, min_cuda_driver="13.0")
    t4 = CudaDevice(driver_api="13.0", name="Tesla T4", sm=75)
    xavier = CudaDevice(driver_api="13.0", name="Xavier", sm=72)
    t4_old_driver = CudaDevice(driver_api="12.2", name="Tesla T4", sm=75)
    other = check_bundle_fit(t4_bundle, Path("/proc/cpuinfo"), probe=lambda: (xavier, ""))
    assert other.status == FAILED and "sm_75 code" in other.detail and "sm_72" in other.detail
    old = check_bundle_fit(t4_bundle, Path("/proc/cpuinfo"), probe=lambda: (t4_old_driver, ""))
    assert old.status == FAILED and "driver" in old.detail and "upgrade the NVIDIA driver" in str(old.fix)
    none = check_bundle_fit(t4_bundle, Path("/proc/cpuinfo"), probe=lambda: (None, "no CUDA driver"))
    assert none.status == FAILED and "needs a CUDA GPU" in none.detail
    fits = check_bundle_fit(t4_bundle, Path("/proc/cpuinfo"), probe=lambda: (t4, ""))
    assert fits.status == OK and "sm_75" in fits.detail and "Tesla T4" in fits.detail

    cpuinfo = tmp_path / "cpuinfo"
    cpuinfo.write_text("processor : 0\nflags : fpu sse2 avx\n")
    avx2 = _manifest(cpu_features=["avx2", "fma"])
    lacking = check_bundle_fit(avx2, cpuinfo, probe=lambda: (None, "none"))
    assert lacking.status == FAILED and "avx2, fma" in lacking.detail and "profile" in str(lacking.fix)
    arm = check_bundle_fit(_manifest(arch="aarch64"), cpuinfo, probe=lambda: (None, "none"), machine="x86_64")
    assert arm.status == FAILED and "aarch64" in arm.detail
    assert check_bundle_fit(None, cpuinfo, probe=lambda: (t4, "")).status == OK


def test_runtime_loads_or_says_why() -> None:
    assert check_runtime(None, None).status == OK  # the real libtvm_runtime.so of this machine's apache-tvm
    missing = check_runtime(None, "/nonexistent/libtvm_runtime.so")
    assert missing.status == FAILED and "does not exist" in missing.detail

    def broken(lib: str | None, cuda: bool, backend: tuple[str, str | None]) -> Path:
        raise RuntimeLoadError("cannot load libtvm_runtime_cuda.so: libcudart.so.13: not found", hint="CUDA 13")

    gpu = check_runtime(_manifest(device="cuda", cuda_sm=75), None, load=broken)
    assert gpu.status == FAILED and "libcudart" in gpu.detail and gpu.fix == "CUDA 13"
    trt_only = check_runtime(_manifest(device="cuda", runtime="tensorrt"), None, load=broken)
    assert trt_only.status == OK and "not needed" in trt_only.detail


def test_tensorrt_version_and_engine_cache(tmp_path: Path) -> None:
    trt = _manifest(device="cuda", runtime="tensorrt")
    engines = tmp_path / "engines"
    assert check_tensorrt(_manifest(), None, engines).status == OK

    def missing() -> str:
        raise ImportError("No module named 'tensorrt'")

    gone = check_tensorrt(trt, None, engines, version=missing)
    assert gone.status == FAILED and "does not import" in gone.detail and "system-site-packages" in str(gone.fix)
    cache = EngineCache(engines)
    cache.store("k1", {"tensorrt": "10.3.0"}, b"plan", {})
    health = {"runtime": {"engine_key": "k1"}}
    assert check_tensorrt(trt, health, engines, version=lambda: "10.3.0").status == OK
    other = check_tensorrt(trt, health, engines, version=lambda: "10.4.0")
    assert other.status == WARNING and "built with TensorRT 10.3.0" in other.detail
    assert check_tensorrt(trt, None, engines, version=lambda: "10.3.0").status == WARNING  # no engine yet
    assert check_tensorrt(trt, {"runtime": {"engine_key": "k2"}}, engines, version=lambda: "10.3.0").status == WARNING
    cache.mark_bad("k1", "top-1 agreement 0.2", {})
    bad = check_tensorrt(trt, health, engines, version=lambda: "10.3.0")
    assert bad.status == FAILED and "acceptance" in bad.detail and "engine-rejected" in str(bad.fix)
    fell = {"runtime": {"fallback_from": "tensorrt", "fallback_reason": {"message": "no GPU"}}}
    assert check_tensorrt(trt, fell, engines, version=lambda: "10.3.0").status == FAILED


def _video(path: Path, frames: int = 10) -> Path:
    w = cv2.VideoWriter(str(path), cv2.VideoWriter.fourcc(*"MJPG"), 25.0, (64, 48))
    for i in range(frames):
        w.write(np.full((48, 64, 3), i * 20, np.uint8))
    w.release()
    return path


def test_camera_opens_reads_frames_or_names_the_fix(tmp_path: Path) -> None:
    video = _video(tmp_path / "clip.avi")
    ok = check_camera(f"file:{video}", serving=False, report=None)
    assert ok.status == OK and ok.data["width"] == 64 and ok.data["height"] == 48 and "5 frames" in ok.detail
    assert " decoded at " in ok.detail
    paced = check_camera(f"file:{video}?fps=20", serving=False, report=None)  # its rate, not its decoder's
    assert paced.status == OK and " decoded at " not in paced.detail and 0 < paced.data["fps"] <= 20.5, paced.detail
    missing = check_camera(f"file:{tmp_path / 'gone.avi'}", serving=True, report=None)
    assert missing.status == FAILED and "does not exist" in missing.detail and "--source" in str(missing.fix)
    garbage = tmp_path / "garbage.avi"
    garbage.write_bytes(b"not a video" * 100)
    assert "cannot open" in check_camera(f"file:{garbage}", serving=False, report=None).detail
    bad_uri = check_camera("webcam0", serving=False, report=None)
    assert bad_uri.status == FAILED and "v4l2:/dev/video0" in str(bad_uri.fix)
    assert check_camera(None, serving=False, report=None).status == WARNING
    dead = check_camera("v4l2:/dev/nonexistent-camera", serving=False, report=None, seconds=0.5)
    assert dead.status == FAILED and "delivered no frame" in dead.detail


def test_a_camera_the_service_holds_is_judged_from_its_reports() -> None:
    def never(uri: str, system_python: str | None) -> object:
        raise AssertionError("opened a camera the running agent holds")

    up = {"seq": 7, "camera_up": True, "fps": 29.8, "frame_age_ms": {"p50": 12.0}, "window_end": "t"}
    ok = check_camera("v4l2:/dev/video0", serving=True, report=up, open_source=never)
    assert ok.status == OK and "29.8 FPS" in ok.detail and "in use by the running agent" in ok.detail
    down = check_camera("csi:0", serving=True, report={**up, "camera_up": False}, open_source=never)
    assert down.status == FAILED and "DOWN" in down.detail
    assert check_camera("v4l2:/dev/video0", serving=True, report=None, open_source=never).status == WARNING
    usb_in_gst = "gst:v4l2src device=/dev/video1 ! videoconvert"
    assert check_camera(usb_in_gst, serving=True, report=up, open_source=never).status == OK


def test_clock_against_the_bundle_and_the_host() -> None:
    now = 1_800_000_000.0
    created = dt.datetime.fromtimestamp(now, dt.timezone.utc) + dt.timedelta(days=30)
    assert check_clock(now, created).status == FAILED  # the clock is behind the bundle's build: a reset RTC
    assert check_clock(now, None).status == OK
    assert check_clock(now, None, (now - 0.2, now + 0.2)).status == OK
    assert check_clock(now + 10, None, (now - 0.2, now + 0.2)).status == WARNING
    late = check_clock(now - 3600, None, (now - 0.2, now + 0.2))
    assert late.status == FAILED and "-3600.0 s from the host" in late.detail and "timedatectl" in str(late.fix)
    # a slow round trip widens the bound instead of inventing a skew
    assert check_clock(now + 10, None, (now - 30, now + 30)).status == OK


def test_disk_space_and_spool(store: DeviceStore) -> None:
    assert check_disk(store.root, 10 << 20, 64 << 20, free_bytes=1 << 30).status == OK
    full = check_disk(store.root, 10 << 20, 64 << 20, free_bytes=20 << 20)
    assert full.status == FAILED and "a push needs 36 MiB" in full.detail
    assert check_disk(store.root, 10 << 20, 64 << 20, free_bytes=100 << 20).status == WARNING
    (store.spool / "20261201T000000-00000001.jsonl").write_bytes(b"x" * 60_000)
    near = check_disk(store.root, 0, 1 << 16, free_bytes=1 << 30)
    assert near.status == WARNING and "edgedeploy status" in str(near.fix)


def test_pinned_keys(store: DeviceStore) -> None:
    assert check_keys(store.root, None).status == WARNING
    TrustStore(store.root).replace([KEY])
    assert check_keys(store.root, 4).status == OK and "serial floor 4" in check_keys(store.root, 4).detail
    (store.root / "trust" / "bad.pub").write_text("rsa:xyz\n")
    assert check_keys(store.root, None).status == FAILED


def test_systemd_unit_states_from_systemctl_show() -> None:
    unit = "edgedeploy-agent.service"
    restarted = judge_unit(unit, parse_systemctl_show((SYSTEMCTL / "active-restarted.txt").read_text()))
    assert (
        restarted.status == WARNING and "2 restart(s)" in restarted.detail and "edgedeploy logs" in str(restarted.fix)
    )
    healthy = (SYSTEMCTL / "active-restarted.txt").read_text().replace("NRestarts=2", "NRestarts=0")
    assert judge_unit(unit, parse_systemctl_show(healthy)).status == OK
    limit = judge_unit(unit, parse_systemctl_show((SYSTEMCTL / "start-limit-hit.txt").read_text()))
    assert limit.status == FAILED and "start-limit-hit" in limit.detail and "1/6" in limit.detail
    absent = judge_unit(unit, parse_systemctl_show((SYSTEMCTL / "not-found.txt").read_text()))
    assert absent.status == FAILED and "agent install" in str(absent.fix)


def test_service_check_asks_systemctl_in_systemd_mode(store: DeviceStore) -> None:
    asked: list[list[str]] = []

    def systemctl(argv: list[str]) -> subprocess.CompletedProcess[str]:
        asked.append(list(argv))
        return subprocess.CompletedProcess(argv, 3, (SYSTEMCTL / "start-limit-hit.txt").read_text(), "")

    cfg = AgentConfig(service="systemd")
    assert check_service(cfg, store, None, run=systemctl).status == FAILED
    assert asked[0][:3] == ["systemctl", "show", "edgedeploy-agent.service"]
    assert check_service(AgentConfig(), store, None).status == WARNING  # process mode, nothing deployed


def test_health_states(store: DeviceStore) -> None:
    state = store.state()
    assert check_health(store, None, state).status == WARNING
    assert check_health(store, "r1", state).status == FAILED  # current, but the agent never reported
    write_health(store, "r1", "failed", error={"code": "frame-failed", "message": "frame 0: nan"})
    failed = check_health(store, "r1", state)
    assert failed.status == FAILED and "troubleshooting.md#frame-failed" in str(failed.fix)
    write_health(store, "r1", "finished", inferences=300)
    assert check_health(store, "r1", state).status == OK
    write_health(store, "r1", "ready", inferences=3)  # written by this process, which never beats
    dead = check_health(store, "r1", state)
    assert dead.status == FAILED and "never sent a heartbeat" in dead.detail
    assert check_health(store, "r1", {**state, "pending": {"release": "r2", "state": "staged"}}).status == WARNING


def test_run_selftest_on_a_fixture_root(store: DeviceStore, tmp_path: Path) -> None:
    video = _video(tmp_path / "clip.avi")
    store.set_source(f"file:{video}")
    result = run_selftest(store, SYSFS / "xavier-nx-jp5", camera_seconds=2)
    checks = {c["name"]: c for c in result["checks"]}
    assert checks["power"]["status"] == OK and checks["camera"]["status"] == OK
    assert checks["thermal"]["status"] == WARNING  # the NX fixture has no thermal zones
    assert result["overall"] == worst([c["status"] for c in result["checks"]]) == WARNING
    assert {c["status"] for c in result["checks"]} <= {OK, WARNING, FAILED}


def test_on_the_device_without_a_host(tmp_path: Path) -> None:
    """`edgedeploy-agent selftest` by a technician on site: the same checklist as text, exit 1 on a failure."""
    root = tmp_path / "root"
    assert agent("--root", str(root), "init", "--source", f"file:{tmp_path / 'unplugged.avi'}").code == 0
    r = agent("--root", str(root), "selftest", "--camera-seconds", "1")
    assert r.code == 1, r.out + r.err
    lines = r.out.splitlines()
    camera = next(i for i, ln in enumerate(lines) if " camera " in ln)
    assert lines[camera].split()[:2] == ["FAILED", "camera"] and lines[camera + 1].strip().startswith("fix: ")
    assert "not compared: run `edgedeploy verify` from the host" in r.out
    assert agent("--root", str(root), "init", "--source", "").code == 0  # no source: a warning, not a failure
    assert agent("--root", str(root), "selftest").code == 0


def test_a_check_that_crashes_is_a_failed_line_of_its_own() -> None:
    def broken() -> Check:
        raise KeyError("hwmon7")

    line = guarded("power", broken)
    assert line.status == FAILED and line.name == "power" and "KeyError" in line.detail
    assert guarded("power", lambda: Check("power", OK, "fine")).status == OK


def test_release_files_are_hashed_against_the_manifest(store: DeviceStore, tmp_path: Path) -> None:
    from tests.agent.bundles import make_bundle

    assert check_release_files(store, None).status == OK
    release = store.stage(make_bundle(tmp_path / "b")).release_name
    assert check_release_files(store, release).status == OK
    lib = store.release_dir(release) / "model.so"
    lib.write_bytes(b"\x7fELF flipped bits on the SD card")
    bad = check_release_files(store, release)
    assert bad.status == FAILED and "does not match its manifest" in bad.detail and "--force" in str(bad.fix)
