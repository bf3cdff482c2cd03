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
    with a lower index), then, for the softmax, the row's maximum and sum of exponentials, then the (N, 2, k)
    result: per slot j the class of rank j and its score. On a GPU that is 2 kernels, 4 with the softmax, whatever
    k is (k argmax passes, one kernel each, had cost MobileNet's infer stage 18 us on the H100)."""
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

    def beaten_by(b: Any, i: Any, j: Any) -> Any:
        """Class j ranks before class i: a larger output, or an equal one and a lower index."""
        xi, xj = flat(b, i), flat(b, j)
        return tvm.tirx.Or(xj > xi, tvm.tirx.And(xj == xi, j < i))

    def rank_of(b: Any, i: Any) -> Any:
        j = te.reduce_axis((0, c), name="j")
        return te.sum(Select(beaten_by(b, i, j), 1, 0), axis=j)

    rank = te.compute((n, c), rank_of, name="rank")  # a permutation of 0..c-1 per row (finite outputs)
    if post.softmax:
        m = te.reduce_axis((0, c), name="m")
        top = te.compute((n,), lambda b: te.max(flat(b, m), axis=m), name="row_max")
        s = te.reduce_axis((0, c), name="s")
        total = te.compute((n,), lambda b: te.sum(te.exp(flat(b, s) - top[b]), axis=s), name="total")

    def score(b: Any, i: Any) -> Any:
        return te.exp(flat(b, i) - top[b]) / total[b] if post.softmax else flat(b, i)

    def result(b: Any, t: Any, j: Any) -> Any:  # the score (t 0) or the class (t 1) of the class of rank j
        r = te.reduce_axis((0, c), name="r")
        value = Select(t == 0, score(b, r), r.astype("float64"))
        return te.max(Select(rank[b, r] == j, value, te.min_value("float64")), axis=r)

    out = te.compute((n, 2, k), result, name="top")
    return te.create_prim_func([logits, out]).with_attr("global_symbol", FUNCTION)


def schedule_gpu(sch: Any) -> None:
    """The ranks: a warp per class, the row across its lanes (a class's count is one warp reduction). The row
    maximum, the sum and each element of the result: a thread block per element, its reduction across the
    block's threads."""
    sch.work_on(FUNCTION)
    for block in sch.get_child_blocks(sch.get_sblock("root")):
        loops = sch.get_loops(block)
        if sch.get(block).name_hint == "rank":  # a warp per class, its lanes over the row, 8 classes a block
            bx, ty = sch.split(sch.fuse(*loops[:2]), factors=[None, THREADS // 32])
            sch.bind(bx, "blockIdx.x")
            sch.bind(ty, "threadIdx.y")
            _, tx = sch.split(loops[2], factors=[None, 32])
            sch.bind(tx, "threadIdx.x")
        else:  # (element..., classes): the element to a block, the classes across its threads
            *element, reduce = loops
            sch.bind(sch.fuse(*element) if len(element) > 1 else element[0], "blockIdx.x")
            _, tx = sch.split(reduce, factors=[None, THREADS])
            sch.bind(tx, "threadIdx.x")
