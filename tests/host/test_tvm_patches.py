"""compile/cuda/tvm_patches.py: every run-time patch of TVM in one module, refused on a TVM it was not written for."""

from __future__ import annotations

import pytest

from edgedeploy.compile.cuda import tvm_patches
from edgedeploy.errors import BuildError


def test_the_pinned_tvm_is_the_one_the_patches_were_written_for() -> None:
    import tvm

    tvm_patches.check_version(str(tvm.__version__))  # 0.27.0.post1: no error
    tvm_patches.check_version(f"{tvm_patches.WRITTEN_FOR}.3")


@pytest.mark.parametrize("version", ["0.28.0", "0.26.1", "1.0.0"])
def test_another_tvm_is_refused(version: str) -> None:
    with pytest.raises(BuildError, match=f"written for TVM 0.27, this is TVM {version}") as e:
        tvm_patches.check_version(version)
    assert "tvm_patches.py" in (e.value.hint or "")


def test_the_patches_apply_once() -> None:
    from tvm.s_tir.dlight import gpu

    tvm_patches.apply()
    patched = gpu.Matmul.apply
    tvm_patches.apply()
    assert gpu.Matmul.apply is patched and patched._falls_through
    assert gpu.matmul.MatmulInt8Tensorization().apply(None, None, False) is None
