"""Tensor cores (WMMA) for FP16 and INT8 convolutions and matmuls on the CUDA profiles.

TVM 0.27's dlight `gpu.Matmul` rule already treats a convolution as an implicit GEMM: its iterator
analysis classifies the output pixels as the M axis, the output channels as N and (channel, ky, kx) as
K, and `reindex` then gathers the im2col operand on the fly into shared memory (no im2col tensor is
ever stored). Three things kept convolutions off the tensor cores in the default pipeline:

1. `Matmul` only tensorizes when every GEMM dimension is *larger than 64*: every 64-channel layer
   (ResNet's stem and first stage, a fifth of its FLOPs) got the SIMT schedule.
2. Its INT8 rule (`MatmulInt8Tensorization`) splits the K loop inside a shared-memory stage by 1 and
   still annotates that inner loop as a 3-stage software pipeline; `InjectSoftwarePipeline` then fails
   on the double-buffered WMMA fragments (`inject_software_pipeline.cc:173 GetWmmaFragmentSize`), so
   INT8 had no tensor cores at all (edgedeploy switched the rule off; nvcc emitted dp4a instead).
3. One tile shape for all: 128x128 output tiles, which wastes half of every tile when N = 64.

`TensorCoreGemm` is the same WMMA schedule (shared-memory staging with a software pipeline, WMMA
fragments, the epilogue - bias, ReLU, residual add, INT8 requantize - inlined into the store from the
shared-memory accumulator) with tiles chosen from the GEMM's shape, an inner K split of at least 2
for INT8, and no "> 64" gate. It runs before dlight's rules; what it declines (depthwise convolutions,
which have no N axis; GEMMs with a dimension below 16; dynamic shapes; other dtypes) goes on to them.

The `nhwc-layout` stage (nhwc.py, fp16 and int8 CUDA builds) gives these kernels NHWC activations and
OHWI weights, so the im2col gather loads vectors and the output tile is stored channel-contiguous.
`EDGEDEPLOY_CUDA_TENSOR_CORES=0` builds the way edgedeploy did before (for before/after measurements).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import tvm
from tvm import s_tir, tirx
from tvm.s_tir.dlight.analysis import get_root_block
from tvm.s_tir.dlight.gpu.base import GPUScheduleRule
from tvm.s_tir.dlight.gpu.matmul import (
    auto_inline_consumer_chain,
    auto_inline_producers,
    get_index_map,
    get_reduction_blocks,
)
from tvm.target import Target

from ..config import Knobs
from . import mma as cuda_mma
from . import source  # noqa: F401 (registers the CUDA source fix with TVM)
from .tiles import (
    ACC_ALIGN,
    FRAG,
    MMA_K,
    OPERAND_ALIGN,
    STATIC_ACC,
    WARP,
    GemmConfig,
    GemmShape,
    Tiles,
    default_config,
    launchable,
    shared_bytes,
    split_ok,
)

MIN_SM = {"float16": 70, "int8": 72}  # Volta HMMA; IMMA from Xavier/Turing on
ASYNC_SM = 80  # cp.async (global -> shared without registers) from Ampere on


TIR_PIPELINE = cuda_mma.TIR_PIPELINE  # tvm.compile(..., tir_pipeline=TIR_PIPELINE) for every CUDA build


def pass_config(target: Target) -> dict[str, Any]:
    """What TVM's lowering needs for these schedules on sm_80+: cp.async from the pipelines' async stages,
    and no TIR common-subexpression elimination, for the INT8 mma kernels any tuned configuration may ask
    for: it binds their fragments' `threadIdx.x * 16` offsets to let-variables, in which TVM 0.27's
    LowerWarpMemory cannot find the thread ("require positive constant coefficient on warp index",
    cuda/mma.py). nvcc eliminates common subexpressions itself (WMMA kernels with and without it: the same
    times, docs/gpu.md "mma.sync m16n8k32")."""
    if _sm(target) < ASYNC_SM:
        return {}
    return {"tirx.use_async_copy": True, "tirx.disable_cse_tir": True}


def kernel_key(func: Any) -> str:
    """A kernel's name in GEMM tuning databases: the structural hash of its unscheduled TIR, attributes
    dropped and every floating-point constant set to 0. Names (of the function, its variables and buffers)
    do not enter it; shapes, dtypes and the epilogue's operations do. Scalar constants do not: a
    per-tensor dequantize scale, a requantize's clip bounds change nothing in how fast a schedule runs,
    and they change with every calibration. (Until gemm_tuning.VERSION 2 they were part of the key: the
    committed ResNet-18 databases missed the 8 of 20 INT8 kernels with a scalar scale on build hosts whose
    CPU exported other BatchNorm statistics, so other scales.) The constants are set through the JSON
    form (tvm.ir.save_json/load_json), which TVM 0.27's Python can edit and which, unlike a TVMScript round
    trip, folds nothing."""
    import json

    import tvm_ffi

    for name in list((func.attrs or {}).keys()):
        func = func.without_attr(name)
    graph = json.loads(tvm.ir.save_json(func))
    for node in graph["nodes"]:
        if node.get("type") == "ir.FloatImm":
            node["data"]["value"] = 0.0
    func = tvm.ir.load_json(json.dumps(graph))
    return f"{tvm_ffi.structural_hash(func) & (2**64 - 1):016x}"


def _sm(target: Target) -> int:
    arch = str(target.attrs.get("arch", ""))
    return int(arch[3:]) if arch.startswith("sm_") and arch[3:].isdigit() else 0


def _drop_unit_reductions(sch: Any, block: Any) -> None:
    iters = list(sch.get(block).iter_vars)
    keep = [
        i
        for i, v in enumerate(iters)
        if not (v.iter_type == tirx.IterVar.CommReduce and isinstance(v.dom.extent, tirx.IntImm) and v.dom.extent == 1)
    ]
    if len(keep) < len(iters):
        sch.transform_block_layout(block, tirx.IndexMap.from_func(lambda *v: [v[i] for i in keep], ndim=len(iters)))


@dataclass
class _Kernel:
    """One GEMM-shaped kernel as the schedule's steps see it: the shared analysis (dtypes, extents, the
    configuration), the instruction family, and the blocks and loops each step hands the next."""

    key: str
    sch: Any
    main: Any  # the GEMM block (after split-K: its rfactor block)
    a_dtype: str
    accumulators: tuple[str, ...]  # accumulator dtypes to try, in order (FP16: float32, then float16)
    batch: int
    m: int
    n: int
    k: int
    config: GemmConfig
    mma_ok: bool  # the GPU and dtype admit mma.sync (recorded for the GEMM search)
    family: Family | None = None
    exact: bool = False  # no padding: M, N and K are whole tiles
    writeback: Any = None  # split-K: the block that adds the partial sums
    inner: Any = None  # the fragment-sized compute block (tensorized)
    outer: Any = None  # the blockized GEMM, whose operands and output are staged
    warp: Any = None
    k0: Any = None  # the loop over shared-memory K stages
    k1: Any = None  # the loop over fragments inside one stage
    inner_pipeline: bool = True
    stages: int = 0  # cp.async buffers (0: through registers, two buffers)
    cp_async: bool = False
    acc_scope: str = ""
    acc_shared: Any = None
    store: Any = None
    sj0: Any = None
    acc: str = ""  # the accumulator dtype the fragments were tensorized with

    @property
    def tiles(self) -> Tiles:
        return self.config.tiles


class Family:
    """An instruction family of the tensor cores: its fragment shapes, scopes, layouts and intrinsics. The
    rule's steps are shared; what differs between the families is asked of them."""

    k_frag = FRAG  # K of one fragment step

    def fits(self, kern: _Kernel) -> bool:
        raise NotImplementedError

    def scope(self, operand: str) -> str:
        """The fragment buffer's scope for "a", "b" or the "accumulator"."""
        raise NotImplementedError

    def inner_pipeline(self) -> bool:
        """Whether fragment loads of the next K step overlap the current one's compute."""
        return True

    def operand_layout(self) -> Any:
        return None

    def accumulator_layout(self, split_k: bool) -> Any:
        return None

    def intrins(self, acc_scope: str, a_dtype: str, acc: str) -> dict[str, str]:
        raise NotImplementedError


