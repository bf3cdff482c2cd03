"""MetaSchedule tuning databases, stored per (profile, model, precision) and reused by every build.

Untuned TVM CPU code is about 90x slower than onnxruntime. `edgedeploy build ... --tune-trials N` tunes
once and writes the database to `profiles/tuning/<profile>/<model sha[:16]>-<precision>/`; later builds
of the same model for the same profile apply it without tuning (the `apply-tuning` stage).
"""

from __future__ import annotations

import os
import tempfile
import time
from pathlib import Path
from typing import Any

import tvm
import tvm_ffi
from tvm import relax

from ..errors import BuildError
from .pipeline import BuildContext, stage

DB_FILES = ("database_workload.json", "database_tuning_record.json")
KEEP_BEST = 4  # records kept per kernel: the best applies, the rest seed the search when the database is extended


def tuning_root() -> Path:
    """The built-in databases, next to the built-in profiles."""
    from importlib import resources

    return Path(str(resources.files("edgedeploy.builtin_profiles"))) / "tuning"


def database_dir(profile: str, key: str, root: Path | None = None) -> Path:
    return (root or tuning_root()) / profile / key


def has_database(path: Path) -> bool:
    return all((path / f).is_file() for f in DB_FILES)


def tuning_target(target: dict[str, Any]) -> Any:
    """MetaSchedule needs the core count in the target; the build target is the profile's."""
    return tvm.target.Target({**target, "num-cores": max(1, os.cpu_count() or 1)})


@stage("apply-tuning")
def apply_tuning(ctx: BuildContext) -> None:
    """Tune when asked (--tune-trials), then apply the stored database if there is one; else a no-op."""
    db = database_dir(ctx.profile.name, ctx.tuning_key)
    if ctx.tune_trials <= 0 and not has_database(db):
        ctx.progress("apply-tuning: no stored database, default schedules")
        return
    target = tuning_target(dict(ctx.profile.compiler.target))
    try:
        with target:
            mod = tvm.transform.Sequential(
                [
                    relax.transform.DecomposeOpsForInference(),
                    relax.transform.CanonicalizeBindings(),
                    relax.get_pipeline("zero"),
                ]
            )(ctx.ir)
            if ctx.tune_trials > 0:
                tune(mod, target, db, ctx.tune_trials, ctx.progress)
            ctx.ir = relax.transform.MetaScheduleApplyDatabase(str(db))(mod)
        kernels = [gv.name_hint for gv, f in ctx.ir.functions.items() if isinstance(f, tvm.tirx.PrimFunc)]
        ctx.tuned_kernels = sorted(k for k in kernels if _is_scheduled(ctx.ir[k]))
        ctx.progress(f"apply-tuning: {len(ctx.tuned_kernels)} of {len(kernels)} kernels from the database {db.name}")
    except BuildError:
        raise
    except Exception as e:  # MetaSchedule raises TVMError and friends
        raise BuildError(f"tuning with database {db} failed: {str(e).strip().splitlines()[-1]}") from None


def _is_scheduled(func: Any) -> bool:
    """MetaScheduleApplyDatabase marks the functions it scheduled (TVM 0.27 spells the attribute tirx.)"""
    attrs = func.attrs
    return attrs is not None and any(k in attrs and bool(attrs[k]) for k in ("tirx.is_scheduled", "tir.is_scheduled"))


def tune(mod: Any, target: Any, db: Path, trials: int, progress: Any) -> None:
    """Spend `trials` where the time is, check every tuned kernel against its default schedule, extend the database.

    The untuned (or already tuned) module is run once with per-kernel timing; trials go to the kernels
    by their share of the measured time (`allocate_trials`). A tuned kernel whose outputs differ from
    the default schedule's on the same inputs is dropped from the database (`verify_database`).
    """
    from tvm.s_tir import meta_schedule as ms

    try:
        import xgboost  # noqa: F401
    except ImportError:
        raise BuildError("tuning needs xgboost", hint="pip install 'edgedeploy[tune]'") from None
    tasks = {t.task_name: t for t in ms.relax_integration.extract_tasks(mod, target)}
    costs = kernel_costs(mod, target, db if has_database(db) else None)
    plan = allocate_trials({k: v for k, v in costs.items() if k in tasks}, trials)
    shown = ", ".join(f"{k} {n}" for k, n in plan.items())
    progress(f"tune: {len(tasks)} tasks, {sum(costs.values()):.2f} ms measured; trials: {shown}")
    db.mkdir(parents=True, exist_ok=True)
    database = ms.database.JSONDatabase(work_dir=str(db))
    with tempfile.TemporaryDirectory(prefix="edgedeploy-tune-") as work:
        for name, n in plan.items():
            ms.tune_tir(
                tasks[name].dispatched[0],
                target,
                work,
                max_trials_global=n,
                num_trials_per_iter=min(16, n),
                database=database,
                builder=ms.builder.LocalBuilder(timeout_sec=120),
            )
    dropped = verify_database(db, [tasks[name] for name in plan], target)
    if dropped:
        progress(f"tune: dropped the records of {', '.join(dropped)}: outputs differ from the default schedule")
    _rewrite_database(db, keep_best=KEEP_BEST)


