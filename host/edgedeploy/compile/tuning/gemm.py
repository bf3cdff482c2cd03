"""Tensor-core GEMM configurations searched on the GPU, stored per (profile, model, precision), applied by builds.

MetaSchedule never searches the kernels `TensorCoreGemm` (cuda/tensorcore.py) schedules: it is a hand
schedule, and what it chooses per kernel is a handful of numbers (`cuda_tiles.GemmConfig`: block tile,
warp shape, K stage, load width, split-K). Their defaults come from rules measured on one GPU (the H200)
and one model; the best choice differs per layer and GPU (docs/gpu.md "Schedule knobs": wider warps
1.6x on one convolution, 0.85x on another). This search measures, on the GPU, each kernel's default and
its neighbours (`cuda_tiles.neighbours`, nearest first):

1. the kernels: every kernel of the exported module that TensorCoreGemm takes, with its calls per inference;
2. each default is built and timed; its time x calls is the kernel's share of the model's GEMM time, and
   the candidates go to kernels by that share (`tuning_common.allocate_trials`); once they are timed, rounds
   of single changes around each kernel's fastest so far follow (`cuda_tiles.refinements`; ResNet-18's
   layer4 chose 64x64 tiles, and only this round splits K for them), while time and trials last;
3. candidates already in the database are skipped: a run resumes where the last one stopped (the file is
   rewritten atomically after every measurement, so a killed run keeps all it measured);
4. candidates build in parallel processes (one per core, the slow part) and are timed one at a time on the
   GPU, each output compared with the default's on the same random inputs (INT8: bit-identical, which exact
   int32 sums and the same requantize guarantee; FP16: 1e-2 relative). Each timed call starts from the L2
   state it meets in the model (`L2State`): weights evicted, activations just written by the kernel before;
   timed back to back with a warm L2, layer4's residual kernels chose 128x128 tiles that took 0.057 ms
   alone and 0.080 ms in the model (docs/gpu.md "What bounds the GEMM kernels");
5. a kernel keeps its fastest correct candidate only if, timed again alternately with the default, it is
   at least MIN_GAIN faster; otherwise the default stays.

    python -m edgedeploy.compile.tune_offline DIR --gemm-minutes 10    # DIR: `edgedeploy tune --export`
    edgedeploy tune --import DIR      # stores DIR/gemm_configs.json beside the MetaSchedule database

Needs tvm with its compiler, nvcc (or NVRTC) and a GPU; nothing else of edgedeploy's dependencies.
"""

from __future__ import annotations

import json
import os
import re
import statistics
import tempfile
import time
from collections.abc import Callable
from concurrent.futures import FIRST_COMPLETED, Future, ProcessPoolExecutor, wait
from dataclasses import dataclass
from multiprocessing import get_context
from pathlib import Path
from typing import Any

from edgedeploy_agent import tvm_without_torch
from edgedeploy_agent.durable import write_json_atomic

from ..cuda.tiles import GemmConfig, GemmShape, default_config, neighbours, refinements
from .common import allocate_trials, random_input

GEMM_FILE = "gemm_configs.json"
# (kernel, configuration, its library) -> (ms per call, the kernel's output): GpuMeasurer, or a test's stand-in
Measure = Callable[["GemmKernel", GemmConfig, Path], tuple[float, Any]]
# a tuned configuration must beat the default by 3 % (timing noise on the H200 was ~1 % with calls timed back
# to back; the single calls L2State prepares have not had their noise measured apart)
MIN_GAIN = 0.03
# 2: kernel keys without the kernel's floating-point constants (cuda_tensorcore.kernel_key); a file of
# version 1 names its kernels by hashes no build computes any more: builds refuse it with a message
VERSION = 2
# how the times in a database were taken; a database timed otherwise is searched again (`_retimed`)
TIMING = "l2-as-in-model"
# bytes copied to evict the L2 before a timed call: several times the L2 of every profile's GPU (datasheets:
# 50 MB H100/H200, 4 MB T4, 512 KB Xavier)
FLUSH_BYTES = 256 << 20