class MmaSync(Family):
    """INT8 mma.sync m16n8k32 fed by ldmatrix.x4 (mma.py), on sm_80+, where the configuration asks for it
    and a K stage holds two 32-deep steps (the pipelines assume an inner K loop)."""

    k_frag = MMA_K

    def fits(self, kern: _Kernel) -> bool:
        return bool(kern.config.mma) and kern.mma_ok and kern.tiles.k >= 2 * MMA_K

    def scope(self, operand: str) -> str:
        return "warp"

    def inner_pipeline(self) -> bool:
        # no: a second fragment buffer costs 8 registers per 16x32 fragment, and the 4x4-fragment warps spilled
        # and ran 0.67-0.83x (settled: it was the knob `mma_frag_buffers`, 1)
        return False

    def operand_layout(self) -> Any:
        return cuda_mma.operand_layout  # the fragment buffer in ldmatrix's register layout (16 bytes a tile)

    def accumulator_layout(self, split_k: bool) -> Any:
        return cuda_mma.split_accumulator_layout if split_k else cuda_mma.accumulator_layout

    def intrins(self, acc_scope: str, a_dtype: str, acc: str) -> dict[str, str]:
        return cuda_mma.intrins("shared.dyn", acc_scope)


class Wmma(Family):
    """WMMA m16n16k16 for FP16 and INT8: every GPU with tensor cores (also for a configuration asking for mma on
    an older GPU)."""

    def fits(self, kern: _Kernel) -> bool:
        return True

    def scope(self, operand: str) -> str:
        return {"a": "wmma.matrix_a", "b": "wmma.matrix_b", "accumulator": "wmma.accumulator"}[operand]

    def intrins(self, acc_scope: str, a_dtype: str, acc: str) -> dict[str, str]:
        from .tensor_intrinsics import import_all

        group: dict[str, str] = import_all().cuda.get_wmma_intrin_group(
            "shared.dyn", acc_scope, a_dtype, acc, trans_b=True
        )
        return group