def kernel_costs(mod: Any, target: Any, db: Path | None, runs: int = 5) -> dict[str, float]:
    """Milliseconds per inference spent in each kernel (all its calls), with `db` applied when given."""
    import numpy as np

    with target:
        if db is not None:
            mod = relax.transform.MetaScheduleApplyDatabase(str(db))(mod)
        ex = tvm.compile(mod, target=target, relax_pipeline=relax.get_default_pipeline(target))
    dev = tvm.cpu()
    vm = relax.VirtualMachine(ex, dev)
    rng = np.random.default_rng(0)
    args = [tvm.runtime.tensor(_random(rng, p.ty), dev) for p in mod["main"].params]
    vm["main"](*args)
    spent: dict[str, float] = {}
    started: dict[str, float] = {}

    def instrument(func: Any, name: str, before: bool, ret: Any, *a: Any) -> int:
        if before:
            started[name] = time.perf_counter()
        else:
            spent[name] = spent.get(name, 0.0) + time.perf_counter() - started[name]
        return 0

    vm.set_instrument(instrument)
    for _ in range(runs):
        vm["main"](*args)
    return {k: v * 1000 / runs for k, v in spent.items()}


def allocate_trials(costs: dict[str, float], total: int, step: int = 8, min_share: float = 0.02) -> dict[str, int]:
    """Trials per kernel in proportion to its measured time; kernels under `min_share` of the total get none.

    Counts are multiples of `step` (one search round), at least one round each, most expensive first.
    """
    whole = sum(costs.values())
    if whole <= 0 or total <= 0:
        return {}
    ranked = sorted(((v, k) for k, v in costs.items() if v >= min_share * whole), reverse=True)
    chosen = sum(v for v, _ in ranked)
    plan: dict[str, int] = {}
    left = total
    for v, k in ranked:
        n = max(step, int(round(total * v / chosen / step)) * step)
        if left < step:
            break
        plan[k] = min(n, left - left % step)
        left -= plan[k]
    return plan


def verify_database(db: Path, tasks: list[Any], target: Any) -> list[str]:
    """Run each task's tuned kernel and its default schedule on the same random inputs; drop the
    records of every task whose outputs differ (bit-exact for integer outputs). Returns their names."""
    import numpy as np
    from tvm.s_tir import meta_schedule as ms

    database = ms.database.JSONDatabase(work_dir=str(db))
    dev, rng = tvm.cpu(), np.random.default_rng(0)
    bad: list[tuple[str, Any]] = []
    for task in tasks:
        workload = task.dispatched[0]
        sch = ms.tir_integration.compile_tir(database, workload, target)
        if sch is None:
            continue
        host = [_random(rng, a) for a in ms.arg_info.ArgInfo.from_prim_func(workload["main"])]
        outs = []
        for m in (workload, sch.mod):
            lib = tvm.compile(m, target=target)
            arrays = [tvm.runtime.tensor(a, dev) for a in host]
            lib["main"](*arrays)
            outs.append(arrays[-1].numpy())
        ref, got = outs
        same = np.array_equal(ref, got) if ref.dtype.kind in "iub" else np.allclose(got, ref, rtol=1e-4, atol=1e-5)
        if not same:
            bad.append((task.task_name, workload))
    if bad:
        _drop_workloads(db, [w for _, w in bad])
    return [name for name, _ in bad]


def _random(rng: Any, t: Any) -> Any:
    """Random inputs for a buffer or tensor type: full range for 8-bit integers, moderate otherwise."""
    import numpy as np

    shape = [int(d) for d in (t.shape.values if hasattr(t.shape, "values") else t.shape)]
    dtype = np.dtype(str(t.dtype))
    if dtype.kind in "iu":
        info = np.iinfo(dtype)
        lo, hi = (int(info.min), int(info.max)) if dtype.itemsize == 1 else (-1000, 1000)
        return rng.integers(lo, hi + 1, size=shape).astype(dtype)
    return rng.standard_normal(shape).astype(dtype)


def _drop_workloads(db: Path, workloads: list[Any]) -> None:
    """Rewrite the database without the records of `workloads` (matched structurally)."""
    _rewrite_database(db, drop=workloads)


def _rewrite_database(db: Path, drop: list[Any] | None = None, keep_best: int | None = None) -> None:
    """Rewrite the database without the records of `drop` and with at most `keep_best` records per workload."""
    from tvm.s_tir import meta_schedule as ms

    old = ms.database.JSONDatabase(work_dir=str(db))
    by_workload: dict[int, list[Any]] = {}
    for r in old.get_all_tuning_records():
        if drop and any(tvm_ffi.structural_equal(r.workload.mod, w) for w in drop):
            continue
        by_workload.setdefault(tvm_ffi.structural_hash(r.workload.mod), []).append(r)
    for f in DB_FILES:
        (db / f).unlink()
    new = ms.database.JSONDatabase(work_dir=str(db))
    for records in by_workload.values():
        records.sort(key=lambda r: _mean_secs(r))
        for r in records[:keep_best]:
            workload = new.commit_workload(r.workload.mod)
            new.commit_tuning_record(ms.database.TuningRecord(r.trace, workload, r.run_secs, r.target, r.args_info))


def _mean_secs(record: Any) -> float:
    secs = [float(s) for s in (record.run_secs or [])]
    return sum(secs) / len(secs) if secs else float("inf")


def _remove_tree(path: Path) -> None:
    for p in sorted(path.rglob("*"), reverse=True):
        p.unlink() if p.is_file() else p.rmdir()
    path.rmdir()
