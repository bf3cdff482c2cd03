"""Build a bundle: model + profile + model card -> compiled library -> bundle file (cached by inputs)."""

from __future__ import annotations

import dataclasses
import datetime as dt
import hashlib
import json
import platform
import shutil
import tempfile
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import tomllib
from pydantic import BaseModel, ConfigDict, Field, ValidationError

from edgedeploy_agent.bundle import (
    MODEL_NAME_PATTERN,
    MODEL_VERSION_PATTERN,
    SCHEMA_VERSION,
    HealthSpec,
    Manifest,
    ModelInfo,
    Postprocess,
    Preprocess,
    Provenance,
    Quantization,
    Target,
    describe_artifact,
    write_bundle,
)

from .. import __version__
from ..build_store import check_given, host_file, keep, restore
from ..errors import InputError, validation_text
from ..paths import cache_dir, config_dir
from ..profiles import DeviceProfile
from ..userfiles import read_text
from .cuda_toolchain import resolve_toolchain
from .cuda_worker import run_cuda_build
from .frontends import SOURCE_ROLES, ForeignModel, frontend_name, load_model
from .onnx_model import OnnxModel, check_preprocess, load_onnx
from .pipeline import PIPELINE_REVISION, BuildContext, pipeline_for, run_pipeline, tensor_cores_enabled
from .tuning import TuneRequest, find_database, tuning_key

if TYPE_CHECKING:
    from .int8_build import Int8Config, Int8Result


class ModelCard(BaseModel):
    """What the model file cannot say: name, version, labels, preprocessing, post-processing."""

    model_config = ConfigDict(extra="forbid")

    name: str | None = Field(default=None, pattern=MODEL_NAME_PATTERN)  # checked here, not after the compile
    version: str = Field(default="1", pattern=MODEL_VERSION_PATTERN)
    description: str = ""
    source_sha256: str | None = Field(default=None, description="sha256 of the model file the card describes")
    labels: list[str] | None = None
    labels_file: str | None = Field(default=None, description="path relative to the card, one label per line")
    preprocess: Preprocess = Field(default_factory=Preprocess)
    postprocess: Postprocess = Field(default_factory=Postprocess)
    health: HealthSpec | None = Field(default=None, description="health objectives checked on every device")


def load_card(path: Path) -> ModelCard:
    try:
        data = tomllib.loads(read_text(path, "model card"))
    except tomllib.TOMLDecodeError as e:
        raise InputError(f"model card {path} is not valid TOML: {e}") from None
    try:
        card = ModelCard.model_validate(data)
    except ValidationError as e:
        raise InputError(f"model card {path}: {validation_text(e)}") from None
    if card.labels_file:
        card = card.model_copy(update={"labels": read_labels(path.parent / card.labels_file), "labels_file": None})
    return card


def card_dirs() -> list[Path]:
    """Where cards are looked up by model hash: the user's config folder, then the built-in ones."""
    from importlib import resources

    return [config_dir() / "cards", Path(str(resources.files("edgedeploy.builtin_cards")))]


def find_card(model_sha256: str) -> tuple[Path, ModelCard] | None:
    """The card whose `source_sha256` is this model's, if any (so a known model needs no --card)."""
    for d in card_dirs():
        for path in sorted(d.glob("*.toml")) if d.is_dir() else []:
            card = load_card(path)
            if card.source_sha256 == model_sha256:
                return path, card
    return None


def card_for(model: Path, card: Path | None) -> tuple[ModelCard, Path | None]:
    """The card given, else the one that names this model file's sha256, else an empty card."""
    if card is not None:
        return load_card(card), card
    if model.is_file():
        found = find_card(hashlib.sha256(model.read_bytes()).hexdigest())
        if found:
            return found[1], found[0]
    return ModelCard(), None


def read_labels(path: Path) -> list[str]:
    lines = read_text(path, "labels file").splitlines()
    while lines and not lines[-1].strip():
        lines.pop()
    if not lines:
        raise InputError(f"labels file {path} is empty")
    return lines


@dataclass
class BuildResult:
    bundle: Path
    manifest: Manifest
    cached: bool
    timings: dict[str, float] = field(default_factory=dict)


