"""Triton source for one fused loop kernel (the CUDA target, docs/inductor.md "Targets").

A kernel block is one Python module: a `@triton.jit` function named `kernel_symbol(name)` and a
`launch(in0, ..., out0, ...)` that computes the grid and launches it with the schedule written
into the source (so a dumped module replays with the same blocks and warps); for the GPU also
`warmup()` and `bind()`, the launch past Triton's JIT (launcher.py). Two shapes:

- pointwise (no reduction): a 1-D grid over the output's flattened elements, XBLOCK per
  program, masked; each loop variable is recovered from the flat index (`//`, `%` by the
  static row-major strides) and every load's index expression is rendered over those tensors.
- rows (a `loop.reduction`, or a `loop.pointwise` whose body holds fused `loop.reduce`s): a 2-D
  grid block [XBLOCK, RBLOCK] — XBLOCK rows (the outer loop variables), and per reduction an
  RBLOCK over its reduced elements: persistent (RBLOCK = next power of two of the row, one
  block) when the row fits in PMAX_ROW elements, else a loop over RBLOCK chunks with an
  elementwise accumulator. Every reduction is computed once per row, before the body that
  reads it; argmax/argmin are the first index where the body equals amax/amin (NaN first, as
  eager). A row pointwise body then runs over its inner elements in IBLOCK chunks.

f16/bf16 values are computed as the node's `cuda_lowp` attribute says (lowp.py): by default
in f32, rounded to their dtype only at stores (as TorchInductor computes); "per-op" rounds
every op's result as eager does. maximum/minimum propagate NaN. Index math is int32 unless an
extent reaches 2**31, is symbolic, or an index reads a size (then int64). Sizes the body reads
(sizes.py) are run-time arguments like the buffers' sizes. IR text reaches the source only as
`sanitize.ident` names and `sanitize.safe_text` comments; numbers are written by Python's repr
of a float or int. Anything the tables do not cover raises `CodegenError` (the kernel then runs
on the reference interpreter, with the reason).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import sympy
import torch

from ember.inductor.indexing import flat_offset, parse_index
from ember.inductor.sanitize import ident, kernel_symbol, safe_text, short
from ember.inductor.targets.cuda.launcher import bind_source
from ember.inductor.targets.cuda.lowp import bf16_math, has_lowp_values, read_lowp, read_math
from ember.inductor.targets.cuda.prelude import prelude
from ember.inductor.targets.cuda.sizes import body_symbols
from ember.ir import DType, Graph, Node, Ref, TensorType, Value
from ember.ir.expr import TRITON, print_expr

RMAX = 4096  # rows kernels' block budget (elements)
# longest persistent row (and at most 64 KB of the widest input); H200, 16384x16384 softmax:
# 52% of copy looped (rows read 3 times), 96-98 persistent (results/...-bf16-anchors.md)
PMAX_ROW = 16384
PMAX = 1024  # pointwise elements per program
INT32_LIMIT = 2**31

TL_DTYPES: dict[DType, str] = {
    DType.f16: "tl.float16", DType.bf16: "tl.bfloat16", DType.f32: "tl.float32",
    DType.f64: "tl.float64", DType.i8: "tl.int8", DType.i16: "tl.int16", DType.i32: "tl.int32",
    DType.i64: "tl.int64", DType.u8: "tl.uint8", DType.u16: "tl.uint16", DType.u32: "tl.uint32",
    DType.u64: "tl.uint64", DType.b8: "tl.int1",
}

_F, _I, _B = "f", "i", "b"
# body op -> per dtype class, a template over operands {0}, {1}, {2}
OPS: dict[str, dict[str, str]] = {
    # f32 exp as ex2.approx.ftz(x * log2 e): tl.exp's error (2 ulp + the product's rounding)
    # less its fix-ups for results below 2**-126, which flush to 0 (3 of 5 instructions)
    "prims.exp": {_F: "libdevice.fast_expf({0})"}, "prims.exp2": {_F: "tl.exp2({0})"},
    "prims.log": {_F: "tl.log({0})"}, "prims.log2": {_F: "tl.log2({0})"},
    "prims.sqrt": {_F: "tl.sqrt_rn({0})"}, "prims.rsqrt": {_F: "(1.0 / tl.sqrt_rn({0}))"},
    "prims.sin": {_F: "tl.sin({0})"}, "prims.cos": {_F: "tl.cos({0})"},
    "prims.erf": {_F: "_erf({0})"},  # f32: prelude's rational erf (f64: OPS_F64)
    "prims.digamma": {_F: "_digamma({0})"},  # prelude's, as eager's CPU kernel
    **{f"prims.{fn}": {_F: f"libdevice.{fn}({{0}})"} for fn in (
        "expm1", "log1p", "log10", "tan", "asin", "acos", "atan", "sinh", "cosh", "tanh",
        "asinh", "acosh", "atanh", "erfc", "lgamma", "erfinv")},
    "prims.floor": {_F: "tl.floor({0})", _I: "{0}"}, "prims.ceil": {_F: "tl.ceil({0})", _I: "{0}"},
    "prims.trunc": {_F: "libdevice.trunc({0})", _I: "{0}"},
    "prims.round": {_F: "libdevice.nearbyint({0})", _I: "{0}"},
    "prims.abs": {_F: "tl.abs({0})", _I: "tl.abs({0})"},
    "prims.neg": {_F: "(-{0})", _I: "(-{0})"},
    "prims.sign": {_F: "_sign({0})", _I: "_sign({0})"},
    "prims.bitwise_not": {_I: "({0} ^ {ones})", _B: "({0} == 0)"},  # ~ on u8 fails interpreted
    "prims.add": {_F: "({0} + {1})", _I: "({0} + {1})"},
    "prims.sub": {_F: "({0} - {1})", _I: "({0} - {1})"},
    "prims.mul": {_F: "({0} * {1})", _I: "({0} * {1})"},
    "prims.div": {_F: "({0} / {1})", _I: "_idiv({0}, {1})"},
    "prims.fmod": {_F: "libdevice.fmod({0}, {1})", _I: "_ifmod({0}, {1})"},
    "prims.remainder": {_F: "_remainder({0}, {1})", _I: "_iremainder({0}, {1})"},
    "prims.pow": {_F: "libdevice.pow({0}, {1})", _I: "_ipow({0}, {1}, {bits}, {signed})"},
    "prims.atan2": {_F: "libdevice.atan2({0}, {1})"},
    "prims.maximum": {_F: "_maximum({0}, {1})", _I: "tl.maximum({0}, {1})"},
    "prims.minimum": {_F: "_minimum({0}, {1})", _I: "tl.minimum({0}, {1})"},
    "prims.shift_left": {_I: "_shl({0}, {1}, {bits})"},
    "prims.shift_right": {_I: "_shr({0}, {1}, {bits})"},
    "prims.bitwise_and": {_I: "({0} & {1})", _B: "({0} & {1})"},
    "prims.bitwise_or": {_I: "({0} | {1})", _B: "({0} | {1})"},
    "prims.bitwise_xor": {_I: "({0} ^ {1})", _B: "({0} ^ {1})"},
    **{f"prims.{name}": {c: f"({{0}} {sym} {{1}})" for c in (_F, _I, _B)} for name, sym in (
        ("eq", "=="), ("ne", "!="), ("lt", "<"), ("le", "<="), ("gt", ">"), ("ge", ">="))},
    "prims.where": {c: "tl.where({0}, {1}, {2})" for c in (_F, _I, _B)},
}

# f64 forms where the f32 template's function takes f32 only
OPS_F64: dict[str, str] = {"prims.erf": "tl.erf({0})", "prims.exp": "tl.exp({0})",
                           "prims.sqrt": "libdevice.sqrt({0})",
                           "prims.rsqrt": "(1.0 / libdevice.sqrt({0}))"}

# 1 / x in f32 (a sigmoid's): div.approx (a reciprocal and a multiply, 2 ulp) in place of
# div.full's range fix-ups; |x| > 2**126 gives 0 where the quotient is below 2**-126. Only for
# a numerator of 1 (c / x with another c would flush quotients that are normal numbers).
RECIP = "libdevice.fast_dividef({0}, {1})"

# schedule-cuda's attributes of a loop node (they dump, can be edited, and replay)
# cuda_programs (rows kernels; 0 or absent: a program per XBLOCK rows): that many programs,
# each looping over every cuda_programs-th block of rows (a grid-stride loop)
SCHED_KEYS = ("cuda_xblock", "cuda_warps", "cuda_persistent", "cuda_rblock", "cuda_evict",
              "cuda_programs")
def read_schedule(node: Node) -> dict[str, int]:
    """The node's cuda_* schedule attributes, checked (ScheduleError names a bad one)."""
    from ember.inductor.schedule import ScheduleError
    out: dict[str, int] = {}
    for k in SCHED_KEYS:
        v = node.kwargs.get(k)
        if v is None:
            continue
        ok = isinstance(v, int) and not isinstance(v, bool) and (
            v in (0, 1) if k in ("cuda_persistent", "cuda_evict") else v in (1, 2, 4, 8, 16, 32)
            if k == "cuda_warps" else 0 <= v <= 1 << 20 if k == "cuda_programs"
            else v >= 1 and v & (v - 1) == 0 and v <= 1 << 16)
        if not ok:
            raise ScheduleError(f"{node.op}: {k}={v!r} is not valid (cuda_xblock, cuda_rblock: "
                                f"powers of two; cuda_warps: 1..32, a power of two; "
                                f"cuda_persistent, cuda_evict: 0 or 1; cuda_programs: "
                                f"0..2**20)")
        out[k] = int(v)  # type: ignore[arg-type]
    return out


