"""Static bounds check of GPU kernels: every access to a kernel's tensor arguments stays inside them.

No GPU is needed. Each scheduled PrimFunc of a CUDA build is lowered by TVM's own first TIR passes (up to
buffer flattening, so indices are the flat offsets the kernel computes) and every load and store of an
argument tensor is bounded: loop and thread variables range over their extents, `if` conditions and
`if_then_else`/select guards constrain the accesses they guard, and what TVM's arithmetic analyzer cannot
bound by itself goes to its Z3 backend (part of the apache-tvm wheel). An access that is not proven inside
[0, size) is reported with its kernel, tensor and the constant bounds of its offset.

Why: a kernel that reads or writes a few elements past its tensor is invisible to compute-sanitizer when
the Relax VM has carved the tensor out of a larger storage block, and faults only where the neighbouring
memory happens to be unmapped. A MobileNet FP16 bundle ran alone and faulted beside another bundle
(docs/gpu.md "The requantizing epilogue in vectors"); this check proved all of its kernels' argument accesses
inside, so the fault is elsewhere (below).

What it does not see: the passes after FlattenBuffer (vectorizing, unrolling, cp.async, the code generator:
trusted), global scratch buffers a kernel allocates itself (split-K partial sums), and pointer arithmetic
inside intrinsics (tensor-core fragments load from shared memory, which is not checked either). A proof that
times out (Z3_TIMEOUT_MS) counts as not proven, so a report can be a false alarm; none so far.

    python -m edgedeploy.compile.kernel_bounds MODEL.onnx --profile h200 --precision fp16 --batch 64 [--knobs SPEC]
    (INT8: MODEL is the bundle's Q/DQ model, from the build store; `--tuning-key` applies a GEMM database)
"""

from __future__ import annotations

import argparse
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import tvm
from tvm import s_tir, sym, tirx
from tvm.ir.expr import TensorLoad

from .config import CudaConfig, Knobs

# TVM's default TIR pipeline (tvm.s_tir.pipeline.default_s_tir_pipeline) up to FlattenBuffer: what the
# kernels compute, with flat offsets, before vectorizing, unrolling and splitting host from device code
_LOWER = [
    s_tir.transform.CanonicalizeLoop(),
    s_tir.transform.LowerCrossThreadReduction(),
    s_tir.transform.LowerInitBlock(),
    s_tir.transform.PlanAndUpdateBufferAllocationLocation(),
    s_tir.transform.ConvertBlocksToOpaque(),
    s_tir.transform.LiftThreadBinding(),
    s_tir.transform.ManifestSharedMemoryLocalStage(),
    s_tir.transform.CompactBufferAllocation(),
    s_tir.transform.LowerAutoCopy(),
    s_tir.transform.UnifyThreadBinding(),
    s_tir.transform.LowerMatchBuffer(),
    s_tir.transform.StmtSimplify(),
    s_tir.transform.InjectPermutedLayout(),
    s_tir.transform.AnnotateIrregularLoop(),
    s_tir.transform.InjectSoftwarePipeline(),
    s_tir.transform.TransformMmaBufferLayout(),
    s_tir.transform.LowerOpaqueBlock(),
    tirx.transform.FlattenBuffer(),
]
_IF_THEN_ELSE = tvm.ir.Op.get("prim.if_then_else")
_LIKELY = tvm.ir.Op.get("prim.likely")
_BUFFER_DATA = tvm.ir.Op.get("tirx.buffer_data")
Z3_TIMEOUT_MS = 2000  # per proof; a proof that times out counts as not proven


def _is_zero(e: Any) -> bool:
    return isinstance(e, tirx.IntImm) and int(e) == 0


def _lane_ends(index: Any) -> list[Any]:
    """The first and last offsets of a vector index (Ramp), or the scalar index itself."""
    if isinstance(index, tirx.Ramp):
        return [index.base, index.base + index.stride * (int(index.lanes) - 1)]
    return [index]


@dataclass(frozen=True)
class OutOfBounds:
    kernel: str
    tensor: str
    access: str  # "load" or "store"
    low: int
    high: int
    size: int

    def __str__(self) -> str:
        return (
            f"{self.kernel}: {self.access} of {self.tensor} at offsets {self.low}..{self.high}, "
            f"outside its {self.size} elements"
        )


