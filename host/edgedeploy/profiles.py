"""Device profiles as data: profiles/*.toml validated by DeviceProfile.

Built-in profiles ship inside the package (edgedeploy.builtin_profiles, from the repo's profiles/);
users add their own TOML files in the user config folder's `profiles/` or in EDGEDEPLOY_PROFILES.
"""

from __future__ import annotations

import os
from importlib import resources
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

from .errors import ProfileError
from .paths import config_dir
from .userfiles import read_toml_model


class CompilerSpec(BaseModel):
    model_config = ConfigDict(extra="forbid")

    target: dict[str, Any] = Field(description="TVM target as a dict, e.g. {kind = 'llvm'}")
    host_triple: str = Field(description="triple of the device's CPU, e.g. x86_64-linux-gnu")
    cross_compiler: str | None = Field(default=None, description="C compiler used to link the library")
    # nvcc: the nvcc on PATH (CUDA 12/13), a fatbin of SASS; nvrtc-11: NVRTC 11.8 from pip (the cuda11 extra), a
    # cubin any CUDA 11.x driver loads, plus its PTX (compile/cuda/nvrtc11.py); nvrtc-12: NVRTC 12.x (the cuda12 extra)
    cuda_codegen: Literal["nvcc", "nvrtc-11", "nvrtc-12"] | None = None
    cuda_device_code: Literal["sass", "ptx"] = Field(
        default="sass",
        description="what the library's CUDA module holds: SASS for cuda_sm, or (twins, nvrtc-11 only) the PTX of "
        "compute_<cuda_sm>, which the driver JIT-compiles for any GPU of that SM or newer",
    )
    cpu_features: list[str] = Field(
        default_factory=list,
        description="CPU flags (/proc/cpuinfo names) the host code needs; agents without them refuse",
    )


class PlatformSpec(BaseModel):
    model_config = ConfigDict(extra="forbid")

    os: str = "linux"
    python: str = Field(description="Python the agent runs on")
    cuda: str | None = None
    min_cuda_driver: str | None = None
    driver_floor_reason: str | None = Field(
        default=None, description="why min_cuda_driver is what it is (device code, runtime backend); in the manifest"
    )
    glibc: str | None = Field(
        default=None,
        pattern=r"^\d+\.\d+$",
        description="oldest glibc the device has (e.g. 2.31: JetPack 5, Ubuntu 20.04); every library the build "
        "writes is checked to need no newer symbol version",
    )
    tensorrt: str | None = None
    jetpack: str | None = None


class DeviceProfile(BaseModel):
    model_config = ConfigDict(extra="forbid")

    name: str
    description: str
    arch: Literal["x86_64", "aarch64"]
    device: Literal["cpu", "cuda"]
    cuda_sm: int | None = None
    compiler: CompilerSpec
    platform: PlatformSpec
    twin_of: str | None = Field(
        default=None,
        description="a twin (compile/twin.py): this profile's device code is the named profile's, as PTX, with a "
        "host library for another CPU, so that it runs on a GPU machine",
    )
    source: str = Field(default="", exclude=True)

    @property
    def tuning_profile(self) -> str:
        """Whose tuning databases a build applies: a twin's are its original's (the same kernels)."""
        return self.twin_of or self.name

    @model_validator(mode="after")
    def _aarch64_names_its_glibc(self) -> DeviceProfile:
        # the cross compiler's libc is newer than the devices' (Debian 12: 2.36); the check needs the floor
        if self.arch == "aarch64" and self.platform.glibc is None:
            raise ValueError('an aarch64 profile must set platform.glibc (the devices\' glibc, e.g. "2.31")')
        if self.compiler.cuda_device_code == "ptx" and self.compiler.cuda_codegen != "nvrtc-11":
            raise ValueError('compiler.cuda_device_code = "ptx" needs cuda_codegen = "nvrtc-11"')
        return self


def _builtin_files() -> list[Path]:
    root = resources.files("edgedeploy.builtin_profiles")
    return sorted(Path(str(p)) for p in root.iterdir() if p.name.endswith(".toml"))


def profile_dirs() -> list[Path]:
    dirs = [config_dir() / "profiles"]
    extra = os.environ.get("EDGEDEPLOY_PROFILES")
    if extra:
        dirs += [Path(p) for p in extra.split(os.pathsep) if p]
    return dirs


def load_profile_file(path: Path) -> DeviceProfile:
    return read_toml_model(path, "profile", DeviceProfile, ProfileError, source=str(path))


def all_profiles() -> dict[str, DeviceProfile]:
    """Built-in profiles, overridden by user profiles of the same name."""
    out: dict[str, DeviceProfile] = {}
    files = _builtin_files() + [p for d in profile_dirs() if d.is_dir() for p in sorted(d.glob("*.toml"))]
    for f in files:
        prof = load_profile_file(f)
        out[prof.name] = prof
    return out


def get_profile(name: str) -> DeviceProfile:
    profiles = all_profiles()
    if name not in profiles:
        raise ProfileError(f"unknown profile {name!r}", hint=f"known profiles: {', '.join(sorted(profiles))}")
    return profiles[name]
