"""The self-test's hardware checks: TVM runtime, bundle vs CPU/GPU, TensorRT and its engine cache, the
camera, power and thermal sensors. Each takes what it touches as arguments (roots, probes, openers), so
tests run it on fixture trees and small real classes; the defaults are the device's real ones.
"""

import dataclasses
import json
import statistics
import time
from pathlib import Path
from typing import Any, Callable, Optional

from .bundle import Manifest, check_compatible
from .errors import AgentError, IncompatibleBundle, RuntimeLoadError, SourceError
from .gpu import CudaDevice, probe_cuda
from .selftest import FAILED, OK, WARNING, Check

# cameras one process holds at a time: while the agent serves one, its own reports describe it
EXCLUSIVE_SCHEMES = ("v4l2", "csi")
EXCLUSIVE_ELEMENTS = ("v4l2src", "nvarguscamerasrc")  # the same devices inside a gst: pipeline
HOT_C = 85.0
SOURCE_FIX = (
    "fix the source on the device (file path, camera cable, stream URL), or point the device at another one: "
    "edgedeploy devices add NAME ... --source URI --replace, then edgedeploy push"
)


PYTHONS_FIX = (
    "on JetPack 5, TensorRT and GStreamer capture run under the system Python 3.8: edgedeploy agent install DEVICE "
    "sets system_python (or on the device: edgedeploy-agent init --system-python /usr/bin/python3.8)"
)

CudaBackendChoice = tuple[str, Optional[str]]  # config cuda_backend, cuda_backend_lib


def _load_tvm(runtime_lib: Optional[str], cuda: bool, backend: CudaBackendChoice = ("auto", None)) -> Path:
    from .runtime.tvm import load_runtime_libraries

    return load_runtime_libraries(runtime_lib, cuda, *backend)


def check_runtime(
    manifest: Optional[Manifest],
    runtime_lib: Optional[str],
    cuda_backend: CudaBackendChoice = ("auto", None),
    load: Callable[[Optional[str], bool, CudaBackendChoice], Path] = _load_tvm,
) -> Check:
    """libtvm_runtime.so (and the CUDA backend when the bundle runs on the GPU) loads in a process of its own."""
    if manifest is not None and not any(a.role == "tvm-library" for a in manifest.artifacts):
        return Check("tvm runtime", OK, f"not needed: the current bundle runs on {manifest.target.runtime}")
    cuda = manifest is not None and manifest.target.device == "cuda"
    try:
        lib = load(runtime_lib, cuda, cuda_backend)
    except RuntimeLoadError as e:
        return Check("tvm runtime", FAILED, e.message, e.hint or "edgedeploy agent install DEVICE")
    if not cuda:
        return Check("tvm runtime", OK, f"{lib} loads", data={"lib": str(lib)})
    from .runtime.tvm import CUDA_DRIVER_FLOOR, cuda_backend_lib

    backend = cuda_backend_lib(lib, *cuda_backend)[0]  # the one the loader took, by the same rule
    return Check(
        "tvm runtime",
        OK,
        f"{lib} loads with the {backend} CUDA backend (CUDA {CUDA_DRIVER_FLOOR[backend]}+ drivers)",
        data={"lib": str(lib), "cuda_backend": backend},
    )


def _gpu_text(gpu: Optional[CudaDevice], reason: str) -> str:
    return f"{gpu.name} sm_{gpu.sm}, CUDA driver API {gpu.driver_api}" if gpu else f"no GPU ({reason})"