class CodegenError(NotImplementedError):
    """A kernel the Triton tables cannot express yet (it runs on the reference interpreter)."""


def dclass(dt: DType) -> str:
    return _F if dt.is_floating else _B if dt == DType.b8 else _I


def tl_dtype(dt: DType) -> str:
    if dt not in TL_DTYPES:
        raise CodegenError(f"dtype {dt.name} has no Triton type yet")
    return TL_DTYPES[dt]


def compute_dtype(dt: DType) -> str:
    """The type values of `dt` are computed in: f16/bf16 in f32 (rounded per cuda_lowp)."""
    return "tl.float32" if dt in (DType.f16, DType.bf16) else tl_dtype(dt)


def next_pow2(n: int) -> int:
    return 1 if n <= 1 else 1 << (n - 1).bit_length()


def _tensor(v: Value) -> TensorType:
    assert isinstance(v.type, TensorType)
    return v.type


def _dims(dims: Sequence[Any]) -> list[Any]:
    """Sizes as ints where static, sympy expressions over size symbols where not."""
    out: list[Any] = []
    for d in dims:
        if isinstance(d, sympy.Expr) and d.is_Integer:
            d = int(d)
        if isinstance(d, bool) or not isinstance(d, (int, sympy.Expr)):
            raise CodegenError(f"size {short(str(d))} is not a number or an expression")
        out.append(d)
    return out


def _widest_bytes(node: Node, how: Callable[[list[int]], int] = max) -> int:  # inputs
    return how([_tensor(v).dtype.torch.itemsize for v in node.args[1:]
                if isinstance(v, Value)] or [4])


def _is_static(e: Any) -> bool:
    return isinstance(e, int)


