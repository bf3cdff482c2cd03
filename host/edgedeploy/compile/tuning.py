"""MetaSchedule tuning: databases stored per (profile, model, precision) and applied by every build.

A database is the pair of JSON files MetaSchedule writes. Builds look for one in this order:
1. the user's, written by `edgedeploy tune`: <config dir>/tuning/<profile>/<key>/
2. the built-in ones shipped with edgedeploy: profiles/tuning/<profile>/<key>/
where key = "<source model sha256[:16]>-<precision>" (precision fp32, fp16 or int8). One database holds
every batch size tuned for that key: MetaSchedule matches kernels by their structure.

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
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ..errors import BuildError
from ..paths import config_dir
from ..profiles import DeviceProfile
from .pipeline import BuildContext, stage
from .tune_offline import keep_whole_lines, open_database, persistent_builder, run_tuning

DB_FILES = ("database_workload.json", "database_tuning_record.json")
EXPORT_MODULE = "tuning-module.json"
EXPORT_META = "tuning.json"

# MetaSchedule's GPU search needs the thread and memory limits in the target; these hold for every
# profile's GPU (sm_72, sm_75, sm_90): 1024 threads per block, 48 KiB static shared memory per block.
CUDA_LIMITS = {
    "max_threads_per_block": 1024,
    "max_num_threads": 1024,
    "max_shared_memory_per_block": 49152,
    "thread_warp_size": 32,
    "registers_per_block": 65536,
}


@dataclass(frozen=True)
class TuneRequest:
    """What `edgedeploy tune` asks of the apply-tuning stage."""

    trials: int
    database: Path  # read and extended
    runner: str = "local"  # local | rpc | export
    tracker: str = ""  # rpc: HOST:PORT of TVM's RPC tracker
    key: str = ""  # rpc: the device key the RPC servers registered with
    export_dir: Path | None = None
    cost_model: str = "xgb"  # xgb | random
    tasks: int = 0  # > 0: only the N heaviest kernels

    def to_json(self) -> dict[str, Any]:
        return {**self.__dict__, "database": str(self.database), "export_dir": str(self.export_dir or "")}

    @classmethod
    def from_json(cls, d: dict[str, Any]) -> TuneRequest:
        return cls(
            **{**d, "database": Path(d["database"]), "export_dir": Path(d["export_dir"]) if d["export_dir"] else None}
        )


def tuning_key(source_sha256: str, precision: str) -> str:
    return f"{source_sha256[:16]}-{precision}"


def builtin_root() -> Path:
    """The built-in databases, next to the built-in profiles."""
    from importlib import resources

    return Path(str(resources.files("edgedeploy.builtin_profiles"))) / "tuning"


def user_root() -> Path:
    return config_dir() / "tuning"


def has_database(path: Path) -> bool:
    return all((path / f).is_file() for f in DB_FILES)


def find_database(profile: str, key: str) -> Path | None:
    """The database a build applies: the user's first, then the built-in one; None when neither exists."""
    for root in (user_root(), builtin_root()):
        if has_database(root / profile / key):
            return root / profile / key
    return None


def tuning_target_spec(profile: DeviceProfile) -> dict[str, Any]:
    """The profile's build target plus what MetaSchedule needs: core count (CPU) or GPU limits (CUDA)."""
    target = dict(profile.compiler.target)
    if profile.device == "cuda":
        return {**CUDA_LIMITS, **target}
    return {**target, "num-cores": max(1, os.cpu_count() or 1)}


def tuning_target(profile: DeviceProfile) -> Any:
    import tvm

    return tvm.target.Target(tuning_target_spec(profile))


def tuning_module(mod: Any) -> Any:
    """The module MetaSchedule extracts tasks from and the database is applied to (fused, legalized)."""
    import tvm
    from tvm import relax

    return tvm.transform.Sequential(
        [
            relax.transform.DecomposeOpsForInference(),
            relax.transform.CanonicalizeBindings(),
            relax.get_pipeline("zero"),
        ]
    )(mod)


def scheduled_kernels(mod: Any) -> tuple[int, int]:
    """(kernels with a schedule from the database, all kernels) in `mod`."""
    import tvm

    kernels = [f for f in mod.functions.values() if isinstance(f, tvm.tirx.PrimFunc)]
    done = sum(1 for f in kernels if f.attrs is not None and bool(f.attrs.get("tirx.is_scheduled", False)))
    return done, len(kernels)