FAMILIES: tuple[Family, ...] = (MmaSync(), Wmma())  # the first that fits a kernel schedules its fragments


class TensorCoreGemm(GPUScheduleRule):  # type: ignore[misc]
    """Tensor-core schedule for any single-reduction GEMM-shaped kernel (matmul, dense, conv2d as implicit
    GEMM), in named steps: analysis, tiles and split-K, operand staging, fragments (by instruction family),
    epilogue."""

    def __init__(self, knobs: Knobs | None = None, configs: Mapping[str, GemmConfig] | None = None) -> None:
        super().__init__()
        self.knobs = knobs or Knobs()
        self.configs = dict(configs or {})  # kernel_key -> a tuned configuration (tuning/gemm.py)
        self.applied: dict[str, GemmConfig] = {}  # kernel_key -> the tuned configuration it got
        self.seen: dict[str, GemmShape] = {}  # kernel_key -> its GEMM, for every kernel this rule scheduled

    def apply(self, func: Any, target: Target, _: bool) -> Any:
        try:
            return self.schedule(func, target)
        except Exception:  # a ScheduleError or TVM check on an unusual kernel: dlight's rules take it
            return None

    def schedule(self, func: Any, target: Target) -> Any:
        """The schedule, or None where the rule does not apply; raises where scheduling fails (`apply`
        turns that into None so that dlight's rules take the kernel; the GEMM search wants the error)."""
        kern = self.analyse(func, target)
        if kern is None:
            return None
        self.tile(kern)
        self.stage_operands(kern, target)
        if not self.fragments(kern):
            return None
        if not self.epilogue(kern):
            return None
        t, sch = kern.tiles, kern.sch
        dynamic, static = shared_bytes(t, kern.a_dtype, max(kern.stages, 2), tvm.DataType(kern.acc).bits // 8)
        if not launchable(dynamic, static):
            raise ValueError(f"{dynamic} + {static} bytes of shared memory: the kernel could not launch")
        self.seen[kern.key] = GemmShape(kern.batch, kern.m, kern.n, kern.k, kern.a_dtype, kern.cp_async, kern.mma_ok)
        if kern.key in self.configs:
            self.applied[kern.key] = kern.config
        return sch

    def analyse(self, func: Any, target: Target) -> _Kernel | None:
        """Analysis: a single-reduction kernel of two same-dtype operands the GPU's tensor cores take, as
        C[S, I, J] += A[S, I, K] * B[S, J, K] with static extents of at least one fragment; its configuration
        (tuned, else the default rules) and instruction family."""
        if not isinstance(func, tirx.PrimFunc) or not self.is_target_available(target):
            return None
        if target.kind.name != "cuda" or "dlight.do_not_tensorize" in func.attrs.keys():
            return None
        key = kernel_key(func)
        sch = s_tir.Schedule(func)
        reductions = get_reduction_blocks(sch, sch.get_child_blocks(get_root_block(sch)))
        if reductions is None:
            return None
        main = reductions[0]
        stmt = sch.get(main)
        if len(stmt.reads) != 2 or len(stmt.writes) != 1:
            return None
        a_dtype, b_dtype = (str(r.source.dtype) for r in stmt.reads)
        out_dtype = str(stmt.writes[0].source.dtype)
        if a_dtype != b_dtype or a_dtype not in MIN_SM or _sm(target) < MIN_SM[a_dtype]:
            return None
        accumulators = {"float16": ("float32", "float16"), "int8": ("int32",)}[a_dtype]
        if out_dtype not in accumulators:
            return None
        _drop_unit_reductions(sch, main)  # a 1x1 convolution's ky, kx (extent 1) break reindex's layouts
        stmt = sch.get(main)
        maps = get_index_map(stmt)
        if maps is None:
            return None
        matmul_map, a_map, b_map, c_map = maps

        # reindex the operands (for a convolution, the A reindex is the im2col gather, computed on the fly into
        # shared memory) and fuse the axes of each kind
        reindex_a = sch.reindex(main, ("read", 0))
        reindex_b = sch.reindex(main, ("read", 1))
        reindex_c = sch.reindex(main, ("write", 0))
        sch.transform_layout(reindex_a, ("write", 0), a_map)
        sch.transform_layout(reindex_b, ("write", 0), b_map)
        sch.transform_layout(reindex_c, ("read", 0), c_map)
        sch.transform_block_layout(main, matmul_map)
        extents = [v.dom.extent for v in sch.get(main).iter_vars]
        if not all(isinstance(e, tirx.IntImm) for e in extents):
            return None  # dynamic shapes: leave them to dlight
        batch, m, n, k = (int(e.value) for e in extents)
        if min(m, n, k) < FRAG:
            return None
        config = self.configs.get(key) or default_config(m, n, k, batch, a_dtype, self.knobs)
        mma_ok = a_dtype == "int8" and _sm(target) >= cuda_mma.MMA_SM
        kern = _Kernel(key, sch, main, a_dtype, accumulators, batch, m, n, k, config, mma_ok)
        kern.family = next(f for f in FAMILIES if f.fits(kern))
        return kern

    def tile(self, kern: _Kernel) -> None:
        """Tiles and split-K: the GEMM padded to whole tiles; K split across thread blocks where the
        configuration asks (int32/float32 partial sums, added up by a second kernel); fragments blockized;
        the block tile over warps (threadIdx.y) and the grid (blockIdx)."""
        sch, t, split, family = kern.sch, kern.tiles, kern.config.split, kern.family
        assert family is not None
        k_frag = family.k_frag
        if split > 1 and not split_ok(kern.n, t.n):
            raise ValueError(f"split-K over a padded N ({kern.n} in tiles of {t.n}) wrote out of bounds: refused")
        kern.exact = kern.m % t.m == 0 and kern.n % t.n == 0 and kern.k % (t.k * split) == 0
        sch.pad_einsum(kern.main, [1, t.m, t.n, t.k * split])

        batch, i, j, kk = sch.get_loops(kern.main)
        if split > 1:
            ks, kk = sch.split(kk, factors=[split, None])
            kern.writeback, kern.main = kern.main, sch.rfactor(ks, factor_axis=0)
            batch, i, j, ks, kk = sch.get_loops(kern.main)  # in the rf block, ks is a spatial axis
            sch.reorder(ks, batch, i, j, kk)
            batch = sch.fuse(ks, batch)
        i, i_frag = sch.split(i, factors=[None, FRAG])
        j, j_frag = sch.split(j, factors=[None, FRAG])
        kk, kk_frag = sch.split(kk, factors=[None, k_frag])
        sch.reorder(i, j, kk, i_frag, j_frag, kk_frag)
        kern.inner = kern.main
        kern.outer = sch.blockize(i_frag)

        i0, i1, i2, i3 = sch.split(i, factors=[None, 1, t.i2, t.i3])
        j0, j1, j2, j3 = sch.split(j, factors=[1, None, t.j2, t.j3])
        k0, k1 = sch.split(kk, factors=[None, t.k // k_frag])
        kern.inner_pipeline = family.inner_pipeline()
        if kern.inner_pipeline:
            sch.annotate(k1, "software_pipeline_order", [0, 1, 2])
            sch.annotate(k1, "software_pipeline_stage", [0, 0, 1])
        sch.reorder(i0, j0, i1, j1, j2, i2, k0, k1, i3, j3)
        sch.bind(batch, "blockIdx.z")
        sch.bind(sch.fuse(i0, j0), "blockIdx.x")
        sch.bind(sch.fuse(i1, j1), "blockIdx.y")
        kern.warp = sch.fuse(j2, i2)
        sch.bind(kern.warp, "threadIdx.y")
        kern.k0, kern.k1 = k0, k1

    def stage_operands(self, kern: _Kernel, target: Target) -> None:
        """Operand staging: A and B copied to shared memory per K stage (the padding and the im2col gather
        happen in the global load), and the software pipelines over the stages."""
        sch, t, config, k0 = kern.sch, kern.tiles, kern.config, kern.k0
        warps = t.i2 * t.j2
        elem = 1 if kern.a_dtype == "int8" else 2
        align = OPERAND_ALIGN[kern.a_dtype]

        def to_shared(index: int) -> tuple[Any, bool]:
            """The operand's shared-memory stage and whether each thread's vector is contiguous in memory."""
            block = sch.cache_read(kern.outer, index, "shared.dyn")
            sch.compute_at(block, k0)
            auto_inline_producers(sch, block)
            rows, threads = (t.m if index == 0 else t.n), warps * WARP
            vector = 4  # elements per thread, raised to config.load_bytes where every thread gets whole vectors
            # from contiguous memory and the GEMM needs no padding: TVM 0.27's CUDA codegen writes a vector of
            # 8 or 16 narrow elements built lane by lane (the padding's zero; a strided gather, as NCHW
            # activations give) as make_int2/make_uint4 with 8 or 16 arguments, which nvcc rejects
            wide = kern.exact and _contiguous_k(sch, block, config.load_bytes // elem)
            while wide and vector * 2 * elem <= config.load_bytes and (rows * t.k) % (threads * vector * 2) == 0:
                vector *= 2
            row, k = sch.get_loops(block)[-2:]
            # one row's chunks on consecutive threads: coalesced global loads. A quarter warp's two rows (80
            # bytes apart) then share banks in its 16-byte shared stores (2 wavefronts, ncu); giving threads one
            # chunk of 8 rows (conflict-free, strided loads) was 0.84x INT8 and 0.41x FP16, and interleaving
            # the rows (conflict-free, coalesced) 1.01x at batch 64, 0.77x at batch 1 (docs/gpu.md "Schedule knobs")
            _, ty, tx, vec = sch.split(sch.fuse(row, k), factors=[None, warps, WARP, vector])
            sch.bind(tx, "threadIdx.x")
            sch.bind(ty, "threadIdx.y")
            sch.vectorize(vec)
            sch.storage_align(block, 0, axis=-2, factor=align[0], offset=align[1])
            return block, wide or _contiguous_k(sch, block, vector)

        copies = [to_shared(0), to_shared(1)]
        # pipelines: global -> shared over k0, shared -> fragments over k1 (k1 >= 2: an inner pipelined loop
        # of extent 1 is what breaks dlight's INT8 rule). Over k0, a configuration with `async_stages` copies
        # with cp.async into that many buffers (sm_80+; the copies run that many stages ahead less one) where
        # both operands' vectors are contiguous in memory: TVM 0.27 turns a strided vector (an FP16
        # classifier's K x N weights) into one cp.async of the wrong bytes, misaligned on the H200. Otherwise,
        # and on older GPUs, the copy goes through registers into two buffers. The orders and stages are MetaSchedule's
        # (multi_level_tiling_tensor_core.cc): k0's children are the A and B copies and the inner pipeline's
        # prologue, body and epilogue; with the register stage, each copy is two.
        kern.cp_async = _sm(target) >= ASYNC_SM and all(c for _, c in copies)
        stages = config.async_stages if kern.cp_async else 0
        # (without the inner pipeline, its prologue, body and epilogue are one child: the K step's compute)
        if stages >= 3:
            sch.annotate(k0, "software_pipeline_async_stages", [0])
            order, stage = ([0, 1, 3, 2, 4], [0, 0, stages - 2, stages - 1, stages - 1])
            if not kern.inner_pipeline:
                order, stage = [0, 1, 2], [0, 0, stages - 1]
        else:
            for block, _ in copies:
                sch.annotate(block, "tirx.manifest_shared_memory_local_stage", 1)
                sch.annotate(block, "double_buffer_scope", 0)
            order, stage = [0, 3, 1, 4, 5, 2, 6], [0, 0, 0, 0, 0, 1, 1]
            if not kern.inner_pipeline:
                order, stage = [0, 3, 1, 4, 2], [0, 0, 0, 0, 1]
        sch.annotate(k0, "software_pipeline_order", order)
        sch.annotate(k0, "software_pipeline_stage", stage)
        kern.stages = stages

    def fragments(self, kern: _Kernel) -> bool:
        """Fragments: operand fragments loaded from the stages per K step, the accumulator fragments stored
        through a shared-memory stage, each tensorized with the family's intrinsics (False: no accumulator
        dtype matches them)."""
        sch, t, family = kern.sch, kern.tiles, kern.family
        assert family is not None
        a_frag = sch.cache_read(kern.outer, 0, family.scope("a"))
        b_frag = sch.cache_read(kern.outer, 1, family.scope("b"))
        sch.compute_at(a_frag, kern.k1)
        sch.compute_at(b_frag, kern.k1)
        # the accumulator stage of tiles up to 64x64 (16 KB) in static shared memory: in shared.dyn beside
        # the operand stages, TVM 0.27's merge of dynamic shared memory fails for the small tiles (see
        # choose_tiles); larger tiles need shared.dyn (a 128x128 int32 stage is 64 KB)
        kern.acc_scope = "shared" if t.m * t.n <= STATIC_ACC else "shared.dyn"
        kern.acc_shared = sch.cache_write(kern.outer, 0, kern.acc_scope)
        store = kern.store = sch.cache_write(kern.outer, 0, family.scope("accumulator"))
        sch.reverse_compute_at(store, kern.warp)
        sch.reverse_compute_at(kern.acc_shared, kern.warp)
        si, sj = sch.get_loops(store)[-2:]
        si0, si1 = sch.split(si, factors=[None, FRAG])
        kern.sj0, sj1 = sch.split(sj, factors=[None, FRAG])
        sch.reorder(si0, kern.sj0, si1, sj1)
        init = sch.get_child_blocks(sch.decompose_reduction(kern.outer, kern.k0))[0]
        from .tensor_intrinsics import import_all

        import_all()  # TVM's tensor intrinsics registered (WMMA's; mma.py registers its own)

        def fragment_loads(intrins: dict[str, str]) -> None:
            for block, name in ((a_frag, "load_a"), (b_frag, "load_b")):
                fi, fj = sch.get_loops(block)[-2:]
                fi0, fi1 = sch.split(fi, factors=[None, FRAG])
                fj0, fj1 = sch.split(fj, factors=[None, family.k_frag])
                sch.reorder(fi0, fj0, fi1, fj1)
                sch.unroll(fi0)
                sch.unroll(fj0)
                if family.operand_layout() is not None:
                    sch.transform_layout(block, ("write", 0), family.operand_layout())
                sch.tensorize(fi1, intrins[name])

        layout = family.accumulator_layout(kern.writeback is not None)
        if layout is not None:
            sch.transform_layout(store, ("read", 0), layout)
        for n_try, acc in enumerate(kern.accumulators):
            intrins = family.intrins(kern.acc_scope, kern.a_dtype, acc)
            try:
                if n_try == 0:
                    fragment_loads(intrins)
                sch.tensorize(sch.get_loops(init)[-2], intrins["init"])
                sch.tensorize(sch.get_loops(store)[-2], intrins["store"])
                sch.tensorize(sch.get_loops(kern.inner)[-3], intrins["compute"])
                kern.acc = acc
                return True
            except Exception:  # tvm.s_tir.ScheduleError: the intrinsic does not match this accumulator
                if n_try == len(kern.accumulators) - 1:
                    return False
        return False

    def epilogue(self, kern: _Kernel) -> bool:
        """Epilogue: the accumulator stage's rows padded against bank conflicts, the kernel's epilogue (bias,
        ReLU, residual add, INT8 requantize) inlined into the copy out to global memory, split-K's partial
        sums added up (False: a block is left off the GPU)."""
        sch = kern.sch
        # rows of the accumulator stage 4 words (mod 16) longer than the tile: 64-word rows put every row of a
        # fragment in the same banks (ncu on the H200: 8-way conflicts on the fragment stores). The stage is
        # the buffer the tensorized fragment store writes (an alignment set before tensorize is dropped)
        [stored] = sch.get_child_blocks(kern.sj0)
        sch.storage_align(stored, 0, -2, *ACC_ALIGN)
        if kern.writeback is None:
            auto_inline_consumer_chain(sch, kern.acc_shared)  # the epilogue runs on the way out to global memory
        _store_epilogue(sch, kern.acc_shared, self.knobs.round_lanes, bool(self.knobs.unroll_epilogue))
        if kern.writeback is not None:
            _sum_partials(sch, kern.writeback)
        return _all_on_gpu(sch)


def _store_epilogue(sch: Any, acc_shared: Any, round_lanes: int = 1, unroll: bool = False) -> None:
    """The warp's copy from the accumulator stage to global memory, the epilogue inlined: 4 consecutive
    elements per thread as one vector, unless the epilogue rounds (the INT8 requantize): TVM 0.27's
    vectorizer cannot vectorize `T.nearbyint` and turns the whole vector into a loop of single elements,
    which made each thread store single bytes 4 apart (ncu on the H200: 8 of every 32 bytes stored per
    sector used). Those kernels give consecutive threads consecutive elements instead: each store
    instruction of the warp writes 32 contiguous bytes, and reads 32 consecutive words of the stage.

    `round_lanes` > 1 (Knobs.round_lanes): each thread of a rounding epilogue takes that many consecutive
    elements, reads their int32 sums from the stage as one vector into registers, rounds them one by one
    there, and stores the bytes as one vector (4 lanes: one 16-byte shared load and one 4-byte global
    store where there were 4 and 4).

    `unroll` (Knobs.unroll_epilogue): the warp's loop over its rows unrolled, so that nvcc can issue the
    loads of a residual (global memory) for every step before the first store instead of one per step."""
    rows, cols = sch.get_loops(acc_shared)[-2:]
    rounds = "T.nearbyint" in str(sch.get(acc_shared))
    lanes = round_lanes if rounds else 4
    width = sch.get(cols).extent
    # (at most 4: 4 int32 sums are the widest vector load; 8 made TVM 0.27 write vector types nvcc rejects)
    if rounds and (lanes not in (2, 4) or not isinstance(width, tirx.IntImm) or int(width) % lanes):
        lanes = 1
    if rounds and lanes > 1:
        out_local = sch.cache_write(acc_shared, 0, "local")
        # into registers as vectors: the int32 sums from the stage and a residual's bytes (global, indexed
        # like the output); per-channel scales stay scalar loads (they are the same across rows)
        reads = [r.source for r in sch.get(acc_shared).reads]
        names = [b.name for b in reads if b.scope().startswith("shared") or b.dtype in ("int8", "uint8")]
        in_locals = []
        for name in names:
            index = next(i for i, r in enumerate(sch.get(acc_shared).reads) if r.source.name == name)
            in_locals.append(sch.cache_read(acc_shared, index, "local"))
    vec = None
    if lanes > 1:
        cols, vec = sch.split(cols, factors=[None, lanes])  # the vector off the columns alone: lane-invariant rows
    steps, tx = sch.split(sch.fuse(rows, cols), factors=[None, WARP])
    sch.bind(tx, "threadIdx.x")
    if unroll:
        sch.unroll(steps)
    if vec is None:
        return
    if not rounds:
        sch.vectorize(vec)
        return
    sch.unroll(vec)
    for block in in_locals:
        sch.compute_at(block, tx)
    sch.reverse_compute_at(out_local, tx)
    bound = sch.get(tx).loop_var
    for block in (*in_locals, out_local):  # the loops under the thread's: its lanes, as one vector
        loops = sch.get_loops(block)
        inner = loops[1 + next(i for i, loop in enumerate(loops) if sch.get(loop).loop_var.same_as(bound)) :]
        sch.vectorize(sch.fuse(*inner) if len(inner) > 1 else inner[0])


def _contiguous_k(sch: Any, block: Any, lanes: int) -> bool:
    """Whether `lanes` consecutive K elements of the shared-memory stage `block` (its producers inlined)
    come from consecutive addresses of every buffer it reads: NHWC/OHWI convolutions with channels a
    multiple of `lanes` and row-major matmuls do; NCHW activations (K = channels, H*W apart) do not.
    Each index is written as a sum of splits of the block's iterators (TVM's iter-affine analysis): the
    innermost must hold K itself (scale 1, extent a multiple of `lanes`), the others only K // lanes-multiples."""
    from tvm.sym import normalize_to_iter_sum

    stmt = sch.get(block)
    domains = {v.var: v.dom for v in stmt.iter_vars}
    k = stmt.iter_vars[-1].var
    for read in stmt.reads:
        *outer, inner = read.region
        try:
            sums = [normalize_to_iter_sum(r.min, domains) for r in (*outer, inner)]
        except Exception:  # not affine in the block's iterators
            return False
        for dim, total in enumerate(sums):
            last = dim == len(sums) - 1
            splits = [a for a in total.args if a.source.source.same_as(k)]
            if last:
                ok = len(splits) == 1 and int(splits[0].lower_factor) == 1 and int(splits[0].scale) == 1
                if not ok or int(splits[0].extent) % lanes:
                    return False
            elif any(int(a.lower_factor) % lanes for a in splits):
                return False
    return True


def _all_on_gpu(sch: Any) -> bool:
    """Every top-level block runs under a thread binding: a block left unscheduled would be lowered to host
    code that reads GPU memory (a segfault, seen with a split-K residual epilogue before it was inlined)."""
    for block in sch.get_child_blocks(get_root_block(sch)):
        if not any(sch.get(loop).kind == tirx.ForKind.THREAD_BINDING for loop in sch.get_loops(block)):
            return False
    return True


def _sum_partials(sch: Any, writeback: Any) -> None:
    """The split-K second kernel: one thread per output adds the partial sums, then runs the epilogue."""
    tail = sch.get_consumers(writeback)[0]  # un-padding, un-reindexing and the epilogue, inlined into one
    auto_inline_consumer_chain(sch, tail)  # (with the epilogue's other inputs: a residual's dequantize)
    sch.set_scope(writeback, 0, "local")  # the sum lives in a register between the two
    *spatial, _ks = sch.get_loops(writeback)
    bx, tx = sch.split(sch.fuse(*spatial), factors=[None, 128])
    sch.bind(bx, "blockIdx.x")
    sch.bind(tx, "threadIdx.x")
    sch.reverse_compute_at(tail, tx)


def fusion_passes(knobs: Knobs) -> list[Any]:
    """Legalization and fusion into kernels, as every CUDA build and its tuning module (tuning.tuning_module)
    run them: INT8 convolutions padding themselves (cuda_conv_pad), then TVM's "zero" pipeline with, after
    FuseOps, INT8 tensors at kernel boundaries (int8_boundaries.py). FuseTIR is last."""
    from .conv_pad import pad_into_conv
    from .int8_boundaries import dequantize_in_consumers

    boundaries = tvm.transform.module_pass(lambda mod, _ctx: dequantize_in_consumers(mod), 0, "int8_boundaries")
    return [
        pad_into_conv,
        tvm.relax.transform.LegalizeOps(),
        tvm.relax.transform.AnnotateTIROpPattern(),
        tvm.relax.transform.FoldConstant(),
        tvm.relax.transform.FuseOps(),
        *([boundaries] if knobs.int8_boundaries else []),
        tvm.relax.transform.FuseTIR(),
    ]


def legalize_passes(target: Target, rule: TensorCoreGemm | None = None) -> list[Any]:
    """TVM's CUDA legalization passes with `TensorCoreGemm` ahead of dlight's default rules,
    `WindowReduction` (pooling, depthwise convolutions) ahead of its reduction rules and
    `VectorizedInjective` (pads, casts, transposes) ahead of its Fallback."""
    from tvm.s_tir import dlight as dl

    from .injective import VectorizedInjective
    from .window import WindowReduction

    rule = rule or TensorCoreGemm()
    return [
        *fusion_passes(rule.knobs),
        dl.ApplyDefaultSchedule(
            rule,
            dl.gpu.Matmul(),
            WindowReduction(rule.knobs),
            dl.gpu.GEMV(),
            dl.gpu.Reduction(),
            dl.gpu.GeneralReduction(),
            VectorizedInjective(rule.knobs),
            dl.gpu.Fallback(),
        ),
    ]


def cuda_pipeline(target: Target, tensor_cores: bool = True, rule: TensorCoreGemm | None = None) -> Any:
    """`relax.backend.cuda.get_default_pipeline(target)`, with tensor-core convolutions when asked (by
    `rule`, when given: its knobs and tuned configurations; it records what it applied)."""
    from tvm.relax.backend.cuda import pipeline as cuda

    if not tensor_cores:
        return cuda.get_default_pipeline(target)

    @tvm.transform.module_pass(opt_level=0)  # type: ignore[untyped-decorator]
    def _pipeline(mod: Any, _ctx: Any) -> Any:
        with target:
            passes = (
                cuda.library_dispatch_passes(target)
                + legalize_passes(target, rule)
                + cuda.dataflow_lower_passes(target)
                + cuda.finalize_passes(target)
            )
            return tvm.transform.Sequential(passes)(mod)

    return _pipeline
