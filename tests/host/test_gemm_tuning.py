"""The tensor-core GEMM search (compile/tuning/gemm.py) and what builds take from its database.

Candidates are compiled for real (nvcc, sm_90); what cannot run here is the GPU, so the measurer is a
stand-in behind the same interface that answers with the times the H200 measured for the same
configurations of a ResNet-18 layer1 convolution with a residual (run14 and run16 in docs/benchmarks.md, timed
back to back): its default (4x4-fragment warps) 0.081 ms, the 2x2-warp tile 0.062 ms.
"""

from __future__ import annotations

import json
import re
from dataclasses import replace
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import tvm

from edgedeploy.compile.cuda.tiles import GemmConfig, default_config, neighbours
from edgedeploy.compile.tuning.gemm import (
    TIMING,
    VERSION,
    GemmKernel,
    L2State,
    gemm_kernels,
    load_configs,
    merge_into,
    time_in_model_state,
    tune,
)
from edgedeploy.errors import BuildError
from tests.host.cuda import dump_sass, require_toolchain
from tests.host.models import int8_conv_model

REPO = Path(__file__).resolve().parents[2]
# the H200's search of ResNet-18 INT8 batch 64 in run16, timed back to back (before gemm_tuning.TIMING)
CAPTURED = REPO / "tests/fixtures/h200.resnet18.int8.bs64.gemm_configs.v1.json"  # tests/fixtures/README.md
LAYER1_RESIDUAL = "9127d464f5600bdb"  # fused_dequantize_conv2d1_...: b1 m200704 n64 k576 int8
TARGET = {"kind": "cuda", "arch": "sm_90", "host": {"kind": "llvm"}}


def test_neighbours_are_single_changes_first_and_never_the_default() -> None:
    shape = (200704, 64, 576, 1, "int8")  # ResNet-18 layer1 at batch 64 (NHWC: batch folded into M)
    base = default_config(*shape)
    assert base == GemmConfig(128, 64, True, 64, 16, 1)
    cands = neighbours(*shape)
    assert base not in cands and len(cands) == len(set(cands)) > 10
    fields = ("tm", "tn", "wide", "stage", "load_bytes", "split", "async_stages")

    def changed(c: GemmConfig) -> int:
        return sum(getattr(c, f) != getattr(base, f) for f in fields)

    n_single = sum(1 for c in cands if changed(c) == 1)
    assert all(changed(c) == 1 for c in cands[:n_single]) and n_single >= 6
    assert replace(base, wide=False) in cands[:n_single]  # the warp shape the H200 run preferred here
    assert all(GemmConfig.parse(c.text) == c for c in cands)
    # few blocks (layer4 at batch 1): split-K is among the choices; many blocks: it is not
    assert any(c.split > 1 for c in neighbours(49, 512, 4608, 1, "int8"))
    assert not any(c.split > 1 for c in cands)


class CapturedH200:
    """Measurer stand-in: the H200's time for each configuration of the captured kernel, the same output for
    all (a correct kernel) except the configurations in `wrong`. Records what it was asked to measure."""

    def __init__(self, wrong: tuple[str, ...] = ()) -> None:
        entry = json.loads(CAPTURED.read_text())["kernels"][LAYER1_RESIDUAL]
        self.ms = {c: v for c, v in entry["tried"].items() if isinstance(v, float)} | {
            entry["default"]: entry["default_ms"]
        }
        self.wrong = wrong
        self.asked: list[str] = []

    def __call__(self, kernel: GemmKernel, config: GemmConfig, library: Path) -> tuple[float, Any]:
        assert library.stat().st_size > 0  # a real library was built for it
        self.asked.append(config.text)
        out = np.zeros(16, np.int8)
        return self.ms[config.text], out + 1 if config.text in self.wrong else out


@pytest.fixture(scope="module")
def layer1() -> Any:
    require_toolchain("h200")
    from edgedeploy.compile.cuda.toolchain import resolve_toolchain
    from edgedeploy.compile.tuning.apply import tuning_module
    from edgedeploy.profiles import get_profile

    env = resolve_toolchain(get_profile("h200")).env
    with pytest.MonkeyPatch.context() as mp:
        for k, v in env.items():
            mp.setenv(k, v)  # the builder processes inherit it: nvcc, a stub libcuda
        with tvm.target.Target(TARGET):
            mod = tuning_module(int8_conv_model(batch=64, channels=64, size=56))
        yield mod


