"""THE bundle format: one file (a gzipped tar) whose first member is `manifest.json`.

The manifest is defined here, once, as pydantic models with a schema version. The host imports this
module to write bundles; the agent uses it to verify and unpack them. Every artifact is listed with
its sha256 and size, and unpacking checks each byte against them before anything is used.

Layout of a bundle file:
    manifest.json      canonical JSON (sorted keys, no spaces): the exact bytes a signature covers
    manifest.sig       optional; reserved for signed bundles (ed25519 over manifest.json)
    <artifacts...>     flat file names listed in manifest.artifacts: what the device runs

Files only the host needs (the source model, the Q/DQ model a TVM INT8 library was compiled from) are
not in the bundle: `manifest.host_files` names them by sha256 in the host's build store. Schema 1
bundles carried them as artifacts; they still unpack and deploy.
"""

import datetime as _dt
import gzip
import hashlib
import io
import json
import math
import os
import platform
import re
import tarfile
from collections.abc import Mapping
from pathlib import Path
from typing import IO, Any, Literal, Optional

from pydantic import BaseModel, ConfigDict, Field, SerializerFunctionWrapHandler, ValidationError, model_serializer

from .durable import atomic_file, fsync_dir
from .errors import BundleError, IncompatibleBundle
from .gpu import CudaDevice, version_tuple

# 2: host_files (host-only files leave the bundle); 1 manifests still parse
# 3: a host file may be a TFLite model or a PyTorch ExportedProgram (the source of the build). Only such
#    bundles are written as 3, so agents that read 2 still take every ONNX-built bundle.
# 4: target.driver_floor_reason, twin_of, and the cuda-ptx artifact (model.ptx): GPU bundles whose device code
#    comes from NVRTC 11 (issue 39). Only bundles with one of them are written as 4.
# 5: the tvm-preprocess artifact (preprocess.so): GPU bundles that preprocess frames on the GPU (issue 36). Only
#    bundles with it are written as 5; this agent reads 5.
SCHEMA_VERSION = 5
WRITTEN_SCHEMA_VERSION = 2  # what a manifest says unless it needs 3, 4 or 5
MANIFEST_NAME = "manifest.json"
SIGNATURE_NAME = "manifest.sig"
BUNDLE_SUFFIX = ".edb"
MAX_MANIFEST_BYTES = 1 << 20
_SAFE_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,127}$")
_CHUNK = 1 << 20


