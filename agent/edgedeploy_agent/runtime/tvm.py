"""The TVM runtime, without the compiler: tvm_ffi + libtvm_runtime.so load the bundle's library.

The `tvm` Python package (and its 260 MB libtvm_compiler.so) is never imported. The runtime library
comes from the agent config (`tvm_runtime_lib`), or from the installed apache-tvm wheel's `tvm/lib`
folder, found without importing the package.

GPU bundles need a CUDA backend beside it, one of two (config `cuda_backend`):
- `edgedeploy`: libedgedeploy_cuda.so (runtime/cuda_backend.cc, put there by `edgedeploy agent install`):
  the CUDA 11.4 driver API only, so it runs on JetPack 5 and on long-term driver branches;
- `tvm`: the apache-tvm wheel's libtvm_runtime_cuda.so, which needs libcudart.so.13 and a CUDA 13 driver.
`auto` (the default) takes edgedeploy's where it is installed, else the wheel's.
"""

import ctypes
import dataclasses
import importlib.util
from pathlib import Path
from typing import Any, Optional

import numpy as np

from ..aligned import aligned
from ..bundle import Manifest, check_compatible
from ..errors import RuntimeLoadError
from ..gpu import probe_cuda, version_tuple

_DEVICE_TYPE = {"cpu": 1, "cuda": 2, "cuda_host": 3}  # DLPack device types (cuda_host: page-locked memory)
_POOLED_ALLOCATOR = 2
_loaded: set[str] = set()
_RUNTIME_HINT = "likely causes: wrong CPU architecture, glibc older than 2.28, missing libstdc++"
EDGEDEPLOY_CUDA = "libedgedeploy_cuda.so"
TVM_CUDA = "libtvm_runtime_cuda.so"
TVM_CUDA_DRIVER = "13.0"  # the wheel's backend links libcudart.so.13
CUDA_DRIVER_FLOOR = {"edgedeploy": "11.4", "tvm": TVM_CUDA_DRIVER}  # the driver API each backend needs
CUDA_BACKENDS = ("auto", "edgedeploy", "tvm")
_CUDA_HINT = {
    "edgedeploy": "reinstall the agent (edgedeploy agent install DEVICE puts libedgedeploy_cuda.so beside "
    "libtvm_runtime.so); likely causes: a library for another architecture, libstdc++ older than GCC 9's",
    "tvm": "the wheel's CUDA backend needs libcudart.so.13 beside it (RUNPATH $ORIGIN) and a CUDA 13 driver "
    "(R580+); edgedeploy's own backend (cuda_backend = 'edgedeploy') needs neither",
}


def find_runtime_lib(configured: Optional[str] = None) -> Path:
    """Locate libtvm_runtime.so: the configured path, else the apache-tvm wheel's copy."""
    if configured:
        p = Path(configured)
        if not p.is_file():
            raise RuntimeLoadError(f"configured TVM runtime {p} does not exist")
        return p
    spec = importlib.util.find_spec("tvm")  # locates the package; does not import it
    if spec is not None and spec.submodule_search_locations:
        for loc in spec.submodule_search_locations:
            p = Path(loc) / "lib" / "libtvm_runtime.so"
            if p.is_file():
                return p
    raise RuntimeLoadError(
        "libtvm_runtime.so not found",
        hint="set tvm_runtime_lib in the agent config, or install the TVM runtime kit on the device",
    )


def _load(lib: Path, hint: str) -> None:
    if str(lib) in _loaded:
        return
    try:
        ctypes.CDLL(str(lib), ctypes.RTLD_GLOBAL)
    except OSError as e:
        raise RuntimeLoadError(f"cannot load {lib}: {e}", hint=hint) from None
    _loaded.add(str(lib))