@pytest.mark.compile
@pytest.mark.cuda
def test_search_resumes_keeps_only_correct_faster_configurations(layer1: Any, tmp_path: Path) -> None:
    [kernel] = gemm_kernels(layer1, tvm.target.Target(TARGET))
    assert (kernel.shape, kernel.default.text) == ("b1 m200704 n64 k576 int8", "128x64w-k64-v16-s1")
    db = tmp_path / "gemm_configs.json"
    first = CapturedH200()
    s1 = tune(layer1, TARGET, db, minutes=10, trials=3, measure=first, workers=2)
    entry = json.loads(db.read_text())["kernels"][kernel.key]
    tried1 = set(entry["tried"])
    # the three nearest neighbours (64x64, 32x64, 16x64 wide tiles) are all slower on the H200: default kept
    assert len(tried1) == 3 and entry["best"] is None and s1["kept"] == 0
    assert load_configs(db) == {}

    # the next run resumes: the default again (the reference output), then only untried candidates; the
    # 2x2-warp tile is among them, and here it computes a wrong output: recorded, never kept
    second = CapturedH200(wrong=("128x64-k64-v16-s1",))
    tune(layer1, TARGET, db, minutes=10, trials=3, measure=second, workers=2)
    entry = json.loads(db.read_text())["kernels"][kernel.key]
    assert second.asked[0] == kernel.default.text and not tried1 & set(second.asked[1:])
    assert entry["tried"]["128x64-k64-v16-s1"] == "differs" and entry["best"] is None

    # once it is correct (its record dropped, measured again), it is 0.76x the default: kept after the
    # alternating re-timing, and a build applies it
    doc = json.loads(db.read_text())
    del doc["kernels"][kernel.key]["tried"]["128x64-k64-v16-s1"]
    db.write_text(json.dumps(doc))
    third = CapturedH200()
    s3 = tune(layer1, TARGET, db, minutes=10, trials=1, measure=third, workers=2)
    entry = json.loads(db.read_text())["kernels"][kernel.key]
    assert third.asked[1] == "128x64-k64-v16-s1" and s3["kept"] == 1
    assert entry["best"] == "128x64-k64-v16-s1" and entry["confirmed_ratio"] < 0.97
    assert third.asked.count("128x64-k64-v16-s1") == 4  # search, then 3 alternating re-timings
    assert load_configs(db) == {kernel.key: GemmConfig.parse("128x64-k64-v16-s1")}

    # importing into a database that holds an older entry of the same kernel keeps the newer one
    older = tmp_path / "older.json"
    stale = json.loads(db.read_text())
    stale["kernels"][kernel.key] |= {"best": None, "updated": 0}
    older.write_text(json.dumps(stale))
    assert merge_into(db, older) == 1 and load_configs(older) == load_configs(db)
    stale_file = tmp_path / "stale.json"
    stale_file.write_text(json.dumps(stale))
    assert merge_into(stale_file, db) == 1 and load_configs(db) == load_configs(older)  # the stale one loses


@pytest.mark.compile
@pytest.mark.cuda
def test_a_stored_configuration_the_schedule_now_refuses_is_recorded_not_fatal(layer1: Any, tmp_path: Path) -> None:
    """A database can hold a time for a configuration that today's schedule refuses (the H200's FP16 ResNet-18
    classifier had split-K over a padded N timed before `split_ok` existed; run23's search then died building
    it to confirm). The run records the refusal and goes on; the kernel keeps no tuned configuration."""
    [kernel] = gemm_kernels(layer1, tvm.target.Target(TARGET))
    refused = "128x128-k64-v16-s2"  # N = 64 in tiles of 128, K split by 2: refused by split_ok
    db = tmp_path / "gemm_configs.json"
    db.write_text(
        json.dumps(
            {
                "version": VERSION,
                "timing": TIMING,
                "kernels": {kernel.key: {"tried": {refused: 0.001}, "best": refused}},
            }
        )
    )
    stats = tune(layer1, TARGET, db, minutes=10, trials=1, measure=CapturedH200(), workers=2)
    entry = json.loads(db.read_text())["kernels"][kernel.key]
    assert entry["tried"][refused].startswith("error:") and "split-K over a padded N" in entry["tried"][refused]
    assert entry["best"] is None and stats["kept"] == 0 and load_configs(db) == {}


