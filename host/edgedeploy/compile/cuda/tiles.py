"""What the tensor-core GEMM schedule (cuda/tensorcore.py) chooses per kernel, and how it chooses by default.

One kernel's choices are a `GemmConfig`: the output tile of a thread block, how the warps split it, K
elements per shared-memory stage, bytes per thread per global load, and thread blocks splitting K.
`default_config` derives it from the GEMM's shape (rules measured on the H200, below); a tuning run
(tuning/gemm.py) measures the neighbours of that default on the GPU and stores the faster ones per kernel,
which builds then apply instead.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace

from ..config import Knobs

WARP = 32
FRAG = 16  # WMMA m16n16k16 for f16 and s8; the M and N of an mma fragment
MMA_K = 32  # K of one INT8 mma.sync m16n8k32 step (cuda/mma.py)


@dataclass(frozen=True)
class Tiles:
    """Fragments per warp (i3, j3), warps per block (i2, j2), K fragments per shared-memory stage (k1)."""

    i2: int
    i3: int
    j2: int
    j3: int
    k1: int

    @property
    def m(self) -> int:
        return FRAG * self.i2 * self.i3

    @property
    def n(self) -> int:
        return FRAG * self.j2 * self.j3

    @property
    def k(self) -> int:
        return FRAG * self.k1


# Fewer thread blocks than this leave most of a large GPU idle (the H200 has 132 SMs, a T4 40): a batch-1
# ResNet-18 layer4 convolution (M = 7x7 pixels, N = 512) got 4 blocks of 64x128 outputs from the
# shape rule alone, each walking K = 4608 on its own.
MIN_BLOCKS = 96
SPLIT_BLOCKS = 256
_ROWS = {128: (4, 2), 64: (2, 2), 32: (2, 1), 16: (1, 1)}  # tile edge -> (warps, fragments per warp)
_WIDE_ROWS = {**_ROWS, 128: (2, 4), 64: (1, 4)}  # INT8 "wide" warps: 4 fragments per warp on long edges


# cp.async stages: 3 where the search turns cp.async on. Deeper pipelines (DEEP_STAGES) only around a
# fastest configuration that has them (`refinements`): they need shared memory a small tile has to spare,
# and TVM 0.27 launches a kernel with over 48 KB only where its dynamic part alone is that large
# (`launchable`: 64x64 INT8 tiles with 4 stages are 40 + 17 KB, refused; 5 are 51 + 17 KB)
ASYNC_STAGES = 3
DEEP_STAGES = (4, 5)
SHORT_K = 256  # a GEMM with fewer K elements (the stem: 7x7x4 = 196) takes 32 per stage: less padding
# K elements per shared-memory stage the search tries (`stages_of`). 128 halves the barriers and cp.async waits
# per multiply-add (a 64x64 INT8 tile's warps did 8 mma between two barriers at 64): FP16, and INT8 with mma
# (64 bytes were half an FP16 stage's); not INT8 WMMA, where TVM 0.27's merge of dynamic shared memory fails
# beside an accumulator stage in shared.dyn (LowerIntrin: "tvm_access_ptr element type must match the source
# buffer", int8 vs int32). 128 only where K is a whole number of them (`_valid`): a padded K loses the
# 16-byte loads (`exact` in cuda_tensorcore), and 192 (layer1's K = 576 in 3) gathers bytes one by one (TVM
# 0.27 cannot prove the vector contiguous across `/ 192`: generated source)
MMA_STAGES = (2 * MMA_K, 4 * MMA_K)  # INT8 with mma: at least two m16n8k32 steps a stage


def stages_of(c: GemmConfig, in_dtype: str) -> tuple[int, ...]:
    if c.mma:
        return MMA_STAGES
    return (32, 64, 128) if in_dtype == "float16" else (32, 64)


def choose_tiles(m: int, n: int, in_dtype: str, batch: int = 1, knobs: Knobs = Knobs(), k: int = SHORT_K) -> Tiles:
    """Block tiles from the GEMM's shape: 128 on an edge longer than 64, else 64 (N = 64 -> 128x64 tiles);
    then, while the grid has fewer than MIN_BLOCKS blocks, halve the N edge (down to 32) or else the M
    edge (down to 16)."""
    tm = 128 if m > 64 else 64
    tn = 128 if n > 64 else 64
    while batch * -(-m // tm) * -(-n // tn) < MIN_BLOCKS:
        if tn > 32 and tn >= tm:
            tn //= 2
        elif tm > 16:
            tm //= 2
        else:
            break
    wide = in_dtype == "int8" and 0 < knobs.wide_warps_from <= batch * -(-m // tm) * -(-n // tn)
    # K stages of 64 (bench/conv_variants.py on the H200, INT8 batch 64: 1.15-1.48x on the 3x3 layers over
    # 32; FP16 32 is 0.77-0.88x); 128 is a choice of the GEMM search (`stages_of`)
    stage = knobs.fp16_k if in_dtype == "float16" else knobs.int8_k
    return tiles_of(tm, tn, wide, min(stage, 32) if k < SHORT_K else stage)


def tiles_of(tm: int, tn: int, wide: bool, stage: int) -> Tiles:
    rows = _WIDE_ROWS if wide else _ROWS
    (i2, i3), (j2, j3) = rows[tm], rows[tn]
    return Tiles(i2, i3, j2, j3, k1=stage // FRAG)


def split_ok(n: int, tile_n: int) -> bool:
    """Whether K may be split for a GEMM of N columns in tiles `tile_n` wide: not where N is padded. ResNet-18's
    FP16 classifier (N = 1000 classes, padded to 1024) split by 2, as the GEMM search chose it, made the model
    write out of bounds on the H200 (compute-sanitizer: thousands of invalid global writes, reported in the
    global average pool's kernel that runs before it; the same model with that kernel unsplit: 0 errors,
    docs/gpu.md "Tiles by block count, split-K"). The split-K convolutions (N = channels, never padded; M
    padded at batch 1) were clean. Not traced further in TVM."""
    return n % tile_n == 0


def choose_split(t: Tiles, batch: int, m: int, n: int, k: int) -> int:
    """Thread blocks that split K between them (int32/float partial sums, added up with the epilogue by a
    second kernel) while the tiles alone give fewer than MIN_BLOCKS and K is long: a batch-1 ResNet-18
    layer4 convolution would otherwise walk K = 4608 in 72 shared-memory stages in each of 64 blocks.
    Up to SPLIT_BLOCKS blocks in all; each keeps at least 8 stages. Not where N needs padding (`split_ok`)."""
    blocks = batch * -(-m // t.m) * -(-n // t.n)
    if blocks >= MIN_BLOCKS or not split_ok(n, t.n):
        return 1
    stages = -(-k // t.k)
    split = 1
    while blocks * split * 2 <= SPLIT_BLOCKS and stages // (split * 2) >= 8:
        split *= 2
    return split


@dataclass(frozen=True)
class GemmShape:
    """A GEMM as the schedule sees it (a convolution: M = output pixels, N = output channels, K = c*ky*kx)."""

    batch: int
    m: int
    n: int
    k: int
    in_dtype: str  # float16 | int8
    cp_async: bool = False  # sm_80+ and every thread's operand vector contiguous: the copies can be cp.async
    mma: bool = False  # INT8 on sm_80+: mma.sync m16n8k32 is available (GemmConfig.mma)


@dataclass(frozen=True)
class GemmConfig:
    """Everything the schedule chooses for one kernel. `text` is its name in tuning databases."""

    tm: int  # output rows (pixels) per thread block: 16, 32, 64 or 128
    tn: int  # output columns (channels) per thread block: 32, 64 or 128
    wide: bool  # INT8: 4 fragments per warp along 64/128 edges (fewer warps, more work each)
    stage: int  # K elements per shared-memory stage: 32, 64 or 128 (`stages_of`)
    load_bytes: int  # bytes per thread per global load, where the layout allows more than 4 elements
    split: int  # thread blocks splitting K (1: none)
    async_stages: int = 0  # sm_80+, where GemmShape.cp_async: shared-memory stages filled by cp.async (0: none)
    mma: bool = False  # INT8 on sm_80+, where GemmShape.mma: mma.sync m16n8k32 + ldmatrix.x4, not WMMA (stage 64)

    @property
    def tiles(self) -> Tiles:
        return tiles_of(self.tm, self.tn, self.wide, self.stage)

    @property
    def text(self) -> str:
        text = f"{self.tm}x{self.tn}{'w' if self.wide else ''}-k{self.stage}-v{self.load_bytes}-s{self.split}"
        return text + (f"-a{self.async_stages}" if self.async_stages else "") + ("-m" if self.mma else "")

    @classmethod
    def parse(cls, text: str) -> GemmConfig:
        tile, k, v, s, *rest = text.split("-")
        tm, tn = tile.rstrip("w").split("x")
        stages = next((int(r[1:]) for r in rest if r.startswith("a")), 0)
        mma = "m" in rest
        return cls(int(tm), int(tn), tile.endswith("w"), int(k[1:]), int(v[1:]), int(s[1:]), stages, mma)


# The shared-memory stages of the schedule (cuda/tensorcore.py). Rows are padded against bank conflicts
# (storage_align's factor and offset, in elements): operand rows to an odd multiple of 16 bytes mod 32,
# accumulator rows to 4 words mod 16. Tiles of at most STATIC_ACC outputs stage their accumulator in static
# shared memory (in shared.dyn TVM 0.27's merge fails for them, see choose_tiles), larger ones in shared.dyn.
OPERAND_ALIGN = {"float16": (16, 8), "int8": (32, 16)}
ACC_ALIGN = (16, 4)
STATIC_ACC = 64 * 64
DEFAULT_SHARED = 48 * 1024  # bytes of shared memory a block may use without opting in to more


def _padded(row: int, factor: int, offset: int) -> int:
    """A row of `row` elements as `storage_align(factor, offset)` lays it out: the least stride >= row that
    is `offset` modulo `factor`."""
    return row + (offset - row) % factor


def shared_bytes(t: Tiles, in_dtype: str, buffers: int, acc_bytes: int) -> tuple[int, int]:
    """(dynamic, static) shared memory of a kernel with tiles `t`: `buffers` operand stages (2 through
    registers, or the cp.async stages) in shared.dyn, and the accumulator stage in static shared memory
    where the tile is small (else it shares shared.dyn with the operand stages, whose lifetimes it does
    not overlap: at most the larger of the two)."""
    elem = 2 if in_dtype == "float16" else 1
    operands = buffers * (t.m + t.n) * _padded(t.k, *OPERAND_ALIGN[in_dtype]) * elem
    accumulator = t.m * _padded(t.n, *ACC_ALIGN) * acc_bytes
    return (operands, accumulator) if t.m * t.n <= STATIC_ACC else (max(operands, accumulator), 0)


def launchable(dynamic: int, static: int) -> bool:
    """Whether TVM's CUDA runtime can launch a kernel with this much shared memory: it opts a kernel in to
    more than 48 KB only when the dynamic part alone is that large (apache/tvm cuda_module.cc: `dyn_shmem_size
    >= (48 << 10)`), so a static accumulator stage beside dynamic operand stages must stay within 48 KB in all.
    The H200's search databases agree: the candidates that failed to launch there ("grid=(1568,2,1),
    block=(32,8,1)") are exactly those this rejects (tests/host/test_cuda_tiles.py)."""
    return not dynamic < DEFAULT_SHARED < dynamic + static