def build_bundle(
    model_path: Path,
    profile: DeviceProfile,
    out: Path,
    card: ModelCard,
    progress: Callable[[str], None] = lambda step: None,
    use_cache: bool = True,
    precision: str = "fp32",
    cuda_graph: bool = True,
    batch: int = 1,
    int8: Int8Config | None = None,
) -> BuildResult:
    """Compile `model_path` (ONNX, TFLite or a PyTorch ExportedProgram, by its type) for `profile` and write a
    bundle to `out` (INT8 when `int8` is given: ONNX models only)."""
    progress("load-model")
    model = load_model(model_path, batch=batch)
    frontend = frontend_name(model)
    check_preprocess(model, card.preprocess)
    name = card.name or _default_name(model_path)
    if int8 is not None:
        precision = "int8"
    if profile.device != "cuda":
        cuda_graph = False
    stages = pipeline_for(profile, precision, frontend)  # refuses combinations without a pipeline, before any work
    extra: dict[str, Any] = {
        "precision": precision,
        "cuda_graph": cuda_graph,
        "batch": batch,
        "pipeline": [PIPELINE_REVISION, *stages],
        "bundle_schema": SCHEMA_VERSION,
    }
    if profile.device == "cuda":
        extra["tensor_cores"] = tensor_cores_enabled()
    calib = None
    if int8 is not None:
        assert isinstance(model, OnnxModel)  # pipeline_for refused int8 for the other frontends
        int8, calib = _calibration(model, card, int8, progress)
        extra |= {"int8": int8.describe(), "calibration_sha256": hashlib.sha256(calib.tobytes()).hexdigest()}
    key_db = tuning_key(model.sha256, precision)
    db = find_database(profile.name, key_db)
    if db is not None:  # a changed database means different code: part of the cache key
        extra["tuning_db"] = hashlib.sha256((db / "database_tuning_record.json").read_bytes()).hexdigest()
    key = _cache_key(model.sha256, profile, card, name, extra)
    cached = cache_dir() / "builds" / key / "bundle.edb"
    if use_cache and cached.is_file():
        from edgedeploy_agent.bundle import read_manifest

        hit = read_manifest(cached)
        # the source is at hand; a Q/DQ model the build store lost means compiling again
        if restore(hit, {model.sha256: model_path}):
            progress("cache-hit")
            _copy_atomic(cached, out)
            return BuildResult(out, hit, cached=True)

    from .tvm_backend import runtime_abi, tool_versions

    with tempfile.TemporaryDirectory(prefix="edgedeploy-build-") as tmp:
        work = Path(tmp)
        compiled, int8_result = _quantized(model, card, int8, calib, work, progress)
        res = _compile(compiled, profile, work, precision, cuda_graph, key_db, db, None, progress)
        assert res.library is not None
        progress("package")
        files: dict[str, Path] = {"model.so": res.library}
        write_labels(work, card, files)
        manifest = card_manifest(
            card,
            model,
            name,
            profile,
            profile_target(
                profile,
                runtime="tvm",
                runtime_abi=runtime_abi(),
                host_machine=res.host_machine,
                device_code=res.device_code,
                cuda_graph=cuda_graph,
                cuda_codegen=res.cuda_codegen,
            ),
            res.outputs,
            files,
            _quantization(int8, int8_result, res.float_left)
            if int8
            else _own_precision(model, precision, res.float_left),
            Provenance(
                tools={"edgedeploy": __version__, "python": platform.python_version(), **tool_versions()},
                build_host=f"{platform.node()} ({platform.machine()})",
                options={"pipeline": ",".join(res.timings), "cache_key": key} | _tuning_note(db, res),
            ),
            host_only={"model.qdq.onnx": compiled.path} if int8 is not None else None,
        )
        cached.parent.mkdir(parents=True, exist_ok=True)
        write_bundle(cached, manifest, files)
    _copy_atomic(cached, out)
    return BuildResult(out, manifest, cached=False, timings=res.timings)


def _own_precision(model: OnnxModel | ForeignModel, precision: str, float_left: list[str]) -> Quantization:
    """A model built as it is: fp32/fp16, or INT8 with its own scales when it came pre-quantized."""
    if isinstance(model, ForeignModel) and model.quantized:
        method = "pre-quantized TFLite (the model's own scales; TFLite integer arithmetic)"
        return Quantization(precision="int8", method=method, float_in_runtime=float_left)
    return Quantization(precision=precision)  # type: ignore[arg-type]


def profile_target(profile: DeviceProfile, **runtime: Any) -> Target:
    """What a device must provide: the profile's part (arch, GPU, driver, CPU flags) plus the runtime's."""
    return Target(
        arch=profile.arch,
        device=profile.device,
        cuda_sm=profile.cuda_sm,
        min_cuda_driver=profile.platform.min_cuda_driver,
        cpu_features=list(profile.compiler.cpu_features),
        **runtime,
    )


def _tuning_note(db: Path | None, res: Compiled) -> dict[str, str]:
    """provenance.options["tuning"]: which database, how many of the kernels, and which, came from it."""
    if db is None or not res.tuned_kernels:
        return {}
    n, m = len(res.tuned_kernels), res.kernel_count
    return {"tuning": f"{db.parent.name}/{db.name}: {n}/{m} kernels: {', '.join(res.tuned_kernels)}"}