def check_bundle_fit(
    manifest: Optional[Manifest],
    cpuinfo: Path,
    probe: Callable[[], tuple[Optional[CudaDevice], str]] = probe_cuda,
    machine: Optional[str] = None,
) -> Check:
    """The current bundle's architecture, CPU flags, SM and minimum driver against this device."""
    gpu, reason = probe()
    data = {"gpu": dataclasses.asdict(gpu) if gpu else None}
    if manifest is None:
        return Check(
            "bundle vs hardware", OK, f"no bundle to compare; this device: {_gpu_text(gpu, reason)}", None, data
        )
    t = manifest.target
    wants = f"{manifest.profile}: {t.arch} {t.device}" + (f" sm_{t.cuda_sm}" if t.cuda_sm else "")
    if t.min_cuda_driver:
        wants += f", CUDA driver {t.min_cuda_driver}+"
    try:
        check_compatible(manifest, machine=machine, gpu=gpu, gpu_reason=reason, cpuinfo=cpuinfo)
    except IncompatibleBundle as e:
        fix = e.hint or "build the bundle for this device's profile (edgedeploy profiles list)"
        return Check("bundle vs hardware", FAILED, f"{e.message} (bundle wants {wants})", fix, data)
    return Check("bundle vs hardware", OK, f"bundle wants {wants}; device: {_gpu_text(gpu, reason)}", None, data)


def _tensorrt_version() -> str:
    import tensorrt  # only on a device with TensorRT (JetPack, NVIDIA's wheels)

    return str(tensorrt.__version__)


def check_tensorrt(
    manifest: Optional[Manifest],
    health: Optional[dict[str, Any]],
    engines: Path,
    version: Callable[[], str] = _tensorrt_version,
) -> Check:
    """TensorRT imports, and the current release's engine is cached, healthy and built by this TensorRT."""
    if manifest is None or manifest.target.runtime != "tensorrt":
        return Check(
            "tensorrt",
            OK,
            "not needed" + (f": the current bundle runs on {manifest.target.runtime}" if manifest else ""),
        )
    try:
        have = version()
    except Exception as e:  # ImportError, or a broken install failing in its native code
        return Check(
            "tensorrt",
            FAILED,
            f"TensorRT does not import: {type(e).__name__}: {e}",
            "use JetPack's TensorRT in a venv made with --system-site-packages (docs/tensorrt.md)",
        )
    from .runtime.engine_cache import EngineCache

    cache = EngineCache(engines)
    entries = [d for d in engines.iterdir() if (d / "plan").is_file()] if engines.is_dir() else []
    size = sum((d / "plan").stat().st_size for d in entries)
    runtime = (health or {}).get("runtime") or {}
    key = runtime.get("engine_key")
    detail = f"TensorRT {have}; engine cache {len(entries)} engine(s), {size / (1 << 20):.1f} MiB"
    data = {"tensorrt": have, "engines": len(entries), "engine_key": key}
    if runtime.get("fallback_from") == "tensorrt":
        reason = (runtime.get("fallback_reason") or {}).get("message")
        return Check("tensorrt", FAILED, f"{detail}; the agent fell back to TVM: {reason}", "docs/tensorrt.md", data)
    if not key:
        return Check(
            "tensorrt",
            WARNING,
            f"{detail}; no engine for the current release yet",
            "wait for the agent to build it",
            data,
        )
    bad = cache.is_bad(str(key))
    if bad is not None:
        return Check(
            "tensorrt",
            FAILED,
            f"{detail}; engine {str(key)[:12]} failed its acceptance check ({bad.get('reason')})",
            "rebuild the bundle; docs/troubleshooting.md#engine-rejected",
            data,
        )
    try:
        built_with = json.loads((cache.entry(str(key)) / "plan.json").read_text(encoding="utf-8"))["fields"]["tensorrt"]
    except (OSError, ValueError, KeyError, TypeError):
        return Check(
            "tensorrt",
            WARNING,
            f"{detail}; engine {str(key)[:12]} is not in the cache",
            "push again with --prebuild",
            data,
        )
    if built_with != have:
        return Check(
            "tensorrt",
            WARNING,
            f"{detail}; engine {str(key)[:12]} was built with TensorRT {built_with}: it is rebuilt at the next start",
            "push again with --prebuild to rebuild it now",
            data,
        )
    return Check("tensorrt", OK, f"{detail}; engine {str(key)[:12]} cached for this TensorRT", None, data)


def _open_source(uri: str, system_python: Optional[str] = None) -> Any:
    from .sources.capture import open_source

    return open_source(uri, system_python=system_python)


def _describe_python(facts: dict[str, Any]) -> str:
    gst = "with GStreamer" if facts.get("gstreamer") else "without GStreamer"
    opencv = f"OpenCV {facts['opencv']} {gst}" if facts.get("opencv") else "no OpenCV"
    return (
        f"Python {facts.get('python')} ({facts.get('executable')}): {opencv}, TensorRT {facts.get('tensorrt') or 'no'}"
    )


