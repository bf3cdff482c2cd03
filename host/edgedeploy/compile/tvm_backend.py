"""TVM (Relax) stages: ONNX import, inference decomposition, compile, export."""

from __future__ import annotations

import shutil
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import tvm
import tvm_ffi
from tvm import relax
from tvm.relax.frontend.onnx import from_onnx

from ..errors import BuildError, ModelError
from ..profiles import DeviceProfile
from .cuda import nvrtc11, tvm_patches
from .cuda.devcode import inspect_library
from .cuda.tensorcore import TIR_PIPELINE, TensorCoreGemm, cuda_pipeline, pass_config
from .elf_versions import glibc_newer_than
from .frontends.model import import_failure, output_specs
from .stage import BuildContext, stage
from .tuning.apply import find_gemm_configs
from .tuning.gemm import load_configs

nvrtc11.install_from_env()  # the CUDA worker of an nvrtc-11 profile: NVRTC 11.8 compiles TVM's CUDA source


def tool_versions() -> dict[str, str]:
    import onnx

    return {"tvm": str(tvm.__version__), "tvm_ffi": str(tvm_ffi.__version__), "onnx": onnx.__version__}


def runtime_abi() -> str:
    major, minor = str(tvm_ffi.__version__).split(".")[:2]
    return f"tvm-ffi-{major}.{minor}"


def make_target(ctx: BuildContext) -> Any:
    try:
        return tvm.target.Target(dict(ctx.profile.compiler.target))
    except Exception as e:
        raise BuildError(f"profile {ctx.profile.name}: invalid TVM target {ctx.profile.compiler.target}: {e}") from None


@stage("import-onnx")
def import_onnx(ctx: BuildContext) -> None:
    shapes = {s.name: list(s.shape) for s in ctx.model.inputs}
    try:
        ctx.ir = from_onnx(ctx.model.proto, shape_dict=shapes, keep_params_in_input=False)
    except Exception as e:  # the frontend raises many types; name the model and the last line
        raise ModelError(f"{ctx.model.path}: TVM cannot import this model: {import_failure(e)}") from None
    ctx.outputs = output_specs(ctx.ir, [o.name for o in ctx.model.proto.graph.output])


@stage("decompose-for-inference")
def decompose(ctx: BuildContext) -> None:
    ctx.ir = relax.transform.DecomposeOpsForInference()(ctx.ir)


@stage("compile-llvm")
def compile_llvm(ctx: BuildContext) -> None:
    target = make_target(ctx)
    try:
        with target:
            ctx.executable = tvm.compile(ctx.ir, target=target, relax_pipeline=relax.get_default_pipeline(target))
    except Exception as e:
        raise BuildError(f"TVM failed to compile {ctx.model.path.name} for {ctx.profile.name}: {e}") from None


@relax.expr_functor.mutator
class _ElementwiseCallsAsOps(relax.PyExprMutator):  # type: ignore[misc]
    """call_tir(maximum|minimum, (x, y)) -> relax.op.maximum|minimum(x, y)."""

    _CALL_TIR = tvm.ir.Op.get("relax.call_tir")
    _OPS = {"maximum": relax.op.maximum, "minimum": relax.op.minimum}

    def visit_call_(self, call: Any) -> Any:
        call = super().visit_call_(call)
        if call.op == self._CALL_TIR and isinstance(call.args[0], tvm.ir.GlobalVar):
            op = self._OPS.get(call.args[0].name_hint.rstrip("0123456789"))
            args = call.args[1].fields
            if op is not None and len(args) == 2:
                return op(args[0], args[1])
        return call


@stage("clip-as-relax-ops")
def clip_as_relax_ops(ctx: BuildContext) -> None:
    """TVM 0.27's ONNX Clip converter emits TE kernels (call_tir maximum/minimum) instead of Relax ops;
    ToMixedPrecision then fails with "Expected TensorType, but got R.Callable". Turn them back into ops."""
    ctx.ir["main"] = _ElementwiseCallsAsOps(ctx.ir).visit_expr(ctx.ir["main"])
    ctx.ir = relax.transform.DeadCodeElimination()(ctx.ir)


@stage("mixed-precision")
def mixed_precision(ctx: BuildContext) -> None:
    """fp16 compute with fp32 inputs and outputs (the bundle's interface does not change)."""
    if ctx.precision == "fp16":
        ctx.ir = relax.transform.ToMixedPrecision(out_dtype="float16")(ctx.ir)
    elif ctx.precision not in ("fp32", "int8"):
        raise BuildError(f"precision {ctx.precision} is not supported by the CUDA pipeline yet (fp32, fp16)")


@dataclass
class CudaLowering:
    """What compile-cuda hands tvm.compile: the target, the PassContext config, the Relax pipeline and its
    tensor-core rule (which records the kernels it scheduled), and the GEMM database applied, if any."""

    target: Any
    config: dict[str, Any]
    pipeline: Any
    rule: TensorCoreGemm
    gemm_file: Path | None


