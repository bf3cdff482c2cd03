"""The agent's preprocessing as one TVM kernel, for GPU bundles: uint8 BGR frames (N, H, W, 3), as captured,
in; the model's input tensor out, with colour order, crop, resize, normalisation and layout done on the GPU.

Resolution-independent: H and W are symbolic, and the crop and the resize come in as two small tap tables
(edgedeploy_agent.preprocess.resize_taps: per output column and row, two source indices and two 8-bit
weights), which the agent computes once per source resolution. The arithmetic is OpenCV's bit-exact
bilinear resize (INTER_LINEAR_EXACT: 8-bit weights, integer sums, one rounding) and its fixed-point
BGR2GRAY, so the resized pixels are the CPU path's bytes exactly, and `x * gain + offset` is rounded after
the multiply and after the add, as numpy does: the same float32 tensor (tests/host/test_gpu_preprocess.py on the
CPU; bench/gpu_pipeline.py on the GPU, every frame of two videos). INTER_AREA is not a
two-tap filter: a bundle whose card asks for `area` keeps the CPU path (no module is built).

A classifier's library also holds `postprocess` (compile/postprocess_kernel.py): the top k on the device.

    python -m edgedeploy.compile.preprocess_kernel REQ.json   # the CUDA build, in the toolchain's environment
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

from edgedeploy_agent.bundle import Manifest, Postprocess, Preprocess, TensorSpec
from edgedeploy_agent.preprocess import input_hw, normalisation

from ..errors import BuildError, EdgeDeployError
from ..profiles import DeviceProfile
from . import postprocess_kernel
from .cuda.toolchain import CudaToolchain

FUNCTION = "preprocess"  # the module's function: (frames, xtaps, ytaps, out)
LIBRARY = "preprocess.so"  # its name in the bundle
ROLE = "tvm-preprocess"  # its artifact role
THREADS = 256
GRAY = (3735, 19235, 9798)  # OpenCV 4/5 BGR2GRAY weights for uint8 (B, G, R), 15 fractional bits (same bytes)


def supported(pp: Preprocess, spec: TensorSpec) -> str | None:
    """Why the GPU kernel cannot do this preprocessing (the bundle then keeps the CPU path), or None."""
    if pp.interpolation == "area":
        return "INTER_AREA is not a two-tap filter"
    try:
        input_hw(spec)
    except ValueError as e:
        return str(e)
    return None


def _mul(a: Any, b: Any, gpu: bool) -> Any:
    """a * b in float32, rounded on its own: CUDA's __fmul_rn, which nvcc never fuses with the add that follows
    into an FMA (fused, the result differed from numpy's in the last bit, and an INT8 MobileNet's top-1 on 9 % of
    a video's frames)."""
    import tvm

    return tvm.tirx.call_pure_extern("float32", "__fmul_rn", a, b) if gpu else a * b


def _add(a: Any, b: Any, gpu: bool) -> Any:
    import tvm

    return tvm.tirx.call_pure_extern("float32", "__fadd_rn", a, b) if gpu else a + b


def preprocess_module(pp: Preprocess, spec: TensorSpec, gpu: bool = False) -> Any:
    """The kernel as a TIR IRModule with one PrimFunc, FUNCTION; H and W are symbolic. `gpu`: CUDA's rounding
    intrinsics for the normalisation (_mul)."""
    import tvm
    from tvm import te

    h, w, c = input_hw(spec)
    n = spec.shape[0]
    height, width = te.var("H", "int32"), te.var("W", "int32")
    frames = te.placeholder((n, height, width, 3), "uint8", name="frames")
    xtaps = te.placeholder((w, 4), "int32", name="xtaps")  # x0, x1, weight0, weight1
    ytaps = te.placeholder((h, 4), "int32", name="ytaps")
    gain, offset = normalisation(pp, c)

    def resized(b: Any, y: Any, x: Any, ch: Any) -> Any:
        def row(r: Any) -> Any:
            p0 = frames[b, r, xtaps[x, 0], ch].astype("int32")
            return xtaps[x, 2] * p0 + xtaps[x, 3] * frames[b, r, xtaps[x, 1], ch].astype("int32")

        return (ytaps[y, 2] * row(ytaps[y, 0]) + ytaps[y, 3] * row(ytaps[y, 1]) + (1 << 15)) >> 16

    def per_channel(values: Any, ch: Any) -> Any:
        expr = tvm.tirx.const(float(values[-1]), "float32")
        for i in range(len(values) - 2, -1, -1):
            expr = tvm.tirx.Select(ch == i, tvm.tirx.const(float(values[i]), "float32"), expr)
        return expr

    def value(b: Any, y: Any, x: Any, ch: Any) -> Any:
        if pp.color == "gray":
            bgr = [resized(b, y, x, i) for i in range(3)]
            v = (bgr[0] * GRAY[0] + bgr[1] * GRAY[1] + bgr[2] * GRAY[2] + (1 << 14)) >> 15
        else:
            v = resized(b, y, x, 2 - ch if pp.color == "rgb" else ch)
        f = _mul(v.astype("float32"), per_channel(gain, ch), gpu)
        if any(o != 0 for o in offset):
            f = _add(f, per_channel(offset, ch), gpu)
        return f if spec.dtype == "float32" else f.astype(spec.dtype)

    if spec.layout == "NCHW":
        out = te.compute((n, c, h, w), lambda b, ch, y, x: value(b, y, x, ch), name="preprocessed")
    else:
        out = te.compute((n, h, w, c), lambda b, y, x, ch: value(b, y, x, ch), name="preprocessed")
    func = te.create_prim_func([frames, xtaps, ytaps, out]).with_attr("global_symbol", FUNCTION)
    return tvm.IRModule({FUNCTION: func})


def frame_module(
    pp: Preprocess, spec: TensorSpec, post: Postprocess | None, output: TensorSpec | None, gpu: bool
) -> Any:
    """preprocess_module, plus postprocess_kernel's function for a classifier (`post` and the model's first
    `output` given)."""
    mod = preprocess_module(pp, spec, gpu)
    if post is not None and output is not None and post.kind == "classifier":
        mod[postprocess_kernel.FUNCTION] = postprocess_kernel.postprocess_func(post, output)
    return mod


def schedule(mod: Any, gpu: bool) -> Any:
    """One thread per output element on a GPU (consecutive threads write consecutive x: coalesced); on a CPU
    the outermost loops in parallel. The postprocessing's own schedule on a GPU; on a CPU, none (serial)."""
    from tvm import s_tir

    sch = s_tir.Schedule(mod)
    if gpu and any(gv.name_hint == postprocess_kernel.FUNCTION for gv in mod.get_global_vars()):
        postprocess_kernel.schedule_gpu(sch)
    sch.work_on(FUNCTION)
    block = sch.get_sblock("preprocessed")
    fused = sch.fuse(*sch.get_loops(block))
    if gpu:
        bx, tx = sch.split(fused, factors=[None, THREADS])
        sch.bind(bx, "blockIdx.x")
        sch.bind(tx, "threadIdx.x")
    else:
        outer, _ = sch.split(fused, factors=[None, 4096])
        sch.parallel(outer)
    return sch.mod


def build(
    pp: Preprocess, spec: TensorSpec, target: Any, post: Postprocess | None = None, output: TensorSpec | None = None
) -> Any:
    """The compiled runtime module (tvm.compile of the scheduled TIR) for `target`."""
    import tvm

    gpu = target.kind.name == "cuda"
    with target:  # the CUDA compile callback reads the arch from Target.current()
        return tvm.compile(schedule(frame_module(pp, spec, post, output, gpu), gpu), target=target)


def build_for_profile(
    pp: Preprocess,
    spec: TensorSpec,
    profile: DeviceProfile,
    work: Path,
    post: Postprocess | None = None,
    output: TensorSpec | None = None,
) -> Path:
    """In this process (its environment holds the CUDA toolchain when the profile is a GPU's): build, export with
    the profile's compiler and check the library as the model's is checked (CPU architecture, glibc, SASS)."""
    from .stage import BuildContext
    from .tvm_backend import check_library, export_library, make_target

    work.mkdir(parents=True, exist_ok=True)
    ctx = BuildContext(model=None, profile=profile, work_dir=work)
    try:
        ctx.executable = build(pp, spec, make_target(ctx), post, output)
    except Exception as e:  # TVM raises its own error types
        lines = [ln for ln in str(e).strip().splitlines() if ln.strip()]
        raise BuildError(f"TVM failed to compile the preprocessing kernel: {lines[-1] if lines else e}") from None
    export_library(ctx)
    check_library(ctx)
    assert ctx.library is not None
    return ctx.library


def build_in_worker(
    pp: Preprocess,
    spec: TensorSpec,
    profile: DeviceProfile,
    work: Path,
    toolchain: CudaToolchain,
    post: Postprocess | None = None,
    output: TensorSpec | None = None,
) -> Path:
    """build_for_profile in a process with the CUDA toolchain's environment (cuda_worker.py says why)."""
    work.mkdir(parents=True, exist_ok=True)
    request = work / "preprocess-request.json"
    request.write_text(
        json.dumps(
            {
                "preprocess": pp.model_dump(mode="json"),
                "input": spec.model_dump(mode="json"),
                "postprocess": post.model_dump(mode="json") if post is not None else None,
                "output": output.model_dump(mode="json") if output is not None else None,
                "profile": profile.model_dump(mode="json"),
                "work": str(work),
            }
        )
    )
    proc = subprocess.run(
        [sys.executable, "-m", "edgedeploy.compile.preprocess_kernel", str(request)],
        env={**os.environ, **toolchain.env},
        capture_output=True,
        text=True,
    )
    word, _, rest = (proc.stdout.strip().splitlines() or [""])[-1].partition(" ")
    if word == "result":
        return Path(rest)
    if word == "error":
        outcome = json.loads(rest)
        raise BuildError(outcome["message"], hint=outcome.get("hint"))
    tail = [ln for ln in proc.stderr.splitlines() if ln.strip()][-1:] or ["no output"]
    raise BuildError(f"preprocessing kernel worker died (exit {proc.returncode}): {tail[0]}")


def add_to_bundle(bundle: Path, out: Path, profile: DeviceProfile, work: Path) -> Manifest:
    """`bundle` (a GPU bundle built before this module existed) with its preprocessing kernel added, written
    unsigned to `out`: a new bundle id, the same model library. What `edgedeploy build` now does in one go."""
    from edgedeploy_agent.bundle import describe_artifact, extract_bundle, write_bundle

    from .cuda.toolchain import resolve_toolchain

    manifest = extract_bundle(bundle, work / "bundle")
    why = supported(manifest.preprocess, manifest.inputs[0])
    if manifest.target.device != "cuda" or why:
        raise BuildError(f"{bundle.name}: no GPU preprocessing for this bundle: {why or 'not a GPU bundle'}")
    kept = [a for a in manifest.artifacts if a.role != ROLE]
    files = {a.path: work / "bundle" / a.path for a in kept}
    files[LIBRARY] = build_in_worker(
        manifest.preprocess,
        manifest.inputs[0],
        profile,
        work / "preprocess",
        resolve_toolchain(profile),
        manifest.postprocess,
        manifest.outputs[0],
    )
    artifacts = [*kept, describe_artifact(files[LIBRARY], ROLE, LIBRARY)]
    manifest = manifest.model_copy(update={"artifacts": artifacts, "schema_version": 5})
    write_bundle(out, manifest, files)
    return manifest


def main(request_path: str) -> int:
    req = json.loads(Path(request_path).read_text())
    try:
        lib = build_for_profile(
            Preprocess.model_validate(req["preprocess"]),
            TensorSpec.model_validate(req["input"]),
            DeviceProfile.model_validate(req["profile"]),
            Path(req["work"]),
            Postprocess.model_validate(req["postprocess"]) if req.get("postprocess") else None,
            TensorSpec.model_validate(req["output"]) if req.get("output") else None,
        )
    except EdgeDeployError as e:
        print("error " + json.dumps({"message": e.message, "hint": e.hint}), flush=True)
        return 1
    print(f"result {lib}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1]))