def _system_python_facts(python: str) -> dict[str, Any]:
    from .sidecar.process import Sidecar

    worker = Sidecar(python, "tensorrt", timeout_s=30.0)
    try:
        return worker.request("info")
    finally:
        worker.close()


def check_pythons(
    system_python: Optional[str],
    manifest: Optional[Manifest],
    source: Optional[str],
    system_facts: Callable[[str], dict[str, Any]] = _system_python_facts,
) -> Check:
    """Which Python and OpenCV each part uses: the agent's own, and JetPack's system Python (the sidecar) for
    TensorRT and GStreamer capture where the agent's lacks them; failed when what the device needs has neither."""
    from .sidecar.python_facts import python_facts
    from .sources.frames import parse_source

    own = python_facts()
    data: dict[str, Any] = {"agent": own, "system_python": None}
    lines = [f"agent: {_describe_python(own)}"]
    system: Optional[dict[str, Any]] = None
    if system_python:
        try:
            system = data["system_python"] = system_facts(system_python)
        except AgentError as e:
            return Check("pythons", FAILED, f"system_python {system_python}: {e.message}", PYTHONS_FIX, data)
        lines.append(f"system: {_describe_python(system)}")

    def where(key: str) -> Optional[str]:
        return "the agent" if own.get(key) else "the sidecar" if system and system.get(key) else None

    trt, gst = where("tensorrt"), where("gstreamer")
    data.update(tensorrt_in=trt, gstreamer_in=gst)
    lines.append(f"TensorRT runs in {trt or 'neither'}, GStreamer capture in {gst or 'neither'}")
    missing = []
    if manifest is not None and manifest.target.runtime == "tensorrt" and trt is None:
        missing.append("the current bundle needs TensorRT")
    try:
        needs_gst = bool(source) and parse_source(str(source)).needs_gstreamer
    except SourceError:
        needs_gst = False  # the camera check says what is wrong with it
    if needs_gst and gst is None:
        missing.append(f"{source} needs OpenCV with GStreamer")
    if missing:
        return Check("pythons", FAILED, "; ".join(lines + missing), PYTHONS_FIX, data)
    return Check("pythons", OK, "; ".join(lines), None, data)


def _from_report(source: str, report: Optional[dict[str, Any]]) -> Check:
    """A camera the serving agent holds: its last report says how it is doing."""
    if report is None:
        return Check("camera", WARNING, f"{source} is in use by the running agent, which has not reported yet", None)
    age = (report.get("frame_age_ms") or {}).get("p50")
    detail = (
        f"{source} is in use by the running agent: report #{report.get('seq')} at {report.get('window_end')} says "
        f"camera {'up' if report.get('camera_up') else 'DOWN'}, {report.get('fps')} FPS, frame age p50 {age} ms, "
        f"{report.get('reconnects', 0)} reconnects"
    )
    if report.get("camera_up") is False:
        return Check("camera", FAILED, detail, SOURCE_FIX)
    return Check("camera", OK, detail, data={"report_seq": report.get("seq")})