def cuda_backend_lib(runtime_lib: Path, choice: str = "auto", configured: Optional[str] = None) -> tuple[str, Path]:
    """(name, path) of the CUDA backend `choice` names: edgedeploy's at `configured` or beside `runtime_lib`,
    the wheel's beside `runtime_lib`."""
    if choice not in CUDA_BACKENDS:
        raise RuntimeLoadError(f"unknown cuda_backend {choice!r}", hint=f"one of: {', '.join(CUDA_BACKENDS)}")
    ours = Path(configured) if configured else runtime_lib.with_name(EDGEDEPLOY_CUDA)
    if choice == "edgedeploy" or (choice == "auto" and ours.is_file()):
        if not ours.is_file():
            raise RuntimeLoadError(f"edgedeploy's CUDA backend {ours} is not installed", hint=_CUDA_HINT["edgedeploy"])
        return "edgedeploy", ours
    return "tvm", runtime_lib.with_name(TVM_CUDA)


def load_runtime_libraries(
    runtime_lib: Optional[str] = None,
    cuda: bool = False,
    cuda_backend: str = "auto",
    cuda_backend_path: Optional[str] = None,
) -> Path:
    """Load tvm_ffi and libtvm_runtime.so (and a CUDA backend) into this process; returns the runtime's path.
    One CUDA backend per process: both register the same functions."""
    try:
        import tvm_ffi  # noqa: F401  (loads libtvm_ffi.so, which libtvm_runtime.so links against)
    except ImportError as e:
        raise RuntimeLoadError(
            f"apache-tvm-ffi is not installed: {e}", hint="reinstall the agent: edgedeploy agent install DEVICE"
        ) from None
    lib = find_runtime_lib(runtime_lib)
    _load(lib, _RUNTIME_HINT)
    if cuda:
        # The runtime-only mode autoloads no CUDA backend (shared/reference/tvm.md §5): load it by hand.
        name, backend = cuda_backend_lib(lib, cuda_backend, cuda_backend_path)
        other = {EDGEDEPLOY_CUDA: TVM_CUDA, TVM_CUDA: EDGEDEPLOY_CUDA}[backend.name]
        if any(Path(p).name == other for p in _loaded):
            raise RuntimeLoadError(f"this process already runs the other CUDA backend ({other})")
        _load(backend, _CUDA_HINT[name])
    return lib


def loaded_cuda_backend() -> Optional[str]:
    """ "edgedeploy" or "tvm": the CUDA backend this process loaded, if any."""
    names = {Path(p).name for p in _loaded}
    return "edgedeploy" if EDGEDEPLOY_CUDA in names else "tvm" if TVM_CUDA in names else None