@pytest.mark.compile
@pytest.mark.cuda
def test_a_database_timed_otherwise_is_searched_again_fastest_first(layer1: Any, tmp_path: Path) -> None:
    """A database whose times were taken with a warm L2 (before TIMING; run16's, as committed then) is
    searched again: the default first (the reference), then its candidates in the order of their old times,
    fastest first; outputs that differed stay recorded, and a kept configuration stays until its kernel is
    measured again (here: the other kernels of the file)."""
    [kernel] = gemm_kernels(layer1, tvm.target.Target(TARGET))
    old = json.loads(CAPTURED.read_text())
    old.pop("timing", None)
    old["version"] = VERSION  # (the captured file's keys are version 1's; the one entry used is keyed anew)
    entry = old["kernels"][kernel.key] = old["kernels"].pop(LAYER1_RESIDUAL)  # the times CapturedH200 answers
    entry["tried"]["32x64w-k64-v16-s1"] = "differs"
    timed = sorted((ms, c) for c, ms in entry["tried"].items() if isinstance(ms, float))
    db = tmp_path / "gemm_configs.json"
    db.write_text(json.dumps(old))
    h200 = CapturedH200()
    tune(layer1, TARGET, db, minutes=10, trials=2, measure=h200, workers=2)
    doc = json.loads(db.read_text())
    assert doc["timing"] == TIMING
    assert h200.asked[:3] == [kernel.default.text] + [c for _, c in timed[:2]]
    new = doc["kernels"][kernel.key]
    assert new["tried"]["32x64w-k64-v16-s1"] == "differs" and new["hint"][: len(timed)] == [c for _, c in timed]
    others = {k: v.get("best") for k, v in old["kernels"].items() if k != kernel.key}
    assert {k: v.get("best") for k, v in doc["kernels"].items() if k != kernel.key} == others


@pytest.mark.compile
@pytest.mark.cuda
def test_a_round_around_the_fastest_follows_the_neighbours(layer1: Any, tmp_path: Path) -> None:
    """Once the default's neighbours are timed, the search tries the single changes of the fastest of them
    (cuda_tiles.refinements) that it has not tried: here the H200's fastest, the 2x2-warp tile, with another
    K stage, load width and every split of K (the default's grid, 1568 blocks, is never split)."""
    [kernel] = gemm_kernels(layer1, tvm.target.Target(TARGET))
    captured = CapturedH200()
    fastest = "128x64-k64-v16-s1"
    assert min(captured.ms, key=lambda c: captured.ms[c]) == fastest
    # every neighbour already tried: the captured time, or (not captured) recorded as a refused build
    tried = {c.text: captured.ms.get(c.text, "error: not built in this test") for c in kernel.neighbours()}
    db = tmp_path / "gemm_configs.json"
    db.write_text(json.dumps({"version": VERSION, "timing": TIMING, "kernels": {kernel.key: {"tried": tried}}}))
    rounds = kernel.refinements(GemmConfig.parse(fastest))
    untried = [c.text for c in rounds if c.text not in tried and c != kernel.default]  # (the default: timed)
    assert {c.split for c in rounds} >= {1, 2, 3} and not any(c.split > 1 for c in kernel.neighbours())
    assert len(untried) >= 3

    class Slower(CapturedH200):  # the configurations run16 did not time: answered slower than the default
        def __call__(self, kernel: GemmKernel, config: GemmConfig, library: Path) -> tuple[float, Any]:
            self.ms.setdefault(config.text, self.ms[kernel.default.text] * 1.1)
            return super().__call__(kernel, config, library)

    h200 = Slower()
    lines: list[str] = []
    tune(layer1, TARGET, db, minutes=10, trials=2, measure=h200, workers=2, progress=lines.append)
    assert h200.asked[0] == kernel.default.text and h200.asked[1:3] == untried[:2]
    assert any("around the fastest; 2 candidates" in line for line in lines), lines
    entry = json.loads(db.read_text())["kernels"][kernel.key]
    assert set(untried[:2]) <= set(entry["tried"]) and entry["best"] == fastest  # kept: 0.75x the default


def _gemm_source(kernel: GemmKernel, config: str) -> str:
    """The CUDA source of the GEMM kernel (the first; a split-K kernel's sum is the second) of `kernel`
    scheduled with `config`, compiled for sm_90 as a build does."""
    from edgedeploy.compile.cuda.tensorcore import TIR_PIPELINE, TensorCoreGemm, pass_config

    target = tvm.target.Target(TARGET)
    rule = TensorCoreGemm(configs={kernel.key: GemmConfig.parse(config)})
    with target, tvm.transform.PassContext(opt_level=3, config=pass_config(target)):
        sch = rule.schedule(kernel.func, target)
        assert sch is not None and kernel.key in rule.applied
        prim = sch.mod["main"].with_attr("global_symbol", "main")
        lib = tvm.compile(tvm.IRModule({"main": prim}), target=target, tir_pipeline=TIR_PIPELINE)
    return str(lib.mod.imports[0].inspect_source())


