"""The agent's TVM runtime leaves the CPU thread pool's workers to the scheduler (runtime/tvm.py unpin_thread_pool): a
worker pinned to a core that another process keeps busy stalls every parallel kernel (docs/int8.md)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.compile

# in a fresh process (the pool reads its environment when it starts): the agent's loading path, one parallel
# kernel, then the CPUs each thread that kernel started may run on (threads from before, e.g. OpenBLAS's, left out)
CHILD = """
import json, os, sys
import numpy as np
from edgedeploy_agent.runtime.tvm import load_runtime_libraries
load_runtime_libraries()
import tvm_ffi
kernel = tvm_ffi.load_module(sys.argv[1])
x = np.arange(1 << 16, dtype="float32")
y = np.zeros_like(x)
before = set(os.listdir("/proc/self/task"))
kernel["main"](tvm_ffi.from_dlpack(x), tvm_ffi.from_dlpack(y))
assert np.array_equal(y, x * 2), "the kernel did not run"
def allowed(task):
    with open(f"/proc/self/task/{task}/status") as f:
        line = next(l for l in f if l.startswith("Cpus_allowed_list:"))
    return line.split(":", 1)[1].strip()
print(json.dumps({t: allowed(t) for t in set(os.listdir("/proc/self/task")) - before}))
"""


@pytest.fixture(scope="module")
def parallel_kernel(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """y = 2 x over 65,536 floats, the loop split across TVM's thread pool."""
    import tvm
    from tvm import te
    from tvm.s_tir import Schedule

    x = te.placeholder((1 << 16,), "float32", name="x")
    y = te.compute(x.shape, lambda i: x[i] * 2, name="y")
    sch = Schedule(te.create_prim_func([x, y]).with_attr("global_symbol", "main"))
    outer, _ = sch.split(sch.get_loops(sch.get_sblock("y"))[0], [64, None])
    sch.parallel(outer)
    out = tmp_path_factory.mktemp("thread_pool") / "parallel.so"
    tvm.compile(sch.mod, target="llvm").export_library(str(out))
    return out


def _thread_cpus(kernel: Path, **env: str) -> dict[str, str]:
    clean = {k: v for k, v in os.environ.items() if not k.startswith("TVM_")}
    run = subprocess.run(
        [sys.executable, "-c", CHILD, str(kernel)],
        env={**clean, "TVM_NUM_THREADS": "2", **env},
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert run.returncode == 0, run.stderr
    return dict(json.loads(run.stdout.strip().splitlines()[-1]))


def _cpus() -> str:
    ids = sorted(os.sched_getaffinity(0))
    if len(ids) < 2:
        pytest.skip("one CPU: a pinned worker looks like a free one")
    return ",".join(map(str, ids))


def test_the_agent_runtime_leaves_tvm_workers_unpinned(parallel_kernel: Path) -> None:
    """The worker TVM's pool started for the parallel kernel, in a process that loaded the runtime the agent's way,
    may run on every CPU the process may."""
    cpus = _cpus()
    workers = _thread_cpus(parallel_kernel)
    assert workers, "the parallel kernel started no worker thread"
    assert {_expand(v) for v in workers.values()} == {cpus}, workers


def test_a_device_can_still_pin_them(parallel_kernel: Path) -> None:
    """TVM_BIND_THREADS=1 in the device's environment (the systemd unit) is kept: TVM pins its worker to one core,
    which is what the test above would see without the agent's default."""
    _cpus()
    workers = _thread_cpus(parallel_kernel, TVM_BIND_THREADS="1")
    assert workers and all("," not in _expand(v) for v in workers.values()), workers


def _expand(cpu_list: str) -> str:
    """'0-2,5' -> '0,1,2,5'."""
    ids: list[int] = []
    for part in cpu_list.split(","):
        lo, _, hi = part.partition("-")
        ids.extend(range(int(lo), int(hi or lo) + 1))
    return ",".join(map(str, sorted(ids)))
