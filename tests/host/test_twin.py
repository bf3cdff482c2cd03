"""Twins (compile/twin.py) of the t4 and xavier-agx builds of a small conv net, INT8 and FP16, against the real
bundles: the same device code (PTX bytes, CUDA source digest, kernel names), as compute_XX PTX in an x86_64
library, and what the agent accepts where. The real bundles' cubins come from NVRTC 11.8 with an ELF header
an 11.x driver reads. No GPU: the twins are executed on the GPU machine by the lead's bench script."""

from __future__ import annotations

import re
import struct
import subprocess
from pathlib import Path

import pytest

from edgedeploy.api import build
from edgedeploy.compile.cards import ModelCard
from edgedeploy.compile.cuda.devcode import cubin_functions, device_blobs, inspect_library, ptx_entries, ptx_version
from edgedeploy_agent.bundle import Manifest, Preprocess, check_compatible, extract_bundle
from edgedeploy_agent.errors import IncompatibleBundle
from edgedeploy_agent.gpu import probe_cuda
from tests.agent.doubles import fake_libcuda
from tests.host.cuda import GPU_PROFILES, require_toolchain
from tests.host.models import convnet

pytestmark = [pytest.mark.compile, pytest.mark.cuda]


def _builds(profile: str, precision: str, data_dir: Path, tmp: Path) -> tuple[Manifest, Path, Manifest, Path]:
    """(real manifest, its unpacked folder, twin manifest, its unpacked folder); the real build is the one
    test_gpu_build's tensor-core test makes (same model bytes, card and options: a build-cache hit after it)."""
    require_toolchain(profile)
    from edgedeploy.compile.int8.build import Int8Config
    from edgedeploy.compile.int8.quantize import QuantizeOptions

    model = convnet(tmp / "convnet.onnx")
    card = ModelCard(name="convnet", preprocess=Preprocess(scale=1 / 255))
    int8 = None
    if precision == "int8":
        int8 = Int8Config(calibration=data_dir / "imagenet-sample", options=QuantizeOptions(samples=16))
    real = build(model, profile, tmp / "real.edb", card, precision=precision, int8=int8)
    twin = build(model, profile, tmp / "twin.edb", card, precision=precision, int8=int8, twin=True)
    extract_bundle(real.bundle, tmp / "real")
    extract_bundle(twin.bundle, tmp / "twin")
    return real.manifest, tmp / "real", twin.manifest, tmp / "twin"


def _readelf_functions(cubin: Path) -> list[str]:
    """The cubin's global functions as binutils reads its symbol table (independent of our parser)."""
    out = subprocess.run(["readelf", "-s", "-W", str(cubin)], capture_output=True, text=True).stdout
    return sorted(m.group(1) for m in re.finditer(r"\bFUNC\s+GLOBAL\s+\S+\s+.*?\s(\S+)$", out, re.MULTILINE))


@pytest.mark.parametrize("profile", ["t4", "xavier-agx"])
@pytest.mark.parametrize("precision", ["int8", "fp16"])
def test_twin_has_the_real_bundles_device_code_as_ptx(
    profile: str, precision: str, data_dir: Path, tmp_path: Path
) -> None:
    sm, arch, _ = GPU_PROFILES[profile]
    real, real_dir, twin, twin_dir = _builds(profile, precision, data_dir, tmp_path)

    # the real bundle: an sm_XX cubin from NVRTC 11.8, ELF ABI 7 (what 11.x drivers read), and its PTX
    t = real.target
    assert t.cuda_codegen == "nvrtc 11.8.89" and t.device_code[0].startswith(f"sm_{sm} sass (cubin,")
    assert (t.min_cuda_driver, t.arch) == ("11.4", arch) and "NVRTC 11.8" in (t.driver_floor_reason or "")
    assert real.schema_version == 5 and real.twin_of is None  # 5: its preprocessing kernel (preprocess.so)
    [(kind, cubin)] = device_blobs((real_dir / "model.so").read_bytes())
    assert kind == "cubin" and cubin[7:9] == b"\x33\x07" and struct.unpack_from("<I", cubin, 20)[0] == 118
    assert {a.path: a.role for a in real.artifacts}["model.ptx"] == "cuda-ptx"
    real_ptx = (real_dir / "model.ptx").read_bytes()
    assert ptx_version(real_ptx) == "7.8" and f"\n.target sm_{sm}\n".encode() in real_ptx

    # the twin: the same PTX, inside an x86_64 library
    w = twin.target
    assert (twin.twin_of, twin.profile, w.arch, w.host_machine) == (profile, f"{profile}-twin", "x86_64", "x86_64")
    assert w.cuda_sm == sm and w.cuda_codegen == t.cuda_codegen and w.min_cuda_driver == "11.8"
    assert len(w.device_code) == 1 and w.device_code[0].startswith(f"compute_{sm} ptx (module,") and w.ptx_only()
    report = inspect_library(twin_dir / "model.so")
    assert report.host_machine == "x86_64" and report.ptx_sms() == {sm} and report.sms() == set()
    header = subprocess.run(["readelf", "-h", str(twin_dir / "model.so")], capture_output=True, text=True).stdout
    assert "X86-64" in header
    [(kind, library_ptx)] = device_blobs((twin_dir / "model.so").read_bytes())
    assert kind == "ptx" and library_ptx == (twin_dir / "model.ptx").read_bytes() == real_ptx
    digest = real.provenance.options["cuda_source_sha256"]
    assert twin.provenance.options["cuda_source_sha256"] == digest  # TVM generated the same CUDA source

    # the same kernels by name: the cubin's functions (our parser and binutils) are the PTX's entries
    (tmp_path / "real.cubin").write_bytes(cubin)
    names = sorted(cubin_functions(cubin))
    assert names == _readelf_functions(tmp_path / "real.cubin") == sorted(ptx_entries(library_ptx))
    assert len(names) >= 5 and all(n.endswith("_kernel") for n in names)


def test_agent_takes_the_twin_on_the_h200_and_the_xavier_bundle_on_jetpack5(data_dir: Path, tmp_path: Path) -> None:
    """Fake drivers: a JetPack 5 Xavier (11.4) takes the real xavier-agx bundle; an H200 (sm_90, 13.0) takes
    its twin (PTX, JIT) and refuses the real one (sm_72 SASS); the JetPack 5 driver cannot JIT the twin's PTX."""
    real, _, twin, _ = _builds("xavier-agx", "int8", data_dir, tmp_path)
    jetpack5, _ = probe_cuda(fake_libcuda(tmp_path, 11040, 72, "Xavier"))
    h200, _ = probe_cuda(fake_libcuda(tmp_path, 13000, 90, "NVIDIA H200"))
    check_compatible(real, machine="aarch64", gpu=jetpack5)
    check_compatible(twin, machine="x86_64", gpu=h200)
    with pytest.raises(IncompatibleBundle, match="sm_72 code, this device's NVIDIA H200 is sm_90"):
        check_compatible(real, machine="aarch64", gpu=h200)
    with pytest.raises(IncompatibleBundle, match=r"11\.8\+ \(compute_72 PTX \(ISA 7\.8\)"):
        check_compatible(twin, machine="x86_64", gpu=jetpack5)
