"""Every change edgedeploy makes to TVM's own code at run time, in one place, checked against the TVM it was
written for (WRITTEN_FOR). A TVM of another minor version is refused before anything is patched: each patch
below names the behaviour it works around, to be checked against the new version and then dropped or kept.

What is not here because it patches nothing of TVM: the CUDA hooks TVM offers for this (source.py's
`tvm_callback_cuda_postproc`, nvrtc11.py's `tvm_callback_cuda_compile`), the TIR pipeline mma.py registers,
and tensor_intrinsics.py's seeding of the standard library's `inspect` cache.
"""

from __future__ import annotations

from typing import Any

from ...errors import BuildError

WRITTEN_FOR = "0.27"  # apache-tvm 0.27.x (pyproject.toml pins 0.27.0.post1)


def check_version(version: str) -> None:
    """Refuse a TVM whose minor version is not WRITTEN_FOR: the patches may no longer fit it."""
    if ".".join(version.split(".")[:2]) != WRITTEN_FOR:
        raise BuildError(
            f"edgedeploy's TVM patches were written for TVM {WRITTEN_FOR}, this is TVM {version}",
            hint="install the pinned apache-tvm (pip install -e .), or check each patch in "
            "compile/cuda/tvm_patches.py against this TVM and raise WRITTEN_FOR",
        )


def apply() -> None:
    """The patches the CUDA pipeline needs (idempotent)."""
    import tvm

    check_version(str(tvm.__version__))
    _int8_rule_off()
    _rules_fall_through()


def _int8_rule_off() -> None:
    """dlight's INT8 tensor-core rule off: in 0.27 its inner pipelined K loop has extent 1 and
    InjectSoftwarePipeline fails on the double-buffered WMMA fragments (cuda/tensorcore.py, whose TensorCoreGemm
    rule runs first and tensorizes INT8 GEMMs correctly). What that rule declines gets dp4a from nvcc instead."""
    from tvm.s_tir.dlight.gpu.matmul import MatmulInt8Tensorization

    MatmulInt8Tensorization.apply = lambda self, *a, **k: None


def _rules_fall_through() -> None:
    """A dlight rule that raises on a kernel it cannot schedule lets the next rule (at worst Fallback) try.

    TVM 0.27's gpu rules raise ScheduleError instead of returning None for some fused kernels, e.g. an
    int8 depthwise convolution with its requantize epilogue ("consumers of the cache-write stage are not
    properly inlined"), which aborts the whole build.
    """
    from tvm.s_tir.dlight import gpu

    for rule in (gpu.Matmul, gpu.GEMV, gpu.LowBatchGEMV, gpu.Reduction, gpu.GeneralReduction):
        if getattr(rule.apply, "_falls_through", False):
            continue
        original = rule.apply

        def apply(self: Any, *args: Any, _original: Any = original, **kwargs: Any) -> Any:
            try:
                return _original(self, *args, **kwargs)
            except Exception:  # tvm.s_tir.schedule.ScheduleError and friends
                return None

        apply._falls_through = True  # type: ignore[attr-defined]
        rule.apply = apply