def _unlikely(cond: Any) -> Any:
    """`likely(c)` -> c (a hint for the code generator; the analyzer reads the condition itself)."""
    if isinstance(cond, tvm.ir.Call) and cond.op.same_as(_LIKELY):
        return cond.args[0]
    return cond


class _Checker:
    def __init__(self, kernel: str, tensors: dict[str, int]) -> None:
        self.kernel = kernel
        self.tensors = tensors  # each argument tensor's name -> its elements
        self.ana = sym.Analyzer()
        if self.ana.is_z3_enabled:
            self.ana.set_z3_timeout_ms(Z3_TIMEOUT_MS)
        self.found: list[OutOfBounds] = []

    # -- accesses
    def access(self, buffer: Any, indices: Any, what: str) -> None:
        for index in indices:
            self.expr(index)
        # an argument tensor's accesses go through a view whose data is buffer_data(root), the root being
        # the flattened parameter (a new variable of the parameter's name: matched by name, unique in a
        # function); shared, local and other scratch buffers have roots of their own
        data = buffer.data
        root = data.args[0] if isinstance(data, tvm.ir.Call) and data.op.same_as(_BUFFER_DATA) else buffer
        if root.name not in self.tensors:
            return
        name, size = root.name, self.tensors[root.name]
        offset = buffer.elem_offset
        for index in indices:
            # a vector access (Ramp) is bounded by its first and last lane, each a scalar offset
            ends = _lane_ends(index if _is_zero(offset) else index + offset)
            bounds = [self.ana.const_int_bound(e) for e in ends]
            lo, hi = min(b.min_value for b in bounds), max(b.max_value for b in bounds)
            if (lo < 0 and not self._proves(ends, lambda i: i >= 0)) or (
                hi >= size and not self._proves(ends, lambda i: i < size)
            ):
                self.found.append(OutOfBounds(self.kernel, name, what, lo, hi, size))

    def _proves(self, ends: list[Any], holds: Any) -> bool:
        """`holds` for every end, from the bindings and guards in scope: the analyzer's proof uses the guards
        where constant bounds cannot (`i * 8 + j < n` under `i < m`); SYMBOLIC_BOUND: where TVM's own
        analyzers fail, its Z3 backend (in the apache-tvm wheel) decides."""
        return all(self.ana.can_prove(holds(e), sym.ProofStrength.SYMBOLIC_BOUND) for e in ends)

    # -- expressions
    def expr(self, e: Any) -> None:
        if isinstance(e, TensorLoad):  # what tirx.BufferLoad makes in this TVM; `source` is the buffer
            self.access(e.source, e.indices, "load")
        elif isinstance(e, tvm.ir.Call) and e.op.same_as(_IF_THEN_ELSE):
            self._guarded(e.args[0], e.args[1], e.args[2])
        elif isinstance(e, tirx.Select):  # CUDA's ?: evaluates one side only, as if_then_else
            self._guarded(e.condition, e.true_value, e.false_value)
        elif isinstance(e, tirx.Let):
            self.expr(e.value)
            self.ana.bind(e.var, e.value)
            self.expr(e.body)
        else:
            for field in ("a", "b", "value", "base", "stride", "condition"):
                child = getattr(e, field, None)
                if isinstance(child, tvm.ir.expr.Expr):
                    self.expr(child)
            for field in ("args", "vectors", "indices"):
                for child in getattr(e, field, None) or []:
                    if isinstance(child, tvm.ir.expr.Expr):
                        self.expr(child)

    def _guarded(self, cond: Any, then: Any, otherwise: Any) -> None:
        cond = _unlikely(cond)
        self.expr(cond)
        with self.ana.constraint_scope(cond):
            self.expr(then)
        with self.ana.constraint_scope(tirx.Not(cond)):
            self.expr(otherwise)

    # -- statements
    def stmt(self, s: Any) -> None:
        if isinstance(s, tirx.SeqStmt):
            for child in s.seq:
                self.stmt(child)
        elif isinstance(s, tirx.For):
            self.ana.bind(s.loop_var, tvm.ir.Range.from_min_extent(s.min, s.extent))
            self.stmt(s.body)
        elif isinstance(s, tirx.AttrStmt):
            if s.attr_key in ("thread_extent", "virtual_thread"):
                iv = s.node
                self.ana.bind(iv.var, tvm.ir.Range.from_min_extent(0, s.value))
            self.stmt(s.body)
        elif isinstance(s, tirx.stmt.Bind):  # a let: the variable holds for the rest of its sequence
            self.expr(s.value)
            self.ana.bind(s.var, s.value)
        elif isinstance(s, tirx.IfThenElse):
            cond = _unlikely(s.condition)
            self.expr(cond)
            with self.ana.constraint_scope(cond):
                self.stmt(s.then_case)
            if s.else_case is not None:
                with self.ana.constraint_scope(tirx.Not(cond)):
                    self.stmt(s.else_case)
        elif isinstance(s, tirx.BufferStore):
            self.expr(s.value)
            self.access(s.buffer, s.indices, "store")
        elif isinstance(s, tirx.Evaluate):
            self.expr(s.value)
        else:  # DeclBuffer and allocations (no body in this TVM), AssertStmt, ...
            body = getattr(s, "body", None)
            if isinstance(body, tirx.Stmt):
                self.stmt(body)