@stage("apply-tuning")
def apply_tuning(ctx: BuildContext) -> None:
    """Tune when `edgedeploy tune` asks, then apply the database if there is one; else a no-op."""
    from tvm import relax

    db = ctx.tune.database if ctx.tune is not None else ctx.tuning_db
    if db is None:
        ctx.progress("apply-tuning: no tuning database, default schedules")
        return
    target = tuning_target(ctx.profile)
    try:
        with target:
            mod = tuning_module(ctx.ir)
            if ctx.tune is not None and ctx.tune.runner == "export":
                export(mod, target, ctx)
                ctx.stop = True
                return
            if ctx.tune is not None:
                tune(mod, target, ctx.tune, ctx.profile, ctx.progress)
            if not has_database(db):
                return
            open_database(db)  # registers the tensor intrinsics its records may name
            ctx.ir = relax.transform.MetaScheduleApplyDatabase(str(db))(mod)
    except BuildError:
        raise
    except Exception as e:  # MetaSchedule raises TVMError and friends
        raise BuildError(f"tuning with database {db} failed: {str(e).strip().splitlines()[-1]}") from None
    done, total = scheduled_kernels(ctx.ir)
    ctx.tuned_kernels = (done, total)
    ctx.progress(f"apply-tuning: {done} of {total} kernels scheduled from {db}")


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
        "tasks": len(ms_tasks(mod, target)),
    }
    (out / EXPORT_META).write_text(json.dumps(meta, indent=2) + "\n")
    ctx.progress(f"apply-tuning: wrote {meta['tasks']} tuning tasks to {out}")


def without_weights(mod: Any) -> Any:
    """The module with every non-scalar constant of its Relax functions replaced by zeros of the same shape:
    the kernels (what is tuned) are unchanged, the export is a tenth of the size and holds no weights."""
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


def ms_tasks(mod: Any, target: Any) -> list[Any]:
    from tvm.s_tir import meta_schedule as ms

    return list(ms.relax_integration.extract_tasks(mod, target))


def export_shared(mod: Any, cc: str = "") -> str:
    """MetaSchedule export for remote runners: a shared library the device loads without a compiler."""
    import tempfile

    import tvm

    path = os.path.join(tempfile.mkdtemp(), "tvm_tmp_mod.so")
    kwargs = {"fcompile": tvm.support.cc.cross_compiler(cc)} if cc else {}
    mod.export_library(path, **kwargs)
    return path


def tune(mod: Any, target: Any, req: TuneRequest, profile: DeviceProfile, progress: Any) -> None:
    """Extend `req.database` with `req.trials` measured candidates, spread over the tasks by MetaSchedule's
    gradient task scheduler (it gives more trials to the kernels where they pay)."""
    from tvm.s_tir import meta_schedule as ms

    if req.cost_model == "xgb":
        try:
            import xgboost  # noqa: F401
        except ImportError:
            raise BuildError(
                "tuning needs xgboost", hint="pip install 'edgedeploy[tune]' or --cost-model random"
            ) from None
    tasks = ms_tasks(mod, target)
    progress(f"tune: {len(tasks)} tasks, {req.trials} trials, measured by {req.runner}")
    builder: Any = None
    runner: Any = None
    if req.runner == "rpc":
        host, port = parse_tracker(req.tracker)
        cc = profile.compiler.cross_compiler or ""
        builder = persistent_builder(f_export=functools.partial(export_shared, cc=cc))
        runner = ms.runner.RPCRunner(
            ms.runner.RPCConfig(tracker_host=host, tracker_port=port, tracker_key=req.key, session_timeout_sec=60)
        )
    with stdout_to_stderr():
        run_tuning(mod, target, req.database, req.trials, builder, runner, req.cost_model, req.tasks)


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
    if not meta_file.is_file() or not has_database(folder):
        raise BuildError(
            f"{folder} holds no tuned database ({EXPORT_META} and {', '.join(DB_FILES)})",
            hint="run `python -m edgedeploy.compile.tune_offline DIR` there first",
        )
    meta = json.loads(meta_file.read_text())
    dest = database or user_root() / meta["profile"] / meta["key"]
    dest.mkdir(parents=True, exist_ok=True)
    keep_whole_lines(folder)
    src, dst = open_database(folder), open_database(dest)
    for r in src.get_all_tuning_records():
        if not r.run_secs:
            continue
        workload = dst.commit_workload(r.workload.mod)
        dst.commit_tuning_record(ms.database.TuningRecord(r.trace, workload, r.run_secs, r.target, r.args_info))
    return dest, len(dst)
