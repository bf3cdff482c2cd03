"""INT8 `mma.sync.m16n8k32` with `ldmatrix` for the tensor-core GEMM schedule on sm_80+ (cuda/tensorcore.py).

TVM 0.27's int8 WMMA fragment is m16n16k16: nvcc lowers it to `IMMA.16816` (half the K of the native int8
instruction of Ampere and Hopper) fed by `LDSM.16.M88.2`, so an INT8 kernel issues as many tensor-core
instructions as its FP16 twin for the same work (INT8 convolutions 1.33-1.35x their FP16 twins where the
hardware offers 2x: docs/gpu.md "mma.sync m16n8k32"). `mma.sync.aligned.m16n8k32.row.col.s32.s8.s8.s32`
(`IMMA.16832`) does twice the K per instruction and `ldmatrix.x4` loads a whole 16x32 operand tile in one
instruction.

TVM registers the pieces (`tvm.s_tir.tensor_intrin.cuda`: the register layouts, ldmatrix, mma, fill) but
not every scope this schedule uses: int8 ldmatrix only from static `shared` and the int32 store only to
global memory. The generators take the scope; the variants registered here are those generators called
with the schedule's scopes (`shared.dyn` operand stages, a `shared`/`shared.dyn` accumulator stage).

mma.sync m16n8k32 for s8 needs sm_80 (PTX ISA); sm_72 (Xavier) and sm_75 (T4) keep WMMA.

TVM 0.27's `LowerWarpMemory` turns only the first "warp"-scope buffer of a statement sequence into the
thread's registers per run: the kernel's other fragment buffers (here the A and B operands, allocated
beside the accumulator) stayed whole-warp arrays in every thread (4 KB of local memory each, every access at
`threadIdx.x * 16`; seen in the CUDA source, and running the pass again lowered the next one). CUDA builds
therefore use the TIR pipeline `TIR_PIPELINE`, TVM's own with that pass repeated until no warp buffer is
left (`tvm.compile(..., tir_pipeline=TIR_PIPELINE)`).
"""

from __future__ import annotations

from typing import Any

import tvm
from tvm.s_tir import TensorIntrin

from . import tensor_intrinsics
from .tiles import MMA_K  # K of one int8 mma tile (two m16n8k32 make a 16x16 output fragment)

MMA_SM = 80


def _register(name: str, pair: tuple[Any, Any]) -> str:
    try:
        TensorIntrin.get(name)
    except Exception:  # not registered yet (TensorIntrin.get raises for an unknown name)
        TensorIntrin.register(name, *pair)
    return name


def _cuda() -> Any:
    return tensor_intrinsics.import_all().cuda  # imported on first use: CPU and WMMA-only builds never need it


def intrins(load_scope: str, store_scope: str) -> dict[str, str]:
    """The tensorize intrinsics of one INT8 mma kernel: B is [N, K] (transposed), the int32 accumulator is
    stored element by element into the accumulator stage (the epilogue reads it from there)."""
    intrin = _cuda()
    tag = load_scope.replace(".", "_")
    store_tag = store_scope.replace(".", "_")
    return {
        "load_a": _register(
            f"edgedeploy_ldmatrix_i8_a_{tag}", intrin.get_ldmatrix_intrin(MMA_K, "int8", "A", False, load_scope)
        ),
        "load_b": _register(
            f"edgedeploy_ldmatrix_i8_b_trans_{tag}", intrin.get_ldmatrix_intrin(MMA_K, "int8", "B", True, load_scope)
        ),
        "compute": intrin.MMA_i8i8i32_TRANS_B_INTRIN,
        "init": intrin.MMA_fill_16x16_i32_INTRIN,
        "store": _register(
            f"edgedeploy_mma_store_i32_{store_tag}", intrin.get_mma_store_intrin("int32", 8, store_scope, False)
        ),
    }


def operand_layout(s: Any, i: Any, k: Any) -> tuple[Any, ...]:
    """A [batch, rows, K] operand fragment buffer in the registers of a warp: 16x32 tiles, each as
    (thread, 16 bytes) the way ldmatrix.x4 fills them (A and the transposed B alike)."""
    return (s, i // 16, k // MMA_K, *_cuda().shared_16x32_to_ldmatrix_32x16_layout(i % 16, k % MMA_K))


def accumulator_layout(s: Any, i: Any, j: Any) -> tuple[Any, ...]:
    """The [batch, M, N] int32 accumulator in the registers of a warp: 16x16 tiles as (thread, 8 words)."""
    return (s, i // 16, j // 16, *_cuda().shared_16x16_to_ldmatrix_32x8_layout(i % 16, j % 16))


def split_accumulator_layout(ks: Any, s: Any, i: Any, j: Any) -> tuple[Any, ...]:
    """`accumulator_layout` of a split-K kernel's partial sums, [split, batch, M, N] (rfactor's leading axis)."""
    return (ks, *accumulator_layout(s, i, j))


TIR_PIPELINE = "edgedeploy_cuda"
_WARP_PASSES = 8  # more than the warp buffers of any kernel this project schedules (3: A, B, accumulator)


def _has_warp_buffer(mod: Any) -> bool:
    return 'scope="warp"' in mod.script(show_meta=False)


@tvm.transform.module_pass(opt_level=0)  # type: ignore[untyped-decorator]
def lower_all_warp_memory(mod: Any, _ctx: Any) -> Any:
    """`LowerWarpMemory` until no warp-scope buffer is left (each run of TVM 0.27's lowers one per sequence)."""
    for _ in range(_WARP_PASSES):
        if not _has_warp_buffer(mod):
            break
        mod = tvm.tirx.transform.LowerWarpMemory()(mod)
    return mod


def _tir_pipeline(**kwargs: Any) -> Any:
    from tvm.s_tir.pipeline import default_s_tir_pipeline

    lower, host, device = default_s_tir_pipeline(**kwargs)

    def device_passes() -> Any:
        return tvm.ir.transform.Sequential([lower_all_warp_memory, device()])

    return lower, host, device_passes


tvm.tirx.compilation_pipeline.register_tir_pipeline(TIR_PIPELINE, _tir_pipeline)
