"""Runs each bundle twice with the agent's runtime, for `compute-sanitizer --tool memcheck` on the GPU machine:

    compute-sanitizer --tool memcheck --print-limit 20 python3 bench/gpu_memcheck.py BUNDLE...

Memcheck sees accesses outside CUDA allocations. A Relax VM carves its tensors out of a few large storage
blocks, so an overrun inside a block goes unseen: a clean report bounds the problem, it does not exclude it.
"""

from __future__ import annotations

import os
import sys
import tempfile
from pathlib import Path

import numpy as np

from edgedeploy_agent.bundle import extract_bundle
from edgedeploy_agent.runtime.tvm import TvmRuntime


def main() -> int:
    for arg in sys.argv[1:]:
        rel = Path(tempfile.mkdtemp()) / "rel"
        m = extract_bundle(Path(arg), rel)
        rt = TvmRuntime(rel, m, runtime_lib=os.environ["TVM_RUNTIME_LIB"])
        x = np.random.default_rng(0).standard_normal([int(d) for d in m.inputs[0].shape]).astype(np.float32)
        a, b = rt.run([x])[0], rt.run([x])[0]
        print(f"{Path(arg).name}: ran twice, outputs {'equal' if np.array_equal(a, b) else 'DIFFER'}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
