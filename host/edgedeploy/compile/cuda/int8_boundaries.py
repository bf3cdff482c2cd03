"""INT8 tensors between kernels: a dequantize that FuseOps put at the end of its producer's kernel moves to
the start of its consumer's kernel (CUDA INT8 builds, between FuseOps and FuseTIR).

The INT8 graph carries a residual as `dequantize(quantize(conv))` into the float add of the block it joins.
Where that int8 tensor has one consumer (the dequantize), TVM 0.27's FuseOps fuses the dequantize into the
producer's kernel as one more elementwise step after the requantize: ResNet-18's downsampling 1x1
convolutions stored their outputs as float32 (4 bytes an element, 25.7 MB at batch 64 in layer2) for the
next kernel to read back, where the int8 tensor is 1 byte. Where the int8 tensor has two consumers (a
block's input: the next convolution and the residual), FuseOps already keeps it int8 and fuses the
dequantize into the consumer (the `fused_dequantize*_conv2d*` kernels); this gives the one-consumer case
that form too. The last block's output before the global average pool moves the same way (the mean reads
int8). The values do not change: the same dequantize, computed in the consumer's kernel.

The move: a fused function (`Primitive`, called once) whose result is `dequantize(q)` of an int8 `q` that it
computes and uses nowhere else returns `q` instead, and its consumer, a fused function called once, takes the
int8 tensor and starts with that dequantize. Only where every use of the result (through plain aliases) is
such a consumer; anything else (a result returned from `main`, a consumer called twice) stays as it was.
`EDGEDEPLOY_CUDA_KNOBS=int8_boundaries=0` turns it off (`Knobs.int8_boundaries`; before/after measurements).
"""

from __future__ import annotations

from typing import Any

import tvm
from tvm import relax

_CALL_TIR = "relax.call_tir"


def _tail_dequantize(func: relax.Function) -> relax.Call | None:
    """The fused function's final `dequantize(q)` call_tir, where q is int8, bound just before it and used
    only by it; None otherwise."""
    body = func.body
    if not isinstance(body, relax.SeqExpr) or len(body.blocks) != 1:
        return None
    bindings = list(body.blocks[0].bindings)
    if len(bindings) < 2 or not bindings[-1].var.same_as(body.body):
        return None
    value, q = bindings[-1].value, bindings[-2].var
    if not (isinstance(value, relax.Call) and value.op.same_as(tvm.ir.Op.get(_CALL_TIR)) and len(value.args) == 2):
        return None
    callee, args = value.args
    if not (isinstance(callee, relax.GlobalVar) and callee.name_hint.startswith("dequantize")):
        return None
    if not (isinstance(args, relax.Tuple) and len(args.fields) == 1 and args.fields[0].same_as(q)):
        return None
    if not isinstance(q.ty, relax.TensorType) or str(q.ty.dtype) not in ("int8", "uint8"):
        return None
    return value if sum(_mentions(b.value, q) for b in bindings) == 1 else None


def _mentions(expr: Any, var: relax.Var) -> int:
    found = [0]

    def visit(e: Any) -> None:
        if isinstance(e, relax.Var) and e.same_as(var):
            found[0] += 1

    relax.analysis.post_order_visit(expr, visit)
    return found[0]


def _trim(func: relax.Function) -> relax.Function:
    """The producer without its final dequantize: it returns the int8 tensor."""
    bindings = list(func.body.blocks[0].bindings)
    q = bindings[-2]
    out = relax.Var(q.var.name, q.var.ty)  # a function's result cannot be a dataflow var
    block = relax.DataflowBlock([*bindings[:-2], relax.VarBinding(out, q.value)])
    return relax.Function(func.params, relax.SeqExpr([block], out), out.ty, func.is_pure, func.attrs)


def _prepend(func: relax.Function, index: int, dequantize: relax.Call, int8: Any) -> relax.Function:
    """The consumer taking its parameter `index` as the int8 tensor and dequantizing it first."""
    old = func.params[index]
    new = relax.Var(old.name + "_q", int8)
    params = [new if i == index else p for i, p in enumerate(func.params)]
    value = relax.op.call_tir(dequantize.args[0], relax.Tuple([new]), dequantize.ty)
    body = func.body
    first = relax.DataflowBlock([relax.VarBinding(old, value), *body.blocks[0].bindings])
    seq = relax.SeqExpr([first, *body.blocks[1:]], body.body)
    return relax.Function(params, seq, func.ret_ty, func.is_pure, func.attrs)


def _is_primitive(mod: tvm.IRModule, op: Any) -> bool:
    """Whether `op` names a fused function (FuseOps marks them `Primitive`)."""
    if not isinstance(op, relax.GlobalVar) or op not in mod.functions:
        return False
    func = mod[op]
    return isinstance(func, relax.Function) and bool((func.attrs or {}).get("Primitive", False))


def _call_counts(mod: tvm.IRModule) -> dict[Any, int]:
    counts: dict[Any, int] = {}

    def visit(e: Any) -> None:
        if isinstance(e, relax.Call) and isinstance(e.op, relax.GlobalVar):
            counts[e.op] = counts.get(e.op, 0) + 1

    for func in mod.functions.values():
        if isinstance(func, relax.Function):
            relax.analysis.post_order_visit(func, visit)
    return counts


