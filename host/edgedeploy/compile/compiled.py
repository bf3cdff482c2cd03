"""What a compile produced: one type, filled from the pipeline's BuildContext in this process or sent as
JSON by the CUDA worker process (cuda_worker.py), so both paths give the bundle writer the same fields."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

from pydantic import BaseModel, ConfigDict

from edgedeploy_agent.bundle import TensorSpec

if TYPE_CHECKING:
    from .stage import BuildContext


class Compiled(BaseModel):
    model_config = ConfigDict(extra="forbid")

    library: Path | None  # None when the pipeline stopped early (tuning export)
    outputs: list[TensorSpec]
    timings: dict[str, float]
    float_left: list[str]  # int8 builds: layers TVM still computes in float
    device_code: list[str]  # e.g. ["sm_75 sass (fatbin, 132704 B)"]
    host_machine: str | None  # ELF machine of the exported library
    tuned_kernels: list[str]  # kernels whose schedule came from the database
    kernel_count: int  # all kernels, when a database was applied
    gemm_tuning: str  # CUDA: how many tensor-core kernels took a tuned configuration (tuning/gemm.py), from where
    ptx: Path | None = None  # nvrtc-11: the PTX of the library's CUDA module (the bundle's model.ptx)
    cuda_source_sha256: str = ""  # nvrtc-11: of the CUDA source TVM generated
    cuda_codegen: str | None = None  # the CUDA toolchain that compiled it (set by the host, not the pipeline)

    @classmethod
    def of(cls, ctx: BuildContext) -> Compiled:
        """The result fields of a finished pipeline: each field of this type is read from the context."""
        return cls(**{name: getattr(ctx, name) for name in cls.model_fields if name != "cuda_codegen"})

    def to_json(self) -> str:
        return self.model_dump_json()

    @classmethod
    def from_json(cls, text: str) -> Compiled:
        return cls.model_validate_json(text)
