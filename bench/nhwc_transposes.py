"""Transposes in an INT8 CUDA graph with TVM's ConvertLayout alone and after nhwc.sink_permutes (docs/gpu.md).

    .venv/bin/python bench/nhwc_transposes.py QDQ.onnx      # e.g. a Q/DQ model from the build store

Runs the cuda-int8 pipeline's stages up to the layout stage on the build host (no GPU) and prints the
permute_dims counts: ConvertLayout alone, the same with constants folded, and nhwc.to_nhwc.
"""

from __future__ import annotations

import sys
from pathlib import Path

from tvm import relax

from edgedeploy.compile import tvm_backend  # noqa: F401  (register the stages)
from edgedeploy.compile.cuda import nhwc
from edgedeploy.compile.frontends.onnx_model import load_onnx
from edgedeploy.compile.stage import STAGES, BuildContext
from edgedeploy.profiles import get_profile


def main() -> int:
    model = load_onnx(Path(sys.argv[1]))
    ctx = BuildContext(model=model, profile=get_profile("h200"), work_dir=Path("."), precision="int8")
    for name in ("import-onnx", "decompose-for-inference", "int8-rewrite", "clip-as-relax-ops"):
        STAGES[name](ctx)
    converted = relax.transform.ConvertLayout({"relax.nn.conv2d": ["NHWC", "OHWI"]})(ctx.ir)
    folded = relax.transform.FoldConstant()(converted)
    print(
        f"ConvertLayout alone: {nhwc.transposes(converted)} transposes, {nhwc.transposes(folded)} after folding "
        f"constants; nhwc.to_nhwc: {nhwc.transposes(nhwc.to_nhwc(ctx.ir))}"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
