"""What a build is asked beyond the model and the profile: the CUDA schedule configuration and the tuning request.

BuildContext (stage.py) carries both, and the CUDA worker's request holds them as JSON. Nothing under compile/
reads them from the environment: the command line does (cli/options.py: EDGEDEPLOY_CUDA_KNOBS and
EDGEDEPLOY_CUDA_TENSOR_CORES, for before/after measurements of one change), and hands them down.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any


@dataclass(frozen=True)
class Knobs:
    """Schedule choices a benchmark can vary for every kernel at once (bench/conv_variants.py); the
    defaults are what builds use where no tuned configuration exists.

    int8_k: K elements (bytes) per shared-memory stage for INT8; fp16_k likewise for FP16.
    load_bytes: bytes each thread loads per global -> shared copy (the im2col gather included).
    """

    int8_k: int = 64
    fp16_k: int = 64
    load_bytes: int = 16
    # INT8 grids of at least this many blocks give each warp 4x4 fragments (64x64 outputs; 2 warps on a
    # 128x64 tile, 4 on 128x128) instead of 2x2: on the H200 1.09x (ResNet-18 layer1, 1568 blocks), 1.25x
    # (layer3, 196 blocks), 1.6x (1x1 stride 2) at batch 64, but 0.85x on layer4's 100 blocks
    # (docs/gpu.md "Schedule knobs"); 0 = never
    wide_warps_from: int = 192
    # sm_80+: shared-memory stages filled by cp.async (3: the copies run two K stages ahead); 0: the copies
    # go through registers into two buffers, as on sm_72/sm_75 always. 3 for every kernel was 0.88-0.94x on
    # the H200 (whole ResNet-18s; the stem 0.135 -> 0.239 ms, layer1 0.100 -> 0.127, layer4 0.077 -> 0.070:
    # docs/gpu.md "Schedule knobs"), so it is a per-kernel choice of the GEMM search
    async_stages: int = 0
    # sm_80+ INT8 kernels without a tuned configuration: mma.sync m16n8k32 with ldmatrix.x4 (cuda_mma.py)
    # instead of WMMA m16n16k16 (1), or WMMA (0). WMMA by default: on the H200 mma is bit-identical and
    # 0.84-1.09x per ResNet-18 convolution at batch 64 (docs/gpu.md "mma.sync m16n8k32"), so it is a per-kernel
    # choice of the GEMM search (GemmConfig.mma)
    int8_mma: int = 0
    # rounding (INT8 requantize) epilogues: consecutive elements per thread, read from the accumulator stage
    # as one vector and stored as one (cuda_tensorcore._store_epilogue); 1: one element per thread and step.
    # 4 on the H200: ResNet-18 INT8 batch 64 1.020 -> 0.973 ms, bit-identical (per convolution 0.99-1.16x;
    # docs/gpu.md "The requantizing epilogue in vectors")
    round_lanes: int = 4
    # depthwise convolutions and NCHW pooling with an epilogue (requantize, bias + clip): each thread sums its
    # output's window in a register and runs the epilogue on it, one kernel (1), or dlight's Fallback (0): two
    # kernels, the window sums stored to global memory as int32/float and read back by the epilogue's
    # (window.window_with_epilogue). 1 on the H200 (docs/gpu.md "Schedule knobs"): MobileNetV1-0.25
    # INT8 batch 64 0.761 -> 0.657 ms, batch 1 0.111 -> 0.092, FP16 batch 64 0.719 -> 0.586; bit-identical
    window_epilogue: int = 1
    # stride-2 convolutions over at most 4 channels (the stem) as stride-1 ones over the input's 2x2
    # space-to-depth rearrangement (nhwc._SpaceToDepth) (1), or as they are (0). 1 on the H200 (same):
    # ResNet-18 batch 64 stem FP16 0.244 -> 0.150 ms, INT8 0.117 -> 0.100 (bit-identical), batch 1 unchanged
    space_to_depth: int = 1
    # injective kernels whose innermost extent admits no vector (an odd width): elements per thread, THREADS
    # apart (cuda_injective.VectorizedInjective); 1: dlight's Fallback, one each. 4 on the H200: MobileNetV1-0.25
    # INT8's input quantize + pad to 225 x 225 at batch 64 0.042 -> 0.030 ms, bit-identical (FP16's vectorized
    # cast of the same image: 0.016; docs/gpu.md "Schedule knobs")
    injective_ilp: int = 4
    # the tensor-core epilogue's loop over a warp's rows unrolled (cuda_tensorcore._store_epilogue), or a loop (0): with
    # a residual add, each step waited for its own global load (their SASS). 1 on the H200 (docs/gpu.md "Schedule
    # knobs"): ResNet-18 INT8 batch 64 kernels 0.858 -> 0.844 ms (residual convolutions 0.0025 ms faster each, the 1x1
    # downsample and layer2's first 3x3 0.0015 slower), batch 1 and MobileNet unchanged; bit-identical
    unroll_epilogue: int = 1
    # INT8 tensors between kernels where FuseOps ended a producer's kernel with a dequantize (ResNet's downsampling
    # convolutions, the last block before the average pool stored float32): the dequantize moved into the
    # consumer's kernel (int8_boundaries.dequantize_in_consumers) (1), or left where FuseOps put it (0)
    int8_boundaries: int = 1

    @classmethod
    def parse(cls, spec: str, source: str = "EDGEDEPLOY_CUDA_KNOBS") -> Knobs:
        """The defaults with overrides from a "NAME=INTEGER,..." spec ("async_stages=3,int8_k=32"); `source` names
        where the spec came from in the error."""
        fields = {f.name for f in dataclasses.fields(cls)}
        values: dict[str, int] = {}
        for item in filter(None, (s.strip() for s in spec.split(","))):
            name, _, value = item.partition("=")
            if name.strip() not in fields or not value.strip().lstrip("-").isdigit():
                raise ValueError(f"{source}: {item!r} is not NAME=INTEGER with NAME one of {sorted(fields)}")
            values[name.strip()] = int(value)
        return cls(**values)

    def spec(self) -> str:
        """The knobs that differ from the defaults, as parse reads them ("" for the defaults)."""
        default = Knobs()
        return ",".join(
            f"{f.name}={getattr(self, f.name)}"
            for f in dataclasses.fields(self)
            if getattr(self, f.name) != getattr(default, f.name)
        )


@dataclass(frozen=True)
class CudaConfig:
    """The CUDA schedule configuration of a build: the knobs, and whether FP16/INT8 convolutions and matmuls go
    on tensor cores (cuda/tensorcore.py; False builds the kernels edgedeploy had before them). Part of the
    build-cache key where it differs from the default."""

    knobs: Knobs = field(default_factory=lambda: Knobs())
    tensor_cores: bool = True

    def to_json(self) -> dict[str, Any]:
        return {"knobs": self.knobs.spec(), "tensor_cores": self.tensor_cores}

    @classmethod
    def from_json(cls, d: dict[str, Any]) -> CudaConfig:
        return cls(Knobs.parse(d["knobs"]), d["tensor_cores"])


@dataclass(frozen=True)
class TuneRequest:
    """What `edgedeploy tune` asks of the apply-tuning stage."""

    trials: int
    database: Path | None  # read and extended; None: the user's, for the model's key (tune_model decides)
    runner: str = "local"  # local | rpc | export
    tracker: str = ""  # rpc: HOST:PORT of TVM's RPC tracker
    key: str = ""  # rpc: the device key the RPC servers registered with
    export_dir: Path | None = None
    cost_model: str = "xgb"  # xgb | random
    tasks: int = 0  # > 0: only N kernels (costliest by measured time here, else heaviest by FLOPs x calls)

    def to_json(self) -> dict[str, Any]:
        return {**self.__dict__, "database": str(self.db), "export_dir": str(self.export_dir or "")}

    @classmethod
    def from_json(cls, d: dict[str, Any]) -> TuneRequest:
        return cls(
            **{**d, "database": Path(d["database"]), "export_dir": Path(d["export_dir"]) if d["export_dir"] else None}
        )

    @property
    def db(self) -> Path:
        if self.database is None:
            raise AssertionError("TuneRequest.database is decided by tune_model before any tuning")
        return self.database
