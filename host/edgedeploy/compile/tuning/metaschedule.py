"""MetaSchedule, as edgedeploy uses it: databases that open whatever intrinsics their records name, a builder
pool that survives slow process starts, the tasks worth tuning, and the one call that tunes them.

Used by `edgedeploy tune` (tuning.py) and by tune_offline.py where the device is; needs only tvm with its
compiler, numpy, psutil and cloudpickle (xgboost for the default cost model).
"""

from __future__ import annotations

import contextlib
import json
import shutil
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

from edgedeploy_agent.durable import write_atomic

from ..cuda import tensor_intrinsics


def open_database(folder: Path) -> Any:
    """A MetaSchedule JSON database, readable whatever intrinsics its records name."""
    from tvm.s_tir import meta_schedule as ms

    tensor_intrinsics.import_all()  # records of tensor-core schedules name intrinsics (wmma_fill_16x16x16_f16)
    return ms.database.JSONDatabase(work_dir=str(folder))


def scheduled_kernels(mod: Any) -> tuple[list[str], int]:
    """(names of the kernels scheduled from a database, number of kernels) in `mod`.
    MetaScheduleApplyDatabase marks what it scheduled; TVM 0.27 spells the attribute tirx.is_scheduled.
    Kernels that come scheduled by edgedeploy (attribute `edgedeploy.schedule`) are not from a database."""
    import tvm

    kernels = {gv.name_hint: f for gv, f in mod.functions.items() if isinstance(f, tvm.tirx.PrimFunc)}
    attrs = {k: f.attrs or {} for k, f in kernels.items()}
    done = sorted(k for k, a in attrs.items() if bool(a.get("tirx.is_scheduled", 0)) and "edgedeploy.schedule" not in a)
    return done, len(kernels)


def build_in_target(mod: Any, target: Any, params: Any) -> Any:
    """MetaSchedule's default build, inside `with target`: TVM's CUDA compile callback reads the SM from
    Target.current() and otherwise asks the GPU, which a build host does not have."""
    from tvm.s_tir.meta_schedule.builder.local_builder import default_build

    # default_build imports tvm.s_tir.tensor_intrin in every builder process: 60-100 s there unless seeded
    # (tensor_intrinsics.py), which under load passed the builder's timeout and failed every candidate
    tensor_intrinsics.import_all()
    with target:
        return default_build(mod, target, params)


def persistent_builder(timeout_sec: float = 120.0, f_export: Any = None) -> Any:
    """MetaSchedule's LocalBuilder starts a fresh pool of worker processes for every batch; each imports
    TVM's 259 MB compiler library. Under gVisor (the GPU machine) and on busy 2-core hosts that start-up
    alone passed the default 30 s timeout, so every candidate "failed to build". One pool, kept."""
    from tvm.s_tir.meta_schedule.builder import BuilderResult, LocalBuilder
    from tvm.s_tir.meta_schedule.builder.local_builder import _serialize_params, _worker_func
    from tvm.support.popen_pool import PopenPoolExecutor, StatusKind

    class PersistentLocalBuilder(LocalBuilder):  # type: ignore[misc]
        pool: Any = None

        def build(self, build_inputs: list[Any]) -> list[Any]:
            if self.pool is None:
                self.pool = PopenPoolExecutor(max_workers=self.max_workers, timeout=self.timeout_sec)
            jobs = [(self.f_build, self.f_export, b.mod, b.target, _serialize_params(b.params)) for b in build_inputs]
            results = []
            for r in self.pool.map_with_error_catching(lambda x: _worker_func(*x), jobs):
                if r.status == StatusKind.COMPLETE:
                    results.append(BuilderResult(r.value, None))
                elif r.status == StatusKind.TIMEOUT:
                    results.append(BuilderResult(None, f"LocalBuilder: timeout after {self.timeout_sec} s"))
                else:
                    results.append(BuilderResult(None, f"LocalBuilder: {r.value}"))
            return results

    return PersistentLocalBuilder(timeout_sec=timeout_sec, f_build=build_in_target, f_export=f_export)


