"""Where a CPU bundle's time goes: the whole call, then each kernel, on this machine.

    python bench/bundle_kernels.py BUNDLE.edb [--runs 60] [--threads N] [--top 20]

The bundle's library runs in a Relax VM on random inputs of its input shape: first `--runs` uninstrumented calls
(min and median ms), then as many through the VM's instrument hook (compile/tuning/apply.py `vm_kernel_costs`),
printing each kernel's ms per call, largest first. The thread pool is set as the agent sets it
(TVM_NUM_THREADS = --threads, default every CPU; runtime/tvm.py `unpin_thread_pool`), before TVM starts it.
Compare thread counts, or bundles, by running it once each.
"""

from __future__ import annotations

import argparse
import os
import statistics
import tempfile
import time
from pathlib import Path

import numpy as np

from edgedeploy.compile.tuning.apply import vm_kernel_costs
from edgedeploy_agent.bundle import extract_bundle
from edgedeploy_agent.runtime.tvm import unpin_thread_pool


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("bundle", type=Path)
    ap.add_argument("--runs", type=int, default=60)
    ap.add_argument("--threads", type=int, default=os.cpu_count() or 1)
    ap.add_argument("--top", type=int, default=20)
    args = ap.parse_args()
    os.environ["TVM_NUM_THREADS"] = str(args.threads)
    bind = unpin_thread_pool()
    import tvm
    from tvm import relax

    with tempfile.TemporaryDirectory() as tmp:
        m = extract_bundle(args.bundle, Path(tmp))
        if m.target.device != "cpu":
            raise SystemExit(f"{args.bundle}: a {m.target.device} bundle; this bench runs CPU bundles")
        vm = relax.VirtualMachine(tvm.runtime.load_module(str(Path(tmp) / m.artifact("tvm-library").path)), tvm.cpu())
        rng = np.random.default_rng(0)
        inputs = [
            tvm.runtime.tensor(rng.standard_normal(spec.shape).astype(spec.dtype), tvm.cpu()) for spec in m.inputs
        ]
        for _ in range(10):
            vm["main"](*inputs)
        times = []
        for _ in range(args.runs):
            t = time.perf_counter()
            vm["main"](*inputs)
            times.append((time.perf_counter() - t) * 1000)
        costs = vm_kernel_costs(vm, inputs, args.runs)
    print(f"{args.bundle.name} ({m.profile}), {args.threads} threads, TVM_BIND_THREADS={bind}, {args.runs} calls")
    print(f"  whole call: min {min(times):.3f} ms, median {statistics.median(times):.3f} ms")
    print(f"  kernels, instrumented: {sum(costs.values()):.3f} ms per call in all; the largest:")
    for name, ms in sorted(costs.items(), key=lambda kv: -kv[1])[: args.top]:
        print(f"  {ms:9.3f} ms  {name}")


if __name__ == "__main__":
    main()
