"""Runs on the GPU machine after bench/gpu_tune.sh: the exported tuning module compiled twice in one
process, with TVM's default (dlight) schedules and with the tuned database, timed on the same GPU.

    python3 bench/gpu_tuned_vs_default.py DIR     (DIR: a module folder tune_offline filled)

The module's weights are zeros (the export leaves them out): timing does not depend on their values.

Prints both times (and compile times) and the speed-up default / tuned.
"""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path

import numpy as np
import tvm
from tvm import relax

from edgedeploy.compile.cuda import tensor_intrinsics
from edgedeploy.compile.tuning.metaschedule import scheduled_kernels


def compile_and_time(mod: object, target: object, db: Path | None) -> tuple[float, float, int]:
    t = time.perf_counter()
    with target, tvm.transform.PassContext(opt_level=3, config={"relax.backend.use_cuda_graph": True}):
        if db is not None:
            tensor_intrinsics.import_all()
            mod = relax.transform.MetaScheduleApplyDatabase(str(db))(mod)
        tuned = len(scheduled_kernels(mod)[0])
        ex = tvm.compile(mod, target=target)
    secs = time.perf_counter() - t
    dev = tvm.cuda()
    vm = relax.VirtualMachine(ex, dev)
    shape = [int(d) for d in mod["main"].params[0].ty.shape.values]
    x = tvm.runtime.tensor(np.random.rand(*shape).astype("float32"), dev)
    ms = vm.time_evaluator("main", dev, number=20, repeat=5)(x).median * 1e3
    return ms, secs, tuned


def main() -> None:
    folder = Path(sys.argv[1])
    meta = json.loads((folder / "tuning.json").read_text())
    target = tvm.target.Target(meta["target"])
    mod = tvm.ir.load_json((folder / "tuning-module.json").read_text())
    base, base_s, _ = compile_and_time(mod, target, None)
    print(f"{folder.name}: default schedules {base:.3f} ms (compiled in {base_s:.0f} s)", flush=True)
    tuned, tuned_s, n = compile_and_time(mod, target, folder)
    print(
        f"{folder.name}: tuned database ({n} kernels) {tuned:.3f} ms (compiled in {tuned_s:.0f} s); "
        f"speed-up {base / tuned:.2f}x",
        flush=True,
    )


if __name__ == "__main__":
    main()