@contextlib.contextmanager
def closing_pools(*workers: Any) -> Iterator[None]:
    """Kill, when the block ends, the worker processes of MetaSchedule builders and runners (LocalBuilder,
    persistent_builder, LocalRunner and RPCRunner keep a PopenPoolExecutor in `.pool`). They are FFI objects,
    collected late or never, so their popen_worker processes outlived the tuning; None entries are skipped."""
    try:
        yield
    finally:
        for worker in workers:
            pool = getattr(worker, "pool", None)
            if pool is not None and hasattr(pool, "shutdown"):
                with contextlib.suppress(Exception):  # a pool already shut down, or broken: it is gone either way
                    pool.shutdown(wait=False)


def tunable_tasks(mod: Any, target: Any) -> list[Any]:
    """MetaSchedule's tasks, without the kernels that come scheduled (x86_int8.py's tensorized convolutions).

    TVM 0.27 means to skip those (relax_integration.extracted_tasks_to_tune_contexts), but it looks for
    `tirx.is_scheduled` in the task module's attributes, where it never is: the flag is on the function."""
    from tvm.s_tir import meta_schedule as ms

    tasks = ms.relax_integration.extract_tasks(mod, target)
    return [t for t in tasks if not t.dispatched[0]["main"].attrs.get("tirx.is_scheduled", False)]


def run_tuning(
    mod: Any,
    target: Any,
    db: Path,
    trials: int,
    builder: Any = None,
    runner: Any = None,
    cost_model: str = "xgb",
    tasks: int = 0,
    progress: Callable[[str], None] = print,
) -> int:
    """The one call into MetaSchedule (also `edgedeploy tune`'s): extends the database in `db`, returns its
    record count. `tasks` > 0 tunes only that many kernels, the heaviest by FLOPs x calls, with the trials
    split evenly between them. MetaSchedule collects a batch's measurements only when it returns to that
    task or ends, so a run that is stopped loses its last round: size the trials to end in time.
    Without a learned cost model, evolutionary search only costs time: sample the design space instead."""
    from tvm.s_tir import meta_schedule as ms
    from tvm.s_tir.analysis import estimate_tir_flops

    db.mkdir(parents=True, exist_ok=True)
    tensor_intrinsics.import_all()  # records already in `db` may name them
    extracted = tunable_tasks(mod, target)
    progress(f"tune: {len(extracted)} tasks, {trials} trials" + (f" on the {tasks} heaviest" if tasks > 0 else ""))
    if tasks > 0:
        extracted.sort(key=lambda t: -estimate_tir_flops(t.dispatched[0]) * t.weight)
        extracted = extracted[:tasks]
    per_task = max(1, trials // len(extracted))
    contexts, weights = ms.relax_integration.extracted_tasks_to_tune_contexts(
        extracted, str(db), strategy="replay-trace" if cost_model == "random" else "evolutionary"
    )
    builder = builder or persistent_builder()
    runner = runner or ms.runner.LocalRunner(timeout_sec=60)
    with closing_pools(builder, runner):
        ms.tune.tune_tasks(
            tasks=contexts,
            task_weights=weights,
            work_dir=str(db),
            max_trials_global=per_task * len(extracted),
            max_trials_per_task=per_task,
            # random sampling: small batches reach every kernel sooner; a learned model wants larger ones
            num_trials_per_iter=min(per_task, 8 if cost_model == "random" else 16),
            builder=builder,
            runner=runner,
            cost_model=cost_model,
        )
    shutil.rmtree(db / "logs", ignore_errors=True)
    return len(open_database(db))


def keep_whole_lines(folder: Path) -> None:
    """A tuning run stopped mid-write can leave a torn last line in a database file: drop it."""
    for name in ("database_workload.json", "database_tuning_record.json"):
        path = folder / name
        if not path.is_file():
            continue
        lines = path.read_text().splitlines()
        whole = []
        for line in lines:
            try:
                json.loads(line)
            except ValueError:
                continue
            whole.append(line)
        if len(whole) != len(lines):
            write_atomic(path, "".join(line + "\n" for line in whole))