def _numel(dims: Sequence[Any]) -> Any:
    n = math.prod(dims)
    return int(n) if isinstance(n, sympy.Expr) and n.is_Integer else n


_PY_SIZE = set("0123456789+* ()")


def pyexpr(e: Any, rtag: str = "", alias: dict[str, str] | None = None) -> str:
    """An index expression over loop variables as Triton code (Python floor semantics: ember.ir's
    Triton table); the reduced variables r0, ... are named r0{rtag}, ...; `alias` renames
    variables (a row's inner variables that are its reduced ones)."""
    def name(n: str) -> str:
        if alias and n in alias:  # a size symbol: a kernel argument
            return alias[n]
        if not (n[:1] in "ir" and n[1:].isdigit()):
            raise CodegenError(f"index symbol {short(n)!r} is not a loop variable")
        out = n + rtag if n[0] == "r" else n
        return alias.get(out, out) if alias else out
    return print_expr(e, TRITON, name, CodegenError)


def literal(v: object, dt: DType, scalar: bool = False) -> str:
    """A number converted to `dt` as eager converts it (torch.tensor(v, dtype)), as Triton code:
    a Python literal (Triton types a float literal f32 and an int literal i32/i64 by its
    value), except an f64 operand, a 0-d f64 tensor (its literal would be rounded to f32);
    `scalar`: the value argument of tl.full, a Python number for every dtype."""
    if isinstance(v, sympy.Expr) and not v.is_number:
        raise CodegenError("a symbolic number operand outside a kernel body")
    x: Any = torch.tensor(v, dtype=dt.torch).item()
    if isinstance(x, bool):
        return "1" if x else "0"
    if isinstance(x, int):
        return str(x)
    if math.isnan(x):
        text = 'float("nan")'
    elif math.isinf(x):
        text = 'float("inf")' if x > 0 else 'float("-inf")'
    else:
        text = repr(float(x))
    if dt == DType.f64 and not scalar:
        return f"tl.full([], {text}, tl.float64)"
    return text


def _round(dt: DType, text: str) -> str:
    """`text` (an f32 value of a f16/bf16 result) rounded to its dtype, kept in f32."""
    if dt in (DType.f16, DType.bf16):
        return f"({text}).to({tl_dtype(dt)}).to(tl.float32)"
    return text


@dataclass
class _Red:
    """One reduction computed per row: its body, buffers (kernel argument names), kind."""

    body: Graph
    bufs: tuple[str, ...]
    reduction: str
    rranges: list[int]
    name: str = ""  # the row value's variable
    block: int = 1
    persistent: bool = True