def _first_kernel(source: str) -> str:
    """The body of the first kernel of a CUDA source (after the kernels' declarations)."""
    bodies = [part for part in source.split("__global__")[1:] if ";" not in part.split("{", 1)[0]]
    return bodies[0]


@pytest.mark.compile
@pytest.mark.cuda
def test_around_layer4s_fastest_split_k_with_mma_and_deeper_pipelines() -> None:
    """ResNet-18 layer4 at batch 64 (M 3136, N 512, K 4608): the search's fastest was 64x64 tiles with
    cp.async and mma (run25: 0.055 ms, the default 0.074), whose K splits only the round around the fastest
    tries. Split-K with mma schedules (its partial sums in mma's register layout, [split, batch, M, N]: before,
    transform_layout failed on the 4-D buffer). A split in 3 (kernel rows of 3 x 512 channels) gathers the
    activations as 16-byte vectors; in 2 (2304 = 4.5 rows) TVM 0.27 gathers them byte by byte. The round
    also tries deeper cp.async pipelines where they fit."""
    require_toolchain("h200")
    from edgedeploy.compile.cuda.toolchain import resolve_toolchain
    from edgedeploy.compile.tuning.apply import tuning_module
    from edgedeploy.profiles import get_profile

    with pytest.MonkeyPatch.context() as mp:
        for k, v in resolve_toolchain(get_profile("h200")).env.items():
            mp.setenv(k, v)
        with tvm.target.Target(TARGET):
            mod = tuning_module(int8_conv_model(batch=64, channels=512, size=7, pad=1))
        [kernel] = gemm_kernels(mod, tvm.target.Target(TARGET))
        assert kernel.shape == "b1 m3136 n512 k4608 int8" and kernel.gemm.mma and kernel.gemm.cp_async
        fastest = GemmConfig.parse("64x64-k64-v16-s1-a3-m")
        splits = {c.split: c for c in kernel.refinements(fastest) if c.split > 1}
        assert set(splits) == {2, 3, 4, 8} and not any(c.split > 1 and c.tm == 64 for c in kernel.neighbours())
        gathers = {}
        for split in (2, 3):
            source = _gemm_source(kernel, splits[split].text)
            assert "mma.sync.aligned.m16n8k32" in source and "cp.async" in source, source[:2000]
            # the activations (padded inside the kernel: through registers, not cp.async) as 16-byte loads
            gathers[split] = len(re.findall(r"= \*\(int4\*\)\(x_ptr \+", _first_kernel(source)))
        # deeper cp.async pipelines around it: 5 stages (51 KB of operands + the 17 KB accumulator); not 4,
        # whose 40 + 17 KB TVM's runtime cannot launch (its dynamic part alone must pass 48 KB to opt in)
        stages = {c.async_stages for c in kernel.refinements(fastest) if c.split == 1 and c.tm == c.tn == 64}
        assert stages == {0, 3, 5}, stages
        assert "cp.async.wait_group 4" in _gemm_source(kernel, replace(fastest, async_stages=5).text)
        # 128-deep K stages (cuda_tiles.MMA_STAGES): with cp.async (3 x 128 rows of 144 bytes: 54 KB of operands,
        # over 48 KB, so TVM's runtime opts the kernel in), not through registers (36 KB beside the 17 KB
        # accumulator: not launchable)
        deep_k = {(c.async_stages, c.split) for c in kernel.refinements(fastest) if c.stage == 128}
        assert (3, 1) in deep_k and (0, 1) not in deep_k, deep_k
        source = _gemm_source(kernel, replace(fastest, stage=128).text)
        assert "mma.sync.aligned.m16n8k32" in source and re.search(r"\* 144\)", source), source[:2000]
    assert gathers[3] > 0 and gathers[2] == 0, gathers


@pytest.mark.cuda
def test_kernels_know_which_arguments_the_model_computes(layer1: Any) -> None:
    """The arguments the model passes computed tensors to (the activations, the residual) are the ones
    L2State reads into the cache before a timed call; the weights are constants and stay in DRAM."""
    [kernel] = gemm_kernels(layer1, tvm.target.Target(TARGET))
    assert [kernel.func.params[i].name for i in kernel.warm] == ["x", "r"]