@dataclass
class TuneResult:
    database: Path
    key: str
    tuned_kernels: list[str]  # after tuning: the kernels scheduled from the database
    kernel_count: int
    exported: Path | None  # runner "export": the folder holding the tuning module
    timings: dict[str, float]


def tune_model(
    bundle: Path,
    request: TuneRequest,
    progress: Callable[[str], None] = lambda step: None,
    sources: Sequence[Path] = (),
) -> TuneResult:
    """Tune what a bundle was built from: its profile, precision, batch and exact (Q/DQ) model, found in the
    build store (or `sources`; schema 1 bundles carry it). The build's own stages run up to apply-tuning,
    which tunes (or exports the tuning module); then the library is compiled with the database as a check.
    Later builds of the same model apply `request.database`."""
    from edgedeploy_agent.bundle import extract_bundle, read_manifest

    from ..profiles import get_profile

    m = read_manifest(bundle)
    if m.target.runtime != "tvm":
        raise InputError(f"{bundle} is a {m.target.runtime} bundle: TensorRT picks its tactics on the device")
    profile = get_profile(m.profile)
    # a TFLite / PyTorch source is compiled as it is (its build's precision key is fp32, as in build_bundle)
    foreign = {r: f for f, r in SOURCE_ROLES.items() if f != "onnx"}
    source = next((h.role for h in m.host_files if h.role in foreign), None)
    precision = "fp32" if source is not None else m.quantization.precision
    role = source or ("qdq-onnx" if precision == "int8" else "onnx-model")
    check_given(m, sources, [role])
    key = tuning_key(m.model.source_sha256, precision)
    with tempfile.TemporaryDirectory(prefix="edgedeploy-tune-") as tmp:
        work = Path(tmp)
        if any(a.role == role for a in m.artifacts):  # a schema 1 bundle carries it
            extract_bundle(bundle, work / "bundle")
        path, batch = host_file(m, role, work / "bundle", sources), m.inputs[0].shape[0]
        # the store names files by sha256 (no suffix): the role says which frontend reads it
        model = load_onnx(path, batch=batch) if source is None else load_model(path, batch, foreign[source])
        res = _compile(model, profile, work, precision, m.target.cuda_graph, key, None, request, progress)
    exported = request.export_dir if res.library is None else None
    return TuneResult(request.database, key, res.tuned_kernels, res.kernel_count, exported, res.timings)


@dataclass
class Compiled:
    library: Path | None  # None when the pipeline stopped early (tuning export)
    outputs: list[Any]
    timings: dict[str, float]
    float_left: list[str]
    device_code: list[str]
    host_machine: str | None
    tuned_kernels: list[str]  # kernels whose schedule came from the database
    kernel_count: int
    cuda_codegen: str | None


def _calibration(model: OnnxModel, card: ModelCard, int8: Int8Config, progress: Callable[[str], None]) -> Any:
    from .int8_build import calibration_inputs

    int8 = dataclasses.replace(int8, label_offset=card.postprocess.label_offset)
    progress("calibration-data")
    calib, _ = calibration_inputs(model, card.preprocess, int8)
    return int8, calib


def _quantized(
    model: OnnxModel | ForeignModel,
    card: ModelCard,
    int8: Int8Config | None,
    calib: Any,
    work: Path,
    progress: Callable[[str], None],
) -> tuple[OnnxModel | ForeignModel, Int8Result | None]:
    """The model the pipeline compiles: the source, or its calibrated Q/DQ form."""
    if int8 is None:
        return model, None
    assert isinstance(model, OnnxModel)
    from .int8_build import quantize_model

    result = quantize_model(model, card.preprocess, int8, calib, progress)
    return _save_qdq(result.qdq, work / "model.qdq.onnx", model), result


def _compile(
    model: OnnxModel | ForeignModel,
    profile: DeviceProfile,
    work: Path,
    precision: str,
    cuda_graph: bool,
    key: str,
    db: Path | None,
    tune: TuneRequest | None,
    progress: Callable[[str], None],
) -> Compiled:
    """The compile pipeline, in this process (CPU) or in the CUDA worker process (GPU profiles)."""
    if profile.device == "cuda":
        assert isinstance(model, OnnxModel)  # pipeline_for has no CUDA pipeline for the other frontends yet
        progress("check-toolchain")
        toolchain = resolve_toolchain(profile)
        r = run_cuda_build(model, profile, work, toolchain, precision, cuda_graph, key, db, tune, progress)
        return Compiled(
            Path(r["library"]) if r["library"] else None,
            r["outputs"],
            r["timings"],
            r["float_left"],
            r["device_code"],
            r["host_machine"],
            r["tuned_kernels"],
            r["kernel_count"],
            toolchain.describe(),
        )
    ctx = run_pipeline(
        BuildContext(
            model=model,
            profile=profile,
            work_dir=work,
            progress=progress,
            precision=precision,
            tuning_key=key,
            tuning_db=db,
            tune=tune,
        )
    )
    return Compiled(
        ctx.library,
        ctx.outputs,
        ctx.timings,
        ctx.float_left,
        ctx.device_code,
        ctx.host_machine,
        ctx.tuned_kernels,
        ctx.kernel_count,
        None,
    )


