"""MetaSchedule tuning: databases stored per (profile, model, precision) and applied by every build.

A database is the pair of JSON files MetaSchedule writes. Builds look for one in this order:
1. the user's, written by `edgedeploy tune`: <config dir>/tuning/<profile>/<key>/
2. the built-in ones shipped with edgedeploy: profiles/tuning/<profile>/<key>/
where key = "<graph digest[:16]>-<precision>" (precision fp32, fp16 or int8): the source model without its
weights (onnx_model.graph_digest), so a retrained model, or the same export written on another CPU, finds
the database of its kernels. One database holds every batch size tuned for that key: MetaSchedule and the
GEMM configurations match kernels by their structure.

How a database is made (`edgedeploy tune`, cli/tune.py), by who measures the candidates:
- "local": this machine (CPU profiles, when the device's CPU is this one);
- "rpc": a device registered with TVM's RPC tracker (`--tracker HOST:PORT --key KEY`); candidates are
  compiled here with the profile's toolchain (cross compiler, nvcc/NVRTC) and uploaded as shared libraries;
- "export": the tuning module (Relax IR as JSON) and its target are written to a folder; where a full TVM
  and the device are, `python -m edgedeploy.compile.tune_offline DIR` tunes it (tvm + numpy only), and
  `edgedeploy tune --import DIR` stores the database it wrote.
"""

from __future__ import annotations

import contextlib
import functools
import json
import os
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

from ...errors import BuildError
from ...paths import config_dir
from ...profiles import DeviceProfile
from ..config import Knobs, TuneRequest
from ..cuda import tensor_intrinsics
from ..stage import BuildContext, stage
from .common import allocate_trials, random_input
from .db import DB_FILES, has_database, rewrite_database, sync_database
from .gemm import GEMM_FILE, merge_into
from .key import _Keyed, tuning_key
from .metaschedule import (
    closing_pools,
    keep_whole_lines,
    open_database,
    persistent_builder,
    run_tuning,
    scheduled_kernels,
    tunable_tasks,
)

EXPORT_MODULE = "tuning-module.json"
EXPORT_META = "tuning.json"
KEEP_BEST = 4  # records kept per kernel: the best applies, the rest seed the search when the database is extended

# MetaSchedule's GPU search needs the thread and memory limits in the target; these hold for every
# profile's GPU (sm_72, sm_75, sm_90): 1024 threads per block, 48 KiB static shared memory per block.
CUDA_LIMITS = {
    "max_threads_per_block": 1024,
    "max_num_threads": 1024,
    "max_shared_memory_per_block": 49152,
    "thread_warp_size": 32,
    "registers_per_block": 65536,
}


def adopt_file_keyed_database(profile: str, model: _Keyed, precision: str) -> None:
    """The user's database for this model written before databases were named by the graph (2026-12-03),
    named by the file's sha256 then: renamed to the graph's key, once."""
    old = database_dir(profile, f"{model.sha256[:16]}-{precision}", user_root())
    new = database_dir(profile, tuning_key(model, precision), user_root())
    if old != new and old.is_dir() and not new.exists():
        os.replace(old, new)


def builtin_root() -> Path:
    """The built-in databases, next to the built-in profiles."""
    from importlib import resources

    return Path(str(resources.files("edgedeploy.builtin_profiles"))) / "tuning"


def user_root() -> Path:
    return config_dir() / "tuning"


def database_dir(profile: str, key: str, root: Path | None = None) -> Path:
    return (root or builtin_root()) / profile / key


def _first(profile: str, key: str, found: Callable[[Path], Path | None]) -> Path | None:
    """The user's database folder first, then the built-in one: what `found` finds there, or None."""
    for root in (user_root(), builtin_root()):
        hit = found(database_dir(profile, key, root))
        if hit is not None:
            return hit
    return None


def find_database(profile: str, key: str) -> Path | None:
    """The MetaSchedule database a build applies; None when neither place has one."""
    return _first(profile, key, lambda d: d if has_database(d) else None)


