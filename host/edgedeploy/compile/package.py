"""Build a TVM bundle: model + profile + model card -> compiled library -> bundle file, cached by its inputs."""

from __future__ import annotations

import dataclasses
import hashlib
import json
import platform
import shutil
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

from edgedeploy_agent.bundle import SCHEMA_VERSION, Provenance, Quantization, write_bundle
from edgedeploy_agent.durable import atomic_file

from .. import __version__
from ..build_store import restore
from ..paths import cache_dir
from ..profiles import DeviceProfile
from .cards import ModelCard, default_name, load_card
from .compiled import Compiled
from .config import CudaConfig, TuneRequest
from .cuda.toolchain import resolve_toolchain
from .cuda_worker import run_cuda_build
from .frontends.load import frontend_name, load_model
from .frontends.model import ForeignModel
from .frontends.onnx_model import OnnxModel, check_preprocess, implied_color
from .manifest import BuildResult, card_manifest, profile_target, write_labels
from .pipeline import compiler_digest, pipeline_for, run_pipeline
from .preprocess_kernel import LIBRARY, build_in_worker, supported
from .stage import BuildContext
from .tuning.apply import adopt_file_keyed_database, find_database, find_gemm_configs
from .tuning.key import tuning_key

__all__ = ["BuildResult", "ModelCard", "build_bundle", "compile_model", "load_card"]  # ModelCard, load_card: bench/

if TYPE_CHECKING:
    from .int8.build import Int8Config, Int8Result


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
    cuda: CudaConfig = CudaConfig(),
) -> BuildResult:
    """Compile `model_path` (ONNX, TFLite or a PyTorch ExportedProgram, by its type) for `profile` and write a
    bundle to `out` (INT8 when `int8` is given: ONNX models only)."""
    progress("load-model")
    model = load_model(model_path, batch=batch)
    frontend = frontend_name(model)
    card = card.model_copy(update={"preprocess": implied_color(model, card.preprocess)})
    check_preprocess(model, card.preprocess)
    name = card.name or default_name(model_path)
    if int8 is not None:
        precision = "int8"
    if profile.device != "cuda":
        cuda_graph = False
    stages = pipeline_for(profile, precision, frontend)  # refuses combinations without a pipeline, before any work
    extra: dict[str, Any] = {
        "precision": precision,
        "cuda_graph": cuda_graph,
        "batch": batch,
        "pipeline": [compiler_digest(), *stages],
        "bundle_schema": SCHEMA_VERSION,
    }
    if profile.device == "cuda":
        extra["tensor_cores"] = cuda.tensor_cores
        if cuda.knobs.spec():  # schedule choices changed for a measurement
            extra["cuda_knobs"] = cuda.knobs.spec()
    calib = None
    if int8 is not None:
        assert isinstance(model, OnnxModel)  # pipeline_for refused int8 for the other frontends
        int8, calib = _calibration(model, card, int8, progress)
        extra |= {"int8": int8.describe(), "calibration_sha256": hashlib.sha256(calib.tobytes()).hexdigest()}
    adopt_file_keyed_database(profile.tuning_profile, model, precision)
    key_db = tuning_key(model, precision)
    db = find_database(profile.tuning_profile, key_db)
    if db is not None:  # a changed database means different code: part of the cache key
        extra["tuning_db"] = hashlib.sha256((db / "database_tuning_record.json").read_bytes()).hexdigest()
    gemm = find_gemm_configs(profile.tuning_profile, key_db) if profile.device == "cuda" else None
    if gemm is not None:  # tuned tensor-core configurations: different kernels
        extra["gemm_configs"] = hashlib.sha256(gemm.read_bytes()).hexdigest()
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
        res = compile_model(compiled, profile, work, precision, cuda_graph, cuda, key_db, db, None, progress)
        assert res.library is not None
        progress("package")
        files: dict[str, Path] = {"model.so": res.library}
        if res.ptx is not None:  # nvrtc-11: the PTX of the same compilation (a future JIT fallback; twins)
            files["model.ptx"] = res.ptx
        if profile.device == "cuda" and supported(card.preprocess, model.inputs[0]) is None:
            progress("compile-preprocess")  # frames to the GPU as uint8, preprocessed there (issue 36)
            files[LIBRARY] = build_in_worker(  # with the top k on the GPU for a classifier
                card.preprocess,
                model.inputs[0],
                profile,
                work / "preprocess",
                resolve_toolchain(profile),
                card.postprocess,
                res.outputs[0],
            )
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
                options={"pipeline": ",".join(res.timings), "cache_key": key}
                | _tuning_note(db, res)
                | ({"cuda_source_sha256": res.cuda_source_sha256} if res.cuda_source_sha256 else {}),
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


def _tuning_note(db: Path | None, res: Compiled) -> dict[str, str]:
    """provenance.options["tuning"]: which database, how many of the kernels, and which, came from it."""
    note = {"gemm_tuning": res.gemm_tuning} if res.gemm_tuning else {}
    if db is None or not res.tuned_kernels:
        return note
    n, m = len(res.tuned_kernels), res.kernel_count
    return note | {"tuning": f"{db.parent.name}/{db.name}: {n}/{m} kernels: {', '.join(res.tuned_kernels)}"}


def _calibration(model: OnnxModel, card: ModelCard, int8: Int8Config, progress: Callable[[str], None]) -> Any:
    from .int8.build import calibration_inputs

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
    from .int8.build import quantize_model

    result = quantize_model(model, card.preprocess, int8, calib, progress)
    return _save_qdq(result.qdq, work / "model.qdq.onnx", model), result


def compile_model(
    model: OnnxModel | ForeignModel,
    profile: DeviceProfile,
    work: Path,
    precision: str,
    cuda_graph: bool,
    cuda: CudaConfig,
    key: str,
    db: Path | None,
    tune: TuneRequest | None,
    progress: Callable[[str], None],
) -> Compiled:
    """The compile pipeline, in this process (CPU) or in the CUDA worker process (GPU profiles); also
    what `edgedeploy tune` runs (tune_bundle.py)."""
    if profile.device == "cuda":
        assert isinstance(model, OnnxModel)  # pipeline_for has no CUDA pipeline for the other frontends yet
        progress("check-toolchain")
        toolchain = resolve_toolchain(profile)
        compiled = run_cuda_build(model, profile, work, toolchain, precision, cuda_graph, cuda, key, db, tune, progress)
        return compiled.model_copy(update={"cuda_codegen": toolchain.describe()})
    ctx = run_pipeline(
        BuildContext(
            model=model,
            profile=profile,
            work_dir=work,
            progress=progress,
            precision=precision,
            cuda=cuda,
            tuning_key=key,
            tuning_db=db,
            tune=tune,
        )
    )
    return Compiled.of(ctx)


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
        options={k: json.dumps(v) for k, v in cfg.describe().items() if k not in ("calibration", "eval")}
        | {"calibration_seconds": json.dumps(round(result.report.seconds, 1))}
        | ({"layers": json.dumps(result.report.choices)} if result.report.choices else {}),
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
    with open(src, "rb") as f, atomic_file(dst) as out:
        shutil.copyfileobj(f, out, 1 << 20)
