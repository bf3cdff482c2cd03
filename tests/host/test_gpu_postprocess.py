"""The postprocess function (compile/postprocess_kernel.py), built for the CPU here, against the agent's top_k.

Tolerance: the same classes in the same order (ties: the lower class first, on both sides), and scores within
1e-12 (the softmax's sum runs in another order, and a GPU's exp may differ in the last bit; on this CPU build
they are usually equal). bench/gpu_pipeline.py checks the CUDA build on every frame of two videos on the GPU.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from edgedeploy_agent.bundle import Manifest, Postprocess, Preprocess, TensorSpec, read_manifest
from tests.agent.bundles import make_bundle

pytestmark = pytest.mark.compile

TOLERANCE = 1e-12
PP = Preprocess()
INPUT = TensorSpec(name="x", shape=[1, 3, 8, 8], layout="NCHW")


def build(post: Postprocess, output: TensorSpec) -> object:
    import tvm

    from edgedeploy.compile.preprocess_kernel import build as build_library

    return build_library(PP, INPUT, tvm.target.Target({"kind": "llvm"}), post, output)["postprocess"]


def host_top(row: np.ndarray, post: Postprocess, manifest: Manifest) -> tuple[np.ndarray, np.ndarray]:
    """The agent's top_k on one row (a manifest with `post`): (classes, unrounded scores)."""
    from edgedeploy_agent.loop import class_scores, top_k

    classes = [c for c, _, _ in top_k(row, manifest.model_copy(update={"postprocess": post}), [])]
    return np.array(classes), class_scores(row, post)[classes]


def device_top(func: object, logits: np.ndarray, post: Postprocess, output: TensorSpec) -> np.ndarray:
    import tvm

    k = post.top_count(output)
    top = tvm.runtime.tensor(np.full((logits.shape[0], 2, k), np.nan))
    func(tvm.runtime.tensor(logits), top)  # type: ignore[operator]
    return top.numpy()


@pytest.mark.parametrize("softmax", [True, False])
@pytest.mark.parametrize(
    ("shape", "top_k"), [((4, 1001), 5), ((2, 1000, 1, 1), 1), ((3, 10), 10), ((2, 7), 9)], ids=str
)
def test_top_k_on_the_device_equals_the_agents(
    tmp_path: Path, softmax: bool, shape: tuple[int, ...], top_k: int
) -> None:
    """Outputs as an INT8 model gives them (multiples of a scale: many ties) and as a float model does."""
    manifest = read_manifest(make_bundle(tmp_path))
    post = Postprocess(top_k=top_k, softmax=softmax)
    output = TensorSpec(name="y", shape=list(shape))
    func = build(post, output)
    rng = np.random.default_rng(sum(shape) + top_k)
    for logits in (
        (rng.integers(-40, 12, shape) * 0.3125).astype(np.float32),  # dequantized: ties at the top
        rng.standard_normal(shape).astype(np.float32) * 4,
    ):
        got = device_top(func, logits, post, output)
        assert got.shape == (shape[0], 2, min(top_k, int(np.prod(shape[1:]))))
        for b in range(shape[0]):
            classes, scores = host_top(logits[b], post, manifest)
            assert np.array_equal(got[b, 1], classes), f"row {b}"
            assert np.abs(got[b, 0] - scores).max() <= TOLERANCE


def test_ties_go_to_the_lower_class() -> None:
    post, output = Postprocess(top_k=3), TensorSpec(name="y", shape=[1, 6])
    got = device_top(build(post, output), np.array([[1, 5, 2, 5, 5, 0]], np.float32), post, output)
    assert got[0].tolist() == [[5, 5, 5], [1, 3, 4]]


@pytest.mark.parametrize(("softmax", "kernels"), [(False, 1), (True, 4)])
def test_gpu_schedule_launches_one_kernel_without_softmax(softmax: bool, kernels: int) -> None:
    """Each kernel launch cost the agent's infer stage host time (H100: 2 launches 0.0063 ms a frame): the ranks and
    the result share one kernel; a softmax adds the row's maximum and sum and the result after them."""
    import tvm
    from tvm import s_tir

    from edgedeploy.compile import postprocess_kernel

    post, output = Postprocess(top_k=5, softmax=softmax), TensorSpec(name="y", shape=[2, 1000, 1, 1])
    sch = s_tir.Schedule(tvm.IRModule({"postprocess": postprocess_kernel.postprocess_func(post, output)}))
    postprocess_kernel.schedule_gpu(sch)
    body = sch.mod["postprocess"].body.block.body  # the root block's loop nests: one kernel each
    nests = list(body.seq) if isinstance(body, tvm.tirx.SeqStmt) else [body]
    assert [n.thread_binding.thread_tag for n in nests] == ["blockIdx.x"] * kernels