def find_gemm_configs(profile: str, key: str) -> Path | None:
    """The tensor-core GEMM configurations (tuning/gemm.py) a CUDA build applies, in the same two places."""
    return _first(profile, key, lambda d: d / GEMM_FILE if (d / GEMM_FILE).is_file() else None)


def tuning_target_spec(profile: DeviceProfile) -> dict[str, Any]:
    """The profile's build target plus what MetaSchedule needs: core count (CPU) or GPU limits (CUDA)."""
    target = dict(profile.compiler.target)
    if profile.device == "cuda":
        return {**CUDA_LIMITS, **target}
    return {**target, "num-cores": max(1, os.cpu_count() or 1)}


def tuning_target(profile: DeviceProfile) -> Any:
    import tvm

    return tvm.target.Target(tuning_target_spec(profile))


def tuning_module(mod: Any, knobs: Knobs = Knobs()) -> Any:
    """The module MetaSchedule extracts tasks from and the database is applied to (fused, legalized), inside
    `with target`: on CUDA fused as builds fuse (the INT8 convolutions padding themselves, INT8 tensors at
    kernel boundaries: cuda_tensorcore.fusion_passes)."""
    import tvm
    from tvm import relax

    from ..cuda.tensorcore import fusion_passes

    target = tvm.target.Target.current(allow_none=True)
    cuda = target is not None and target.kind.name == "cuda"
    fuse = fusion_passes(knobs) if cuda else [relax.get_pipeline("zero")]
    return tvm.transform.Sequential(
        [relax.transform.DecomposeOpsForInference(), relax.transform.CanonicalizeBindings(), *fuse]
    )(mod)


@stage("apply-tuning")
def apply_tuning(ctx: BuildContext) -> None:
    """Tune when `edgedeploy tune` asks, then apply the database if there is one; else a no-op."""
    from tvm import relax

    db = ctx.tune.db if ctx.tune is not None else ctx.tuning_db
    if db is None:
        ctx.progress("apply-tuning: no tuning database, default schedules")
        return
    target = tuning_target(ctx.profile)
    try:
        with target:
            mod = tuning_module(ctx.ir, ctx.cuda.knobs)
            if ctx.tune is not None and ctx.tune.runner == "export":
                export(mod, target, ctx)
                ctx.stop = True
                return
            if ctx.tune is not None:
                tune(mod, target, ctx.tune, ctx.profile, ctx.progress)
            if not has_database(db):
                return
            tensor_intrinsics.import_all()  # the records may name them
            ctx.ir = relax.transform.MetaScheduleApplyDatabase(str(db))(mod)
    except BuildError:
        raise
    except Exception as e:  # MetaSchedule raises TVMError and friends
        raise BuildError(f"tuning with database {db} failed: {str(e).strip().splitlines()[-1]}") from None
    ctx.tuned_kernels, ctx.kernel_count = scheduled_kernels(ctx.ir)
    ctx.progress(f"apply-tuning: {len(ctx.tuned_kernels)} of {ctx.kernel_count} kernels scheduled from {db}")


def export(mod: Any, target: Any, ctx: BuildContext) -> None:
    import tvm

    assert ctx.tune is not None and ctx.tune.export_dir is not None
    out = ctx.tune.export_dir
    out.mkdir(parents=True, exist_ok=True)
    (out / EXPORT_MODULE).write_text(tvm.ir.save_json(without_weights(mod)))
    meta = {
        "profile": ctx.profile.name,
        "key": ctx.tuning_key,
        "target": tuning_target_spec(ctx.profile),
        "tvm": str(tvm.__version__),
        "tasks": len(tunable_tasks(mod, target)),
    }
    (out / EXPORT_META).write_text(json.dumps(meta, indent=2) + "\n")
    ctx.progress(f"apply-tuning: wrote {meta['tasks']} tuning tasks to {out}")


