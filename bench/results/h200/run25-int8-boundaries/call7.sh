#!/usr/bin/env bash
# run25 call 7: the agent runtime's _to_host with one page-locked tensor per output shape, reused (after call 6):
# its outputs against a copy into a new pageable tensor (call 6's "now"), for two different inputs in turn (a
# stale or unfinished copy would show), and the time per call of both, launch + sync alone beside them.
# carry [".gpu/wheels", ".gpu/lib", ".gpu/bundles/resnet18"]
set -u
export kit=.gpu; source bench/gpu_kit_env.sh
python3 - <<'PY'
import ctypes, os, statistics, tempfile, time
from pathlib import Path
import numpy as np
from edgedeploy_agent.bundle import extract_bundle
from edgedeploy_agent.runtime.tvm import TvmRuntime
cudart = ctypes.CDLL("/tmp/kitlib/libcudart.so.13")
rng = np.random.default_rng(0)
for name in ("resnet18.int8.bs64.edb", "resnet18.fp16.bs64.edb", "resnet18.int8.bs1.edb", "resnet18.fp32.bs1.edb"):
    rel = Path(tempfile.mkdtemp()) / "rel"
    rt = TvmRuntime(rel, extract_bundle(Path(".gpu/bundles/resnet18") / name, rel), runtime_lib=os.environ["TVM_RUNTIME_LIB"])
    bs = 64 if "bs64" in name else 1
    xs = [rt._to_device(rng.standard_normal((bs, 3, 224, 224)).astype(np.float32)) for _ in range(2)]
    def pageable(xd):
        out = rt._main(xd)
        host = rt._alloc(out.shape, out.dtype, rt._cpu, None)
        rt._copy(out, host)
        return np.from_dlpack(host).copy()
    def pinned(xd): return np.from_dlpack(rt._to_host(rt._main(xd))).copy()
    for i in range(6):
        xd = xs[i % 2]
        assert np.array_equal(pinned(xd), pageable(xd)), (name, i)
    assert not np.array_equal(pinned(xs[0]), pinned(xs[1]))
    cases = {"new pageable tensor per call (before)": lambda: pageable(xs[0]),
             "page-locked tensor reused (now)": lambda: pinned(xs[0]),
             "launch + sync only": lambda: (rt._main(xs[0]), cudart.cudaDeviceSynchronize())}
    samples = {k: [] for k in cases}
    for _ in range(5):
        for k, f in cases.items():
            for _ in range(20): f()
            for _ in range(200):
                t = time.perf_counter(); f(); samples[k].append((time.perf_counter() - t) * 1e3)
    print(name, "outputs equal")
    for k, s in samples.items():
        print(f"  {k:40s} {statistics.median(s):.4f} ms  p90 {np.percentile(s, 90):.4f}")
PY