def dequantize_in_consumers(mod: tvm.IRModule) -> tvm.IRModule:
    """`mod` (after FuseOps) with each qualifying dequantize moved from its producer to its consumer."""
    counts = _call_counts(mod)
    tails = {}
    for gv, func in mod.functions.items():
        if _is_primitive(mod, gv) and counts.get(gv) == 1:
            tail = _tail_dequantize(func)
            if tail is not None:
                tails[gv] = tail
    if not tails:
        return mod
    out = relax.BlockBuilder(mod.clone())  # (add_func gives the new functions' GlobalVars their types)
    stale: set[Any] = set()
    for gv, func in mod.functions.items():
        if isinstance(func, relax.Function) and not _is_primitive(mod, gv):
            caller = _Caller(mod, func, tails, counts)
            rewritten = caller.rewrite(out)
            if rewritten is not None:
                out.update_func(gv, rewritten)
                stale |= caller.stale
    if not stale:
        return mod
    built = out.get()
    kept = {gv: f for gv, f in built.functions.items() if gv not in stale}
    # (the new calls carry no type yet: Normalize infers them from the functions they call)
    return relax.transform.Normalize()(tvm.IRModule(kept, attrs=built.attrs, global_infos=built.global_infos))


class _Caller:
    """One caller's (main's) bindings: which producer results move, and the rewrite."""

    def __init__(
        self, mod: tvm.IRModule, func: relax.Function, tails: dict[Any, relax.Call], counts: dict[Any, int]
    ) -> None:
        self.mod, self.func, self.tails, self.counts = mod, func, tails, counts
        self.stale: set[Any] = set()  # the fused functions replaced (no caller left)
        blocks = func.body.blocks if isinstance(func.body, relax.SeqExpr) else []
        self.bindings = [b for block in blocks for b in block.bindings]
        self.root: dict[Any, Any] = {}  # a producer's result var, or an alias of it -> the result var
        self.producer: dict[Any, Any] = {}  # a producer's result var -> the fused function that computes it
        for b in self.bindings:
            if isinstance(b.value, relax.Call) and b.value.op in tails:
                self.root[b.var] = b.var
                self.producer[b.var] = b.value.op
            elif isinstance(b.value, relax.Var) and b.value in self.root:
                self.root[b.var] = self.root[b.value]

    def _uses(self) -> dict[Any, list[tuple[Any, int]] | None]:
        """Per producer result: its uses as (consumer binding, argument index), or None where one use is not a
        fused consumer called once."""
        uses: dict[Any, list[tuple[Any, int]] | None] = {r: [] for r in set(self.root.values())}
        for b in self.bindings:
            if isinstance(b.value, relax.Var) and b.value in self.root:
                continue  # an alias
            for var, r in self.root.items():
                n = _mentions(b.value, var)
                if not n or uses[r] is None:
                    continue
                value = b.value
                consumer = isinstance(value, relax.Call) and _is_primitive(self.mod, value.op)
                positions = [i for i, a in enumerate(value.args) if a.same_as(var)] if consumer else []
                if b.var.same_as(r):
                    continue  # the producer's own binding
                if not consumer or self.counts.get(value.op) != 1 or len(positions) != n:
                    uses[r] = None
                else:
                    uses[r].extend((b, i) for i in positions)  # type: ignore[union-attr]
        for var, r in self.root.items():  # returned (alone or in a tuple): the float result must stay
            if _mentions(self.func.body.body, var):
                uses[r] = None
        return uses

    def rewrite(self, out: relax.BlockBuilder) -> relax.Function | None:
        moving = {r: u for r, u in self._uses().items() if u}
        if not moving:
            return None
        int8: dict[Any, relax.Var] = {}
        edits: dict[Any, dict[int, Any]] = {}
        for r, uses in moving.items():
            for b, i in uses:
                edits.setdefault(b, {})[i] = r
        blocks = []
        for block in self.func.body.blocks:
            new = []
            for b in block.bindings:
                value = b.value
                if isinstance(value, relax.Var) and self.root.get(value) in moving:
                    continue  # an alias of a moving result: its consumers take the int8 tensor
                if b.var not in moving and b not in edits:
                    new.append(b)
                    continue
                # a consumer of moved results (their dequantizes prepended), a producer (its own dequantize
                # dropped), or both (the last block's output: the mean takes it int8, and its result moves on)
                func, args, name = self.mod[value.op], list(value.args), value.op.name_hint
                if b in edits:
                    names = []
                    for i, r in sorted(edits[b].items()):
                        tail = self.tails[self.producer[r]]
                        func = _prepend(func, i, tail, int8[r].ty)
                        args[i] = int8[r]
                        names.append(tail.args[0].name_hint)
                    name = "fused_" + "_".join(names) + "_" + name.removeprefix("fused_")
                var = b.var
                if b.var in moving:
                    func = _trim(func)
                    name = name.removesuffix("_" + self.tails[value.op].args[0].name_hint)
                    kind = relax.DataflowVar if isinstance(b.var, relax.DataflowVar) else relax.Var
                    var = int8[b.var] = kind(b.var.name + "_q", func.ret_ty)
                self.stale.add(value.op)
                new.append(relax.VarBinding(var, relax.Call(out.add_func(func, name), args)))
            kind = relax.DataflowBlock if isinstance(block, relax.DataflowBlock) else relax.BindingBlock
            blocks.append(kind(new))
        body = relax.SeqExpr(blocks, self.func.body.body)
        return relax.Function(self.func.params, body, self.func.ret_ty, self.func.is_pure, self.func.attrs)
