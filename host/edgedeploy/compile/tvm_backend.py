"""TVM (Relax) stages: ONNX import, inference decomposition, compile, export."""

from __future__ import annotations

import shutil
from typing import Any

import tvm
import tvm_ffi
from tvm import relax
from tvm.relax.frontend.onnx import from_onnx

from edgedeploy_agent.bundle import TensorSpec

from ..errors import BuildError, ModelError
from .onnx_model import guess_layout
from .pipeline import BuildContext, stage


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
    except Exception as e:  # the frontend raises many types; name the model and the first line
        msg = str(e).strip().splitlines()
        detail = next((line for line in reversed(msg) if line.strip()), type(e).__name__)
        raise ModelError(f"{ctx.model.path}: TVM cannot import this model: {detail}") from None
    ctx.outputs = _output_specs(ctx.ir, ctx.model.proto)


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


def _output_specs(mod: Any, proto: Any) -> list[TensorSpec]:
    names = [o.name for o in proto.graph.output]
    ret = mod["main"].ret_ty  # TVM 0.27 renamed StructInfo to Type (TensorType, TupleType)
    infos = list(ret.fields) if isinstance(ret, relax.TupleType) else [ret]
    specs = []
    for i, info in enumerate(infos):
        if not isinstance(info, relax.TensorType) or info.shape is None:
            raise ModelError(f"output {i} of the model has no static tensor shape")
        try:
            shape = [int(d) for d in info.shape.values]
        except TypeError:
            raise ModelError(f"output {names[i] if i < len(names) else i} has a symbolic shape") from None
        name = names[i] if i < len(names) else f"output{i}"
        specs.append(TensorSpec(name=name, shape=shape, dtype=str(info.dtype), layout=guess_layout(shape)))
    return specs
