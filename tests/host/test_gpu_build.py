"""GPU profiles on a GPU-less host: real device code for exactly the profile's SM, a host library for
the device's CPU, checked by our parser and independently by cuobjdump and readelf."""

from __future__ import annotations

import importlib.util
import os
import shutil
import subprocess
from pathlib import Path

import pytest

from edgedeploy.api import build
from edgedeploy.compile.cuda_toolchain import resolve_toolchain
from edgedeploy.compile.devcode import device_blobs, inspect_library
from edgedeploy.compile.onnx_model import load_onnx
from edgedeploy.compile.package import ModelCard
from edgedeploy.compile.pipeline import BuildContext, run_pipeline
from edgedeploy.errors import BuildError
from edgedeploy.profiles import get_profile
from edgedeploy_agent.bundle import Preprocess, extract_bundle

GPU_PROFILES = {"t4": (75, "x86_64", "nvcc"), "h200": (90, "x86_64", "nvcc"), "xavier-agx": (72, "aarch64", "nvrtc")}


def _toolchain_or_skip(profile: str) -> None:
    try:
        resolve_toolchain(get_profile(profile))
    except BuildError as e:
        if os.environ.get("EDGEDEPLOY_REQUIRE_GPU_TOOLCHAIN") == "1":
            pytest.fail(f"CUDA toolchain for {profile} required here but missing: {e.message}")
        pytest.skip(f"no CUDA toolchain for {profile} here: {e.message}")


def _cuobjdump() -> str | None:
    spec = importlib.util.find_spec("nvidia")
    for root in spec.submodule_search_locations if spec and spec.submodule_search_locations else []:
        exe = Path(root) / "cu13" / "bin" / "cuobjdump"
        if exe.is_file():
            exe.chmod(0o755)
            return str(exe)
    return shutil.which("cuobjdump")


@pytest.mark.parametrize("profile", sorted(GPU_PROFILES))
def test_gpu_bundle_has_device_code_for_its_sm(profile: str, data_dir: Path, tmp_path: Path) -> None:
    _toolchain_or_skip(profile)
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
        cuobjdump = _cuobjdump()
        if cuobjdump is None:
            pytest.skip("cuobjdump not installed (pip install nvidia-cuda-cuobjdump)")
        listing = subprocess.run([cuobjdump, "--list-elf", str(f)], capture_output=True, text=True).stdout
        assert f"sm_{sm}" in listing, listing


def test_int8_on_gpu_computes_with_dp4a(data_dir: Path, tmp_path: Path) -> None:
    """The QDQ -> integer rewrite on the CUDA pipeline: nvcc emits dp4a (IDP.4A) for the int8 MACs."""
    _toolchain_or_skip("t4")
    cuobjdump = _cuobjdump()
    if cuobjdump is None or not (Path(cuobjdump).parent / "nvdisasm").exists():
        pytest.skip("cuobjdump/nvdisasm not installed (pip install nvidia-cuda-cuobjdump nvidia-cuda-nvdisasm)")
    (Path(cuobjdump).parent / "nvdisasm").chmod(0o755)
    from edgedeploy.compile.int8_build import Int8Config
    from edgedeploy.compile.quantize import QuantizeOptions

    cfg = Int8Config(calibration=data_dir / "mnist", options=QuantizeOptions(samples=32))
    card = ModelCard(name="mnist", preprocess=Preprocess(color="gray"))
    res = build(data_dir / "models" / "mnist-8_opset13.onnx", "t4", tmp_path / "i8.edb", card, int8=cfg)
    assert res.manifest.quantization.precision == "int8"
    assert any(h.role == "qdq-onnx" for h in res.manifest.host_files)
    rel = tmp_path / "rel"
    extract_bundle(res.bundle, rel)
    [(kind, blob)] = device_blobs((rel / "model.so").read_bytes())
    (tmp_path / "dev.fatbin").write_bytes(blob)
    sass = subprocess.run(
        [cuobjdump, "--dump-sass", str(tmp_path / "dev.fatbin")],
        capture_output=True,
        text=True,
        env={**os.environ, "NVDISASM_PATH": str(Path(cuobjdump).parent)},
    ).stdout
    assert sass.count("IDP.4A.S8.S8") > 0, sass[:2000]


def test_int8_on_gpu_names_the_layers_left_in_float(data_dir: Path, tmp_path: Path) -> None:
    """The CUDA worker reports what the int8 rewrite left in float, as the CPU pipeline does."""
    _toolchain_or_skip("t4")
    from edgedeploy.compile.int8_build import Int8Config
    from edgedeploy.compile.quantize import QuantizeOptions

    cfg = Int8Config(calibration=data_dir / "mnist", options=QuantizeOptions(samples=16, keep_float=("last",)))
    card = ModelCard(name="mnist", preprocess=Preprocess(color="gray"))
    res = build(data_dir / "models" / "mnist-8_opset13.onnx", "t4", tmp_path / "i8.edb", card, int8=cfg)
    assert res.manifest.quantization.float_in_runtime == ["Times212: operands are not dequantized (kept in float)"]


def test_cuda_source_instead_of_binary_fails_loudly(data_dir: Path, tmp_path: Path) -> None:
    """TVM's pitfall reproduced: compiled in a process without the CUDA toolchain environment (no
    libcuda), the library holds CUDA source; the check-library stage must refuse it."""
    ctx = BuildContext(
        model=load_onnx(data_dir / "models" / "mnist-8_opset13.onnx"), profile=get_profile("t4"), work_dir=tmp_path
    )
    with pytest.raises(BuildError, match="has no sm_75 SASS .*CUDA source"):
        run_pipeline(ctx)


def test_toolchain_refuses_what_it_cannot_target() -> None:
    profile = get_profile("xavier-agx")
    nvcc_for_xavier = profile.model_copy(
        update={"compiler": profile.compiler.model_copy(update={"cuda_codegen": "nvcc"})}
    )
    if shutil.which("nvcc") is None:
        pytest.skip("nvcc not installed")
    with pytest.raises(BuildError, match="cannot target sm_72") as e:
        resolve_toolchain(nvcc_for_xavier)
    assert "nvrtc-12" in (e.value.hint or "")
