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
    """The TIR PrimFunc: k argmax passes over the row (each leaving out the classes taken before), then the
    softmax's sum of exponentials, then the (N, 2, k) result."""
    import tvm
    from tvm import te
    from tvm.tirx import Select

    n, c, k = spec.shape[0], math.prod(spec.shape[1:]), post.top_count(spec)
    logits = te.placeholder(tuple(spec.shape), spec.dtype, name="logits")
    trailing = spec.shape[1:]

    def flat(b: Any, i: Any) -> Any:
        index, rest = [b], i
        for extent in reversed(trailing):  # the class index over the output's trailing dimensions
            index.insert(1, rest % extent)
            rest = rest // extent
        return logits[tuple(index)].astype("float64")

    # (class, value): the larger value, on a tie the lower class; TVM's own form of it (and its identity), which
    # its GPU lowering recognises (a reduction across a thread block)
    def combine(x: Any, y: Any) -> Any:
        take_x = tvm.tirx.Or(x[1] > y[1], tvm.tirx.And(x[1] == y[1], x[0] < y[0]))
        return Select(take_x, x[0], y[0]), Select(x[1] > y[1], x[1], y[1])

    def identity(t0: Any, t1: Any) -> Any:
        return tvm.tirx.const(-1, t0), te.min_value(t1)

    argmax = te.comm_reducer(combine, identity, name="argmax")

    def best(j: int, taken: list[Any]) -> Any:
        """(row) -> the argmax of the row, the classes `taken` left out."""

        def fcompute(b: Any) -> Any:
            r = te.reduce_axis((0, c), name=f"c{j}")
            gone = tvm.tirx.any(*[t[b] == r for t in taken]) if taken else tvm.tirx.const(False)
            return argmax((r, Select(gone, te.min_value("float64"), flat(b, r))), axis=r)  # (finite outputs win)

        return fcompute

    picks: list[tuple[Any, Any]] = []
    for j in range(k):
        index, value = te.compute((n,), best(j, [p[0] for p in picks]), name=f"pick{j}")
        picks.append((index, value))
    top = picks[0][1]  # the first pick's value is the row's maximum
    if post.softmax:
        r = te.reduce_axis((0, c), name="cs")
        total = te.compute((n,), lambda b: te.sum(te.exp(flat(b, r) - top[b]), axis=r), name="total")

    def chosen(b: Any, j: Any, part: int) -> Any:
        expr = picks[k - 1][part][b]
        for i in range(k - 2, -1, -1):
            expr = Select(j == i, picks[i][part][b], expr)
        return expr

    def result(b: Any, t: Any, j: Any) -> Any:
        value = chosen(b, j, 1)
        score = te.exp(value - top[b]) / total[b] if post.softmax else value
        return Select(t == 0, score, chosen(b, j, 0).astype("float64"))

    out = te.compute((n, 2, k), result, name="top")
    return te.create_prim_func([logits, out]).with_attr("global_symbol", FUNCTION)


def schedule_gpu(sch: Any) -> None:
    """One thread block per row for each pass (its reduction across the block's threads), one thread per element
    of the result: k + 2 small kernels."""
    sch.work_on(FUNCTION)
    for block in sch.get_child_blocks(sch.get_sblock("root")):
        loops = sch.get_loops(block)
        if sch.get(block).name_hint == "top":
            bx, tx = sch.split(sch.fuse(*loops), factors=[None, 32])
            sch.bind(bx, "blockIdx.x")
            sch.bind(tx, "threadIdx.x")
        else:  # (row, classes): the row to a block, the classes across its threads
            row, reduce = loops
            sch.bind(row, "blockIdx.x")
            _, tx = sch.split(reduce, factors=[None, THREADS])
            sch.bind(tx, "threadIdx.x")