@dataclass(frozen=True)
class GemmKernel:
    key: str  # cuda_tensorcore.kernel_key
    name: str  # the kernel's name in the module (for people)
    func: Any  # the unscheduled PrimFunc
    calls: int  # per inference
    gemm: GemmShape
    warm: tuple[int, ...] = ()  # the parameters the model passes computed tensors (not constants) to

    @property
    def shape(self) -> str:
        g = self.gemm
        return f"b{g.batch} m{g.m} n{g.n} k{g.k} {g.in_dtype}"  # e.g. "b1 m200704 n64 k576 int8"

    @property
    def default(self) -> GemmConfig:
        g = self.gemm
        return default_config(g.m, g.n, g.k, g.batch, g.in_dtype)

    def neighbours(self) -> list[GemmConfig]:
        g = self.gemm
        return neighbours(g.m, g.n, g.k, g.batch, g.in_dtype, cp_async=g.cp_async, mma=g.mma)

    def refinements(self, best: GemmConfig) -> list[GemmConfig]:
        g = self.gemm
        return refinements(best, g.m, g.n, g.k, g.in_dtype, cp_async=g.cp_async, mma=g.mma)


def gemm_kernels(mod: Any, target: Any) -> list[GemmKernel]:
    """The kernels of a fused module (tuning.tuning_module) that TensorCoreGemm schedules."""
    import tvm
    from tvm import relax

    from ..cuda.tensorcore import TensorCoreGemm

    calls: dict[str, int] = {}
    warm: dict[str, set[int]] = {}  # kernel -> the inputs computed from the model's input (not weights)
    call_tir = tvm.ir.Op.get("relax.call_tir")
    for f in mod.functions.values():
        if not isinstance(f, relax.Function):
            continue
        # weights are constants in a build and zeros in an export (tuning.without_weights): neither
        # depends on the function's parameters, which is what tells an activation from a weight
        computed = set(f.params)
        for block in f.body.blocks:
            for b in block.bindings:
                value = b.value
                if any(v in computed for v in relax.analysis.free_vars(value)):
                    computed.add(b.var)
                if isinstance(value, relax.Call) and value.op.same_as(call_tir):
                    name = value.args[0].name_hint
                    calls[name] = calls.get(name, 0) + 1
                    inputs = value.args[1].fields if isinstance(value.args[1], relax.Tuple) else [value.args[1]]
                    warm.setdefault(name, set()).update(i for i, a in enumerate(inputs) if a in computed)
    out: dict[str, GemmKernel] = {}
    with target:
        for gv, f in mod.functions.items():
            if not isinstance(f, tvm.tirx.PrimFunc):
                continue
            rule = TensorCoreGemm()
            if rule.apply(f, target, False) is None or not rule.seen:
                continue
            ((key, gemm),) = rule.seen.items()
            name = gv.name_hint
            k = GemmKernel(key, name, f, calls.get(name, 1), gemm, tuple(sorted(warm.get(name, ()))))
            if key in out:  # kernels that differ in scalar constants only (kernel_key): one, with all the calls
                twin = out[key]
                warm_both = tuple(sorted({*twin.warm, *k.warm}))
                k = GemmKernel(key, twin.name, twin.func, twin.calls + k.calls, gemm, warm_both)
            out[key] = k
    return list(out.values())


def load_configs(path: Path | None) -> dict[str, GemmConfig]:
    """kernel_key -> the configuration a build applies (each kernel's kept best). Raises ValueError for a
    file of another VERSION (its keys would silently match nothing)."""
    if path is None or not path.is_file():
        return {}
    doc = json.loads(path.read_text())
    _check_version(doc, path)
    return {k: GemmConfig.parse(v["best"]) for k, v in doc.get("kernels", {}).items() if v.get("best")}