def _elements(ty: Any) -> int | None:
    n = 1
    for d in ty.shape:
        if not isinstance(d, tirx.IntImm):
            return None  # a dynamic shape: nothing to bound it with
        n *= int(d)
    return n


def check_function(name: str, func: Any, target: Any) -> list[OutOfBounds]:
    """The out-of-bounds accesses of one scheduled PrimFunc (empty: every access proven inside)."""
    tensors: dict[str, int] = {}
    for param in func.params:
        if isinstance(param.ty, tirx.BufferType):
            size = _elements(param.ty)
            if size is not None:
                tensors[param.name] = size
    mod = tvm.IRModule({name: func.with_attr("target", target)})
    with target:
        lowered = tvm.transform.Sequential(_LOWER)(mod)
    checker = _Checker(name, tensors)
    checker.stmt(lowered[name].body)
    return checker.found


def check_module(mod: Any, target: Any) -> tuple[int, list[OutOfBounds]]:
    """(kernels checked, out-of-bounds accesses) of every scheduled PrimFunc of a Relax module."""
    found: list[OutOfBounds] = []
    kernels = 0
    for gv, func in mod.functions.items():
        if isinstance(func, tirx.PrimFunc) and not func.attrs.get("tir.is_host_func", False):
            kernels += 1
            found += check_function(gv.name_hint, func, target)
    return kernels, found


def scheduled_module(
    model: Path, profile_name: str, precision: str, batch: int, tuning_key: str = "", cuda: CudaConfig = CudaConfig()
) -> tuple[Any, Any]:
    """The Relax module of a CUDA build after its Relax pipeline (kernels scheduled as `edgedeploy build`
    schedules them with the configuration `cuda`; with `tuning_key` (tuning.tuning_key), its tuned configurations
    too), and its target."""
    from ..profiles import get_profile
    from .frontends.onnx_model import load_onnx
    from .pipeline import run_pipeline
    from .stage import BuildContext
    from .tvm_backend import cuda_lowering

    ctx = BuildContext(
        model=load_onnx(model, batch=batch),
        profile=get_profile(profile_name),
        work_dir=Path(tempfile.mkdtemp(prefix="edgedeploy-bounds-")),
        precision=precision,
        cuda=cuda,
        tuning_key=tuning_key,
    )
    run_pipeline(ctx, stop_before="compile-cuda")
    low = cuda_lowering(ctx)
    with low.target, tvm.transform.PassContext(opt_level=3, config=low.config):
        return low.pipeline(ctx.ir), low.target


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("model", type=Path, help="an ONNX model (for --precision int8: its Q/DQ model)")
    ap.add_argument("--profile", default="h200")
    ap.add_argument("--precision", default="fp32", choices=["fp32", "fp16", "int8"])
    ap.add_argument("--batch", type=int, default=1)
    ap.add_argument("--tuning-key", default="", help="apply this database's GEMM configurations (docs/tuning.md)")
    ap.add_argument("--knobs", default="", help='schedule knobs, as EDGEDEPLOY_CUDA_KNOBS takes them ("int8_mma=1")')
    args = ap.parse_args(argv)
    try:
        cuda = CudaConfig(Knobs.parse(args.knobs, "--knobs"))
    except ValueError as e:
        ap.error(str(e))  # one line, exit 2
    mod, target = scheduled_module(args.model, args.profile, args.precision, args.batch, args.tuning_key, cuda)
    kernels, found = check_module(mod, target)
    for f in found:
        print(f)
    print(f"{kernels} kernels, {len(found)} accesses not proven inside their tensors")
    return 1 if found else 0


if __name__ == "__main__":
    sys.exit(main())