@pytest.mark.compile
def test_l2_state_sets_the_cache_before_every_timed_call(tmp_path: Path) -> None:
    """TVM's time evaluator calls L2State (its f_preproc) before each of the single timed calls, and it
    reads the warm arguments in: here on the CPU, the same runtime calls as on the GPU."""
    from tvm import te

    a = te.placeholder((1024,), "float32", name="a")
    lib = tvm.compile(tvm.IRModule({"main": te.create_prim_func([a, te.compute((1024,), lambda i: a[i] + 1.0)])}))
    lib.export_library(str(tmp_path / "add.so"))
    lib = tvm.runtime.load_module(str(tmp_path / "add.so"))
    dev = tvm.cpu()
    args = [tvm.runtime.tensor(np.arange(1024, dtype="float32"), dev), tvm.runtime.empty((1024,), "float32", dev)]
    l2 = L2State(dev, flush_bytes=1 << 20)
    l2.set_warm(args, (0,))
    ms = time_in_model_state(lib, dev, args, 5, l2)
    assert l2.calls == 5 and ms > 0
    np.testing.assert_array_equal(l2.warm[0][1].numpy(), np.arange(1024, dtype="float32"))
    np.testing.assert_array_equal(args[1].numpy(), np.arange(1024, dtype="float32") + 1)


@pytest.mark.cuda
def test_the_build_applies_a_tuned_configuration(layer1: Any) -> None:
    """The rule finds a configuration by the kernel's key and schedules with it: here the 2x2 warp tile
    (8 warps of 2x2 fragments on a 128x64 tile) instead of the default's 2 warps of 4x4."""
    from edgedeploy.compile.cuda.tensorcore import TensorCoreGemm, legalize_passes

    target = tvm.target.Target(TARGET)
    [kernel] = gemm_kernels(layer1, target)

    def threads(rule: TensorCoreGemm) -> set[int]:
        with target:
            mod = tvm.transform.Sequential(legalize_passes(target, rule))(int8_conv_model(64, 64, 56))
        script = "\n".join(f.script() for f in mod.functions.values() if isinstance(f, tvm.tirx.PrimFunc))
        return {int(n) for n in re.findall(r'T.thread_binding\((?:T.int64\()?(\d+)\)?, thread="threadIdx.y"', script)}

    default, tuned = TensorCoreGemm(), TensorCoreGemm(configs={kernel.key: GemmConfig.parse("128x64-k64-v16-s1")})
    assert threads(default) == {2} and threads(tuned) == {8}
    assert kernel.key in tuned.seen and tuned.applied == {kernel.key: GemmConfig.parse("128x64-k64-v16-s1")}
    assert default.applied == {}


def test_import_stores_a_gemm_only_export(tmp_path: Path, hermetic: Path) -> None:
    """`edgedeploy tune --import DIR` of a folder where only the GEMM search ran (no MetaSchedule files)."""
    from edgedeploy.compile.tuning.apply import find_gemm_configs, import_database

    folder = tmp_path / "export"
    folder.mkdir()
    (folder / "tuning.json").write_text(json.dumps({"profile": "h200", "key": "abc-int8", "target": TARGET}))
    doc = json.loads(CAPTURED.read_text())
    (folder / "gemm_configs.json").write_text(json.dumps(doc))
    # the captured file is version 1 (kernel keys with the constants in): refused, with the way out
    with pytest.raises(BuildError, match="version 1.*gemm_db_rekey"):
        import_database(folder)
    with pytest.raises(ValueError, match="version 1"):  # a build warns and builds without (tvm_backend)
        load_configs(CAPTURED)
    doc["version"] = VERSION
    (folder / "gemm_configs.json").write_text(json.dumps(doc))
    dest, kept = import_database(folder)
    assert kept == sum(1 for v in doc["kernels"].values() if v.get("best")) > 0
    assert find_gemm_configs("h200", "abc-int8") == dest / "gemm_configs.json"
    assert load_configs(dest / "gemm_configs.json") == load_configs(folder / "gemm_configs.json")


