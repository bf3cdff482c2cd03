"""Tune an exported tuning module where a full TVM and the device are:

    python -m edgedeploy.compile.tune_offline DIR [--trials 200] [--cost-model random]   # MetaSchedule
    python -m edgedeploy.compile.tune_offline DIR --trials 0 --gemm-minutes 10          # tensor-core GEMMs

DIR is what `edgedeploy tune BUNDLE --export DIR` wrote (tuning-module.json, tuning.json). The databases
go to DIR (MetaSchedule's database_workload.json and database_tuning_record.json, metaschedule.py; the
tensor-core GEMM configurations gemm_configs.json, tuning/gemm.py); bring DIR back and store them with
`edgedeploy tune --import DIR`. Needs only tvm (with its compiler) and numpy, plus psutil and
cloudpickle for MetaSchedule and xgboost for its default cost model: the machine that measures need not
have edgedeploy's other dependencies (run it with PYTHONPATH pointing at this repository's host/ and agent/).
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

from .tuning.metaschedule import keep_whole_lines, open_database, run_tuning


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m edgedeploy.compile.tune_offline", description=__doc__.splitlines()[0])
    ap.add_argument("dir", type=Path)
    ap.add_argument("--trials", type=int, default=200, help="0: only repair and count the database")
    ap.add_argument("--cost-model", choices=("xgb", "random"), default="xgb")
    ap.add_argument("--tasks", type=int, default=0, help="tune only the N heaviest kernels (0: all)")
    ap.add_argument("--gemm-minutes", type=float, default=0, help="search tensor-core GEMM configurations (GPU)")
    ap.add_argument("--gemm-trials", type=int, default=0, help="at most N GEMM candidates (0: all neighbours)")
    args = ap.parse_args(argv)
    meta_file, module_file = args.dir / "tuning.json", args.dir / "tuning-module.json"
    if not meta_file.is_file() or not module_file.is_file():
        print(f"error: {args.dir} has no tuning.json / tuning-module.json (edgedeploy tune --export)", file=sys.stderr)
        return 2
    keep_whole_lines(args.dir)
    import tvm

    meta = json.loads(meta_file.read_text())
    target = tvm.target.Target(meta["target"])
    if args.trials == 0 and args.gemm_minutes <= 0:
        print(f"{args.dir}: {len(open_database(args.dir))} records", flush=True)
        return 0
    mod = tvm.ir.load_json(module_file.read_text())
    print(f"{meta['profile']} {meta['key']}: target {target}", flush=True)
    if args.gemm_minutes > 0:
        from .tuning.gemm import GEMM_FILE, tune

        tune(mod, meta["target"], args.dir / GEMM_FILE, args.gemm_minutes, args.gemm_trials,
             progress=lambda line: print(line, flush=True))  # fmt: skip
    if args.trials == 0:
        return 0
    t = time.perf_counter()
    records = run_tuning(
        mod, target, args.dir, args.trials, cost_model=args.cost_model, tasks=args.tasks,
        progress=lambda line: print(line, flush=True),
    )  # fmt: skip
    print(f"tuned in {time.perf_counter() - t:.0f} s: {records} records in {args.dir}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
