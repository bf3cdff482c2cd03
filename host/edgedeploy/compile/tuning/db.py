"""A MetaSchedule database as files: the pair of JSON files, and rewriting them durably (a rewrite that
is interrupted leaves the old database whole, or is completed by the next reader)."""

from __future__ import annotations

import os
import shutil
import tempfile
from pathlib import Path
from typing import Any

from edgedeploy_agent.durable import fsync_dir, fsync_file

from .metaschedule import open_database

DB_FILES = ("database_workload.json", "database_tuning_record.json")


def has_database(path: Path) -> bool:
    """Whether `path` holds a database (an interrupted durable rewrite there is completed first)."""
    finish_rewrite(path)
    return all((path / f).is_file() for f in DB_FILES)


REWRITE_READY = ".rewrite-ready"  # a complete new database, replacing the old one file by file


def rewrite_database(db: Path, drop: list[Any] | None = None, keep_best: int | None = None) -> None:
    """Rewrite the database without the records of `drop` and with at most `keep_best` records per workload.

    The new pair of files is written beside the old one (in db/.rewrite-*), made durable, then renamed to
    db/.rewrite-ready: the commit point. Before it, an interrupted rewrite (Ctrl-C, a power cut) leaves the
    old database as it was; after it, `finish_rewrite` (run by every reader here) completes the swap."""
    import tvm_ffi
    from tvm.s_tir import meta_schedule as ms

    finish_rewrite(db)
    by_workload: dict[int, list[Any]] = {}
    for r in open_database(db).get_all_tuning_records():
        if drop and any(tvm_ffi.structural_equal(r.workload.mod, w) for w in drop):
            continue
        by_workload.setdefault(tvm_ffi.structural_hash(r.workload.mod), []).append(r)
    with tempfile.TemporaryDirectory(prefix=".rewrite-", dir=db) as work:
        new = open_database(Path(work))
        for records in by_workload.values():
            records.sort(key=lambda r: mean_secs(r))
            for r in records[:keep_best]:
                workload = new.commit_workload(r.workload.mod)
                new.commit_tuning_record(ms.database.TuningRecord(r.trace, workload, r.run_secs, r.target, r.args_info))
        del new
        sync_database(Path(work))
        os.replace(work, db / REWRITE_READY)
        fsync_dir(db)
        os.mkdir(work)  # for TemporaryDirectory's clean-up
    finish_rewrite(db)


def sync_database(db: Path) -> None:
    """Make what MetaSchedule appended to the database durable (its writer does not fsync)."""
    for f in DB_FILES:
        if (db / f).is_file():
            fsync_file(db / f)
    fsync_dir(db)


def finish_rewrite(db: Path) -> None:
    """Complete a rewrite that reached its commit point (db/.rewrite-ready): move its files in, workloads
    first; a crash in between is completed by the next call. Drop the leftovers of one that did not."""
    ready = db / REWRITE_READY
    if ready.is_dir():
        for f in DB_FILES:
            if (ready / f).exists():
                os.replace(ready / f, db / f)
        fsync_dir(db)
        ready.rmdir()
    for left in db.glob(".rewrite-*") if db.is_dir() else []:
        shutil.rmtree(left, ignore_errors=True)


def mean_secs(record: Any) -> float:
    secs = [float(s) for s in (record.run_secs or [])]
    return sum(secs) / len(secs) if secs else float("inf")
