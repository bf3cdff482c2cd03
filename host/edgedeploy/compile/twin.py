"""Twins: a profile's exact device code, as PTX, with an x86_64 host library, so that the kernels of a GPU we do
not have (Xavier sm_72, T4 sm_75) execute on the one we do (the H200) before they ship.

A twin is built by the same pipeline from a derived profile (`twin_profile`): the same cuda_sm and TVM CUDA
target (so the same schedules, tensor-core instructions and tile rules, which key on the SM), the original's
tuning databases and GEMM configurations (`DeviceProfile.tuning_profile`), the same code generator (NVRTC 11.8)
and options; only two things differ:
- the host code: x86_64 (`llvm`, x86_64-linux-gnu), linked with the host's gcc, instead of the device's CPU;
- the CUDA module in the library: the PTX of compute_<SM> instead of the sm_<SM> cubin. NVRTC's PTX of a
  compute_72 compilation is byte for byte the PTX of the sm_72 compilation the real bundle's cubin was assembled
  from, and both bundles carry it as `model.ptx`: equal files mean equal device code
  (tests/host/test_twin.py compares them, the CUDA source digests and the kernel names).

On a newer GPU the driver JIT-compiles the PTX (PTX ISA 7.8 from NVRTC 11.8: a CUDA 11.8+ driver); the
agent accepts PTX for compute_XY on any GPU of SM >= XY (bundle.check_compatible). The manifest says
`twin_of = "<profile>"`, `profile = "<profile>-twin"`, and its device code "compute_72 ptx (module, N B)".

Built like any bundle, with `twin=True` (`edgedeploy build --twin`, `api.build(..., twin=True)`; bench/twin_kit.sh);
no GPU is needed here, and the bundle then runs through the agent runtime on the GPU machine.
"""

from __future__ import annotations

from ..errors import BuildError
from ..profiles import DeviceProfile

TWIN_SUFFIX = "-twin"
TWIN_HOST_TRIPLE = "x86_64-linux-gnu"
# The driver floor of a twin: PTX ISA 7.8 (NVRTC 11.8) is JIT-compiled by CUDA 11.8+ drivers only
TWIN_MIN_DRIVER = "11.8"
TWIN_FLOOR_REASON = (
    "compute_{sm} PTX (ISA 7.8) from NVRTC 11.8, which the driver JIT-compiles: CUDA 11.8+ (R520+); "
    "the edgedeploy CUDA backend itself uses driver API <= 11.4"
)


def twin_profile(profile: DeviceProfile) -> DeviceProfile:
    """`profile` as a twin: its device code as PTX, the host library for x86_64."""
    if profile.device != "cuda" or profile.cuda_sm is None:
        raise BuildError(f"profile {profile.name} is not a CUDA profile: it has no device code to twin")
    if profile.twin_of is not None:
        return profile
    if profile.compiler.cuda_codegen != "nvrtc-11":
        raise BuildError(
            f"profile {profile.name} compiles with {profile.compiler.cuda_codegen}: twins need cuda_codegen = "
            "'nvrtc-11' (the PTX of the same NVRTC compilation as the profile's cubin)",
            hint="twins are for the t4 and xavier profiles; an h200 bundle runs on the H200 as it is",
        )
    target = dict(profile.compiler.target)
    target["host"] = {"kind": "llvm", "mtriple": TWIN_HOST_TRIPLE}
    compiler = profile.compiler.model_copy(
        update={"target": target, "host_triple": TWIN_HOST_TRIPLE, "cross_compiler": None, "cuda_device_code": "ptx"}
    )
    platform = profile.platform.model_copy(
        update={
            "glibc": None,  # runs where it is built (the GPU machine's x86_64 host), not on the device
            "min_cuda_driver": TWIN_MIN_DRIVER,
            "driver_floor_reason": TWIN_FLOOR_REASON.format(sm=profile.cuda_sm),
        }
    )
    return DeviceProfile(
        name=profile.name + TWIN_SUFFIX,
        description=f"twin of {profile.name}: its sm_{profile.cuda_sm} kernels as compute_{profile.cuda_sm} PTX, "
        "x86_64 host code (runs on a newer NVIDIA GPU through the driver's JIT)",
        arch="x86_64",
        device="cuda",
        cuda_sm=profile.cuda_sm,
        compiler=compiler,
        platform=platform,
        twin_of=profile.name,
    )
