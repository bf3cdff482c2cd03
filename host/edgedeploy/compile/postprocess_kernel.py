"""The agent's classifier postprocessing as a TVM function, for GPU bundles: the model's first output in, on the
device, and only the top k scores and class indices out, so one small copy comes back instead of the logits and
the host sorts nothing.

It computes what `edgedeploy_agent.loop.top_k` computes: per batch row, the k largest outputs (ties: the lower
class index first), and their scores, the softmax (in float64, `exp(x - max) / sum(exp(x - max))`) when the card
asks for one, else the outputs as they are. The selection is on the outputs themselves, exactly; softmax keeps
their order (it could only merge two classes whose outputs differ by less than float64's resolution at the
largest one, 1e-16 of it). The scores differ from the host's by the order of the sum and the exp's last bit:
within 1e-12 (tests/host/test_gpu_postprocess.py; the bench checks every frame on the GPU). The function lives in
the bundle's preprocessing library (preprocess.so) beside `preprocess`: agents that do not know it ignore it.

Its output is one float64 tensor (N, 2, k): the scores, then the class indices (exact in float64).
"""

from __future__ import annotations

import math
from typing import Any

from edgedeploy_agent.bundle import Postprocess, TensorSpec

FUNCTION = "postprocess"  # the function: (output, top)
THREADS = 256


def postprocess_func(post: Postprocess, spec: TensorSpec) -> Any:
    """The TIR PrimFunc: each class's rank in its row (how many classes beat it: a larger output, or an equal one
    with a lower index), and each class of rank j < k writes itself and its score to slot j of the (N, 2, k)
    result; for the softmax, the row's maximum and sum of exponentials first. On a GPU that is one kernel, 4 with
    the softmax, whatever k is (k argmax passes, one kernel each, had cost MobileNet's infer stage 18 us on the
    H100; ranks, then a kernel that gathered the result by rank, 2 launches: 0.0063 ms of the host's time a frame).
    The ranks compare the outputs in their own type (a float32 is exactly a float64: the same order)."""
    from tvm.script import tirx as T

    shape = tuple(int(d) for d in spec.shape)
    n, c, k, dtype, softmax = shape[0], math.prod(shape[1:]), post.top_count(spec), spec.dtype, post.softmax

    def at(logits: Any, b: Any, i: Any) -> Any:
        """logits[b, class i], the class index over the output's trailing dimensions."""
        index, rest = [b], i
        for extent in reversed(shape[1:]):
            index.insert(1, rest % extent)
            rest = rest // extent
        return logits[tuple(index)]

    @T.prim_func(s_tir=True)
    def func(logits_handle: T.handle, top_handle: T.handle) -> None:
        T.func_attr({"global_symbol": FUNCTION, "tir.noalias": True})
        logits = T.match_buffer(logits_handle, shape, dtype)
        top = T.match_buffer(top_handle, (n, 2, k), "float64")
        with T.sblock("root"):
            rank = T.sblock_alloc_buffer((n, c), "int32")
            row_max = T.sblock_alloc_buffer((n,), "float64")
            total = T.sblock_alloc_buffer((n,), "float64")
            if softmax:
                for b, m in T.grid(n, c):
                    with T.sblock("row_max"):
                        vb, vm = T.axis.remap("SR", [b, m])
                        with T.init():
                            row_max[vb] = T.min_value("float64")
                        row_max[vb] = T.max(row_max[vb], T.cast(at(logits, vb, vm), "float64"))
                for b, s in T.grid(n, c):
                    with T.sblock("total"):
                        vb, vs = T.axis.remap("SR", [b, s])
                        with T.init():
                            total[vb] = T.float64(0)
                        total[vb] = total[vb] + T.exp(T.cast(at(logits, vb, vs), "float64") - row_max[vb])
            for b, i, j in T.grid(n, c, c):
                with T.sblock("rank"):
                    vb, vi, vj = T.axis.remap("SSR", [b, i, j])
                    with T.init():
                        rank[vb, vi] = 0
                    rank[vb, vi] = rank[vb, vi] + T.Select(
                        T.Or(
                            at(logits, vb, vj) > at(logits, vb, vi),
                            T.And(at(logits, vb, vj) == at(logits, vb, vi), vj < vi),
                        ),
                        1,
                        0,
                    )
            for b, i in T.grid(n, c):
                with T.sblock("top"):  # a scatter: slot rank[b, i], if it is one of the k
                    vb, vi = T.axis.remap("SS", [b, i])
                    T.reads(rank[vb, vi], logits[vb, 0:c], row_max[vb], total[vb])
                    T.writes(top[vb, 0:2, 0:k])
                    if rank[vb, vi] < k:
                        if softmax:
                            top[vb, 0, rank[vb, vi]] = (
                                T.exp(T.cast(at(logits, vb, vi), "float64") - row_max[vb]) / total[vb]
                            )
                        else:
                            top[vb, 0, rank[vb, vi]] = T.cast(at(logits, vb, vi), "float64")
                        top[vb, 1, rank[vb, vi]] = T.cast(vi, "float64")

    return func


def schedule_gpu(sch: Any) -> None:
    """The ranks: a warp per class, the row across its lanes (a class's count is one warp reduction), 8 classes a
    block; then, in the same warp, its slot in the result if it has one. With the softmax the result needs the
    row's maximum and sum, kernels of their own (a thread block per row, its reduction across the block's
    threads), so it is a fourth kernel, a thread per class."""
    sch.work_on(FUNCTION)
    rank = sch.get_sblock("rank")
    b, i, j = sch.get_loops(rank)
    bx, ty = sch.split(sch.fuse(b, i), factors=[None, THREADS // 32])
    sch.bind(bx, "blockIdx.x")
    sch.bind(ty, "threadIdx.y")
    _, tx = sch.split(j, factors=[None, 32])
    sch.bind(tx, "threadIdx.x")
    top = sch.get_sblock("top")
    names = {sch.get(block).name_hint for block in sch.get_child_blocks(sch.get_sblock("root"))}
    if "row_max" not in names:
        sch.set_scope(rank, 0, "local")
        sch.reverse_compute_at(top, ty)
        return
    bx, tx = sch.split(sch.fuse(*sch.get_loops(top)), factors=[None, THREADS])
    sch.bind(bx, "blockIdx.x")
    sch.bind(tx, "threadIdx.x")
    for name in ("row_max", "total"):
        block = sch.get_sblock(name)
        row, classes = sch.get_loops(block)
        sch.bind(row, "blockIdx.x")
        _, tx = sch.split(classes, factors=[None, THREADS])
        sch.bind(tx, "threadIdx.x")