# Every artifact file name a bundle writer may use, and its role in the manifest. The source model is
# never an artifact: it stays in the host's build store (manifest.host_files).
ARTIFACT_ROLES = {
    "model.so": "tvm-library",
    "model.qdq.onnx": "qdq-onnx",
    "labels.txt": "labels",
    "reference.npz": "tensorrt-reference",
}


def write_labels(work: Path, card: ModelCard, files: dict[str, Path]) -> None:
    """labels.txt from the card, when it has labels."""
    if card.labels:
        files["labels.txt"] = work / "labels.txt"
        files["labels.txt"].write_text("\n".join(card.labels) + "\n", encoding="utf-8")


def card_manifest(
    card: ModelCard,
    model: OnnxModel | ForeignModel,
    name: str,
    profile: DeviceProfile,
    target: Target,
    outputs: list[Any],
    files: dict[str, Path],
    quantization: Quantization,
    provenance: Provenance,
    host_only: Mapping[str, Path] | None = None,
    **extra: Any,
) -> Manifest:
    """The manifest every bundle writer makes: model facts, the card's pre/post-processing, labels and
    health objectives, the target and the artifacts (described from `files`). The source model and the
    `host_only` files (name -> path) go to the host's build store, named in `host_files`."""
    role = SOURCE_ROLES[frontend_name(model)]
    host_files = [keep(model.path, role, model.path.name, model.sha256)]
    host_files += [keep(p, ARTIFACT_ROLES[n], n) for n, p in sorted((host_only or {}).items())]
    if role != "onnx-model":  # agents that read schema 2 do not know this source role (plan_push refuses them)
        extra.setdefault("schema_version", 3)
    return Manifest(
        model=ModelInfo(name=name, version=card.version, description=card.description, source_sha256=model.sha256),
        created=dt.datetime.now(dt.timezone.utc).replace(microsecond=0),
        profile=profile.name,
        target=target,
        inputs=model.inputs,
        outputs=outputs,
        preprocess=card.preprocess,
        postprocess=card.postprocess,
        labels="labels.txt" if "labels.txt" in files else None,
        quantization=quantization,
        health=card.health,
        provenance=provenance,
        artifacts=[describe_artifact(p, ARTIFACT_ROLES[n], n) for n, p in sorted(files.items())],
        host_files=host_files,
        **extra,
    )


def _default_name(path: Path) -> str:
    stem = "".join(c if (c.isascii() and c.isalnum()) or c in "._-" else "-" for c in path.stem)
    return stem.lstrip("._-")[:64] or "model"


def _save_qdq(proto: Any, path: Path, source: OnnxModel) -> OnnxModel:
    import onnx

    onnx.save(proto, path)
    sha = hashlib.sha256(path.read_bytes()).hexdigest()
    return OnnxModel(path=path, proto=proto, sha256=sha, inputs=source.inputs)


def _quantization(cfg: Int8Config | None, result: Int8Result | None, float_in_tvm: list[str]) -> Quantization:
    if cfg is None or result is None:
        return Quantization()
    o = result.report.options
    return Quantization(
        precision="int8",
        method=o.method + (f"(percentile={o.percentile})" if o.method == "percentile" else ""),
        calibration_samples=result.report.samples,
        float_layers=result.report.float_layers,
        accuracy=result.accuracy(),
        calibration=f"{cfg.calibration.resolve()} (split: {result.calibration_split})",
        evaluation=f"{cfg.eval_data.resolve()} (split: {result.eval_split})" if cfg.eval_data else None,
        options={k: json.dumps(v) for k, v in cfg.describe().items() if k not in ("calibration", "eval")},
        float_in_runtime=float_in_tvm,
    )


def _cache_key(
    model_sha: str, profile: DeviceProfile, card: ModelCard, name: str, extra: dict[str, Any] | None = None
) -> str:
    from .tvm_backend import tool_versions

    parts: dict[str, Any] = {
        **(extra or {}),
        "model": model_sha,
        "profile": profile.model_dump(mode="json"),
        "card": card.model_dump(mode="json"),
        "name": name,
        "edgedeploy": __version__,
        "tools": tool_versions(),
    }
    return hashlib.sha256(json.dumps(parts, sort_keys=True).encode()).hexdigest()[:32]


def _copy_atomic(src: Path, dst: Path) -> None:
    dst.parent.mkdir(parents=True, exist_ok=True)
    tmp = dst.with_name(dst.name + ".tmp")
    shutil.copyfile(src, tmp)
    tmp.replace(dst)