def check_camera(
    source: Optional[str],
    serving: bool,
    report: Optional[dict[str, Any]],
    seconds: float = 5.0,
    frames: int = 5,
    open_source: Callable[[str, Optional[str]], Any] = _open_source,
    system_python: Optional[str] = None,
) -> Check:
    """The configured source opens and delivers frames: resolution, rate, frame age; the service keeps running."""
    if not source:
        return Check("camera", WARNING, "no frame source configured", SOURCE_FIX)
    from .sources.frames import parse_source

    try:
        spec = parse_source(source)
    except SourceError as e:
        return Check("camera", FAILED, e.message, e.hint or SOURCE_FIX)
    exclusive = spec.scheme in EXCLUSIVE_SCHEMES or any(e in spec.target for e in EXCLUSIVE_ELEMENTS)
    if exclusive and serving:
        return _from_report(source, report)
    try:
        src = open_source(source, system_python)
    except SourceError as e:
        return Check("camera", FAILED, e.message, e.hint or SOURCE_FIX)
    where = src.where
    got: list[tuple[tuple[int, ...], float, float]] = []
    deadline = time.monotonic() + seconds
    try:
        while len(got) < frames and time.monotonic() < deadline:
            frame = src.read(timeout=max(deadline - time.monotonic(), 0.01))
            if frame is None:
                if src.ended:
                    break
                continue
            got.append((frame.image.shape, frame.age_ms, frame.captured))
        last_error = src.state().last_error
    finally:
        src.close()
    if not got:
        why = f" ({last_error})" if last_error else ""
        return Check("camera", FAILED, f"{source} delivered no frame in {seconds:.0f} s{why}", SOURCE_FIX)
    h, w = got[0][0][:2]
    span = got[-1][2] - got[0][2]
    fps = (len(got) - 1) / span if len(got) > 1 and span > 0 else None
    age = statistics.median(a for _, a, _ in got)
    rate = f"{fps:.1f} FPS" if fps else "rate unknown (one frame)"
    how = "decoded at" if not (spec.live or spec.fps) else "at"  # (a paced file delivers at its fps=, not faster)
    beside = " (read beside the running agent)" if serving else ""
    who = "the sidecar" if where.get("sidecar") else "the agent"
    by = f"{who}'s Python {where.get('python')}, OpenCV {where.get('opencv')}"
    detail = f"{source}: {w}x{h} {how} {rate}, frame age {age:.0f} ms over {len(got)} frames{beside}, through {by}"
    data = {
        "width": w,
        "height": h,
        "fps": None if fps is None else round(fps, 2),
        "frame_age_ms": round(age, 1),
        "capture": where,
    }
    return Check("camera", OK, detail, data=data)


def _nvml() -> Any:
    from .sources.nvml import NvmlEnergy

    return NvmlEnergy()


def check_power(sys_root: Path, nvml: Callable[[], Any] = _nvml) -> Check:
    """The first power sensor the agent would use (INA3221, NVML, RAPL) reads a value."""
    from .sources.ina3221 import Ina3221Hwmon, Ina3221Iio
    from .sources.power import SensorUnavailable
    from .sources.rapl import RaplEnergy

    reasons = []
    for make in (Ina3221Hwmon, Ina3221Iio):
        try:
            reader = make(sys_root / "sys")
            rails = reader.read_rails()
            total = reader.total_watts(rails)
            text = ", ".join(f"{k} {v:.2f} W" for k, v in rails.items())
            return Check("power", OK, f"{reader.name}: {total:.2f} W ({text})", data={"sensor": reader.name})
        except (SensorUnavailable, OSError, ValueError) as e:
            reasons.append(str(e))
    for name, make_counter in (("nvml", nvml), ("rapl", lambda: RaplEnergy(sys_root / "sys"))):
        try:
            counter = make_counter()
            return Check("power", OK, f"{name}: energy counter at {counter.read_joules():.1f} J", data={"sensor": name})
        except (SensorUnavailable, OSError, ValueError) as e:
            reasons.append(str(e))
    return Check(
        "power",
        WARNING,
        "no power sensor readable: reports carry no power or energy (" + "; ".join(reasons) + ")",
        "x86: RAPL's energy_uj is root-only, give the agent's group read access (udev rule); NVIDIA GPU: install "
        "nvidia-ml-py in the agent's venv; Jetson: the agent's user must read the ina3221 hwmon files",
    )


def check_thermal(sys_root: Path) -> Check:
    from .sources.thermal import ThermalZones

    temps = ThermalZones(sys_root / "sys").read()
    if not temps:
        return Check("thermal", WARNING, f"no thermal zone readable under {sys_root / 'sys/class/thermal'}", None)
    zone, hottest = max(temps.items(), key=lambda kv: kv[1])
    detail = f"{len(temps)} zone(s), hottest {zone} {hottest:.1f} C"
    if hottest >= HOT_C:
        return Check(
            "thermal", WARNING, detail + ": the device may throttle", "check the fan, heatsink and airflow", temps
        )
    return Check("thermal", OK, detail, data=temps)