def default_config(m: int, n: int, k: int, batch: int, in_dtype: str, knobs: Knobs = Knobs()) -> GemmConfig:
    t = choose_tiles(m, n, in_dtype, batch, knobs, k)
    wide = t.i3 == 4 or t.j3 == 4
    split = choose_split(t, batch, m, n, k)
    mma = bool(knobs.int8_mma) and in_dtype == "int8" and t.k >= 2 * MMA_K  # (the schedule checks the GPU)
    return GemmConfig(t.m, t.n, wide, t.k, knobs.load_bytes, split, knobs.async_stages, mma)


# K splits the search tries. 3: a 3x3 convolution's K in whole kernel rows (K / 3 = kw x channels), the one
# split whose im2col gather stays 16-byte vectors where 2 does not: ResNet-18 layer4's K = 4608 split in 2
# starts the second half inside a row (2304 = 4.5 x 512 channels), TVM 0.27 cannot prove the vector's
# bytes contiguous across `% 1536` and gathers them byte by byte (generated source, sm_90)
SPLITS = (2, 3, 4, 8)


def neighbours(
    m: int,
    n: int,
    k: int,
    batch: int,
    in_dtype: str,
    knobs: Knobs = Knobs(),
    cp_async: bool = False,
    mma: bool = False,
) -> list[GemmConfig]:
    """The configurations a tuning run tries for one kernel, nearest to the default first: each single
    change (tile edges, warp shape, stage, load width, split; cp.async copies where `cp_async`; INT8 mma
    instead of WMMA where `mma`), then pairs of tile and warp changes (with cp.async and mma as well, where
    they apply). Tile edges over twice the GEMM's (all padding) are left out."""
    base = default_config(m, n, k, batch, in_dtype, knobs)
    edges_m, edges_n = _edges(m, n)
    # splitting K helps small grids only, from the default's tiles (`refinements` tries it around the best)
    small = batch * -(-m // base.tm) * -(-n // base.tn) < SPLIT_BLOCKS
    out = _single_changes(base, m, n, k, in_dtype, cp_async, mma, SPLITS if small else ())
    copies = sorted({base.async_stages, ASYNC_STAGES}) if cp_async else [base.async_stages]
    instructions = sorted({base.mma, True}) if mma else [base.mma]
    for tm in edges_m:
        for tn in edges_n:
            for wide in (False, True) if in_dtype == "int8" else (False,):
                for stages in copies:
                    for with_mma in instructions:
                        stage = max(base.stage, 2 * MMA_K) if with_mma else base.stage
                        pair = replace(base, tm=tm, tn=tn, wide=wide, split=1, async_stages=stages)
                        _add(out, base, replace(pair, mma=with_mma, stage=stage), in_dtype, n, k)
    return out


def refinements(
    best: GemmConfig, m: int, n: int, k: int, in_dtype: str, cp_async: bool = False, mma: bool = False
) -> list[GemmConfig]:
    """The single changes of a kernel's fastest configuration so far, every split of K included whatever
    the grid, and deeper cp.async pipelines where it has one: the search's next round after the default's
    neighbours (gemm_tuning). ResNet-18 layer4's 3x3 convolutions at batch 64 chose 64x64 tiles (392
    blocks), a grid `neighbours` never splits."""
    return _single_changes(best, m, n, k, in_dtype, cp_async, mma, SPLITS, deep=True)


def _edges(m: int, n: int) -> tuple[list[int], list[int]]:
    """Tile edges up to twice the GEMM's (more is all padding)."""
    return [e for e in (16, 32, 64, 128) if e <= max(16, 2 * m)], [e for e in (32, 64, 128) if e <= max(32, 2 * n)]


def _single_changes(
    base: GemmConfig,
    m: int,
    n: int,
    k: int,
    in_dtype: str,
    cp_async: bool,
    mma: bool,
    splits: tuple[int, ...],
    deep: bool = False,
) -> list[GemmConfig]:
    edges_m, edges_n = _edges(m, n)
    out: list[GemmConfig] = []

    def near(edges: list[int], e: int) -> list[int]:
        return sorted(edges, key=lambda x: abs(math.log2(x / e)))

    changes = [replace(base, tm=tm, split=1) for tm in near(edges_m, base.tm)]
    changes += [replace(base, tn=tn, split=1) for tn in near(edges_n, base.tn)]
    if in_dtype == "int8":
        changes.append(replace(base, wide=not base.wide))
    changes += [replace(base, stage=stage) for stage in stages_of(base, in_dtype)]
    changes.append(replace(base, load_bytes=4 if base.load_bytes > 4 else 16))
    if cp_async:
        changes.append(replace(base, async_stages=0 if base.async_stages else ASYNC_STAGES))
        if base.async_stages and deep:
            changes += [replace(base, async_stages=n) for n in (ASYNC_STAGES, *DEEP_STAGES)]
    if mma and base.mma:  # to WMMA, with its deepest INT8 stage at most
        changes.append(replace(base, mma=False, stage=min(base.stage, 64)))
    elif mma:  # to mma, with each of its stages
        changes += [replace(base, mma=True, stage=stage) for stage in MMA_STAGES]
    changes += [replace(base, split=split) for split in (1, *splits)]  # (_valid drops splits where N is padded)
    for c in changes:
        _add(out, base, c, in_dtype, n, k)
    return out


def _add(out: list[GemmConfig], base: GemmConfig, c: GemmConfig, in_dtype: str, n: int, k: int) -> None:
    if c != base and c not in out and _valid(c, in_dtype, n, k):
        out.append(c)


def _valid(c: GemmConfig, in_dtype: str, n: int, k: int) -> bool:
    if c.wide and (in_dtype != "int8" or (c.tm < 64 and c.tn < 64)):
        return False  # WMMA FP16 keeps 2x2 fragments (unmeasured); a tile of edges < 64 has nothing to widen
    if c.split > 1 and (-(-k // c.tiles.k) // c.split < 2 or not split_ok(n, c.tn)):
        return False
    acc_bytes = 4 if in_dtype == "int8" else 2  # int32; FP16 GEMMs with FP16 outputs accumulate in float16
    if not launchable(*shared_bytes(c.tiles, in_dtype, max(c.async_stages, 2), acc_bytes)):
        return False  # (the schedule checks the accumulator it really got)
    if c.mma and in_dtype != "int8":
        return False  # mma is INT8's (cuda/tensorcore.py)
    if c.stage not in stages_of(c, in_dtype) or (c.stage == 128 and k % 128):
        return False  # (stages_of; 128 only where K divides into it)
    return c.load_bytes in (4, 8, 16) and c.async_stages in (0, ASYNC_STAGES, *DEEP_STAGES)