@dataclass
class _Writer:
    name: str
    items: dict[str, Any]
    lines: list[str] = field(default_factory=list)
    reds: dict[tuple[Any, ...], _Red] = field(default_factory=dict)
    renders: int = 0
    wide: bool = False  # int64 index math
    interpret: bool = False  # for Triton's interpreter (numpy in place of libdevice)
    # cuda_evict=1 on a one-pass rows kernel: L2 eviction hints on its loads, as TorchInductor
    # gives them (a load every row reads again, missing an outer variable: evict_last; a load
    # read once: evict_first); the outer loop variables' names
    evict: frozenset[str] | None = None
    tags: int = 0  # passes over a reduction row so far (each names its locals apart)
    rtag: str = ""  # the suffix of the reduced loop variables' names in the current pass
    # one persistent row for every reduction and the row body: one set of indices, and each
    # value (a load above all) computed once per row, found again by its text
    shared: bool = False
    alias: dict[str, str] = field(default_factory=dict)
    cse: dict[str, str] | None = None
    contiguous: Any = None  # pointwise: the flat index as an expression of the loop variables
    sizes: list[str] = field(default_factory=list)  # size symbols: kernel arguments
    per_op: bool = False  # cuda_lowp="per-op": f16/bf16 op results rounded as eager rounds
    bf16: bool = False  # cuda_math="bf16": the prelude's cheaper sin and 1 + erf (lowp.py)
    # names of per-row values (a reduction, and ops over reductions and numbers only): a
    # division by one is a multiplication by its reciprocal, computed once per row
    rowvals: set[str] = field(default_factory=set)

    def op_round(self, dt: DType, text: str) -> str:
        """An op's result: rounded to f16/bf16 under "per-op", left in f32 under "f32"."""
        return _round(dt, text) if self.per_op else text

    def sz(self, e: Any) -> str:
        """A size as Triton code (a static one as its number)."""
        return str(e) if _is_static(e) else pyexpr(e, "", self.alias)

    def number(self, v: Any, dt: DType, scalar: bool = False) -> str:
        """A number operand: a literal, or a size expression as a value of `dt`."""
        if isinstance(v, sympy.Expr) and not v.is_number:
            return f"({self.sz(v)} + tl.zeros([], {compute_dtype(dt)}))"
        return literal(v, dt, scalar)

    def emit(self, depth: int, text: str) -> None:
        self.lines.append("    " * depth + text)

    def body(self, depth: int, g: Graph, bufs: Sequence[str], mask: str, shape: str
             ) -> list[str]:
        """Emit one evaluation of body `g` (loads of buffer params read `bufs`) under `mask`
        over a block of `shape`; returns the names of its outputs."""
        self.renders += 1
        pre = f"v{self.renders}_"
        env: dict[Value, str] = {}
        for p, b in zip(g.params, bufs, strict=True):
            env[p] = b
        for n in g.nodes:
            r = n.results[0]
            loc = f" ({short(n.loc.file)}:{n.loc.line})" if n.loc else ""
            self.emit(depth, "# " + safe_text(f"%{r.name} = {n.op}{loc}"))
            rhs = self.rhs(n, env, pre, mask, shape)
            vals = [env[a] for a in n.args if isinstance(a, Value)]
            row = n.op == "loop.reduce" or (bool(vals) and all(v in self.rowvals for v in vals)
                                            and n.op not in ("loop.load", "loop.index"))
            if self.cse is not None and rhs in self.cse:
                env[r] = self.cse[rhs]
                continue
            env[r] = ident(r.name, pre)
            if row:
                self.rowvals.add(env[r])
            self.emit(depth, f"{env[r]} = {rhs}")
            if self.cse is not None:
                self.cse[rhs] = env[r]
        return [env[o] for o in g.outputs]

    def rhs(self, n: Node, env: dict[Value, str], pre: str, mask: str, shape: str) -> str:
        r = n.results[0]
        dt = _tensor(r).dtype
        if n.op == "loop.load":
            buf = n.args[0]
            assert isinstance(buf, Value)
            index = [parse_index(s) for s in n.kwargs["index"]]  # type: ignore[union-attr]
            flat = flat_offset(index, _dims(_tensor(buf).shape))
            if self.contiguous is not None and sympy.expand(flat - self.contiguous) == 0:
                off = "xflat"  # the buffer read in the loop's own order: contiguous lanes
            else:
                off = pyexpr(flat, self.rtag, self.alias)
            # the offsets broadcast to the block (a row value's load under a [X, R] mask)
            hint = ""
            if self.evict is not None:
                names = {str(f) for f in flat.free_symbols} \
                    if isinstance(flat, sympy.Basic) else set()  # a constant index: every row
                hint = ", eviction_policy=" + (
                    "'evict_first'" if self.evict <= names else "'evict_last'")
            load = f"tl.load({env[buf]} + ({off}) + tl.zeros({shape}, tl.int32), " \
                   f"mask={mask}, other=0{hint})"
            # bf16: a 16-bit shift (prelude's _up_bf16), one instruction a value
            return {DType.bf16: f"_up_bf16({load})", DType.f16: f"{load}.to(tl.float32)"
                    }.get(dt, load)
        if n.op == "loop.index":
            e = pyexpr(parse_index(n.kwargs["index"]), self.rtag, self.alias)
            return f"(tl.zeros({shape}, tl.int64) + {e})"
        if n.op == "loop.reduce":
            return self.reduce_ref(n, env).name
        if n.op == "prims.full":
            val = n.kwargs["value"]
            if isinstance(val, sympy.Expr) and not val.is_number:
                return f"(tl.zeros({shape}, {compute_dtype(dt)}) + {self.number(val, dt)})"
            return f"tl.full({shape}, {literal(val, dt, True)}, {compute_dtype(dt)})"
        if n.op == "prims.convert_element_type":
            x = n.args[0]
            assert isinstance(x, Value)
            if dt == DType.b8:
                return f"({env[x]} != 0)"
            # "f32": the decompositions' downcast after each upcast op (eager's rounding of
            # every result) is no rounding here (TorchInductor: emulate_precision_casts off)
            return self.op_round(dt, f"{env[x]}.to({compute_dtype(dt)})")
        table = OPS.get(n.op)
        tensors = [a for a in n.args if isinstance(a, Value)]
        if table is None or not tensors:
            raise CodegenError(f"{n.op} has no Triton template yet")
        odt = _tensor(tensors[-1]).dtype  # where: the branches' dtype decides the class
        tmpl = OPS_F64.get(n.op) if odt == DType.f64 else None
        tmpl = tmpl or table.get(dclass(odt))
        if tmpl is None:
            raise CodegenError(f"{n.op} has no Triton template for {odt.name}")
        if self.bf16 and odt != DType.f64 and (fast := bf16_math(n, env)) is not None:
            return fast
        ops = [env[a] if isinstance(a, Value) else self.number(a, odt) for a in n.args]
        if n.op == "prims.div" and dclass(odt) == _F and odt != DType.f64 and ops[0] == "1.0":
            tmpl = RECIP
        elif n.op == "prims.div" and dclass(odt) == _F and ops[1] in self.rowvals \
                and ops[0] not in self.rowvals:  # softmax's e / sum: one division per row
            tmpl = "({0} * (1.0 / {1}))"
        if dclass(odt) == _I:  # typed as the tensor operands: an int literal is i32 to Triton
            ops = [o if isinstance(a, Value) else f"tl.full([], {o}, {tl_dtype(odt)})"
                   for o, a in zip(ops, n.args, strict=True)]
        bits = 8 * odt.torch.itemsize
        unsigned = odt in (DType.u8, DType.u16, DType.u32, DType.u64)
        text = tmpl.format(*ops, bits=bits, ones=(1 << bits) - 1 if unsigned else -1,
                           signed=not unsigned)
        if dt == DType.b8 or dclass(odt) == _B:
            return text
        return self.op_round(dt, f"({text}).to({compute_dtype(dt)})" if dclass(dt) == _I
                             else text)

    def reduce_ref(self, n: Node, env: dict[Value, str]) -> _Red:
        ref = n.args[0]
        assert isinstance(ref, Ref)
        key = (ref.name, tuple(env[a] for a in n.args[1:] if isinstance(a, Value)),
               n.kwargs.get("reduction"))
        red = self.reds.get(key)
        if red is None:
            raise CodegenError("a loop.reduce that the kernel does not compute per row")
        return red


