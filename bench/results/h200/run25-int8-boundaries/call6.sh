#!/usr/bin/env bash
# run25 call 6: where a call's ~0.1 ms over its kernels goes at batch 64 (README, "per-call cost"): the agent
# runtime's call as bench/gpu_vs_torch.py times it (a host tensor allocated per call, pageable), against the same
# with one host tensor reused (pageable; pinned, cudaMallocHost), and the launch alone (cudaDeviceSynchronize,
# no copy). 5 interleaved rounds of 200 calls, medians in ms.
# carry [".gpu/wheels", ".gpu/lib", ".gpu/bundles/resnet18"]
set -u
export kit=.gpu; source bench/gpu_kit_env.sh
python3 - <<'PY'
import ctypes, os, statistics, tempfile, time
from pathlib import Path
import numpy as np
from edgedeploy_agent.bundle import extract_bundle
from edgedeploy_agent.runtime.tvm import TvmRuntime
import tvm_ffi
cudart = ctypes.CDLL("/tmp/kitlib/libcudart.so.13")
rng = np.random.default_rng(0)
for name in ("resnet18.int8.bs64.edb", "resnet18.fp16.bs64.edb", "resnet18.int8.bs1.edb"):
    rel = Path(tempfile.mkdtemp()) / "rel"
    rt = TvmRuntime(rel, extract_bundle(Path(".gpu/bundles/resnet18") / name, rel), runtime_lib=os.environ["TVM_RUNTIME_LIB"])
    bs = 64 if "bs64" in name else 1
    xd = rt._to_device(rng.standard_normal((bs, 3, 224, 224)).astype(np.float32))
    out = rt._main(xd)
    pageable = rt._alloc(out.shape, out.dtype, rt._cpu, None)
    pinned = rt._alloc(out.shape, out.dtype, tvm_ffi.device(3, 0), None)
    def a(): return np.from_dlpack(rt._to_host(rt._main(xd))).copy()
    def b():
        rt._copy(rt._main(xd), pageable); return np.from_dlpack(pageable).copy()
    def d(): rt._main(xd); cudart.cudaDeviceSynchronize()
    ref = a()
    cases = {"per-call host tensor (now)": a, "reused pageable": b, "launch + sync only": d}
    try:
        rt._copy(rt._main(xd), pinned)
        got = np.from_dlpack(pinned).copy()
        assert np.array_equal(got, ref)
        cases["reused pinned"] = lambda: (rt._copy(rt._main(xd), pinned), np.from_dlpack(pinned).copy())[1]
    except Exception as e:
        print(f"  pinned: {type(e).__name__}: {e}")
    assert np.array_equal(b(), ref)
    samples = {k: [] for k in cases}
    for _ in range(5):
        for k, f in cases.items():
            for _ in range(20): f()
            for _ in range(200):
                t = time.perf_counter(); f(); samples[k].append((time.perf_counter() - t) * 1e3)
    print(name)
    for k, s in samples.items():
        print(f"  {k:32s} {statistics.median(s):.4f} ms  p90 {np.percentile(s, 90):.4f}")
PY