class _Model(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class TensorSpec(_Model):
    """One model input or output as the compiled library sees it."""

    name: str
    shape: list[int] = Field(description="static shape; the batch dimension is fixed at build time")
    dtype: str = "float32"
    layout: Optional[str] = Field(default=None, description="e.g. NCHW, NHWC; None for non-image tensors")


class Preprocess(_Model):
    """How a BGR camera frame becomes the model input. One implementation: preprocess.py."""

    color: Literal["rgb", "bgr", "gray"] = "rgb"
    resize: Literal["stretch", "center_crop"] = "stretch"
    crop_fraction: float = Field(default=1.0, gt=0, le=1, description="center_crop: kept part of the short side")
    interpolation: Literal["area", "linear", "nearest"] = "linear"
    scale: float = Field(default=1.0, description="pixels (0..255) are multiplied by this first")
    mean: list[float] = Field(default_factory=lambda: [0.0], description="then (x - mean) / std, per channel")
    std: list[float] = Field(default_factory=lambda: [1.0])


class Postprocess(_Model):
    """How raw outputs become predictions."""

    kind: Literal["classifier", "raw"] = "classifier"
    top_k: int = Field(default=5, ge=1)
    softmax: bool = Field(default=False, description="apply softmax to the first output (logit models)")
    label_offset: int = Field(default=0, description="output index minus this is the label index")

    def top_count(self, output: TensorSpec) -> int:
        """k: how many classes a row's top holds (top_k, at most the classes of the first `output`)."""
        return min(self.top_k, math.prod(output.shape[1:]))


class Target(_Model):
    """What a device must provide to run the bundle."""

    arch: Literal["x86_64", "aarch64"]
    device: Literal["cpu", "cuda"]
    cuda_sm: Optional[int] = None
    min_cuda_driver: Optional[str] = Field(default=None, description="minimum CUDA driver API version, e.g. 13.0")
    driver_floor_reason: Optional[str] = Field(
        default=None, description="why min_cuda_driver is that version (device code, runtime backend)"
    )
    runtime: Literal["tvm", "tensorrt"] = "tvm"
    runtime_abi: str = Field(description="runtime ABI the library was built against, e.g. tvm-ffi-0.1")
    host_machine: Optional[str] = Field(default=None, description="ELF machine of the library, read back")
    device_code: list[str] = Field(default_factory=list, description="device images found in the library")
    cuda_codegen: Optional[str] = Field(default=None, description="what produced the device code, e.g. nvcc 13.0.88")
    cuda_graph: bool = False
    cpu_features: list[str] = Field(
        default_factory=list,
        description="CPU flags the host code needs, as /proc/cpuinfo names them (e.g. avx2, fma)",
    )

    @model_serializer(mode="wrap")
    def _omit_empty_cpu_features(self, handler: SerializerFunctionWrapHandler) -> dict[str, Any]:
        # a target without required CPU flags (or a floor reason) serialises as before the field existed: same
        # bundle id
        data: dict[str, Any] = handler(self)
        if not data.get("cpu_features"):
            data.pop("cpu_features", None)
        if data.get("driver_floor_reason") is None:
            data.pop("driver_floor_reason", None)
        return data

    def ptx_only(self) -> bool:
        """The library's device code is PTX alone (a twin): the driver JIT-compiles it for any newer GPU."""
        return bool(self.device_code) and all(d.split()[1:2] == ["ptx"] for d in self.device_code)


class Artifact(_Model):
    """A file in the bundle (schema 1 bundles also carried onnx-model here)."""

    path: str
    role: Literal[
        "tvm-library", "onnx-model", "qdq-onnx", "labels", "other", "tensorrt-reference", "cuda-ptx", "tvm-preprocess"
    ]
    sha256: str = Field(pattern=r"^[0-9a-f]{64}$")
    size: int = Field(ge=0)


MODEL_NAME_PATTERN = r"^[A-Za-z0-9][A-Za-z0-9._-]{0,63}$"
MODEL_VERSION_PATTERN = r"^[A-Za-z0-9][A-Za-z0-9.+_-]{0,31}$"


class HostFile(_Model):
    """A file the bundle was built from that only the host needs; kept in the host's build store by sha256."""

    name: str = Field(description="file name when the bundle was built (informational)")
    role: Literal["onnx-model", "qdq-onnx", "tflite-model", "torch-program"]
    sha256: str = Field(pattern=r"^[0-9a-f]{64}$")
    size: int = Field(ge=0)


class ModelInfo(_Model):
    name: str = Field(pattern=MODEL_NAME_PATTERN)
    version: str = Field(pattern=MODEL_VERSION_PATTERN)
    description: str = ""
    source_sha256: str = Field(pattern=r"^[0-9a-f]{64}$", description="sha256 of the source model file")


class Quantization(_Model):
    precision: Literal["fp32", "fp16", "int8"] = "fp32"
    method: Optional[str] = None
    calibration_samples: Optional[int] = None
    float_layers: list[str] = Field(default_factory=list)
    accuracy: dict[str, float] = Field(default_factory=dict, description="measured metrics, e.g. top1")
    calibration: Optional[str] = Field(default=None, description="calibration source and split")
    evaluation: Optional[str] = Field(default=None, description="evaluation set and split")
    options: dict[str, str] = Field(default_factory=dict, description="quantization options (JSON values)")
    float_in_runtime: list[str] = Field(default_factory=list, description="layers the runtime computes in float")


class ShapeProfile(_Model):
    """One TensorRT optimisation profile entry: the min/opt/max shape of one input."""

    input: str
    min: list[int]
    opt: list[int]
    max: list[int]


class TensorRTSettings(_Model):
    """What the device needs to build, cache and accept a TensorRT engine from the bundle's QDQ ONNX."""

    onnx: str = Field(description="artifact path of the symmetric INT8 QDQ ONNX the engine is built from")
    precision: Literal["int8-qdq"] = "int8-qdq"
    fp16: bool = Field(default=True, description="TensorRT < 11: let non-quantized layers run in FP16")
    profiles: list[list[ShapeProfile]] = Field(description="optimisation profiles, each min/opt/max per input")
    workspace_bytes: int = Field(gt=0)
    builder_optimization_level: int = Field(default=3, ge=0, le=5)
    reference: str = Field(
        description="artifact path of the .npz with reference inputs and the exact INT8 reference outputs"
    )
    min_top1_agreement: float = Field(default=0.75, ge=0, le=1)
    atol: float = Field(
        default=0.05, ge=0, description="the build sets it: the FP32 model's distance from the reference"
    )
    rtol: float = Field(default=0.0, ge=0)
    reference_fp32_top1_agreement: Optional[float] = Field(
        default=None, ge=0, le=1, description="top-1 agreement of the reference outputs with the FP32 model (build)"
    )
    reference_fp32_samples: Optional[int] = Field(default=None, ge=1, description="samples the build gate measured")


class HealthSpec(_Model):
    """What the device must show after activation, besides loading and one warm-up inference."""

    min_inferences: int = Field(default=0, ge=0, description="successful inferences on the device's source")
    max_p95_ms: Optional[float] = Field(default=None, gt=0, description="inference latency objective")
    min_fps: Optional[float] = Field(default=None, gt=0, description="throughput objective")


class Provenance(_Model):
    tools: dict[str, str] = Field(description="versions of the tools that built the bundle")
    build_host: str
    options: dict[str, str] = Field(default_factory=dict)


class Manifest(_Model):
    """Everything a device and a human need to know about a bundle."""

    schema_version: int = WRITTEN_SCHEMA_VERSION
    model: ModelInfo
    created: _dt.datetime
    profile: str
    target: Target
    inputs: list[TensorSpec]
    outputs: list[TensorSpec]
    preprocess: Preprocess
    postprocess: Postprocess
    labels: Optional[str] = Field(default=None, description="artifact path of the labels file, one per line")
    quantization: Quantization = Field(default_factory=Quantization)
    provenance: Provenance
    artifacts: list[Artifact]
    host_files: list[HostFile] = Field(
        default_factory=list, description="not in the bundle: files in the host's build store (eval, tune, rebuilds)"
    )
    tensorrt: Optional[TensorRTSettings] = Field(default=None, description="set when target.runtime is tensorrt")
    # Reserved for signed bundles: a monotonically increasing serial and an expiry.
    serial: Optional[int] = None
    expires: Optional[_dt.datetime] = None
    health: Optional[HealthSpec] = Field(default=None, description="health objectives; the command line may add")
    twin_of: Optional[str] = Field(
        default=None,
        description="a twin: the named profile's device code as PTX with a host library for this target's CPU, "
        "built to run that profile's kernels on another GPU",
    )

    @model_serializer(mode="wrap")
    def _omit_unset_fields(self, handler: SerializerFunctionWrapHandler) -> dict[str, Any]:
        # a manifest without objectives or host files serialises exactly as before those fields existed:
        # an older bundle unpacked by this agent keeps its bundle id (and its signed bytes)
        data: dict[str, Any] = handler(self)
        if data.get("health") is None:
            data.pop("health", None)
        if not data.get("host_files"):
            data.pop("host_files", None)
        if data.get("twin_of") is None:
            data.pop("twin_of", None)
        return data

    def artifact(self, role: str) -> Artifact:
        for a in self.artifacts:
            if a.role == role:
                return a
        raise BundleError(f"bundle {self.model.name} has no {role} artifact")

    def canonical_bytes(self) -> bytes:
        return canonical_json(self.model_dump(mode="json"))

    @property
    def bundle_id(self) -> str:
        """Content id: the first 16 hex digits of the sha256 of the canonical manifest."""
        return hashlib.sha256(self.canonical_bytes()).hexdigest()[:16]

    @property
    def release_name(self) -> str:
        return f"{self.model.name}-{self.model.version}-{self.bundle_id}"


def canonical_json(data: object) -> bytes:
    return json.dumps(data, sort_keys=True, separators=(",", ":"), ensure_ascii=True).encode()


def manifest_json_schema() -> dict[str, Any]:
    """JSON Schema of the manifest (generated into docs/, never written by hand)."""
    schema = Manifest.model_json_schema()
    schema["$comment"] = f"edgedeploy bundle manifest, schema_version {SCHEMA_VERSION}"
    return schema


def sha256_file(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(_CHUNK), b""):
            h.update(chunk)
    return h.hexdigest()


def describe_artifact(path: Path, role: str, name: Optional[str] = None) -> Artifact:
    return Artifact(path=name or path.name, role=role, sha256=sha256_file(path), size=path.stat().st_size)  # type: ignore[arg-type]


def write_bundle(out: Path, manifest: Manifest, files: Mapping[str, Path], signature: Optional[bytes] = None) -> Path:
    """Write `manifest` (and its signature) and the files it lists into one bundle file, atomically."""
    listed = {a.path: a for a in manifest.artifacts}
    if set(listed) != set(files):
        raise BundleError(f"artifacts {sorted(listed)} do not match files {sorted(files)}")
    for name, art in listed.items():
        check_artifact_name(name)
        if sha256_file(files[name]) != art.sha256:
            raise BundleError(f"{files[name]} changed while the bundle was being written")
    body = manifest.canonical_bytes()
    out.parent.mkdir(parents=True, exist_ok=True)
    with atomic_file(out) as raw, gzip.GzipFile(fileobj=raw, mode="wb", mtime=0, compresslevel=6) as gz:
        with tarfile.open(fileobj=gz, mode="w", format=tarfile.PAX_FORMAT) as tar:
            tar.addfile(_tarinfo(MANIFEST_NAME, len(body)), io.BytesIO(body))
            if signature is not None:
                tar.addfile(_tarinfo(SIGNATURE_NAME, len(signature)), io.BytesIO(signature))
            for name in sorted(listed):
                with open(files[name], "rb") as f:
                    tar.addfile(_tarinfo(name, listed[name].size), f)
    return out


def read_manifest(path: Path) -> Manifest:
    """Read and validate only the manifest (the first member); cheap even for large bundles."""
    with _open_tar(path) as tar:
        member = _next_member(tar, path)
        if member is None or member.name != MANIFEST_NAME:
            raise BundleError(f"{path}: not an edgedeploy bundle (first member must be {MANIFEST_NAME})")
        return _parse_manifest(_read_small(tar, member, path), path)


def read_signed_manifest(path: Path) -> tuple[Manifest, bytes, Optional[bytes]]:
    """The manifest, its exact bytes and the signature member (None when unsigned); reads two members."""
    with _open_tar(path) as tar:
        member = _next_member(tar, path)
        if member is None or member.name != MANIFEST_NAME:
            raise BundleError(f"{path}: not an edgedeploy bundle (first member must be {MANIFEST_NAME})")
        body = _read_small(tar, member, path)
        manifest = _parse_manifest(body, path)
        second = _next_member(tar, path)
        sig = _read_small(tar, second, path) if second is not None and second.name == SIGNATURE_NAME else None
        return manifest, body, sig


def verify_bundle(path: Path) -> Manifest:
    """Check every artifact's size and sha256 without writing anything."""
    return _walk(path, dest=None)


def extract_bundle(path: Path, dest: Path) -> Manifest:
    """Verify and unpack into `dest` (new, or an empty folder). Only listed regular files are written."""
    dest.mkdir(parents=True, exist_ok=True)
    if any(dest.iterdir()):
        raise BundleError(f"cannot unpack {path.name} into {dest}: the folder is not empty")
    return _walk(path, dest=dest)


def check_schema(manifest: Manifest) -> None:
    if manifest.schema_version > SCHEMA_VERSION:
        raise IncompatibleBundle(
            f"bundle schema {manifest.schema_version} is newer than this agent understands ({SCHEMA_VERSION})",
            hint="upgrade edgedeploy-agent on the device",
        )


CPUINFO = Path("/proc/cpuinfo")


def cpu_flags(cpuinfo: Path = CPUINFO) -> Optional[frozenset[str]]:
    """The CPU feature flags of this machine (the `flags` line of /proc/cpuinfo), or None when unreadable."""
    try:
        text = cpuinfo.read_text(errors="replace")
    except OSError:
        return None
    for line in text.splitlines():
        key, sep, value = line.partition(":")
        if sep and key.strip() in ("flags", "Features"):  # x86 | aarch64
            return frozenset(value.split())
    return None


def check_compatible(
    manifest: Manifest,
    machine: Optional[str] = None,
    gpu: Optional[CudaDevice] = None,
    gpu_reason: str = "",
    cpuinfo: Path = CPUINFO,
) -> None:
    """Refuse a bundle this device cannot run, before any byte of it is unpacked or loaded.

    `gpu` is what the device's CUDA driver reports (gpu.probe_cuda); None means no usable GPU.
    `cpuinfo` is where the CPU's feature flags are read from when the bundle needs any.
    """
    check_schema(manifest)
    arch = machine or platform.machine()
    t = manifest.target
    if t.arch != arch:
        raise IncompatibleBundle(
            f"bundle {manifest.model.name} is built for profile {manifest.profile} ({t.arch}), this device is {arch}"
        )
    if t.cpu_features:
        have = cpu_flags(cpuinfo)
        if have is None:
            raise IncompatibleBundle(
                f"bundle for {manifest.profile} needs CPU features {', '.join(t.cpu_features)}; "
                f"{cpuinfo} lists no CPU flags"
            )
        missing = [f for f in t.cpu_features if f not in have]
        if missing:
            raise IncompatibleBundle(
                f"bundle for {manifest.profile} needs CPU features this device lacks: {', '.join(missing)}",
                hint="build the bundle for a profile whose CPU features this device has (edgedeploy profiles list)",
            )
    if t.device != "cuda":
        return
    if gpu is None:
        raise IncompatibleBundle(f"bundle for {manifest.profile} needs a CUDA GPU (sm_{t.cuda_sm}): {gpu_reason}")
    if t.runtime == "tensorrt":
        return  # the engine is built on the device for its own GPU; the TensorRT runtime checks the rest
    want = t.cuda_sm or 0
    if t.ptx_only():
        # PTX for compute_XY: the driver JIT-compiles it for any GPU of SM XY or newer (twins)
        if gpu.sm < want:
            raise IncompatibleBundle(
                f"bundle holds compute_{want} PTX, this device's {gpu.name} is sm_{gpu.sm} (older)",
                hint=f"build the bundle for this device's profile (a profile with cuda_sm = {gpu.sm})",
            )
    # SASS runs on the same major architecture with an equal or newer minor version
    elif gpu.sm // 10 != want // 10 or gpu.sm < want:
        raise IncompatibleBundle(
            f"bundle holds sm_{want} code, this device's {gpu.name} is sm_{gpu.sm}",
            hint=f"build the bundle for this device's profile (a profile with cuda_sm = {gpu.sm})",
        )
    if t.min_cuda_driver and version_tuple(gpu.driver_api) < version_tuple(t.min_cuda_driver):
        why = f" ({t.driver_floor_reason})" if t.driver_floor_reason else ""
        raise IncompatibleBundle(
            f"bundle needs CUDA driver API {t.min_cuda_driver}+{why}, this device's driver offers {gpu.driver_api}",
            hint=f"upgrade the NVIDIA driver to one of CUDA {t.min_cuda_driver} or newer, or build for a profile "
            "whose min_cuda_driver this driver meets (edgedeploy profiles list)",
        )


# --- internals --------------------------------------------------------------------------------


def _tarinfo(name: str, size: int) -> tarfile.TarInfo:
    ti = tarfile.TarInfo(name)
    ti.size, ti.mtime, ti.mode, ti.uid, ti.gid, ti.uname, ti.gname = size, 0, 0o644, 0, 0, "", ""
    return ti


def check_artifact_name(name: str) -> None:
    """A flat, safe file name that is not reserved for the manifest or its signature."""
    if not _SAFE_NAME.match(name) or name in (MANIFEST_NAME, SIGNATURE_NAME):
        raise BundleError(f"unsafe or reserved artifact name {name!r}")


def _open_tar(path: Path) -> tarfile.TarFile:
    try:
        # Stream mode: members are read in order, nothing is seeked or cached.
        return tarfile.open(path, mode="r|gz")
    except FileNotFoundError:
        raise BundleError(f"{path}: no such bundle file") from None
    except (tarfile.TarError, OSError, EOFError) as e:
        raise BundleError(f"{path}: not a readable bundle ({e})") from None


def _next_member(tar: tarfile.TarFile, path: Path) -> Optional[tarfile.TarInfo]:
    try:
        return tar.next()
    except (tarfile.TarError, OSError, EOFError, gzip.BadGzipFile) as e:
        raise BundleError(f"{path}: corrupt bundle archive ({e})") from None


def _read_small(tar: tarfile.TarFile, member: tarfile.TarInfo, path: Path) -> bytes:
    if not member.isfile() or member.size > MAX_MANIFEST_BYTES:
        raise BundleError(f"{path}: {member.name} is not a regular file of sane size")
    f = tar.extractfile(member)
    assert f is not None
    try:
        return f.read()
    except (tarfile.TarError, OSError, EOFError) as e:
        raise BundleError(f"{path}: corrupt bundle archive ({e})") from None


def _parse_manifest(body: bytes, path: Path) -> Manifest:
    try:
        m = Manifest.model_validate(json.loads(body))
    except (ValueError, ValidationError) as e:
        first = str(e).splitlines()
        detail = first[1] if len(first) > 1 else first[0] if first else "invalid"
        raise BundleError(f"{path}: invalid manifest ({detail.strip()})") from None
    check_schema(m)
    return m


def _walk(path: Path, dest: Optional[Path]) -> Manifest:
    with _open_tar(path) as tar:
        first = _next_member(tar, path)
        if first is None or first.name != MANIFEST_NAME:
            raise BundleError(f"{path}: not an edgedeploy bundle (first member must be {MANIFEST_NAME})")
        manifest = _parse_manifest(_read_small(tar, first, path), path)
        expected = {a.path: a for a in manifest.artifacts}
        for name in expected:
            check_artifact_name(name)
        seen: dict[str, bool] = {}
        second = True  # the signature may only be the second member, as read_signed_manifest expects
        while True:
            member = _next_member(tar, path)
            if member is None:
                break
            if member.name == SIGNATURE_NAME:
                if not second:
                    raise BundleError(f"{path}: {SIGNATURE_NAME} must appear once, right after {MANIFEST_NAME}")
                second = False
                sig = _read_small(tar, member, path)
                if dest is not None:
                    _write_exclusive(dest / SIGNATURE_NAME, io.BytesIO(sig), len(sig), None, path)
                continue
            second = False
            art = expected.get(member.name)
            if art is None or member.name in seen:
                raise BundleError(f"{path}: unexpected member {member.name!r} (not listed once in the manifest)")
            if not member.isfile():
                raise BundleError(f"{path}: member {member.name!r} is not a regular file")
            if member.size != art.size:
                raise BundleError(f"{path}: {member.name} is {member.size} bytes, manifest says {art.size}")
            f = tar.extractfile(member)
            assert f is not None
            if dest is None:
                digest = _hash_stream(f, path)
            else:
                digest = _write_exclusive(dest / member.name, f, art.size, art.sha256, path)
            if digest != art.sha256:
                raise BundleError(f"{path}: sha256 mismatch for {member.name} (tampered or corrupt bundle)")
            seen[member.name] = True
        missing = sorted(set(expected) - set(seen))
        if missing:
            raise BundleError(f"{path}: bundle is truncated, missing {', '.join(missing)}")
    if dest is not None:
        (dest / MANIFEST_NAME).write_bytes(manifest.canonical_bytes())
        fsync_dir(dest)
    return manifest


def _hash_stream(f: IO[bytes], path: Path) -> str:
    h = hashlib.sha256()
    try:
        for chunk in iter(lambda: f.read(_CHUNK), b""):
            h.update(chunk)
    except (tarfile.TarError, OSError, EOFError) as e:
        raise BundleError(f"{path}: corrupt bundle archive ({e})") from None
    return h.hexdigest()


def _write_exclusive(target: Path, f: IO[bytes], size: int, sha256: Optional[str], path: Path) -> str:
    h = hashlib.sha256()
    fd = os.open(target, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o644)
    written = 0
    try:
        with os.fdopen(fd, "wb") as out:
            for chunk in iter(lambda: f.read(_CHUNK), b""):
                written += len(chunk)
                if written > size:
                    raise BundleError(f"{path}: {target.name} is longer than declared")
                h.update(chunk)
                out.write(chunk)
            out.flush()
            os.fsync(out.fileno())
    except (tarfile.TarError, EOFError) as e:
        raise BundleError(f"{path}: corrupt bundle archive ({e})") from None
    return h.hexdigest()


def load_labels(release_dir: Path, manifest: Manifest) -> tuple[str, ...]:
    if manifest.labels is None:
        return ()
    lines = (release_dir / manifest.labels).read_text(encoding="utf-8").splitlines()
    while lines and not lines[-1].strip():
        lines.pop()
    return tuple(lines)