def _collect(w: _Writer, g: Graph, bufs: Sequence[str], outer: list[int],
             order: list[_Red]) -> None:
    """The fused reductions of body `g` (nested ones first), each once per kernel."""
    env = dict(zip(g.params, bufs, strict=True))
    for n in g.nodes:
        if n.op != "loop.reduce":
            continue
        ref = n.args[0]
        sub = w.items.get(ref.name) if isinstance(ref, Ref) else None
        if not isinstance(ref, Ref) or not isinstance(sub, Graph) or len(sub.outputs) != 1:
            raise CodegenError("a loop.reduce without a one-value body")
        if _dims(n.kwargs["ranges"]) != outer:  # type: ignore[arg-type]
            raise CodegenError("fused reductions over different outer ranges")
        sbufs = tuple(env[a] for a in n.args[1:] if isinstance(a, Value))
        key = (ref.name, sbufs, n.kwargs.get("reduction"))
        if key in w.reds:
            continue
        _collect(w, sub, sbufs, outer, order)
        red = _Red(sub, sbufs, str(n.kwargs["reduction"]),
                   _dims(n.kwargs["reduce_ranges"]))  # type: ignore[arg-type]
        w.reds[key] = red
        order.append(red)


def _decompose(w: _Writer, depth: int, flat: str, dims: list[int], var: str, start: int,
               tag: str = "") -> None:
    """Loop variables `var{start+k}` recovered from the flat row-major index `flat`."""
    if _numel(dims) == 0:  # an empty loop: every lane is masked off, any index does
        for k in range(len(dims)):
            w.emit(depth, f"{var}{start + k}{tag} = {flat} * 0")
        return
    for k, d in enumerate(dims):
        stride = _numel(dims[k + 1:])
        e = flat if stride == 1 else f"({flat} // ({w.sz(stride)}))"
        if k > 0:
            e = f"({e} % ({w.sz(d)}))"
        w.emit(depth, f"{var}{start + k}{tag} = {e}")


IDENT: dict[str, dict[str, str]] = {
    "sum": {_F: "0.0", _I: "0"}, "prod": {_F: "1.0", _I: "1"},
    "amax": {_F: 'float("-inf")'}, "amin": {_F: 'float("inf")'},
}
_COMBINE = {"sum": "tl.sum", "prod": "_prod", "amax": "tl.max", "amin": "tl.min"}


def _int_ident(red: str, dt: DType) -> str:
    info = torch.iinfo(dt.torch) if dt != DType.b8 else None
    if red in ("sum", "prod"):
        return IDENT[red][_I]
    if info is None:
        return "0" if red == "amax" else "1"
    return str(info.min if red == "amax" else info.max)


def _row_reduce(w: _Writer, depth: int, red: _Red, xmask: str, bshape: str) -> None:
    """Emit red.name = the reduction of red.body over its row, shape [XBLOCK, 1]."""
    rn = w.sz(_numel(red.rranges))
    dt = _tensor(red.body.outputs[0]).dtype
    kind = red.reduction
    value_kind = {"argmax": "amax", "argmin": "amin"}.get(kind, kind)
    if value_kind not in ("sum", "prod", "amax", "amin"):
        raise CodegenError(f"reduction {kind} has no Triton form yet")
    if dclass(dt) == _B and value_kind in ("sum", "prod"):
        raise CodegenError(f"a {kind} of bools")
    ct = compute_dtype(dt) if dt != DType.b8 else "tl.int8"
    ident_v = IDENT[value_kind][_F] if dclass(dt) == _F else _int_ident(value_kind, dt)
    blk = red.block
    rshape = f"[XBLOCK, {blk}]"

    def chunk(d: int, roff: str) -> tuple[str, str, str]:
        """Emit the body over one chunk of the row: (value, flat index, mask) names. Every
        pass over a row has its own names (r0_3, rv3, ...): Triton types a name that a loop
        assigns by its type before the loop."""
        if w.shared:  # every pass over the row shares its indices (emitted once)
            t = "s"
            if w.cse is None:
                w.cse = {}
                _row_indices(w, d, red.rranges, blk, xmask, rn)
        else:
            w.tags += 1
            t = str(w.tags)
            w.emit(d, f"rflat{t} = {roff}tl.arange(0, {blk})[None, :]" + (
                ".to(tl.int64)" if w.wide else ""))
            w.emit(d, f"rmask{t} = {xmask} & " + _below(f"rflat{t}", _numel(red.rranges), rn,
                                                        blk, red.persistent))
            _decompose(w, d, f"rflat{t}", red.rranges, "r", 0, f"_{t}")
        w.rtag = f"_{t}"
        (v,) = w.body(d, red.body, red.bufs, f"rmask{t}", rshape)
        w.rtag = ""
        w.tags += 1
        rv = f"rv{w.tags}"
        w.emit(d, f"{rv} = tl.where(rmask{t}, {v}.to({ct}), {ident_v})")
        return rv, f"rflat{t}", f"rmask{t}"

    val = red.name if kind == value_kind else red.name + "_m"
    nan_fix = dclass(dt) == _F and value_kind in ("amax", "amin")
    op = _COMBINE[value_kind]
    acc = f"acc{red.name}"
    if red.persistent and nan_fix and ct == "tl.float32":
        # a NaN-propagating combine (max.NaN / min.NaN, one instruction an element) in place
        # of tl.max and a second reduction looking for NaN (three an element)
        rv, _, _ = chunk(depth, "")
        nan_comb = "_nanmax" if value_kind == "amax" else "_nanmin"
        w.emit(depth, f"{val} = tl.reduce({rv}, 1, {nan_comb}, keep_dims=True)")
    elif red.persistent:
        rv, _, _ = chunk(depth, "")
        w.emit(depth, f"{val} = {_reduce_call(op, rv)}")
        if nan_fix:  # tl.max drops NaN: a row holding one reduces to NaN, as eager
            w.emit(depth, f"{val} = tl.where(tl.max(({rv} != {rv}).to(tl.int8), 1, "
                          f"keep_dims=True) > 0, float('nan'), {val})")
    else:
        w.emit(depth, f"{acc} = tl.full({rshape}, {ident_v}, {ct})")
        w.emit(depth, f"for roff in range(0, {rn}, {blk}):")
        rv, _, _ = chunk(depth + 1, "roff + ")
        fmax = "_maximum" if dclass(dt) == _F else "tl.maximum"
        fmin = "_minimum" if dclass(dt) == _F else "tl.minimum"
        comb = {"sum": f"{acc} + {rv}", "prod": f"{acc} * {rv}",
                "amax": f"{fmax}({acc}, {rv})", "amin": f"{fmin}({acc}, {rv})"}
        w.emit(depth + 1, f"{acc} = {comb[value_kind]}")
        w.emit(depth, f"{val} = {_reduce_call(op, acc)}")
        if nan_fix:
            w.emit(depth, f"{val} = tl.where(tl.max(({acc} != {acc}).to(tl.int8), 1, "
                          f"keep_dims=True) > 0, float('nan'), {val})")
    if dt in (DType.f16, DType.bf16) and w.per_op:  # the row value as eager rounds it
        w.emit(depth, f"{val} = {val}.to({tl_dtype(dt)}).to(tl.float32)")
    elif dt == DType.b8:
        w.emit(depth, f"{val} = {val} != 0")
    if kind == value_kind:
        return
    # argmax/argmin: the first index where the value is the max/min (a NaN where it is NaN)
    big = rn
    w.emit(depth, f"{red.name} = tl.zeros([XBLOCK, 1], tl.int64) + {big}")
    loop = not red.persistent
    d = depth + 1 if loop else depth
    if loop:
        w.emit(depth, f"for roff in range(0, {rn}, {blk}):")
    rv, rflat, rmask = chunk(d, "roff + " if loop else "")
    hit = f"({rv} == {val})" + (f" | (({rv} != {rv}) & ({val} != {val}))"
                                if dclass(dt) == _F else "")
    w.emit(d, f"{red.name} = tl.minimum({red.name}, tl.min(tl.where({rmask} & ({hit}), "
              f"{rflat}.to(tl.int64), {big}), 1, keep_dims=True))")


