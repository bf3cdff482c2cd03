"""MetaSchedule tuning databases, stored per (profile, model, precision) and reused by every build.

Untuned TVM CPU code is about 90x slower than onnxruntime. `edgedeploy build ... --tune-trials N` tunes
once and writes the database to `profiles/tuning/<profile>/<model sha[:16]>-<precision>/`; later builds
of the same model for the same profile apply it without tuning (the `apply-tuning` stage).
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import tvm
from tvm import relax

from ..errors import BuildError
from .pipeline import BuildContext, stage

DB_FILES = ("database_workload.json", "database_tuning_record.json")


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
    except BuildError:
        raise
    except Exception as e:  # MetaSchedule raises TVMError and friends
        raise BuildError(f"tuning with database {db} failed: {str(e).strip().splitlines()[-1]}") from None


def tune(mod: Any, target: Any, db: Path, trials: int, progress: Any) -> None:
    """Spread `trials` evenly over every task (round robin, small batches) and extend the database."""
    from tvm.s_tir import meta_schedule as ms

    try:
        import xgboost  # noqa: F401
    except ImportError:
        raise BuildError("tuning needs xgboost", hint="pip install 'edgedeploy[tune]'") from None
    tasks = ms.relax_integration.extract_tasks(mod, target)
    per_task = max(4, -(-trials // max(1, len(tasks))))
    progress(f"tune: {len(tasks)} tasks, {per_task} trials each")
    db.mkdir(parents=True, exist_ok=True)
    ms.relax_integration.tune_relax(
        mod,
        {},
        target,
        str(db),
        max_trials_global=per_task * len(tasks),
        max_trials_per_task=per_task,
        num_trials_per_iter=min(16, per_task),
        task_scheduler="round-robin",
    )
    logs = db / "logs"
    if logs.is_dir():
        _remove_tree(logs)


def _remove_tree(path: Path) -> None:
    for p in sorted(path.rglob("*"), reverse=True):
        p.unlink() if p.is_file() else p.rmdir()
    path.rmdir()
