"""GPU profiles on a GPU-less host: real device code for exactly the profile's SM, a host library for
the device's CPU, checked by our parser and independently by cuobjdump and readelf."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import numpy as np
import pytest

from edgedeploy.api import build
from edgedeploy.compile.cards import ModelCard
from edgedeploy.compile.cuda.devcode import device_blobs, inspect_library
from edgedeploy.compile.cuda.toolchain import resolve_toolchain
from edgedeploy.compile.frontends.onnx_model import load_onnx
from edgedeploy.compile.pipeline import run_pipeline
from edgedeploy.compile.stage import BuildContext
from edgedeploy.errors import BuildError
from edgedeploy.profiles import get_profile
from edgedeploy_agent.bundle import Preprocess, extract_bundle
from tests.helpers import require
from tests.host.cuda import GPU_PROFILES, dump_sass, require_cuobjdump, require_toolchain
from tests.host.models import convnet, float_and_int8_modules, run_on_cpu


@pytest.mark.compile
@pytest.mark.cuda
@pytest.mark.parametrize("profile", sorted(GPU_PROFILES))
def test_gpu_bundle_has_device_code_for_its_sm(profile: str, data_dir: Path, tmp_path: Path) -> None:
    require_toolchain(profile)
    sm, arch, codegen = GPU_PROFILES[profile]
    card = ModelCard(name="mnist", preprocess=Preprocess(color="gray"))
    res = build(data_dir / "models" / "mnist-8_opset13.onnx", profile, tmp_path / "b.edb", card)
    t = res.manifest.target
    assert (t.device, t.cuda_sm, t.host_machine, t.arch) == ("cuda", sm, arch, arch)
    assert t.cuda_codegen and t.cuda_codegen.startswith(codegen) and t.cuda_graph
    assert any(d.startswith(f"sm_{sm} sass") for d in t.device_code), t.device_code

    rel = tmp_path / "rel"
    extract_bundle(res.bundle, rel)
    lib = rel / "model.so"
    report = inspect_library(lib)
    assert report.sms() == {sm} and not report.has_cuda_source
    # the preprocessing kernel (frames to the GPU as uint8; compile/preprocess_kernel.py): its own library, same SM
    assert res.manifest.artifact("tvm-preprocess").path == "preprocess.so" and res.manifest.schema_version >= 5
    assert inspect_library(rel / "preprocess.so").sms() == {sm}
    # a classifier's: also the top k (compile/postprocess_kernel.py), kernels of the same library
    assert b"postprocess_kernel" in (rel / "preprocess.so").read_bytes()
    header = subprocess.run(["readelf", "-h", str(lib)], capture_output=True, text=True, check=True).stdout
    assert {"x86_64": "X86-64", "aarch64": "AArch64"}[arch] in header

    blobs = device_blobs(lib.read_bytes())
    assert [k for k, _ in blobs] == (["cubin"] if codegen == "nvrtc" else ["fatbin"])
    for i, (kind, blob) in enumerate(blobs):
        f = tmp_path / f"dev{i}.{kind}"
        f.write_bytes(blob)
        if kind == "cubin":
            # pip's cuobjdump is CUDA 13, which no longer reads sm_72: binutils reads the ELF whole instead
            elf = subprocess.run(["readelf", "-h", "-l", str(f)], capture_output=True, text=True)
            assert "NVIDIA CUDA architecture" in elf.stdout and "Error" not in elf.stderr, elf.stderr
            continue
        cuobjdump = require_cuobjdump(sm, nvdisasm=False)
        listing = subprocess.run([cuobjdump, "--list-elf", str(f)], capture_output=True, text=True).stdout
        assert f"sm_{sm}" in listing, listing


@pytest.mark.compile
@pytest.mark.cuda
def test_int8_on_gpu_computes_with_dp4a(data_dir: Path, tmp_path: Path) -> None:
    """The QDQ -> integer rewrite on the CUDA pipeline: nvcc emits dp4a (IDP.4A) for the int8 MACs."""
    require_toolchain("t4")
    require_cuobjdump()
    from edgedeploy.compile.int8.build import Int8Config
    from edgedeploy.compile.int8.quantize import QuantizeOptions

    cfg = Int8Config(calibration=data_dir / "mnist", options=QuantizeOptions(samples=32))
    card = ModelCard(name="mnist", preprocess=Preprocess(color="gray"))
    res = build(data_dir / "models" / "mnist-8_opset13.onnx", "t4", tmp_path / "i8.edb", card, int8=cfg)
    assert res.manifest.quantization.precision == "int8"
    assert any(h.role == "qdq-onnx" for h in res.manifest.host_files)
    rel = tmp_path / "rel"
    extract_bundle(res.bundle, rel)
    sass = dump_sass(rel / "model.so", tmp_path)
    assert sass.count("IDP.4A.S8.S8") > 0, sass[:2000]


@pytest.mark.compile
@pytest.mark.cuda
def test_int8_on_gpu_names_the_layers_left_in_float(data_dir: Path, tmp_path: Path) -> None:
    """The CUDA worker reports what the int8 rewrite left in float, as the CPU pipeline does."""
    require_toolchain("t4")
    from edgedeploy.compile.int8.build import Int8Config
    from edgedeploy.compile.int8.quantize import QuantizeOptions

    cfg = Int8Config(calibration=data_dir / "mnist", options=QuantizeOptions(samples=16, keep_float=("last",)))
    card = ModelCard(name="mnist", preprocess=Preprocess(color="gray"))
    res = build(data_dir / "models" / "mnist-8_opset13.onnx", "t4", tmp_path / "i8.edb", card, int8=cfg)
    assert res.manifest.quantization.float_in_runtime == ["Times212: operands are not dequantized (kept in float)"]


@pytest.mark.compile
def test_cuda_source_instead_of_binary_fails_loudly(data_dir: Path, tmp_path: Path) -> None:
    """TVM's pitfall reproduced: compiled in a process without the CUDA toolchain environment (no
    libcuda), the library holds CUDA source; the check-library stage must refuse it."""
    ctx = BuildContext(
        model=load_onnx(data_dir / "models" / "mnist-8_opset13.onnx"), profile=get_profile("t4"), work_dir=tmp_path
    )
    with pytest.raises(BuildError, match="has no sm_75 SASS .*CUDA source"):
        run_pipeline(ctx)


@pytest.mark.cuda
def test_toolchain_refuses_what_it_cannot_target() -> None:
    profile = get_profile("xavier-agx")
    nvcc_for_xavier = profile.model_copy(
        update={"compiler": profile.compiler.model_copy(update={"cuda_codegen": "nvcc"})}
    )
    require("GPU_TOOLCHAIN", "nvcc not installed" if shutil.which("nvcc") is None else None)
    with pytest.raises(BuildError, match="cannot target sm_72") as e:
        resolve_toolchain(nvcc_for_xavier)
    assert "nvrtc-11" in (e.value.hint or "")


def _opcodes(sass: str, op: str) -> int:
    return sum(1 for line in sass.splitlines() if f" {op}" in line)


@pytest.mark.compile
@pytest.mark.cuda
@pytest.mark.parametrize("profile", ["t4", "xavier-agx"])
@pytest.mark.parametrize("precision", ["fp16", "int8"])
def test_convolutions_run_on_tensor_cores(precision: str, profile: str, data_dir: Path, tmp_path: Path) -> None:
    """cuda/tensorcore.py: FP16 convolutions on HMMA, INT8 ones on IMMA, in the SASS of a t4 (sm_75) and a
    xavier-agx (sm_72) build, cubins from NVRTC 11.8; INT8 rounding without FRND (cuda/source.py)."""
    require_toolchain(profile)
    from edgedeploy.compile.int8.build import Int8Config
    from edgedeploy.compile.int8.quantize import QuantizeOptions

    model = convnet(tmp_path / "convnet.onnx")
    card = ModelCard(name="convnet", preprocess=Preprocess(scale=1 / 255))
    int8 = None
    if precision == "int8":
        int8 = Int8Config(calibration=data_dir / "imagenet-sample", options=QuantizeOptions(samples=16))
    res = build(model, profile, tmp_path / "c.edb", card, precision=precision, int8=int8)
    assert res.manifest.quantization.float_in_runtime == []
    extract_bundle(res.bundle, tmp_path / "rel")
    sass = dump_sass(tmp_path / "rel" / "model.so", tmp_path, GPU_PROFILES[profile][0])
    assert "Function" in sass, sass[:2000]  # the tool read the code (an unreadable SM prints no functions)
    if precision == "fp16":
        assert _opcodes(sass, "HMMA") > 0, sass[:2000]
    else:
        assert _opcodes(sass, "IMMA") > 0 and _opcodes(sass, "HMMA") == 0, sass[:2000]
        # the convolutions' requantize rounds on the FP32 pipe (cuda_source.round_on_fp32_pipe), not with FRND
        # (a vectorized quantize outside them, float4 lanes rounded one by one, keeps it: not that pattern)
        convolutions = [f for f in sass.split("Function : ")[1:] if _opcodes(f, "IMMA")]
        assert convolutions and not [f.split()[0] for f in convolutions if _opcodes(f, "FRND")]


@pytest.mark.compile
@pytest.mark.cuda
def test_int8_mma_knob_gives_m16n8k32_with_ldmatrix_x4_on_sm90(data_dir: Path, tmp_path: Path) -> None:
    """cuda/mma.py (EDGEDEPLOY_CUDA_KNOBS=int8_mma=1, off by default): INT8 convolutions on sm_90 with a K
    of at least 64 become mma.sync m16n8k32 (IMMA.16832) fed by ldmatrix.x4 (LDSM.16.M88.4) instead of
    TVM's WMMA m16n16k16 (IMMA.16816), with their operand fragments in registers: a fragment left a
    whole-warp array (TVM 0.27's LowerWarpMemory, cuda/mma.py) is indexed by the thread and lives in local
    memory (LDL/STL)."""
    require_toolchain("h200")
    from edgedeploy.compile.config import CudaConfig, Knobs
    from edgedeploy.compile.int8.build import Int8Config
    from edgedeploy.compile.int8.quantize import QuantizeOptions

    model = convnet(tmp_path / "convnet.onnx")
    card = ModelCard(name="convnet", preprocess=Preprocess(scale=1 / 255))
    int8 = Int8Config(calibration=data_dir / "imagenet-sample", options=QuantizeOptions(samples=16))
    mma = CudaConfig(Knobs(int8_mma=1))
    res = build(model, "h200", tmp_path / "c.edb", card, precision="int8", int8=int8, cuda=mma)
    extract_bundle(res.bundle, tmp_path / "rel")
    sass = dump_sass(tmp_path / "rel" / "model.so", tmp_path, 90)
    assert "Function" in sass, sass[:2000]
    # (the stem and the 1x1 convolution have K = 27 and 32: one 32-deep stage, which stays WMMA, IMMA.16816)
    assert _opcodes(sass, "IMMA.16832") > 0, sass[:2000]
    assert _opcodes(sass, "LDSM.16.M88.4") > 0, sass[:2000]
    assert _opcodes(sass, "LDL") == 0 and _opcodes(sass, "STL") == 0, sass[:2000]


def _conv_weight_shapes(mod: object) -> list[tuple[int, ...]]:
    from tvm import relax

    shapes: list[tuple[int, ...]] = []

    def visit(e: object) -> None:
        if isinstance(e, relax.Call) and getattr(e.op, "name", "") == "relax.nn.conv2d":
            shapes.append(tuple(e.args[1].value.numpy().shape))  # the weight, a constant

    relax.analysis.post_order_visit(mod["main"], visit)  # type: ignore[index]
    return shapes


@pytest.mark.compile
def test_nhwc_layout_is_exact_on_cpu(tmp_path: Path) -> None:
    """The nhwc-layout stage changes no result: the int8-rewritten graph gives the same bytes on llvm with
    and without it, the float graph the same values within float32 rounding. And it leaves no transposes
    between the layers: TVM's ConvertLayout alone wraps the requantize's clip, the zero-point pad and the
    Q/DQ ops (no layout rules in 0.27) in a pair each; nhwc.sink_permutes cancels them."""
    import onnx
    from tvm import relax

    from edgedeploy.compile.cuda.nhwc import to_nhwc, transposes

    model = onnx.load(convnet(tmp_path / "convnet.onnx"))
    calib = np.random.default_rng(3).uniform(0, 1, (8, 3, 32, 32)).astype(np.float32)
    fp32, int8, report = float_and_int8_modules(model, calib)
    assert len(report.integer) == 4 and report.float_left == []

    for mod, exact in ((int8, True), (fp32, False)):
        nhwc = to_nhwc(mod)
        assert nhwc.script().count('data_layout="NHWC"') == 3
        converted_only = relax.transform.ConvertLayout({"relax.nn.conv2d": ["NHWC", "OHWI"]})(mod)
        converted_only = relax.transform.FoldConstant()(converted_only)
        assert transposes(nhwc) == 2, nhwc.script()  # the input's and the one before the classifier
        # the 3-channel stem reads 4-channel pixels (nhwc.widen_channels): zero weights for the fourth
        assert [w[-1] for w in _conv_weight_shapes(nhwc)][0] == 4
        assert [w[-1] for w in _conv_weight_shapes(converted_only)][0] == 3
        if exact:  # int8: ConvertLayout alone wraps the requantize/zero-point-pad chains in transposes
            assert transposes(converted_only) >= 6
        before, after = run_on_cpu(mod, calib), run_on_cpu(nhwc, calib)
        if exact:
            assert np.array_equal(before, after)
        else:
            np.testing.assert_allclose(after, before, rtol=1e-4, atol=1e-4 * float(np.abs(before).max()))