def cuda_lowering(ctx: BuildContext) -> CudaLowering:
    """The Relax pipeline of a CUDA build as compile-cuda runs it (kernel_bounds.py runs it too)."""
    tvm_patches.apply()
    target = make_target(ctx)
    config = {"relax.backend.use_cuda_graph": ctx.cuda_graph, **pass_config(target)}
    gemm_file = find_gemm_configs(ctx.profile.tuning_profile, ctx.tuning_key)
    try:
        configs = load_configs(gemm_file)
    except ValueError as e:  # a database of an older version: a slower build, not a failed one
        ctx.progress(f"compile-cuda: warning: {e}")
        configs, gemm_file = {}, None
    rule = TensorCoreGemm(ctx.cuda.knobs, configs=configs)
    pipeline = cuda_pipeline(target, tensor_cores=ctx.cuda.tensor_cores, rule=rule)
    return CudaLowering(target, config, pipeline, rule, gemm_file)


@stage("compile-cuda")
def compile_cuda(ctx: BuildContext) -> None:
    low = cuda_lowering(ctx)
    compiled_before = len(nvrtc11.MODULES)
    try:
        # the compile callback reads the arch from Target.current(): compile inside `with target`
        with low.target, tvm.transform.PassContext(opt_level=3, config=low.config):
            ctx.executable = tvm.compile(
                ctx.ir, target=low.target, relax_pipeline=low.pipeline, tir_pipeline=TIR_PIPELINE
            )
        if low.gemm_file is not None:
            gemm_file = low.gemm_file
            where = f"{gemm_file.parent.parent.name}/{gemm_file.parent.name}/{gemm_file.name}"
            ctx.gemm_tuning = f"{len(low.rule.applied)} of {len(low.rule.seen)} tensor-core kernels tuned ({where})"
            ctx.progress(f"compile-cuda: {ctx.gemm_tuning}")
    except Exception as e:
        lines = [ln for ln in str(e).strip().splitlines() if ln.strip()]
        raise BuildError(
            f"TVM failed to compile {ctx.model.path.name} for {ctx.profile.name}: "
            f"{lines[-1] if lines else type(e).__name__}"
        ) from None
    _keep_ptx(ctx, nvrtc11.MODULES[compiled_before:])


def _keep_ptx(ctx: BuildContext, modules: list[nvrtc11.DeviceModule]) -> None:
    """nvrtc-11: the PTX of the one CUDA module TVM compiled, for the bundle (model.ptx)."""
    if not modules:
        return
    if len(modules) != 1:
        raise BuildError(f"expected one CUDA module from TVM, NVRTC 11 compiled {len(modules)}")
    [module] = modules
    ctx.ptx = ctx.work_dir / "model.ptx"
    ctx.ptx.write_bytes(module.ptx)
    ctx.cuda_source_sha256 = module.source_sha256
    ctx.progress(f"compile-cuda: NVRTC 11 PTX ISA {module.ptx_isa} for compute_{module.sm}")


@stage("export-library")
def export_library(ctx: BuildContext) -> None:
    out = ctx.work_dir / "model.so"
    cc = ctx.profile.compiler.cross_compiler
    kwargs: dict[str, Any] = {}
    if cc:
        if shutil.which(cc) is None:
            raise BuildError(
                f"profile {ctx.profile.name} needs the C cross compiler {cc!r}, which is not installed",
                hint="on Debian/Ubuntu: apt-get install gcc-aarch64-linux-gnu",
            )
        kwargs["fcompile"] = tvm.support.cc.cross_compiler(cc)
    elif shutil.which("gcc") is None and shutil.which("cc") is None:
        raise BuildError("exporting the library needs a C compiler (gcc)", hint="apt-get install gcc")
    ctx.executable.export_library(str(out), **kwargs)
    ctx.library = out


def check_glibc(library: Path, profile: DeviceProfile) -> None:
    """Refuse a library that needs a glibc symbol version newer than the profile's devices have."""
    floor = profile.platform.glibc
    too_new = glibc_newer_than(library, floor) if floor else []
    if too_new:
        need = too_new[0]
        what = f"{need.symbols[0]}@{need.version}" if need.symbols else need.version
        raise BuildError(
            f"{library.name} for {profile.name} needs {what} from {need.library}, "
            f"newer than the devices' glibc {floor}",
            hint=f"link against a glibc {floor} sysroot: point compiler.cross_compiler at a gcc using one",
        )


@stage("check-library")
def check_library(ctx: BuildContext) -> None:
    """The library is for the device's CPU, and a GPU library holds SASS for exactly the profile's SM (a twin's:
    the PTX of compute_<SM>)."""
    assert ctx.library is not None
    report = inspect_library(ctx.library)
    ctx.host_machine = report.host_machine
    ctx.device_code = [str(i) for i in report.images]
    if report.host_machine != ctx.profile.arch:
        raise BuildError(
            f"exported library is {report.host_machine}, profile {ctx.profile.name} needs {ctx.profile.arch}"
        )
    check_glibc(ctx.library, ctx.profile)
    if ctx.profile.device != "cuda":
        return
    sm = ctx.profile.cuda_sm
    ptx = ctx.profile.compiler.cuda_device_code == "ptx"
    if sm not in (report.ptx_sms() if ptx else report.sms()):
        found = ", ".join(ctx.device_code) or "no device binary"
        source = "; TVM stored CUDA source instead (the CUDA runtime did not load)" if report.has_cuda_source else ""
        want = f"compute_{sm} PTX" if ptx else f"sm_{sm} SASS"
        raise BuildError(
            f"GPU library for {ctx.profile.name} has no {want} (found: {found}){source}",
            hint="check the toolchain: edgedeploy build prints what it needs",
        )