def _xmask(w: _Writer, xn: Any, xn_t: str, shape: str) -> None:
    """xmask = xflat < xn, a constant where the grid covers xn exactly (decided at compile
    time by the launch's XBLOCK, so a re-launch with another XBLOCK stays correct)."""
    if not _is_static(xn) or xn <= 0:
        w.emit(1, f"xmask = xflat < {xn_t}")
        return
    w.emit(1, f"if {xn} % XBLOCK == 0:  # every lane in range: a mask Triton folds away")
    w.emit(2, f"xmask = tl.full({shape}, 1, tl.int1)")
    w.emit(1, "else:")
    w.emit(2, f"xmask = xflat < {xn_t}")


def _below(idx: str, n: Any, n_text: str, blk: int, one_block: bool, shape: str = "") -> str:
    """The mask `idx < n` (n_text: n as Triton code) of lanes [k*blk, (k+1)*blk): a constant
    where every lane is in range (a static n that is `blk` for one block, or a multiple of
    it), which Triton's compiler folds away (unmasked loads and stores, no selects)."""
    if _is_static(n) and n > 0 and (n == blk if one_block else n % blk == 0):
        return f"tl.full({shape or f'[1, {blk}]'}, 1, tl.int1)"
    return f"({idx} < {n_text})"


def _row_indices(w: _Writer, d: int, rranges: list[Any], blk: int, xmask: str, rn: str
                 ) -> None:
    w.emit(d, "rflats = tl.arange(0, " + str(blk) + ")[None, :]" + (
        ".to(tl.int64)" if w.wide else ""))
    w.emit(d, f"rmasks = {xmask} & " + _below("rflats", _numel(rranges), rn, blk, True))
    _decompose(w, d, "rflats", rranges, "r", 0, "_s")


def _reduce_call(op: str, x: str) -> str:
    if op == "_prod":
        return f"tl.reduce({x}, 1, _mul, keep_dims=True)"
    return f"{op}({x}, 1, keep_dims=True)"


@dataclass
class Rendered:
    source: str
    schedule: dict[str, int]
    sizes: list[str] = field(default_factory=list)  # size symbols the kernel takes, in order