def _check_version(doc: dict[str, Any], path: Path) -> None:
    if doc.get("version", 1) != VERSION:
        raise ValueError(
            f"{path} is a GEMM tuning database of version {doc.get('version', 1)}, whose kernel keys this "
            f"edgedeploy (version {VERSION}) no longer computes; search again (docs/tuning.md), or convert it: "
            "python bench/gemm_db_rekey.py"
        )


def merge_into(src: Path, dest: Path) -> int:
    """Merge the database `src` into `dest`, kernel by kernel; returns the kernels with a kept best."""
    doc, old = _load(src), _load(dest)  # both as this version times them: times taken two ways do not mix
    for key, entry in doc.get("kernels", {}).items():
        # the newest entry wins: a file copied beside another module's run holds older entries of the
        # kernels that run did not touch
        if entry.get("updated", 0) >= old["kernels"].get(key, {}).get("updated", 0):
            old["kernels"][key] = entry
    old["target"] = doc.get("target", old.get("target"))
    _save(dest, old)
    return sum(1 for v in old["kernels"].values() if v.get("best"))


class L2State:
    """Before each timed call, the L2 cache as the kernel meets it in the model: everything evicted (a
    device-to-device copy of FLUSH_BYTES), then the kernel's `warm` arguments read back in (the activations
    and residuals the kernels before it just wrote). The weights come from DRAM, as they do once per
    inference. TVM's time evaluator calls it before every repeat (its `f_preproc`, a global function)."""

    NAME = "edgedeploy.gemm_tuning.l2_state"

    def __init__(self, dev: Any, flush_bytes: int = FLUSH_BYTES) -> None:
        import tvm
        import tvm_ffi

        self.dev = dev
        self.src = tvm.runtime.empty((flush_bytes // 4,), "int32", dev)
        self.dst = tvm.runtime.empty((flush_bytes // 4,), "int32", dev)
        self.warm: list[tuple[int, Any]] = []  # (argument index, a scratch tensor of its shape)
        self.calls = 0
        tvm_ffi.register_global_func(self.NAME, self, override=True)

    def set_warm(self, args: list[Any], warm: tuple[int, ...]) -> None:
        import tvm

        self.warm = [(i, tvm.runtime.empty(args[i].shape, args[i].dtype, self.dev)) for i in warm if i < len(args)]

    def __call__(self, *args: Any) -> None:
        self.calls += 1
        self.src.copyto(self.dst)
        for i, scratch in self.warm:
            args[i].copyto(scratch)


class GpuMeasurer:
    """Times one built candidate on the GPU (the median of single calls, each from the model's L2 state)
    and returns its output (the kernel's last argument)."""

    def __init__(self, repeat: int = 30) -> None:
        import tvm

        self.dev = tvm.cuda(0)
        self.repeat = repeat
        self.l2 = L2State(self.dev)
        self._inputs: dict[str, list[Any]] = {}

    def __call__(self, kernel: GemmKernel, config: GemmConfig, library: Path) -> tuple[float, Any]:
        import tvm

        if kernel.key not in self._inputs:
            self._inputs[kernel.key] = kernel_inputs(kernel)
        args = [tvm.runtime.tensor(a, self.dev) for a in self._inputs[kernel.key]]
        lib = tvm.runtime.load_module(str(library))
        self.l2.set_warm(args, kernel.warm)
        ms = time_in_model_state(lib, self.dev, args, self.repeat, self.l2)
        lib["main"](*args)
        return ms, args[-1].numpy()


def time_in_model_state(lib: Any, dev: Any, args: list[Any], repeat: int, l2: L2State) -> float:
    """Milliseconds, the median of `repeat` single calls of `lib`'s main, each after `l2` set the cache."""
    timer = lib.time_evaluator("main", dev, number=1, repeat=repeat, min_repeat_ms=0, f_preproc=L2State.NAME)
    return float(statistics.median(timer(*args).results) * 1e3)


def kernel_inputs(kernel: GemmKernel) -> list[Any]:
    """The kernel's arguments as numpy arrays (seeded random inputs; the output buffers too)."""
    import numpy as np
    from tvm.s_tir.meta_schedule.arg_info import ArgInfo

    rng = np.random.default_rng(0)
    return [_kernel_input(rng, kernel, a) for a in ArgInfo.from_prim_func(kernel.func)]


def _kernel_input(rng: Any, kernel: GemmKernel, arg: Any) -> Any:
    """Random inputs that keep an INT8 kernel's outputs off saturation: float parameters (requantize
    multipliers, dequantize scales) sized so that the int32 sums map to a spread of int8 values."""
    import numpy as np

    a = random_input(rng, arg)
    if kernel.gemm.in_dtype == "int8" and a.dtype.kind == "f":
        k = kernel.gemm.k
        a = (rng.uniform(0.5, 1.5, a.shape) * 60 / (np.sqrt(k) * 128 * 128 / 3)).astype(a.dtype)
    return a


def _same(ref: Any, got: Any) -> bool:
    import numpy as np

    if ref.dtype.kind in "iub":
        return bool(np.array_equal(ref, got))
    scale = max(float(np.abs(ref.astype(np.float32)).max()), 1e-6)
    return bool(np.abs(ref.astype(np.float32) - got.astype(np.float32)).max() <= 1e-2 * scale)


def build_candidate(func_json: str, key: str, config: str, target_spec: dict[str, Any], out: str) -> str:
    """One candidate as a shared library (run in a builder process); raises when it does not schedule or compile."""
    import tvm

    from ..cuda.tensorcore import TIR_PIPELINE, TensorCoreGemm, pass_config

    func = tvm.ir.load_json(func_json)
    target = tvm.target.Target(target_spec)
    rule = TensorCoreGemm(configs={key: GemmConfig.parse(config)})
    with target, tvm.transform.PassContext(opt_level=3, config=pass_config(target)):
        sch = rule.schedule(func, target)
        if sch is None or key not in rule.applied:
            raise ValueError("TensorCoreGemm declined this configuration")
        prim = sch.mod["main"].with_attr("global_symbol", "main")
        lib = tvm.compile(tvm.IRModule({"main": prim}), target=target, tir_pipeline=TIR_PIPELINE)
    lib.export_library(out)
    return out


def tune(
    mod: Any,
    target_spec: dict[str, Any],
    db_file: Path,
    minutes: float,
    trials: int = 0,
    measure: Measure | None = None,
    workers: int = 0,
    progress: Callable[[str], None] = print,
) -> dict[str, Any]:
    """Extend the database `db_file` for the kernels of `mod` within `minutes` (the confirmation of step 5
    comes after); returns the run's summary. `trials` caps the candidates (0: every untried neighbour of
    every kernel with at least 2 % of the GEMM time)."""
    import tvm

    target = tvm.target.Target(target_spec)
    doc = _load(db_file)
    doc["target"] = str(target)
    kernels = {k.key: k for k in gemm_kernels(mod, target)}
    workers = workers or max(1, (os.cpu_count() or 2) - 1)
    t0 = time.monotonic()
    with tempfile.TemporaryDirectory(prefix="edgedeploy-gemm-") as work:
        search = _Search(kernels, doc, db_file, target_spec, measure or GpuMeasurer(), Path(work), workers)
        try:
            search.run(deadline=t0 + minutes * 60, trials=trials, progress=progress)
            stats = search.stats | {"search_s": round(time.monotonic() - t0, 1), "left": len(search.pending)}
            stats["kept"] = search.confirm()
        finally:
            search.close()
    stats["minutes"] = round((time.monotonic() - t0) / 60, 2)
    progress("gemm: " + json.dumps(stats))
    return stats


class _Search:
    """Builds in a process pool, measures in this process (one GPU), records every result as it comes."""

    def __init__(
        self,
        kernels: dict[str, GemmKernel],
        doc: dict[str, Any],
        db_file: Path,
        target_spec: dict[str, Any],
        measure: Measure,
        work: Path,
        workers: int,
    ) -> None:
        self.kernels, self.doc, self.db_file, self.target_spec = kernels, doc, db_file, target_spec
        self.measure, self.work = measure, work
        # spawned builders import TVM afresh: without PyTorch, as the CLI does (4 s a builder where torch is installed)
        self.pool = ProcessPoolExecutor(
            max_workers=workers, mp_context=get_context("spawn"), initializer=tvm_without_torch.install
        )
        self.pending: dict[Future[str], tuple[GemmKernel, GemmConfig]] = {}
        self.refs: dict[str, Any] = {}  # kernel key -> the default's output
        self.costs: dict[str, float] = {}  # kernel key -> default ms x calls
        self.stats = {"kernels": len(kernels), "built": 0, "measured": 0, "build_errors": 0, "differs": 0}

    def submit(self, k: GemmKernel, config: GemmConfig, tag: str = "") -> Future[str]:
        import tvm

        out = str(self.work / f"{tag}{k.key}-{config.text}.so")
        fut = self.pool.submit(build_candidate, tvm.ir.save_json(k.func), k.key, config.text, self.target_spec, out)
        self.pending[fut] = (k, config)
        return fut

    def entry(self, k: GemmKernel) -> dict[str, Any]:
        entry = self.doc["kernels"].setdefault(k.key, {"tried": {}})
        entry.update({"name": k.name, "shape": k.shape, "calls": k.calls, "default": k.default.text})
        entry["updated"] = round(time.time(), 1)  # merge_into: the newest entry of a kernel wins
        return entry  # type: ignore[no-any-return]

    def run(self, deadline: float, trials: int, progress: Callable[[str], None]) -> None:
        """Defaults first (their share of the time decides where the candidates go), then the candidates
        near the defaults, then rounds of single changes around each kernel's fastest so far, while time
        and `trials` (0: no cap) last."""
        for k in self.kernels.values():
            self.submit(k, k.default)
        submitted, what = 0, ""
        while self.pending and time.monotonic() < deadline:
            done, _ = wait(self.pending, timeout=max(0.0, deadline - time.monotonic()), return_when=FIRST_COMPLETED)
            plan: dict[str, list[GemmConfig]] = {}
            for fut in done:
                k, config = self.pending.pop(fut)
                self.finish(fut, k, config)
                if config == k.default and len(self.costs) == len(self.kernels):  # the last default: plan
                    plan = _plan(self.kernels, self.costs, self.doc, trials)
                    what = f"{len(self.kernels)} kernels, {sum(self.costs.values()):.3f} ms"
            left = trials - submitted if trials else 0
            if not plan and not self.pending and len(self.costs) == len(self.kernels) and (left > 0 or not trials):
                plan = _refine(self.kernels, self.costs, self.doc, left)  # a round around the fastest
                what = "around the fastest"
            if plan:
                n = sum(len(v) for v in plan.values())
                progress(f"gemm: {what}; {n} candidates")
                for key, configs in plan.items():
                    for c in configs:
                        self.submit(self.kernels[key], c)
                submitted += n

    def finish(self, fut: Future[str], k: GemmKernel, config: GemmConfig) -> None:
        entry = self.entry(k)
        try:
            library = Path(fut.result())
            self.stats["built"] += 1
        except Exception as e:  # a candidate that does not schedule or compile
            self.stats["build_errors"] += 1
            entry["tried"][config.text] = f"error: {_last_line(e)}"
            if config == k.default:  # cannot happen for a kernel TensorCoreGemm took; then not tuned
                self.costs[k.key] = 0.0
        else:
            try:
                ms, output = self.measure(k, config, library)
            except Exception as e:  # a launch the GPU refuses (resources): recorded, not retried
                if config == k.default:
                    raise
                entry["tried"][config.text] = f"error: {_last_line(e)}"
                _save(self.db_file, self.doc)
                return
            finally:
                library.unlink(missing_ok=True)
            self.stats["measured"] += 1
            if config == k.default:
                self.refs[k.key] = output
                entry["default_ms"] = round(ms, 5)
                self.costs[k.key] = ms * k.calls
            elif _same(self.refs[k.key], output):
                entry["tried"][config.text] = round(ms, 5)
            else:
                self.stats["differs"] += 1
                entry["tried"][config.text] = "differs"
        _save(self.db_file, self.doc)

    def confirm(self) -> int:
        """Step 5 for every kernel measured in this run (the builds of all of them at once); returns how many
        keep a tuned configuration."""
        for fut in self.pending:
            fut.cancel()
        self.pending.clear()
        chosen: dict[str, str] = {}
        for key, entry in self.doc["kernels"].items():
            if key not in self.refs or not any(isinstance(ms, float) for ms in entry["tried"].values()):
                continue  # not searched (in this run, or since `_retimed`): its kept configuration stays
            entry["best"] = None
            entry_best = _fastest(entry)
            if entry_best is not None:
                chosen[key] = entry_best
        _save(self.db_file, self.doc)
        builds = {
            (key, c): self.submit(self.kernels[key], GemmConfig.parse(c), "confirm-")
            for key, best in chosen.items()
            for c in (self.kernels[key].default.text, best)
        }
        self.pending.clear()
        for key, best in chosen.items():
            k, entry = self.kernels[key], self.doc["kernels"][key]
            try:
                paths = {c: Path(builds[(key, c)].result()) for c in (k.default.text, best)}
            except Exception as e:  # timed by an earlier run, refused by today's schedule (split_ok, launchable)
                entry["tried"][best] = f"error: {_last_line(e)}"
                _save(self.db_file, self.doc)
                continue
            entry["best"] = self._confirm_one(k, entry, best, paths)
            entry["updated"] = round(time.time(), 1)
            _save(self.db_file, self.doc)
        return sum(1 for key in chosen if self.doc["kernels"][key].get("best"))

    def _confirm_one(self, k: GemmKernel, entry: dict[str, Any], best: str, paths: dict[str, Path]) -> str | None:
        times: dict[str, list[float]] = {c: [] for c in paths}
        for _ in range(3):
            for c, path in paths.items():
                ms, output = self.measure(k, GemmConfig.parse(c), path)
                if c == best and not _same(self.refs[k.key], output):
                    return None
                times[c].append(ms)
        ratio = statistics.median(times[best]) / statistics.median(times[k.default.text])
        entry["confirmed_ratio"] = round(ratio, 4)
        return best if ratio <= 1 - MIN_GAIN else None

    def close(self) -> None:
        self.pool.shutdown(wait=False, cancel_futures=True)


def _fastest(entry: dict[str, Any]) -> str | None:
    """The fastest correct candidate of a kernel, if it beats the default by MIN_GAIN in the search."""
    timed = {c: ms for c, ms in entry["tried"].items() if isinstance(ms, float)}
    best = min(timed, key=lambda c: timed[c]) if timed else None
    return best if best is not None and timed[best] <= entry["default_ms"] * (1 - MIN_GAIN) else None


def _load(path: Path) -> dict[str, Any]:
    """A database to search or merge (empty where there is none), with its times as TIMING takes them."""
    doc: dict[str, Any] = json.loads(path.read_text()) if path.is_file() else {"version": VERSION, "kernels": {}}
    _check_version(doc, path)
    if doc.get("timing") != TIMING:
        _retimed(doc)
    return doc


def _retimed(doc: dict[str, Any]) -> None:
    """A database whose times were taken another way (before TIMING: back to back, the L2 warm) is searched
    again: its timed candidates become `hint`, the order in which this search tries them first (fastest
    then first); what does not depend on timing stays (build errors, launch failures, outputs that
    differed), and so do kept configurations until their kernel is measured again."""
    for entry in doc.get("kernels", {}).values():
        timed = {c: ms for c, ms in entry.get("tried", {}).items() if isinstance(ms, float)}
        entry["hint"] = sorted(timed, key=lambda c: timed[c]) + [c for c in entry.get("hint", []) if c not in timed]
        entry["tried"] = {c: v for c, v in entry.get("tried", {}).items() if not isinstance(v, float)}
        for field in ("default_ms", "confirmed_ratio"):
            entry.pop(field, None)
    doc["timing"] = TIMING


def _hint_of_twin(doc: dict[str, Any], entry: dict[str, Any]) -> list[str]:
    """A new kernel's hint from an entry of the same GEMM shape and epilogue (its name, operators numbered
    apart): its key changed with its TIR, as the convolutions that took in their pad did (cuda/conv_pad.py),
    and LegalizeOps numbered the convolutions anew."""

    def twin(e: dict[str, Any]) -> tuple[str, str]:
        return re.sub(r"conv2d\d*", "conv2d", str(e.get("name"))), str(e.get("shape"))

    for other in doc["kernels"].values():
        if other is not entry and other.get("hint") and twin(other) == twin(entry):
            return list(other["hint"])
    return []


def _plan(
    kernels: dict[str, GemmKernel], costs: dict[str, float], doc: dict[str, Any], trials: int
) -> dict[str, list[GemmConfig]]:
    """Per kernel, the candidates not tried yet, as many as its share of the time allows: first those an
    earlier search timed otherwise (`_retimed`), fastest first, then the others nearest first."""

    def order(key: str, k: GemmKernel) -> list[GemmConfig]:
        entry = doc["kernels"][key]
        hint = {c: i for i, c in enumerate(entry.get("hint") or _hint_of_twin(doc, entry))}
        near = [c for c in k.neighbours() if c.text not in entry["tried"]]
        return sorted(near, key=lambda c: hint.get(c.text, len(hint)))  # stable: nearest first after the hints

    untried = {key: order(key, k) for key, k in kernels.items()}
    total = trials or sum(len(v) for v in untried.values())
    shares = allocate_trials({k: v for k, v in costs.items() if untried[k]}, total, step=1)
    return {key: untried[key][:n] for key, n in shares.items() if n}


def _refine(
    kernels: dict[str, GemmKernel], costs: dict[str, float], doc: dict[str, Any], trials: int
) -> dict[str, list[GemmConfig]]:
    """Per kernel whose fastest correct candidate beats its default, the untried single changes of that
    candidate (`cuda_tiles.refinements`), as many as its share of the time allows (`trials`, 0: all)."""
    untried: dict[str, list[GemmConfig]] = {}
    for key, k in kernels.items():
        entry = doc["kernels"][key]
        timed = {c: ms for c, ms in entry["tried"].items() if isinstance(ms, float)}
        if not timed or min(timed.values()) >= entry.get("default_ms", 0.0):
            continue  # the default is the fastest: its neighbours were the plan
        best = GemmConfig.parse(min(timed, key=lambda c: timed[c]))
        untried[key] = [c for c in k.refinements(best) if c.text not in entry["tried"] and c != k.default]
    total = trials or sum(len(v) for v in untried.values())
    shares = allocate_trials({k: v for k, v in costs.items() if untried.get(k)}, total, step=1)
    return {key: untried[key][:n] for key, n in shares.items() if n}


def _save(path: Path, doc: dict[str, Any]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    write_json_atomic(path, doc)


def _last_line(e: BaseException) -> str:
    lines = [ln for ln in str(e).splitlines() if ln.strip()]
    return (lines[-1] if lines else type(e).__name__)[:200]