def without_weights(mod: Any) -> Any:
    """The module with every non-scalar constant of its Relax functions replaced by zeros of the same shape:
    the kernels (what is tuned) are unchanged and the export holds no weights (MobileNetV1-0.25 fp16:
    2.2 MB → 1.0 MB, 57 kB with xz)."""
    import tvm
    from tvm import relax

    @relax.expr_functor.mutator
    class Zeros(relax.PyExprMutator):  # type: ignore[misc]
        def visit_generic_const_(self, c: Any) -> Any:
            shape = [int(d) for d in c.value.shape]
            return relax.op.zeros(relax.ShapeExpr(shape), str(c.value.dtype)) if shape else c

    return tvm.IRModule(
        {gv: Zeros(mod).visit_expr(f) if isinstance(f, relax.Function) else f for gv, f in mod.functions.items()}
    )


def export_shared(mod: Any, cc: str = "") -> str:
    """MetaSchedule export for remote runners: a shared library the device loads without a compiler."""
    import tvm

    path = os.path.join(tempfile.mkdtemp(), "tvm_tmp_mod.so")
    kwargs = {"fcompile": tvm.support.cc.cross_compiler(cc)} if cc else {}
    mod.export_library(path, **kwargs)
    return path


def tune(mod: Any, target: Any, req: TuneRequest, profile: DeviceProfile, progress: Any) -> None:
    """Extend `req.database` with `req.trials` measured candidates.

    Measured here (CPU): trials go to the kernels by their share of the measured time, and every tuned
    kernel is checked against its default schedule (`tune_where_the_time_is`). Measured elsewhere (RPC):
    MetaSchedule's gradient task scheduler spreads the trials (`run_tuning`), optionally over the
    `req.tasks` heaviest kernels only.
    """
    from tvm.s_tir import meta_schedule as ms

    if req.cost_model == "xgb":
        try:
            import xgboost  # noqa: F401
        except ImportError:
            hint = "pip install 'edgedeploy[tune]', or --cost-model random"
            raise BuildError("tuning needs xgboost", hint=hint) from None
    with stdout_to_stderr():
        if req.runner == "local" and profile.device == "cpu":
            tune_where_the_time_is(mod, target, req, progress)
            return
        host, port = parse_tracker(req.tracker)
        cc = profile.compiler.cross_compiler or ""
        builder = persistent_builder(f_export=functools.partial(export_shared, cc=cc))
        runner = ms.runner.RPCRunner(
            ms.runner.RPCConfig(tracker_host=host, tracker_port=port, tracker_key=req.key, session_timeout_sec=60)
        )
        run_tuning(mod, target, req.db, req.trials, builder, runner, req.cost_model, req.tasks, progress)


def tune_where_the_time_is(mod: Any, target: Any, req: TuneRequest, progress: Any) -> None:
    """Measure → allocate → one MetaSchedule search per kernel → verify → prune.

    The module (with the database so far) is run once with per-kernel timing; trials go to the kernels by
    their share of the measured time (`allocate_trials`), among the `req.tasks` costliest when that is set.
    One builder pool serves every kernel. A tuned kernel whose outputs differ from the
    default schedule's on the same inputs is dropped from the database (`verify_database`), so is one that
    is not faster than the default schedule in the model (`drop_slower_than_default`), and only the
    best KEEP_BEST records per kernel are kept.
    """
    from tvm.s_tir import meta_schedule as ms

    db = req.db
    tasks = {t.task_name: t for t in tunable_tasks(mod, target)}
    costs = kernel_costs(mod, target, db if has_database(db) else None)
    ranked = sorted((k for k in costs if k in tasks), key=lambda k: -costs[k])
    chosen = ranked[: req.tasks] if req.tasks > 0 else ranked
    plan = allocate_trials({k: costs[k] for k in chosen}, req.trials)
    shown = ", ".join(f"{k} {n}" for k, n in plan.items())
    progress(f"tune: {len(tasks)} tasks, {sum(costs.values()):.2f} ms measured; trials: {shown}")
    db.mkdir(parents=True, exist_ok=True)
    database = open_database(db)
    builder = persistent_builder()
    runner = ms.runner.LocalRunner()  # one for every kernel (tune_tir's default makes one a call, never closed)
    with tempfile.TemporaryDirectory(prefix="edgedeploy-tune-") as work, closing_pools(builder, runner):
        for name, n in plan.items():
            ms.tune_tir(
                tasks[name].dispatched[0],
                target,
                work,
                max_trials_global=n,
                num_trials_per_iter=min(16, n),
                database=database,
                builder=builder,
                runner=runner,
                cost_model=req.cost_model,
                strategy="replay-trace" if req.cost_model == "random" else "evolutionary",
            )
    dropped = verify_database(db, [tasks[name] for name in plan], target)
    if dropped:
        progress(f"tune: dropped the records of {', '.join(dropped)}: outputs differ from the default schedule")
    slower = drop_slower_than_default(mod, target, db, tasks)
    if slower:
        progress(f"tune: dropped the records of {', '.join(slower)}: not faster than the default schedule")
    rewrite_database(db, keep_best=KEEP_BEST)