def test_kernel_keys_leave_scalar_constants_out() -> None:
    """Another calibration (other per-tensor scales) gives the same kernel key, so a tuned configuration
    still applies; another shape does not. Two kernels of one module that differ in scales only are one
    kernel of the search, with the calls of both."""
    import tvm_ffi

    from edgedeploy.compile.tuning.apply import tuning_module

    target = tvm.target.Target(TARGET)

    def kernels(*models: Any) -> list[GemmKernel]:
        mod = tvm.IRModule()
        for i, model in enumerate(models):
            with target:
                fused = tuning_module(model)
            for gv, f in fused.functions.items():
                if isinstance(f, tvm.tirx.PrimFunc):
                    mod[f"{gv.name_hint}_{i}"] = f
        return gemm_kernels(mod, target)

    [a] = kernels(int8_conv_model(1, 64, 14, scales=(1e-3, 0.5)))
    [b] = kernels(int8_conv_model(1, 64, 14, scales=(7.3e-4, 0.031)))
    [c] = kernels(int8_conv_model(1, 32, 14))
    assert a.key == b.key != c.key
    assert not tvm_ffi.structural_equal(a.func, b.func)  # the constants differ, and TVM's own hash sees them
    [both] = kernels(int8_conv_model(1, 64, 14, scales=(1e-3, 0.5)), int8_conv_model(1, 64, 14, scales=(2e-3, 0.1)))
    assert both.key == a.key and both.calls == 2


def _sass_ops(library: Path, tmp_path: Path) -> dict[str, int]:
    """Instruction counts of a built library's device code (cuobjdump, as test_gpu_build reads it)."""
    sass = dump_sass(library, tmp_path, 90)
    return {op: len(re.findall(rf"\b{op}\b", sass)) for op in ("IMMA", "LDGSTS", "LDSM", "LDG", "STS")}


@pytest.mark.compile
@pytest.mark.cuda
def test_sm90_copies_operands_with_cp_async_where_configured(layer1: Any, tmp_path: Path) -> None:
    """On sm_80+ a configuration with async_stages copies the operands with cp.async (SASS LDGSTS) into 3
    shared-memory stages instead of loading them into registers and storing them to shared memory; the
    default (and sm_72/sm_75 always) keeps the register path. The search offers it as a neighbour."""
    from concurrent.futures import ProcessPoolExecutor
    from multiprocessing import get_context

    from edgedeploy.compile.tuning.gemm import build_candidate

    [kernel] = gemm_kernels(layer1, tvm.target.Target(TARGET))
    assert kernel.gemm.cp_async and kernel.default.async_stages == 0
    cp_async = replace(kernel.default, async_stages=3)
    assert cp_async in kernel.neighbours() and cp_async.text == kernel.default.text + "-a3"
    assert GemmConfig.parse(cp_async.text) == cp_async
    func_json = tvm.ir.save_json(kernel.func)
    ops = {}
    for config in (kernel.default, cp_async):
        # a builder process, as tuning runs them: TVM compiles device code only where the (stub) driver
        # library loaded at start-up, and the fixture's environment names it
        with ProcessPoolExecutor(1, mp_context=get_context("spawn")) as pool:
            out = str(tmp_path / f"{config.text}.so")
            lib = pool.submit(build_candidate, func_json, kernel.key, config.text, TARGET, out).result()
        ops[config.async_stages] = _sass_ops(Path(lib), tmp_path)
    assert ops[0]["IMMA"] > 0 and ops[3]["IMMA"] > 0
    assert ops[3]["LDGSTS"] > 0, ops
    assert ops[0]["LDGSTS"] == 0 and ops[0]["LDG"] > 0, ops


def test_knobs_from_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    """The command line reads the knobs (cli/options.py); compile/ is handed them, and they travel as their spec."""
    from edgedeploy.cli.options import cuda_config_from_env
    from edgedeploy.compile.config import CudaConfig, Knobs
    from edgedeploy.errors import BuildError

    monkeypatch.setenv("EDGEDEPLOY_CUDA_KNOBS", "async_stages=3, int8_k=32")
    monkeypatch.setenv("EDGEDEPLOY_CUDA_TENSOR_CORES", "0")
    config = cuda_config_from_env()
    assert config == CudaConfig(Knobs(async_stages=3, int8_k=32), tensor_cores=False)
    assert CudaConfig.from_json(config.to_json()) == config and config.knobs.spec() == "int8_k=32,async_stages=3"
    monkeypatch.setenv("EDGEDEPLOY_CUDA_KNOBS", "")
    monkeypatch.delenv("EDGEDEPLOY_CUDA_TENSOR_CORES")
    assert cuda_config_from_env() == CudaConfig() and Knobs().spec() == ""
    for bad in ("async_stage=3", "async_stages=three", "async_stages"):
        monkeypatch.setenv("EDGEDEPLOY_CUDA_KNOBS", bad)
        with pytest.raises(BuildError, match="EDGEDEPLOY_CUDA_KNOBS: .* is not NAME=INTEGER"):
            cuda_config_from_env()
