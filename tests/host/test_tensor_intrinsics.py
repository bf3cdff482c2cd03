"""compile/cuda/tensor_intrinsics.py: TVM's tensor intrinsics import without one scan of sys.modules per stack
frame (the cause of 5-minute CUDA builds of a 26 KB model, and of a CI run past its 90 minutes)."""

from __future__ import annotations

import inspect
from unittest import mock

from edgedeploy.compile.cuda import tensor_intrinsics


def _scans(filename: str) -> int:
    """How many modules `inspect.getmodule` looks at to resolve a frame of `filename` (1: none but the object)."""
    code = compile("0", filename, "eval")
    with mock.patch.object(inspect, "ismodule", wraps=inspect.ismodule) as ismodule:
        assert inspect.getmodule(code, filename) is None  # the answer the scan gives: no module
    return ismodule.call_count


def test_frames_that_are_no_file_resolve_from_the_cache() -> None:
    tensor_intrinsics.seed_inspect_cache()
    for name in ("<frozen importlib._bootstrap>", "<frozen importlib._bootstrap_external>", "<ast>"):
        assert _scans(name) == 1, name
    assert _scans("<some other string>") > 100  # the stdlib's own behaviour for any name not seeded


def test_real_modules_still_resolve() -> None:
    tensor_intrinsics.seed_inspect_cache()
    assert inspect.getmodule(tensor_intrinsics.seed_inspect_cache) is tensor_intrinsics
    assert inspect.getmodule(inspect.getmodule.__code__, inspect.__file__) is inspect


def test_import_all_registers_the_cuda_intrinsics() -> None:
    from tvm.s_tir import TensorIntrin

    package = tensor_intrinsics.import_all()
    assert TensorIntrin.get("wmma_fill_16x16x16_f16") is not None
    assert callable(package.cuda.get_ldmatrix_intrin)