@contextlib.contextmanager
def stdout_to_stderr() -> Iterator[None]:
    """MetaSchedule prints its progress tables on stdout (from C++ too), where `--json` output and the CUDA
    worker's protocol go: send file descriptor 1 to stderr while it runs."""
    sys.stdout.flush()
    saved = os.dup(1)
    os.dup2(2, 1)
    try:
        yield
    finally:
        sys.stdout.flush()
        os.dup2(saved, 1)
        os.close(saved)


def parse_tracker(text: str) -> tuple[str, int]:
    host, _, port = text.rpartition(":")
    if not host or not port.isdigit():
        raise BuildError(f"--tracker takes HOST:PORT, got {text!r}")
    return host, int(port)


def import_database(folder: Path, database: Path | None = None) -> tuple[Path, int]:
    """Merge the database tune_offline wrote into `folder` into `database` (default: the user's one for
    the exported profile and key). Records are re-committed, so workload indices stay consistent."""
    from tvm.s_tir import meta_schedule as ms

    meta_file = folder / EXPORT_META
    gemm = folder / GEMM_FILE
    if not meta_file.is_file() or not (has_database(folder) or gemm.is_file()):
        raise BuildError(
            f"{folder} holds no tuned database ({EXPORT_META} and {', '.join(DB_FILES)} or {GEMM_FILE})",
            hint="run `python -m edgedeploy.compile.tune_offline DIR` there first",
        )
    meta = json.loads(meta_file.read_text())
    dest = database or user_root() / meta["profile"] / meta["key"]
    dest.mkdir(parents=True, exist_ok=True)
    try:
        tuned_gemms = merge_into(gemm, dest / GEMM_FILE) if gemm.is_file() else 0
    except ValueError as e:  # a database of another version (gemm_tuning.VERSION)
        raise BuildError(str(e)) from None
    if not has_database(folder):
        return dest, tuned_gemms
    keep_whole_lines(folder)
    src, dst = open_database(folder), open_database(dest)
    for r in src.get_all_tuning_records():
        if not r.run_secs:
            continue
        workload = dst.commit_workload(r.workload.mod)
        dst.commit_tuning_record(ms.database.TuningRecord(r.trace, workload, r.run_secs, r.target, r.args_info))
    sync_database(dest)
    return dest, len(dst) + tuned_gemms


def kernel_costs(mod: Any, target: Any, db: Path | None, runs: int = 5) -> dict[str, float]:
    """Milliseconds per inference spent in each kernel (all its calls), with `db` applied when given."""
    import numpy as np
    import tvm
    from tvm import relax

    with target:
        if db is not None:
            tensor_intrinsics.import_all()
            mod = relax.transform.MetaScheduleApplyDatabase(str(db))(mod)
        ex = tvm.compile(mod, target=target, relax_pipeline=relax.get_default_pipeline(target))
    dev = tvm.cpu()
    vm = relax.VirtualMachine(ex, dev)
    rng = np.random.default_rng(0)
    args = [tvm.runtime.tensor(random_input(rng, p.ty), dev) for p in mod["main"].params]
    vm["main"](*args)
    return vm_kernel_costs(vm, args, runs)


