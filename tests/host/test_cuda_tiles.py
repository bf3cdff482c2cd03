"""Tile shapes and split-K of the tensor-core schedule (compile/cuda/tensorcore.py), checked on the
scheduled TIR (no nvcc needed): a batch-1 ResNet-18 layer4 convolution got 4 thread blocks from the shape
rule alone; now the grid has enough blocks for a large GPU, and K is split across blocks where tiles
cannot shrink further, with the epilogue moved to the kernel that adds the partial sums."""

from __future__ import annotations

import re

import numpy as np
import pytest
import tvm
from tvm import relax

from edgedeploy.compile.cuda.tensorcore import legalize_passes
from edgedeploy.compile.cuda.tiles import MIN_BLOCKS, SPLIT_BLOCKS, choose_split, choose_tiles
from tests.host.cuda import TARGET
from tests.host.models import int8_conv_model


@pytest.mark.parametrize(
    ("m", "n", "k"),
    [(49, 512, 4608), (196, 256, 2304), (784, 128, 1152), (3136, 64, 576), (49 * 64, 512, 4608), (200704, 64, 147)],
)
def test_grid_fills_the_gpu_or_tiles_are_smallest(m: int, n: int, k: int) -> None:
    t = choose_tiles(m, n, "int8")
    split = choose_split(t, 1, m, n, k)
    blocks = -(-m // t.m) * -(-n // t.n)
    if blocks < MIN_BLOCKS:  # the tiles could not shrink further: K is split instead, within bounds
        assert (t.m, t.n) == (16, 32)
        assert split > 1 and blocks * split <= SPLIT_BLOCKS and -(-k // t.k) // split >= 8
    else:
        assert split == 1
    if m * n >= 128 * 128 * MIN_BLOCKS:  # large GEMMs keep the large tiles
        assert t.m == 128 and t.n >= 64


def _int8_conv(batch: int, channels: int, size: int) -> object:
    """`int8_conv_model`, legalized, fused and scheduled as CUDA builds do."""
    target = tvm.target.Target(TARGET)
    with target:
        return tvm.transform.Sequential(legalize_passes(target))(int8_conv_model(batch, channels, size))


def _kernel_script(mod: object, name: str) -> str:
    """The scheduled kernel whose name has `name`, after checking that all its top-level blocks run on the
    GPU (a block left without a thread binding is lowered to host code reading GPU memory: a segfault)."""
    from tvm import s_tir

    from edgedeploy.compile.cuda.tensorcore import _all_on_gpu

    func = next(f for gv, f in mod.functions.items() if name in gv.name_hint)  # type: ignore[attr-defined]
    assert _all_on_gpu(s_tir.Schedule(func))
    return str(func.script())


def _conv_kernel_script(mod: object) -> str:
    return _kernel_script(mod, "conv2d")


def test_small_batch_conv_is_split_across_blocks_with_the_epilogue_after_the_sum() -> None:
    script = _conv_kernel_script(_int8_conv(batch=1, channels=512, size=7))  # ResNet-18 layer4 at batch 1
    assert "wmma.mma_sync" in script or "tvm_mma_sync" in script, script[:3000]
    assert "_rf" in script  # the partial sums: one int32 plane per K slice
    grids = [int(g) for g in re.findall(r'T.int64\((\d+)\), thread="blockIdx.[xyz]"', script)]
    assert grids and max(grids) > 4, grids  # more than the 4 blocks of the shape rule
    # the requantize (round, clip, cast to int8) runs where the partial sums are added, not in the GEMM
    assert "T.nearbyint" in script and 'T.Cast("int8"' in script


def test_large_batch_conv_is_not_split() -> None:
    script = _conv_kernel_script(_int8_conv(batch=16, channels=512, size=7))
    assert "wmma.mma_sync" in script or "tvm_mma_sync" in script
    assert "_rf" not in script


def test_int8_operands_load_16_bytes_per_thread_where_the_gemm_needs_no_padding() -> None:
    """Knobs' defaults (bench/conv_variants.py on the H200: 1.15-1.47x on ResNet-18's 3x3 INT8 layers): 64 K
    elements per shared-memory stage and 16-byte global loads; the loads stay 4 bytes where the GEMM is
    padded (TVM 0.27 writes the padding's zero vector of 8 or 16 int8 as a make_int2/make_int4 call that
    nvcc rejects)."""
    from edgedeploy.compile.config import Knobs
    from edgedeploy.compile.cuda.tiles import SHORT_K, Tiles

    assert (Knobs().int8_k, Knobs().load_bytes) == (64, 16)
    assert choose_tiles(3136, 64, "int8", 64, Knobs(), k=576).k == 64
    assert choose_tiles(802816, 64, "int8", 1, Knobs(), k=196).k == 32 < SHORT_K  # the stem: short K
    # many blocks: 64x64 outputs per warp (layer1 at batch 64, 1568 blocks); few: 32x32 (layer4, 100 blocks)
    assert choose_tiles(200704, 64, "int8", 1, Knobs(), k=576) == Tiles(2, 4, 1, 4, 4)
    assert choose_tiles(3136, 512, "int8", 1, Knobs(), k=4608) == Tiles(4, 2, 4, 2, 4)
    assert choose_tiles(200704, 64, "float16", 1, Knobs(), k=576) == Tiles(4, 2, 2, 2, 4)  # FP16 unmeasured
    exact = _conv_kernel_script(_int8_conv(batch=64, channels=64, size=8))  # M = 4096 = 32 tiles of 128
    padded = _conv_kernel_script(_int8_conv(batch=1, channels=64, size=7))  # M = 49: padded to 64

    def lanes(script: str) -> list[int]:  # the two operand loads, first in the kernel (the epilogue's come last)
        return [int(n) for n in re.findall(r"in T.vectorized\(T.int64\((\d+)\)\)", script)][:2]

    assert lanes(exact) == [16, 16], exact[:3000]
    assert lanes(padded) == [4, 4]


@pytest.mark.compile
def test_epilogue_stores_are_coalesced_and_the_accumulator_stage_is_padded() -> None:
    """What ncu showed on the H200 in every INT8 GEMM kernel of ResNet-18: 8-way bank conflicts where the
    fragments are stored to the shared-memory accumulator stage (its 64-word rows all began in bank 0), and
    only 8 of every 32 bytes of a sector used by the epilogue's global stores (TVM 0.27 turned its 4-lane
    vector into a loop of single bytes, each thread's 4 apart: `T.nearbyint` does not vectorize). Checked on
    the CUDA source: the fragment store's row stride is not a multiple of 32 words, and the requantizing
    epilogue's int8 store (and its residual's load) is indexed by threadIdx.x itself, so a warp writes 32
    consecutive bytes (16 in warp tiles 16 columns wide) per instruction; an epilogue without rounding keeps
    4-lane vectors."""
    from edgedeploy.compile.config import Knobs
    from edgedeploy.compile.cuda.tensorcore import TensorCoreGemm
    from tests.host.cuda import cuda_source

    # (one element per thread and step: Knobs.round_lanes = 1; the default's vectors are the next test's; a loop
    # of steps, not unrolled, so that its one store is read below: the unrolled epilogue is test_epilogue_unrolled)
    knobs = Knobs(round_lanes=1, unroll_epilogue=0)
    src = cuda_source(int8_conv_model(64, 64, 8), TensorCoreGemm(knobs)).split("__global__")[-1]
    strides = [int(n) for n in re.findall(r"store_matrix_sync\(.*, (\d+), nvcuda::wmma::mem_row_major\)", src)]
    assert strides and all(s % 32 for s in strides), strides
    [store] = [line for line in src.splitlines() if re.match(r"\s*compute\w*_ptr\[", line)]
    lane = r"\+ \(+\(int\)threadIdx.x\)( & (15|31)\))?\)\]"  # + tx, or + (tx & 15) in 16-column warp tiles
    assert re.search(lane + " = ", store) and "_s < 4" not in src, store
    assert re.search(r"r_ptr\[[^]]*" + lane, store), store
    bb = relax.BlockBuilder()  # an FP16 GEMM: the epilogue casts without rounding, as float4 vectors
    x = relax.Var("x", relax.TensorType((256, 128), "float16"))
    w = (np.random.default_rng(3).standard_normal((128, 128)) * 0.1).astype("float16")
    with bb.function("main", [x]):
        with bb.dataflow():
            out = bb.emit_output(bb.emit(relax.op.nn.relu(relax.op.matmul(x, relax.const(w)))))
        bb.emit_func_output(out)
    fp16 = cuda_source(bb.get()).split("__global__")[-1]
    assert "store_matrix_sync" in fp16 and re.search(r"\*\(half4\*\)\(\w*compute\w*_ptr", fp16), fp16[-2500:]


@pytest.mark.compile
@pytest.mark.parametrize("mma", [0, 1])
def test_rounding_epilogue_with_round_lanes_moves_vectors(mma: int) -> None:
    """Knobs.round_lanes = 4: each thread of a requantizing epilogue takes 4 consecutive outputs, reads their
    int32 sums from the accumulator stage as one 16-byte vector and the residual's 4 bytes as one word, rounds
    in registers, and stores the 4 bytes as one word: a quarter of the epilogue's iterations, loads and
    stores (WMMA and mma accumulators alike)."""
    from edgedeploy.compile.config import Knobs
    from edgedeploy.compile.cuda.tensorcore import TensorCoreGemm
    from tests.host.cuda import cuda_source

    def epilogue(lanes: int) -> str:
        knobs = Knobs(round_lanes=lanes, int8_mma=mma, unroll_epilogue=0)
        src = cuda_source(int8_conv_model(64, 64, 8), TensorCoreGemm(knobs))
        return src.split("__global__")[-1].split("__syncthreads();")[-1]

    assert Knobs().round_lanes == 4  # the default since run21 (1.05x on ResNet-18 INT8 batch 64, bit-identical)
    one, four = epilogue(1), epilogue(4)
    steps = [int(re.search(r"< (\d+); \+\+", e).group(1)) for e in (one, four)]  # type: ignore[union-attr]
    assert steps[0] == 4 * steps[1], (one, four)
    stage_vector = r"\*\(int4\*\)\(\w+_local_ptr \+ 0\) = \*\(int4\*\)\("  # 4 sums from the stage
    assert "*(int4*)" not in one and re.search(stage_vector, four), four
    assert re.search(r"\*\(int\*\)\(r_local_ptr \+ 0\) = \*\(int\*\)\(r_ptr", four), four  # the residual
    assert re.search(r"^\s*\*\(int\*\)\(compute\w*_ptr \+", four, re.M), four  # the 4 output bytes
    assert four.count("__edgedeploy_rq(") == 4  # rounded one by one, unrolled (on the FP32 pipe: cuda_source)


@pytest.mark.compile
def test_epilogue_steps_are_unrolled() -> None:
    """Knobs.unroll_epilogue (1 since run24): a warp's epilogue steps are unrolled, so that nvcc can issue
    every step's residual load before the first store (in the loop, each step waited for its own global load;
    seen in the SASS of ResNet-18's residual convolutions); 0 keeps the loop."""
    from edgedeploy.compile.config import Knobs
    from edgedeploy.compile.cuda.tensorcore import TensorCoreGemm
    from tests.host.cuda import cuda_source

    def epilogue(unroll: int) -> str:
        src = cuda_source(int8_conv_model(64, 64, 8), TensorCoreGemm(Knobs(unroll_epilogue=unroll)))
        return src.split("__global__")[-1].split("__syncthreads();")[-1]

    assert Knobs().unroll_epilogue == 1
    looped, unrolled = epilogue(0), epilogue(1)
    loop = re.search(r"for \(int \w+ = 0; \w+ < (\d+); \+\+\w+\) \{", looped)
    assert loop and int(loop.group(1)) > 1 and "for (" not in unrolled, unrolled
    residual = r"= \*\(int\*\)\(r_ptr"  # the residual's 4 bytes, one load per step
    assert len(re.findall(residual, looped)) == 1 and len(re.findall(residual, unrolled)) == int(loop.group(1))


def test_strided_operands_keep_4_element_loads() -> None:
    """An NCHW convolution's K (channels) lies H*W apart in memory: its loads stay 4 elements wide (a wider
    strided gather made TVM 0.27 emit make_uint4 with 8 fp16 arguments, which nvcc rejects: MobileNet)."""
    rng = np.random.default_rng(1)
    bb = relax.BlockBuilder()
    x = relax.Var("x", relax.TensorType((64, 64, 28, 28), "float16"))
    w = (rng.standard_normal((128, 64, 1, 1)) * 0.1).astype("float16")
    with bb.function("main", [x]):
        with bb.dataflow():
            out = bb.emit_output(bb.emit(relax.op.nn.conv2d(x, relax.const(w))))
        bb.emit_func_output(out)
    target = tvm.target.Target(TARGET)
    with target:
        mod = tvm.transform.Sequential(legalize_passes(target))(bb.get())
    script = _conv_kernel_script(mod)
    assert "wmma.mma_sync" in script or "tvm_mma_sync" in script, script[:3000]
    assert [int(n) for n in re.findall(r"in T.vectorized\(T.int64\((\d+)\)\)", script)][:2] == [4, 4]


SM90 = {**TARGET, "arch": "sm_90", "max_shared_memory_per_block": 232448}


def _scheduled_on(target_spec: dict[str, object], mod: object, name: str, async_stages: int) -> tuple[str, bool]:
    """The kernel `name` of `mod` scheduled for a target with the knob async_stages, and whether the rule
    found its copies fit for cp.async."""
    from edgedeploy.compile.config import Knobs
    from edgedeploy.compile.cuda.tensorcore import TensorCoreGemm

    rule = TensorCoreGemm(Knobs(async_stages=async_stages))
    target = tvm.target.Target(target_spec)
    with target:
        script = _kernel_script(tvm.transform.Sequential(legalize_passes(target, rule))(mod), name)
    [shape] = rule.seen.values()
    return script, shape.cp_async


def _fp16_classifier() -> object:
    """A classifier as ResNet-18's ONNX Gemm becomes: x (64 x 512) times a constant weight stored K x N (the
    transposition folded), so K is strided in memory."""
    w = (np.random.default_rng(2).standard_normal((1000, 512)) * 0.05).astype("float16")
    bb = relax.BlockBuilder()
    x = relax.Var("x", relax.TensorType((64, 512), "float16"))
    with bb.function("main", [x]):
        with bb.dataflow():
            out = bb.emit_output(bb.emit(relax.op.matmul(x, relax.op.permute_dims(relax.const(w)))))
        bb.emit_func_output(out)
    return bb.get()


def test_sm90_pipelines_copy_with_cp_async_only_from_contiguous_memory() -> None:
    """sm_80+ with async_stages (a tuned configuration, or the knob): the operand copies are asynchronous (3
    shared-memory stages, no register stage) where every thread's vector is contiguous in memory (NHWC/OHWI
    convolutions). A K x N weight keeps the register path, which loads it element by element: TVM 0.27 made
    one 8-byte cp.async of the wrong bytes of it (the H200 said misaligned address in ResNet-18's FP16
    classifier). sm_75 never has cp.async; the default has none either."""
    conv = int8_conv_model(64, 64, 8)
    default, fit = _scheduled_on(SM90, conv, "conv2d", 0)
    assert fit and "software_pipeline_async_stages" not in default
    asynchronous, _ = _scheduled_on(SM90, conv, "conv2d", 3)
    assert "tvm_mma_sync" in asynchronous or "wmma.mma_sync" in asynchronous
    assert '"software_pipeline_async_stages": [0]' in asynchronous, asynchronous[:3000]
    assert '"software_pipeline_stage": [0, 0, 1, 2, 2]' in asynchronous
    assert "manifest_shared_memory_local_stage" not in asynchronous
    for target, mod, name in ((SM90, _fp16_classifier(), "matmul"), (TARGET, conv, "conv2d")):
        script, fit = _scheduled_on(target, mod, name, 3)
        assert "tvm_mma_sync" in script or "wmma.mma_sync" in script
        assert not fit and "software_pipeline_async_stages" not in script
        assert "manifest_shared_memory_local_stage" in script


def _lowered_shared_bytes(mod: object, target: object) -> dict[str, tuple[int, int]]:
    """(dynamic, static) shared memory of each kernel of `mod`, read from TVM's lowered device TIR (the merged
    shared.dyn allocation; the static shared allocations)."""
    from tvm.tirx.build import split_host_device_mods

    prim = tvm.IRModule({gv: f for gv, f in mod.functions.items() if isinstance(f, tvm.tirx.PrimFunc)})  # type: ignore[attr-defined]
    prim = tvm.tirx.transform.BindTarget(target.with_host(tvm.target.Target("llvm")))(prim)  # type: ignore[attr-defined]
    _, devices = split_host_device_mods(tvm.tirx.get_default_tir_pipeline(target)[0](prim))
    size = {"int32": 4, "float32": 4, "float16": 2, "int8": 1, "uint8": 1}
    out = {}
    for device in devices.values():
        for gv, func in device.functions.items():
            script = func.script()
            static = sum(int(n) * size[d] for n, d in re.findall(r'T.alloc_shared\(\((\d+),\), "(\w+)"\)', script))
            dynamic = sum(
                int(n) for n in re.findall(r'T.alloc_buffer\(\((\d+),\), "uint8", scope="shared.dyn"\)', script)
            )
            out[gv.name_hint] = (dynamic, static)
    return out


@pytest.mark.parametrize(
    ("size", "tiles"),
    [
        (8, "64x64-k64-v16-s1"),  # static accumulator (int32)
        (16, "128x64w-k64-v16-s1"),  # accumulator in shared.dyn
        (8, "64x64-k64-v16-s1-a3"),  # 3 cp.async stages
    ],
)
def test_shared_memory_estimate_is_what_tvm_allocates(size: int, tiles: str) -> None:
    """cuda_tiles.shared_bytes, which keeps kernels TVM's runtime could not launch out of builds and of the GEMM
    search (`launchable`), equals the shared memory of TVM's lowered kernel."""
    from edgedeploy.compile.cuda.tensorcore import TensorCoreGemm, kernel_key
    from edgedeploy.compile.cuda.tiles import GemmConfig, shared_bytes

    config = GemmConfig.parse(tiles)
    target = tvm.target.Target(SM90)
    model = int8_conv_model(64, 64, size)
    with target:
        fused = tvm.transform.Sequential(legalize_passes(target)[:-1])(model)
        [(name, func)] = [(gv.name_hint, f) for gv, f in fused.functions.items() if "conv2d" in gv.name_hint]
        rule = TensorCoreGemm(configs={kernel_key(func): config})
        mod = tvm.transform.Sequential(legalize_passes(target, rule))(model)
        lowered = _lowered_shared_bytes(mod, target)  # (sm_90: on sm_75 a pass of 0.27's TIR pipeline fails here)
    assert rule.applied, "the configuration was not applied"
    buffers = max(config.async_stages if next(iter(rule.seen.values())).cp_async else 0, 2)
    assert lowered[name] == shared_bytes(config.tiles, "int8", buffers, 4)


def test_configurations_that_could_not_launch_are_never_tried() -> None:
    """A 128x32 INT8 tile with 3 cp.async stages: 38400 bytes of operand stages (dynamic, under 48 KB) beside an
    18432-byte static accumulator stage. TVM's runtime does not opt such a kernel in to over 48 KB of shared
    memory, so it cannot launch (the H200 said so); the search no longer offers it."""
    from edgedeploy.compile.cuda.tiles import GemmConfig, launchable, neighbours, shared_bytes

    bad = GemmConfig.parse("128x32-k64-v16-s1-a3")
    assert shared_bytes(bad.tiles, "int8", 3, 4) == (38400, 18432)
    assert not launchable(38400, 18432) and launchable(49152, 18432) and launchable(30720, 17408)
    tried = neighbours(200704, 64, 576, 1, "int8", cp_async=True)
    assert bad not in tried and GemmConfig.parse("128x32-k64-v16-s1") in tried


def test_launchable_rejects_exactly_what_failed_to_launch_on_the_h200() -> None:
    """Every candidate the H200's GEMM searches recorded (profiles/tuning/h200/*/gemm_configs.json): those whose
    launch failed ("error: grid=..., block=...") are exactly those `launchable` rejects; all that were timed
    pass it (with the accumulator the FP16 kernels of those models have: float16)."""
    import json
    from pathlib import Path

    from edgedeploy.compile.cuda.tiles import GemmConfig, launchable, shared_bytes

    failed = 0
    for db in sorted((Path(__file__).resolve().parents[2] / "profiles/tuning/h200").glob("*/gemm_configs.json")):
        for kernel in json.loads(db.read_text())["kernels"].values():
            dtype = "int8" if kernel["shape"].endswith("int8") else "float16"
            # a kernel timed before the search timed as in the model keeps what it timed as `hint` (all launched)
            timed = [(c, 1.0) for c in kernel.get("hint", [])] + [(kernel["default"], kernel.get("default_ms", 1.0))]
            for text, result in [*timed, *kernel["tried"].items()]:
                if not isinstance(result, float) and "grid=" not in str(result):
                    continue  # another kind of error: says nothing about launching
                c = GemmConfig.parse(text)
                fits = launchable(*shared_bytes(c.tiles, dtype, max(c.async_stages, 2), 4 if dtype == "int8" else 2))
                assert fits == isinstance(result, float), (db.parent.name, kernel["name"], text, result)
                failed += not fits
    assert failed > 0  # the databases do hold launch failures


def test_k_is_never_split_where_n_is_padded() -> None:
    """ResNet-18's FP16 classifier (N = 1000 classes in 32-wide tiles, padded) split by 2 wrote out of bounds on
    the H200 (compute-sanitizer, run19): no default, no search candidate and no stored configuration gets it."""
    from tvm import relax

    from edgedeploy.compile.cuda.tensorcore import TensorCoreGemm, kernel_key
    from edgedeploy.compile.cuda.tiles import GemmConfig, neighbours, split_ok

    assert split_ok(512, 32) and not split_ok(1000, 32)
    assert choose_split(choose_tiles(16, 1000, "float16"), 1, 16, 1000, 4096) == 1
    assert choose_split(choose_tiles(16, 1024, "float16"), 1, 16, 1024, 4096) > 1  # the same GEMM, N unpadded
    assert all(c.split == 1 for c in neighbours(64, 1000, 512, 1, "float16"))
    assert any(c.split > 1 for c in neighbours(64, 1024, 512, 1, "float16"))

    bb = relax.BlockBuilder()
    x = relax.Var("x", relax.TensorType((64, 512), "float16"))
    with bb.function("main", [x]):
        with bb.dataflow():
            y = bb.emit(relax.op.matmul(x, relax.const(np.zeros((512, 1000), "float16")), out_dtype="float16"))
            out = bb.emit_output(y)
        bb.emit_func_output(out)
    mod = relax.transform.LegalizeOps()(bb.get())
    (func,) = [f for f in mod.functions.values() if isinstance(f, tvm.tirx.PrimFunc)]
    stored = GemmConfig.parse("16x32-k64-v16-s2")  # what the run19 search had kept
    rule = TensorCoreGemm(configs={kernel_key(func): stored})
    with pytest.raises(ValueError, match="padded N"):
        rule.schedule(func, tvm.target.Target(TARGET))


def test_int8_mma_is_a_search_choice_with_two_32_deep_steps_per_stage() -> None:
    """GemmConfig.mma (cuda/mma.py): written `-m` after the cp.async stages and parsed in either order; the
    search offers it for INT8 where the GPU has it (GemmShape.mma), always with a 64-deep K stage, never for
    FP16 or below 64; the default asks for it only with the int8_mma knob and a K of at least 64."""
    from edgedeploy.compile.config import Knobs
    from edgedeploy.compile.cuda.tiles import GemmConfig, default_config, neighbours

    c = GemmConfig.parse("128x64-k64-v16-s1-a3-m")
    assert c.mma and c.async_stages == 3 and c.text == "128x64-k64-v16-s1-a3-m"
    assert GemmConfig.parse("128x64-k64-v16-s1-m-a3") == c
    assert not GemmConfig.parse("128x64-k64-v16-s1-a3").mma

    tried = neighbours(200704, 64, 576, 1, "int8", cp_async=True, mma=True)
    with_mma = [t for t in tried if t.mma]
    assert with_mma and all(t.stage == 64 for t in with_mma)
    assert any(t.mma and t.async_stages for t in tried) and any(t.mma and not t.async_stages for t in tried)
    assert not any(t.mma for t in neighbours(200704, 64, 576, 1, "int8", cp_async=True))  # (no sm_80+)
    assert not any(t.mma for t in neighbours(200704, 64, 576, 1, "float16", mma=True))

    assert not default_config(200704, 64, 576, 1, "int8").mma  # WMMA unless asked
    assert default_config(200704, 64, 576, 1, "int8", Knobs(int8_mma=1)).mma
    assert not default_config(200704, 64, 576, 1, "float16", Knobs(int8_mma=1)).mma
    assert not default_config(802816, 64, 32, 1, "int8", Knobs(int8_mma=1)).mma  # K 32: one step per stage


def test_stages_of_128_only_where_k_is_a_whole_number_of_them() -> None:
    """cuda_tiles.stages_of: around an INT8 mma configuration or an FP16 one the search tries 128-deep K
    stages where K divides into them (ResNet-18 layer4, K 4608), not where K would be padded (layer1's 576:
    the loads would drop to 4 bytes), and never with INT8 WMMA (TVM 0.27's shared-memory merge fails)."""
    from edgedeploy.compile.cuda.tiles import GemmConfig, refinements

    layer4 = refinements(GemmConfig.parse("64x64-k64-v16-s1-a3-m"), 3136, 512, 4608, "int8", cp_async=True, mma=True)
    deep = [c for c in layer4 if c.stage == 128]
    assert GemmConfig.parse("64x64-k128-v16-s1-a3-m") in deep and all(c.mma for c in deep)
    assert GemmConfig.parse("64x64-k128-v16-s1-a3-m").text == "64x64-k128-v16-s1-a3-m"
    back = refinements(GemmConfig.parse("64x64-k128-v16-s1-a3-m"), 3136, 512, 4608, "int8", cp_async=True, mma=True)
    assert GemmConfig.parse("64x64-k64-v16-s1-a3-m") in back  # and back to 64
    assert GemmConfig.parse("64x64-k64-v16-s1-a3") in back  # WMMA: at most 64
    layer1 = refinements(GemmConfig.parse("128x64w-k64-v16-s1-m"), 200704, 64, 576, "int8", cp_async=True, mma=True)
    assert layer1 and not any(c.stage == 128 for c in layer1)
    wmma = refinements(GemmConfig.parse("64x64-k64-v16-s1-a3"), 3136, 512, 4608, "int8", cp_async=True, mma=True)
    assert {c.stage for c in wmma if c.mma} == {64, 128} and not any(c.stage == 128 and not c.mma for c in wmma)
    fp16 = refinements(GemmConfig.parse("64x64-k64-v16-s1-a3"), 3136, 512, 4608, "float16", cp_async=True)
    assert GemmConfig.parse("64x64-k128-v16-s1-a3") in fp16 and not any(c.mma for c in fp16)
    fp16_layer1 = refinements(GemmConfig.parse("128x64-k64-v16-s1"), 200704, 64, 576, "float16", cp_async=True)
    assert {c.stage for c in fp16_layer1} == {32, 64}