def render(name: str, node: Node, body: Graph, items: dict[str, Any], interpret: bool = False
           ) -> Rendered:
    """The Triton module of kernel `name` computing `node` (loop.pointwise / loop.reduction);
    `interpret`: for Triton's interpreter (libdevice is interp_libdevice.py)."""
    w = _Writer(name, items, interpret=interpret)
    user = read_schedule(node)
    lowp = read_lowp(node)
    w.per_op = lowp == "per-op"
    w.bf16 = read_math(node) == "bf16" and not w.per_op
    t = _tensor(node.results[0])
    ranges = _dims(node.kwargs["ranges"])  # type: ignore[arg-type]
    free: set[sympy.Symbol] = set()
    for v in [*node.args[1:], *node.results]:
        if isinstance(v, Value):
            tl_dtype(_tensor(v).dtype)
            numel = _numel(_dims(_tensor(v).shape))
            free |= set() if _is_static(numel) else numel.free_symbols
            w.wide |= not _is_static(numel) or numel >= INT32_LIMIT  # a symbolic size: int64
    for key in ("ranges", "reduce_ranges"):
        dims = node.kwargs.get(key)
        free |= {f for d in _dims(dims if isinstance(dims, list) else [])
                 if not _is_static(d) for f in d.free_symbols}
    # sizes the body reads that no buffer carries (a cache position plus the prompt length:
    # a size as a value, or in an index): run-time arguments like the others
    used = body_symbols(body, items)
    w.wide |= bool(used["index"])  # an index over a run-time size: int64, as symbolic shapes
    free |= used["index"] | used["value"]
    w.sizes = sorted(str(f) for f in free)
    if any(not (s[:1] == "s" and s[1:].isdigit()) for s in w.sizes):
        raise CodegenError(f"sizes over symbols {w.sizes} (size symbols are s0, s1, ...)")
    w.alias = {s: s for s in w.sizes}
    nin = len(node.args) - 1
    nout = len(node.results)
    ins = [f"in{k}" for k in range(nin)]
    outs = [f"out{k}" for k in range(nout)]
    order: list[_Red] = []
    main: _Red | None = None
    if node.op == "loop.reduction":
        main = _Red(body, tuple(ins), str(node.kwargs["reduction"]),
                    _dims(node.kwargs["reduce_ranges"]))  # type: ignore[arg-type]
        _collect(w, body, ins, ranges, order)
        order.append(main)
        outer = ranges
    else:
        outer = _outer(w, body, ins, ranges, order)
    xn = _numel(outer)
    static = _is_static(xn)
    w.wide |= not static or xn >= INT32_LIMIT
    xn_t = w.sz(xn)
    sym = kernel_symbol(name)
    sched: dict[str, int] = {}
    # sizes are run-time int64s on the GPU, not specialized by value (one binary for every
    # size, so launcher.py binds it once); the interpreter's range() takes only Python ints,
    # so there they are constexpr
    jit = "@triton.jit" if interpret or not w.sizes else \
        f"@triton.jit(do_not_specialize={tuple(w.sizes)!r})"
    head = [f"# ember triton kernel {safe_text('@' + short(name))}: "
            f"{safe_text(node.op)} over {ranges}"]
    if has_lowp_values(node, body, items):
        head.append(f"# f16/bf16: cuda_lowp={lowp} (" + (
            "every op's result rounded to its dtype, as eager" if w.per_op else
            "computed in f32, rounded at stores") + ")")
    head += [prelude(interpret), "", jit]
    sizes = [f"{s}: tl.constexpr" if interpret else f"{s}: tl.int64" for s in w.sizes]
    params = ", ".join([*ins, *outs, *sizes, "XBLOCK: tl.constexpr"])
    w.emit(0, f"def {sym}({params}):")
    pid = "tl.program_id(0)" + (".to(tl.int64)" if w.wide else "")
    if not order:  # plain pointwise: 1-D over the flattened output
        xblock = user.get("cuda_xblock", min(PMAX, next_pow2(xn)) if static else PMAX)
        sched = {"XBLOCK": xblock,
                 "num_warps": user.get("cuda_warps", max(1, min(8, xblock // 256))),
                 "grid": math.ceil(xn / xblock) if static else -1}
        w.emit(1, f"xflat = {pid} * XBLOCK + tl.arange(0, XBLOCK)")
        _xmask(w, xn, xn_t, "[XBLOCK]")
        _decompose(w, 1, "xflat", ranges, "i", 0)
        w.contiguous = sum(sympy.Symbol(f"i{k}") * _numel(ranges[k + 1:])
                           for k in range(len(ranges)))
        vals = w.body(1, body, ins, "xmask", "[XBLOCK]")
        for o, v, r in zip(outs, vals, node.results, strict=True):
            w.emit(1, f"tl.store({o} + xflat, {v}.to({tl_dtype(_tensor(r).dtype)}), "
                      f"mask=xmask)")
    else:
        widest = 1
        for k, red in enumerate(order):
            rn = _numel(red.rranges)
            red.persistent = _is_static(rn) and bool(user.get("cuda_persistent", rn <= RMAX or (
                rn <= PMAX_ROW and rn * _widest_bytes(node) <= 65536
                and rn * _widest_bytes(node, sum) <= 131072)))  # (registers: all inputs)
            red.block = next_pow2(rn) if red.persistent else user.get("cuda_rblock", RMAX // 4)
            red.name = f"red{k}"
            widest = max(widest, red.block)
        inner = ranges[len(outer):] if main is None else []
        ni = _numel(inner)
        iblock = 1 if main is not None else min(next_pow2(ni), max(RMAX, widest)) \
            if _is_static(ni) else RMAX // 4  # (a persistent row past RMAX: all of it)
        widest = max(widest, iblock)
        xblock = user.get("cuda_xblock",
                          max(1, min(next_pow2(xn) if static else 64, 64, RMAX // widest)))
        elems = xblock * widest
        # a plain row reduction (one reduction, a value per row, each row read once; a bf16
        # sum is a pointwise kernel rounding its fused reduction's value)
        plain = len(order) == 1 and ni == 1 and order[0].reduction not in ("argmax", "argmin")
        warps = 8 if elems > 4096 else 4 if elems >= 1024 else 2 if elems >= 256 else 1
        if 1024 <= elems <= PMAX_ROW:
            # by bytes a thread loads (the widest input): on the H200 at 16384x4096 a plain
            # row reduction streams best at 32 a thread (sum: bf16 8 warps 86.8% of copy
            # against 74.4 with 4, f32 16 warps 94.5 against 90.9 with 4, both with eviction
            # hints), a row with a body at 64 (layernorm+gelu: bf16 4 warps 72.8 against 65.5
            # with 8, f32 8 warps 93.0 against 91.8 with 4; softmax within a point)
            # (benchmarks/results/2026-12-02-h200-memory-bound-math.md)
            nbytes = elems * _widest_bytes(node)
            warps = min(16, max(4, nbytes // (32 * (32 if plain else 64))))
        sched = {"XBLOCK": xblock, "num_warps": user.get("cuda_warps", warps),
                 "grid": math.ceil(xn / xblock) if static else -1}
        for k, red in enumerate(order):
            sched[f"R{k}BLOCK"] = red.block
        sched["persistent"] = int(all(r.persistent for r in order))
        rr = order[0].rranges
        w.shared = all(r.persistent and r.rranges == rr for r in order) and (
            main is not None or inner == rr)
        sched["shared_row"] = int(w.shared)
        # one pass over each row (no buffer read again by a later pass: one reduction, not
        # argmax/argmin's two, and one value per row after it): eviction hints apply
        sched["one_pass"] = int(w.shared or (len(order) == 1 and ni == 1 and order[0].reduction
                                             not in ("argmax", "argmin")))
        # L2 eviction hints: on by default for plain row reductions (H200, 16384x4096 sums:
        # bf16 +12 points of copy, f32 +2), off for rows with a body (softmax, layernorm:
        # 4 points worse with them)
        if user.get("cuda_evict", int(plain)) == 1 and sched["one_pass"]:
            w.evict = frozenset(f"i{k}" for k in range(len(outer)))
            sched["evict"] = 1
        progs = user.get("cuda_programs", 0)
        stride = static and 0 < progs < sched["grid"]
        first, blocks = len(w.lines), sched["grid"]
        if stride:  # a grid-stride loop: the kernel's rows below at one more indent
            sched["grid"] = sched["programs"] = progs
            w.emit(1, f"for it in range({-(-blocks // progs)}):  # blocks of rows")
            first = len(w.lines)
            w.emit(1, f"xflat = ({pid} + it * {progs}) * XBLOCK + tl.arange(0, XBLOCK)[:, None]")
        else:
            w.emit(1, f"xflat = {pid} * XBLOCK + tl.arange(0, XBLOCK)[:, None]")
        if stride and blocks % progs:  # the last pass of some programs: past the rows
            w.emit(1, f"xmask = xflat < {xn_t}")
        else:
            _xmask(w, xn, xn_t, "[XBLOCK, 1]")
        _decompose(w, 1, "xflat", outer, "i", 0)
        for red in order:
            _row_reduce(w, 1, red, "xmask", "[XBLOCK, 1]")
        if main is not None:
            w.emit(1, f"tl.store({outs[0]} + xflat, {main.name}.to({tl_dtype(t.dtype)}), "
                      f"mask=xmask)")
        elif w.shared:  # the row's elements are the reduced ones: same indices, same values
            sched["IBLOCK"] = iblock
            w.alias.update({f"i{len(outer) + k}": f"r{k}_s" for k in range(len(inner))})
            vals = w.body(1, body, ins, "rmasks", f"[XBLOCK, {iblock}]")
            for o, v, r in zip(outs, vals, node.results, strict=True):
                w.emit(1, f"tl.store({o} + xflat * {ni} + rflats, "
                          f"{v}.to({tl_dtype(_tensor(r).dtype)}), mask=rmasks)")
        else:
            sched["IBLOCK"] = iblock
            d = 1
            loop = not _is_static(ni) or ni > iblock
            ni_t = w.sz(ni)
            if loop:
                w.emit(1, f"for ioff in range(0, {ni_t}, {iblock}):")
                d = 2
            start = "ioff + " if loop else ""
            w.emit(d, f"iflat = {start}tl.arange(0, {iblock})[None, :]" + (
                ".to(tl.int64)" if w.wide else ""))
            w.emit(d, "imask = xmask & " + _below("iflat", ni, ni_t, iblock, not loop))
            _decompose(w, d, "iflat", inner, "i", len(outer))
            vals = w.body(d, body, ins, "imask", f"[XBLOCK, {iblock}]")
            for o, v, r in zip(outs, vals, node.results, strict=True):
                w.emit(d, f"tl.store({o} + xflat * ({ni_t}) + iflat, "
                          f"{v}.to({tl_dtype(_tensor(r).dtype)}), mask=imask)")
        if stride:
            w.lines[first:] = ["    " + line for line in w.lines[first:]]
    args = ", ".join([*ins, *outs, *w.sizes])
    launch = ["", "", f"SCHEDULE = {sched!r}", "", "", f"def launch({args}):"]
    grid = str(sched["grid"])
    grid_lines = [f"    grid = {grid}"]
    if not static:  # the grid from the sizes the call passes (Python: products and sums)
        py = str(xn)
        if not set(py) <= _PY_SIZE | set("s"):
            raise CodegenError(f"a grid over {short(py)} (products and sums of sizes only)")
        grid_lines = [f"    grid = (({py}) + {sched['XBLOCK']} - 1) // {sched['XBLOCK']}",
                      "    if grid <= 0:", "        return None  # no elements"]
        launch += grid_lines
        grid = "grid"
    launch += [f"    {sym}[({grid},)]({args}, XBLOCK={sched['XBLOCK']}, "
               f"num_warps={sched['num_warps']})", ""]
    if static and (xn == 0 or sched["grid"] == 0):
        launch[-2] = grid_lines[0] = "    return None  # no elements"
    if not interpret:  # the launch past Triton's JIT (launcher.py)
        launch.append(bind_source(sym, [*ins, *outs], w.sizes, grid_lines, sched["XBLOCK"],
                                  sched["num_warps"]))
    return Rendered("\n".join([*head, *w.lines, *launch]), sched, w.sizes)


def _outer(w: _Writer, body: Graph, ins: list[str], ranges: list[int],
           order: list[_Red]) -> list[int]:
    """The outer ranges of a pointwise kernel's fused reductions ([] where it has none)."""
    outer: list[int] | None = None
    for n in body.nodes:
        if n.op == "loop.reduce":
            o = _dims(n.kwargs["ranges"])  # type: ignore[arg-type]
            if outer is not None and o != outer:
                raise CodegenError("fused reductions over different outer ranges")
            outer = o
    if outer is None:
        return ranges
    if ranges[:len(outer)] != outer:
        raise CodegenError("a fused reduction whose rows are not the kernel's outer dims")
    _collect(w, body, ins, outer, order)
    return outer