class TvmRuntime:
    """Runs a Relax VM executable exported by `tvm.compile(...).export_library`."""

    name = "tvm"

    def __init__(
        self,
        release_dir: Path,
        manifest: Manifest,
        runtime_lib: Optional[str] = None,
        cuda_backend: str = "auto",
        cuda_backend_lib: Optional[str] = None,
    ) -> None:
        target = manifest.target
        gpu, reason = probe_cuda() if target.device == "cuda" else (None, "")
        check_compatible(manifest, gpu=gpu, gpu_reason=reason)
        self._lib_path = load_runtime_libraries(runtime_lib, target.device == "cuda", cuda_backend, cuda_backend_lib)
        self._cuda_backend = loaded_cuda_backend() if target.device == "cuda" else None
        if gpu is not None and self._cuda_backend == "tvm":
            _check_wheel_driver(gpu.driver_api)
        import tvm_ffi

        self._ffi = tvm_ffi
        self._alloc = tvm_ffi.get_global_func("runtime.TVMTensorAllocWithScope")
        self._copy = tvm_ffi.get_global_func("runtime.TVMTensorCopyFromTo")
        self._device = tvm_ffi.device(target.device, 0)
        self._cpu = tvm_ffi.device("cpu", 0)
        self._stream_sync: Any = (
            tvm_ffi.get_global_func("runtime.Device_StreamSync") if target.device == "cuda" else None
        )
        self._pinned = tvm_ffi.device(_DEVICE_TYPE["cuda_host"], 0)
        self._host_outputs: dict[tuple[Any, ...], Any] = {}  # (shape, dtype) -> the page-locked tensor reused
        library = release_dir / manifest.artifact("tvm-library").path
        try:
            module = tvm_ffi.load_module(str(library.resolve()))
            self._vm = module["vm_load_executable"]()
            if target.device == "cuda":  # the device, then the host, each with a pooled allocator
                self._vm["vm_initialization"](_DEVICE_TYPE["cuda"], 0, _POOLED_ALLOCATOR, 1, 0, _POOLED_ALLOCATOR)
            else:
                self._vm["vm_initialization"](1, 0, _POOLED_ALLOCATOR)
            self._main = self._vm["main"]
        except Exception as e:  # the FFI raises its own error types
            raise RuntimeLoadError(
                f"TVM could not load {library.name}: {e}",
                hint="likely causes: runtime ABI mismatch (rebuild the bundle with the device's TVM version), "
                "a library for another architecture, or a truncated file",
            ) from None
        self._manifest = manifest
        self._manifest_device = target.device
        self._gpu = gpu

    def run(self, inputs: list[np.ndarray]) -> list[np.ndarray]:
        args = [self._to_device(np.ascontiguousarray(x)) for x in inputs]
        out = self._main(*args)
        outs = list(out) if isinstance(out, (list, tuple)) or type(out).__name__ == "Array" else [out]
        return [np.from_dlpack(self._to_host(o)).copy() for o in outs]

    def _to_device(self, x: np.ndarray) -> Any:
        host = self._ffi.from_dlpack(aligned(x))
        if self._manifest_device == "cpu":
            return host
        dev = self._alloc(host.shape, host.dtype, self._device, None)
        self._copy(host, dev)
        return dev

    def _to_host(self, t: Any) -> Any:
        """`t` in host memory, the inference finished. On a GPU: a page-locked tensor per output shape,
        reused by the next call (callers copy it out). A new pageable tensor per call, as before, cost a
        batch-64 ResNet-18 call 0.045 ms more on the H200 (0.908 against 0.864 ms, outputs equal;
        docs/benchmarks.md, "Build changes", run25 calls 6-7)."""
        if self._manifest_device == "cpu":
            return t
        key = (tuple(t.shape), str(t.dtype))
        host = self._host_outputs.get(key)
        if host is None:
            host = self._host_outputs[key] = self._alloc(t.shape, t.dtype, self._pinned, None)
        self._copy(t, host)
        self._stream_sync(self._device, 0)  # the default stream: a copy into page-locked memory returns early
        return host

    def describe(self) -> dict[str, Any]:
        return {
            "runtime": "tvm",
            "runtime_lib": str(self._lib_path),
            "device": self._manifest.target.device,
            "cuda_backend": self._cuda_backend,
            "gpu": dataclasses.asdict(self._gpu) if self._gpu else None,
            "loaded_tvm_libraries": loaded_tvm_libraries(),
        }

    def close(self) -> None:
        """Nothing to free: the loaded libraries stay for the process (one CUDA backend per process)."""


def _check_wheel_driver(driver_api: str) -> None:
    if version_tuple(driver_api) < version_tuple(TVM_CUDA_DRIVER):
        raise RuntimeLoadError(
            f"the apache-tvm wheel's CUDA backend needs a CUDA {TVM_CUDA_DRIVER}+ driver, this device's offers "
            f"{driver_api}",
            hint="install edgedeploy's CUDA backend (edgedeploy agent install DEVICE), which needs CUDA 11.4+",
        )


def loaded_tvm_libraries() -> list[str]:
    """The TVM shared libraries mapped into this process (proof that no compiler is loaded)."""
    try:
        with open("/proc/self/maps", encoding="utf-8") as f:
            paths = {line.split()[-1] for line in f if "libtvm" in line}
    except OSError:
        return []
    return sorted(Path(p).name for p in paths)