def vm_kernel_costs(vm: Any, args: list[Any], runs: int) -> dict[str, float]:
    """Milliseconds per call of `vm`'s main spent in each kernel (all its calls), through the VM's instrument
    hook (which adds its own cost: the sum is above the uninstrumented call)."""
    spent: dict[str, float] = {}
    started: dict[str, float] = {}

    def instrument(func: Any, name: str, before: bool, ret: Any, *a: Any) -> int:
        if before:
            started[name] = time.perf_counter()
        else:
            spent[name] = spent.get(name, 0.0) + time.perf_counter() - started[name]
        return 0

    vm.set_instrument(instrument)
    try:
        for _ in range(runs):
            vm["main"](*args)
    finally:
        vm.set_instrument(None)
    return {k: v * 1000 / runs for k, v in spent.items()}


def outputs_agree(ref: Any, got: Any) -> bool:
    """A tuned kernel's output against its default schedule's: integers byte for byte; floats within 1e-4 of
    the output's largest magnitude (and rtol 1e-4). A float32 sum of K products taken in another order differs
    by up to about K * 2**-24 * sum|terms| on every element, which a per-element relative tolerance misses on
    elements near zero (ResNet-18's 3x3 convolutions, K = 1,152-4,608); an element a schedule got wrong or
    never wrote is off by the output's own scale."""
    import numpy as np

    if ref.dtype.kind in "iub":
        return bool(np.array_equal(ref, got))
    finite = np.isfinite(ref)
    scale = float(np.abs(ref[finite]).max()) if finite.any() else 0.0
    return bool(np.allclose(got, ref, rtol=1e-4, atol=1e-4 * scale + 1e-6, equal_nan=True))


def verify_database(db: Path, tasks: list[Any], target: Any) -> list[str]:
    """Run each task's tuned kernel and its default schedule on the same random inputs; drop the
    records of every task whose outputs differ (`outputs_agree`). Returns their names."""
    import numpy as np
    import tvm
    from tvm.s_tir import meta_schedule as ms

    database = open_database(db)
    dev, rng = tvm.cpu(), np.random.default_rng(0)
    bad: list[tuple[str, Any]] = []
    for task in tasks:
        workload = task.dispatched[0]
        sch = ms.tir_integration.compile_tir(database, workload, target)
        if sch is None:
            continue
        host = [random_input(rng, a) for a in ms.arg_info.ArgInfo.from_prim_func(workload["main"])]
        outs = []
        for m in (workload, sch.mod):
            lib = tvm.compile(m, target=target)
            arrays = [tvm.runtime.tensor(a, dev) for a in host]
            lib["main"](*arrays)
            outs.append(arrays[-1].numpy())
        if not outputs_agree(*outs):
            bad.append((task.task_name, workload))
    if bad:
        rewrite_database(db, drop=[w for _, w in bad])
    return [name for name, _ in bad]


def drop_slower_than_default(
    mod: Any, target: Any, db: Path, tasks: dict[str, Any], measure: Callable[..., dict[str, float]] | None = None
) -> list[str]:
    """Run the whole model with and without the database (per-kernel timing, `measure`: kernel_costs) and
    drop the records of every kernel that is not faster with its tuned schedule than with TVM's default one.
    MetaSchedule never measures the default schedule: for small elementwise and depthwise kernels its best
    candidate can be slower (measured: the input quantize 0.14 ms tuned against 0.04 ms default).
    Returns their names."""
    import tvm_ffi

    measure = measure or functools.partial(kernel_costs, runs=20)
    recorded = {tvm_ffi.structural_hash(r.workload.mod) for r in open_database(db).get_all_tuning_records()}
    names = [k for k, t in tasks.items() if tvm_ffi.structural_hash(t.dispatched[0]) in recorded]
    tuned = measure(mod, target, db)
    default = measure(mod, target, None)
    slower = sorted(k for k in names if k in tuned and k in default and tuned[k] >= default[k])
    if slower:
        rewrite_database(db, drop=[tasks[k].dispatched[0] for k in slower])
    return slower
