"""C++ code generation for loop kernels, by tables.

`CPP_OPS` maps each body op to a C++ expression template per dtype class ("f" floating, "i"
integer, "b" bool); `{0}`, `{1}`, `{2}` are the operands, `{T}` the result's compute type.
f16 and bf16 are stored as `_Float16` / `uint16_t` and computed in float, rounded back to their
precision after every op (as eager rounds each op's result). Integer ops wrap (`-fwrapv`);
integer division and modulo by zero set a flag that the caller turns into eager's error. One `extern "C"`
function per kernel, named after the kernel, with comments naming the IR nodes it computes.
"""

from __future__ import annotations

import contextlib
import dataclasses
import math
import re
from collections.abc import Callable, Iterable, Iterator, Mapping
from contextvars import ContextVar
from typing import Any

import sympy
import torch

from ember.inductor.indexing import flat_offset, parse_index
from ember.inductor.sanitize import comment, ident, short
from ember.ir import DType, Graph, Node, TensorType, Value
from ember.ir.expr import CPP, Dim, print_expr, simplify_dim

# dtype -> (storage C type, compute C type)
CTYPES: dict[DType, tuple[str, str]] = {
    DType.f16: ("_Float16", "float"), DType.bf16: ("uint16_t", "float"),
    DType.f32: ("float", "float"), DType.f64: ("double", "double"),
    DType.i8: ("int8_t", "int8_t"), DType.i16: ("int16_t", "int16_t"),
    DType.i32: ("int32_t", "int32_t"), DType.i64: ("int64_t", "int64_t"),
    DType.u8: ("uint8_t", "uint8_t"), DType.u16: ("uint16_t", "uint16_t"),
    DType.u32: ("uint32_t", "uint32_t"), DType.u64: ("uint64_t", "uint64_t"),
    DType.b8: ("bool", "bool"),
}

_F, _I, _B = "f", "i", "b"


def _math(fn: str) -> dict[str, str]:
    return {_F: f"std::{fn}({{0}})"}


CPP_OPS: dict[str, dict[str, str]] = {
    "prims.exp": {_F: "ember_exp<{T}>({0})"},  # f32: inline, no libmvec call
    **{f"prims.{fn}": _math(fn) for fn in (
        "exp2", "expm1", "log", "log2", "log10", "log1p", "sqrt", "sin", "cos", "tan",
        "asin", "acos", "atan", "sinh", "cosh", "tanh", "asinh", "acosh", "atanh", "erf", "erfc",
        "lgamma")},
    **{f"prims.{fn}": {_F: f"std::{fn}({{0}})", _I: "{0}"} for fn in ("floor", "ceil", "trunc")},
    "prims.rsqrt": {_F: "({T})1 / std::sqrt({0})"},
    "prims.round": {_F: "std::nearbyint({0})", _I: "{0}"},
    "prims.abs": {_F: "std::abs({0})", _I: "({0} < 0 ? ({T})-{0} : {0})"},
    "prims.neg": {_F: "-{0}", _I: "({T})-{0}"},
    # as torch's CPU kernel: sign(nan) = 0, sign(-0.0) = +0
    "prims.sign": {_F: "({T})(({0} > 0) - ({0} < 0))", _I: "({T})(({0} > 0) - ({0} < 0))"},
    "prims.bitwise_not": {_I: "({T})~{0}", _B: "!{0}"},
    "prims.add": {_F: "{0} + {1}", _I: "({T})({0} + {1})"},
    "prims.sub": {_F: "{0} - {1}", _I: "({T})({0} - {1})"},
    "prims.mul": {_F: "{0} * {1}", _I: "({T})({0} * {1})"},
    "prims.div": {_F: "{0} / {1}", _I: "ember_div_trunc<{T}>({0}, {1})"},
    "prims.fmod": {_F: "std::fmod({0}, {1})", _I: "ember_fmod<{T}>({0}, {1})"},
    "prims.remainder": {_F: "ember_remainder<{T}>({0}, {1})", _I: "ember_pymod<{T}>({0}, {1})"},
    "prims.pow": {_F: "std::pow({0}, {1})", _I: "ember_ipow<{T}>({0}, {1})"},
    "prims.maximum": {_F: "(({0} != {0} || {0} > {1}) ? {0} : {1})",
                      _I: "std::max<{T}>({0}, {1})"},
    "prims.minimum": {_F: "(({0} != {0} || {0} < {1}) ? {0} : {1})",
                      _I: "std::min<{T}>({0}, {1})"},
    "prims.atan2": {_F: "std::atan2({0}, {1})"},
    "prims.bitwise_and": {_I: "({T})({0} & {1})", _B: "({0} && {1})"},
    "prims.bitwise_or": {_I: "({T})({0} | {1})", _B: "({0} || {1})"},
    "prims.bitwise_xor": {_I: "({T})({0} ^ {1})", _B: "({0} != {1})"},
    "prims.shift_left": {_I: "ember_shl<{T}>({0}, {1})"},
    "prims.shift_right": {_I: "ember_shr<{T}>({0}, {1})"},
    **{f"prims.{name}": {c: f"({{0}} {sym} {{1}})" for c in (_F, _I, _B)} for name, sym in (
        ("eq", "=="), ("ne", "!="), ("lt", "<"), ("le", "<="), ("gt", ">"), ("ge", ">="))},
    "prims.where": {c: "({0} ? {1} : {2})" for c in (_F, _I, _B)},
}

# reduction -> (accumulator init per class, combine statement); `acc`, `v` are the names
ACC_INIT: dict[str, dict[str, str]] = {
    "sum": {_F: "0", _I: "0"}, "prod": {_F: "1", _I: "1"},
    "amax": {_F: "-INFINITY", _I: "std::numeric_limits<{S}>::lowest()", _B: "false"},
    "amin": {_F: "INFINITY", _I: "std::numeric_limits<{S}>::max()", _B: "true"},
    "argmax": {_F: "-INFINITY", _I: "std::numeric_limits<{S}>::lowest()"},
    "argmin": {_F: "INFINITY", _I: "std::numeric_limits<{S}>::max()"},
}
COMBINE: dict[str, dict[str, str]] = {
    "sum": {_F: "acc += v;", _I: "acc += v;"},
    "prod": {_F: "acc *= v;", _I: "acc *= v;"},
    "amax": {_F: "if (v > acc || v != v) acc = v;", _I: "if (v > acc) acc = v;",
             _B: "acc = acc || v;"},
    "amin": {_F: "if (v < acc || v != v) acc = v;", _I: "if (v < acc) acc = v;",
             _B: "acc = acc && v;"},
    "argmax": {_F: "if (!(acc != acc) && (v > acc || v != v)) { acc = v; arg = r; }",
               _I: "if (v > acc) { acc = v; arg = r; }"},
    "argmin": {_F: "if (!(acc != acc) && (v < acc || v != v)) { acc = v; arg = r; }",
               _I: "if (v < acc) { acc = v; arg = r; }"},
}

PRELUDE = r"""// ember.inductor C++ prelude: helpers the kernels below share.
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <algorithm>
#include <type_traits>
#include <omp.h>
#if defined(__linux__)
#include <sys/mman.h>
#endif
#ifdef EMBER_MVEC
// glibc's vector math library (libmvec, <= 4 ulp): declaring the SIMD variants lets g++
// vectorise loops that call these functions (math.h declares them only under -ffast-math)
extern "C" {
#define EMBER_SIMD(fn) float fn##f(float) __attribute__((simd("notinbranch"))); \
  double fn(double) __attribute__((simd("notinbranch")));
EMBER_SIMD(sin) EMBER_SIMD(cos) EMBER_SIMD(tan) EMBER_SIMD(asin) EMBER_SIMD(acos)
EMBER_SIMD(atan) EMBER_SIMD(sinh) EMBER_SIMD(cosh) EMBER_SIMD(tanh) EMBER_SIMD(asinh)
EMBER_SIMD(acosh) EMBER_SIMD(atanh) EMBER_SIMD(exp) EMBER_SIMD(exp2) EMBER_SIMD(expm1)
EMBER_SIMD(log) EMBER_SIMD(log2) EMBER_SIMD(log10) EMBER_SIMD(log1p) EMBER_SIMD(erf)
EMBER_SIMD(erfc)
#undef EMBER_SIMD
float atan2f(float, float) __attribute__((simd("notinbranch")));
double atan2(double, double) __attribute__((simd("notinbranch")));
float powf(float, float) __attribute__((simd("notinbranch")));
double pow(double, double) __attribute__((simd("notinbranch")));
}
#endif
// a large output is faulted in as 2 MB pages (transparent huge pages, "madvise" mode) rather
// than 4 KB ones: a fresh 64 MB buffer's page faults otherwise cost as much as softmax's math
static inline void ember_hugepages(void* p, int64_t bytes) {
#if defined(__linux__) && defined(MADV_HUGEPAGE)
  const uintptr_t H = (uintptr_t)2 << 20;  // only whole 2 MB pages inside the buffer
  uintptr_t a = ((uintptr_t)p + H - 1) & ~(H - 1), e = ((uintptr_t)p + bytes) & ~(H - 1);
  if (e > a) madvise((void*)a, e - a, MADV_HUGEPAGE);
#else
  (void)p; (void)bytes;
#endif
}
// float exp, inline: Cephes' expf (n = round(x log2 e), r = x - n ln 2 in two parts, a degree-7
// polynomial, times 2^n as two factors so that denormal results round once). g++ vectorises it
// at any width with no call: libmvec's expf took its scalar slow path for a vector holding
// -inf (a masked softmax) and needed a guard around it (~10% of a softmax), a call clobbers
// every vector register, and a row's tail element called the scalar expf. <= 1.3 ulp (sampled
// over all floats; libmvec's: 2.5); below -104 exactly 0, above 89 inf, NaN stays NaN.
#if defined(__FMA__) || defined(__ARM_FEATURE_FMA)
#define EMBER_FMA(a, b, c) std::fma(a, b, c)
#else
#define EMBER_FMA(a, b, c) ((a) * (b) + (c))
#endif
static inline float ember_expf(float x) {
  const float magic = 12582912.0f;  // 1.5 * 2^23: adding it rounds to an integer
  const float t = EMBER_FMA(x, 1.44269504088896341f, magic), n = t - magic;
  float r = EMBER_FMA(n, -0.693359375f, x);
  r = EMBER_FMA(n, 2.12194440e-4f, r);
  float p = 1.9875691500e-4f;
  p = EMBER_FMA(p, r, 1.3981999507e-3f);
  p = EMBER_FMA(p, r, 8.3334519073e-3f);
  p = EMBER_FMA(p, r, 4.1665795894e-2f);
  p = EMBER_FMA(p, r, 1.6666665459e-1f);
  p = EMBER_FMA(p, r, 5.0000001201e-1f);
  p = EMBER_FMA(p, r * r, r + 1.0f);
  uint32_t tb, mb;
  std::memcpy(&tb, &t, 4); std::memcpy(&mb, &magic, 4);
  const int32_t ni = (int32_t)(tb - mb), n1 = ni >> 1, n2 = ni - n1;  // n, as an integer
  const uint32_t b1 = (uint32_t)(n1 + 127) << 23, b2 = (uint32_t)(n2 + 127) << 23;
  float s1, s2;
  std::memcpy(&s1, &b1, 4); std::memcpy(&s2, &b2, 4);
  const float e = p * s1 * s2;  // (out of range, t and so s1, s2 are junk: selected away)
  return x < -104.0f ? 0.0f : (x > 89.0f ? INFINITY : e);
}
template <typename T> static inline T ember_exp(T x) {
  if constexpr (std::is_same_v<T, float>) {
    return ember_expf(x);
  } else {
    return std::exp(x);
  }
}
static inline float ember_bf16_to_float(uint16_t b) {
  uint32_t u = (uint32_t)b << 16; float f; std::memcpy(&f, &u, 4); return f; }
static inline uint16_t ember_float_to_bf16(float f) {
  uint32_t u; std::memcpy(&u, &f, 4);
  if (f != f) return 0x7fc0;
  u += 0x7fff + ((u >> 16) & 1); return (uint16_t)(u >> 16); }
static inline float ember_round_bf16(float f) { return ember_bf16_to_float(ember_float_to_bf16(f)); }
static inline float ember_round_f16(float f) { return (float)(_Float16)f; }
// integer division or modulo by zero: eager raises; the kernel sets this flag, returns 0 for
// the element, and the caller raises after the call (ember_take_errors)
static int ember_errors = 0;
extern "C" int ember_take_errors() { int e = ember_errors; ember_errors = 0; return e; }
static inline void ember_zero_division() { __atomic_store_n(&ember_errors, 1, __ATOMIC_RELAXED); }
template <typename T> static inline T ember_div_trunc(T a, T b) {
  if (b == 0) { ember_zero_division(); return 0; }
  if (std::is_signed<T>::value && b == (T)-1) return (T)(0 - (uint64_t)a);
  return a / b; }
template <typename T> static inline T ember_fmod(T a, T b) {
  if (b == 0) { ember_zero_division(); return 0; }
  if (std::is_signed<T>::value && b == (T)-1) return 0; return a % b; }
template <typename T> static inline T ember_pymod(T a, T b) {
  if (b == 0) { ember_zero_division(); return 0; }
  if (std::is_signed<T>::value && b == (T)-1) return 0;
  T r = a % b; return (r != 0 && ((r < 0) != (b < 0))) ? (T)(r + b) : r; }
template <typename T> static inline T ember_remainder(T a, T b) {
  T r = std::fmod(a, b); if (r != 0 && ((r < 0) != (b < 0))) r += b; return r; }
template <typename T> static inline T ember_ipow(T a, T b) {
  if (b < 0) return a == 1 ? 1 : (a == -1 ? ((b & 1) ? -1 : 1) : 0);
  T r = 1; while (b) { if (b & 1) r = (T)(r * a); a = (T)(a * a); b >>= 1; } return r; }
template <typename T> static inline T ember_shl(T a, T b) {
  if (b < 0 || b >= (T)(8 * sizeof(T))) return 0; return (T)((uint64_t)a << b); }
template <typename T> static inline T ember_shr(T a, T b) {
  if (b < 0 || b >= (T)(8 * sizeof(T))) return a < 0 ? (T)-1 : (T)0; return (T)(a >> b); }
static inline int64_t ember_floordiv(int64_t a, int64_t b) {
  int64_t q = a / b; return (q * b != a && ((a < 0) != (b < 0))) ? q - 1 : q; }
static inline int64_t ember_mod(int64_t a, int64_t b) {
  int64_t r = a % b; return (r != 0 && ((r < 0) != (b < 0))) ? r + b : r; }
static inline int64_t ember_imax(int64_t a, int64_t b) { return a > b ? a : b; }
static inline int64_t ember_imin(int64_t a, int64_t b) { return a < b ? a : b; }
"""


_LOOP_VAR = re.compile(r"[ir][0-9]+")
_SIZE_SYM = re.compile(r"[su][0-9]+")  # size symbols (u: unbacked, ir-v1.2): C++ kernel args
# the size symbols the kernel being written reads (None outside `size_symbols`)
_SIZES: ContextVar[set[str] | None] = ContextVar("ember_cpp_sizes", default=None)


class CodegenError(NotImplementedError):
    """A kernel the C++ tables cannot express yet (it keeps running on the reference)."""


def dclass(dt: DType) -> str:
    return _F if dt.is_floating else _B if dt == DType.b8 else _I


def ctypes_of(dt: DType) -> tuple[str, str]:
    if dt not in CTYPES:
        raise CodegenError(f"dtype {dt.name} has no C++ type yet")
    return CTYPES[dt]


# Index max/min (a `where`'s clamped load: pad, concatenation, a convolution's or pooling's
# window) by value: std::max<int64_t> returns a reference, and inside an `omp simd` loop g++
# kept its operands in per-lane stack arrays and read the loads' indices back by gathers, also
# where the clamp is invariant in the loop (a channels-last pad + mul over [2, 58, 58, 96]:
# 24 gathers, 440 us; by value: contiguous loads, 55 us)
KERNEL_CPP = dataclasses.replace(CPP, max="ember_imax", min="ember_imin")


def cexpr(e: Dim) -> str:
    """An index expression as C++ (int64 arithmetic, Python // and mod: ember.ir's C++ table,
    max/min by value: KERNEL_CPP)."""
    return print_expr(e, KERNEL_CPP, _index_name, CodegenError)


def _index_name(name: str) -> str:
    if _SIZE_SYM.fullmatch(name):
        used = _SIZES.get()
        if used is None:
            raise CodegenError(f"size symbol {name} outside a kernel that takes it")
        used.add(name)  # the kernel takes it as an int64_t argument (size_symbols)
        return name
    if not _LOOP_VAR.fullmatch(name):  # only the loops' own variables are C++ names
        raise CodegenError(f"index symbol {short(name)!r} is not a loop variable")
    return name


@contextlib.contextmanager
def size_symbols() -> Iterator[set[str]]:
    """While writing one kernel: the set of size symbols (`s0`) its C++ reads, filled by
    `cexpr`; the kernel takes each as an `int64_t` argument after its buffers."""
    used: set[str] = set()
    token = _SIZES.set(used)
    try:
        yield used
    finally:
        _SIZES.reset(token)


def symbol_order(names: Iterable[str]) -> list[str]:
    """Size symbols in the order of a kernel's arguments: by number (s2 before s10)."""
    return sorted(names, key=lambda n: (int(n[1:]), n))


def bound(n: Dim) -> str:
    """A loop extent as C++: a static one as its digits (as before symbolic sizes), else its
    expression over the kernel's size arguments."""
    return str(n) if isinstance(n, int) else cexpr(n)


def literal(v: object, dt: DType) -> str:
    """A number operand converted to `dt` exactly as eager does (torch.tensor(v, dtype)); a
    size expression (mean's count `s1`) is converted from its int64 value per call."""
    if isinstance(v, sympy.Expr) and not v.is_number:
        ct = ctypes_of(dt)[1]
        if dt == DType.b8:
            return f"({cexpr(v)} != 0)"
        return _round(dt, f"(({ct}){cexpr(v)})")
    x: Any = torch.tensor(v, dtype=dt.torch).item()
    if isinstance(x, bool):
        return "true" if x else "false"
    if isinstance(x, int):
        return "(-9223372036854775807LL - 1)" if x == -(2**63) else f"(int64_t){x}LL"
    if math.isnan(x):
        return "NAN"
    if math.isinf(x):
        return "INFINITY" if x > 0 else "-INFINITY"
    return f"({ctypes_of(dt)[1]}){float(x)!r}"


def _round(dt: DType, text: str) -> str:
    if dt == DType.f16:
        return f"ember_round_f16({text})"
    if dt == DType.bf16:
        return f"ember_round_bf16({text})"
    return text


def _tensor(v: Value) -> TensorType:
    assert isinstance(v.type, TensorType)
    return v.type


def _cname(v: Value, pre: str = "v_") -> str:
    """The C++ variable of a body value: an injective identifier of its IR name (sanitize)."""
    return ident(v.name, pre)


def body_statements(body: Graph, args: dict[Value, str], pre: str = "v_",
                    reduce_value: Callable[[Node], str] | None = None,
                    override: Mapping[Value, str] | None = None) -> list[str]:
    """One C++ statement per body node (loads read `args[param]` at the row-major offset);
    C++ names are the values' names after `pre`. A `loop.reduce` node reads the variable that
    `reduce_value(node)` names (computed before the loops that need it); a value in
    `override` is that C++ expression instead (softmax's rescale)."""
    out: list[str] = []
    for n in body.nodes:
        r = n.results[0]
        dt = _tensor(r).dtype
        ct = ctypes_of(dt)[1]
        out.append(comment(_describe(n)))
        if override is not None and r in override:
            rhs = override[r]
        elif n.op == "loop.reduce":
            if reduce_value is None:
                raise CodegenError("loop.reduce outside a kernel that computes it")
            rhs = reduce_value(n)
        else:
            rhs = _rhs(n, args, pre)
        out.append(f"{ct} {_cname(r, pre)} = {rhs};")
    return out


def _describe(n: Node) -> str:
    """A node as comment text (raw IR text: callers write it through sanitize.comment)."""
    loc = f" ({short(n.loc.file)}:{n.loc.line})" if n.loc else ""
    return f"%{n.results[0].name} = {n.op}{loc}"


def _rhs(n: Node, args: dict[Value, str], pre: str = "v_") -> str:
    r = n.results[0]
    dt = _tensor(r).dtype
    if n.op == "loop.load":
        buf = n.args[0]
        assert isinstance(buf, Value)
        bt = _tensor(buf)
        index = [parse_index(s) for s in n.kwargs["index"]]  # type: ignore[union-attr]
        text = f"{args[buf]}[{cexpr(flat_offset(index, bt.shape))}]"
        if dt == DType.b8:  # read as bytes: g++ 12 leaves a loop selecting on a bool load scalar
            return f"(((const unsigned char*){args[buf]})[{cexpr(flat_offset(index, bt.shape))}] != 0)"
        return f"ember_bf16_to_float({text})" if dt == DType.bf16 else \
            f"(float){text}" if dt == DType.f16 else text
    if n.op == "loop.index":
        return cexpr(parse_index(n.kwargs["index"]))
    if n.op == "prims.full":
        return literal(n.kwargs["value"], dt)
    if n.op == "prims.convert_element_type":
        x = n.args[0]
        assert isinstance(x, Value)
        src = _cname(x, pre)
        if dt == DType.b8:
            return f"({src} != 0)"
        return _round(dt, f"({ctypes_of(dt)[1]}){src}")
    table = CPP_OPS.get(n.op)
    tensors = [a for a in n.args if isinstance(a, Value)]
    if table is None or not tensors:
        raise CodegenError(f"{n.op} has no C++ template yet")
    odt = _tensor(tensors[-1]).dtype  # where: the branches' dtype decides the class
    tmpl = table.get(dclass(odt))
    if tmpl is None:
        raise CodegenError(f"{n.op} has no C++ template for {odt.name}")
    ops = [_cname(a, pre) if isinstance(a, Value) else literal(a, odt) for a in n.args]
    text = tmpl.format(*ops, T=ctypes_of(dt)[1])
    return _round(dt, text)


def _store(dt: DType, text: str) -> str:
    if dt == DType.bf16:
        return f"ember_float_to_bf16({text})"
    if dt == DType.f16:
        return f"(_Float16){text}"
    return text


def _int(d: object) -> Dim:
    """A size of a kernel: an int, or an expression over size symbols (its C++ reads them)."""
    if isinstance(d, bool) or not isinstance(d, (int, sympy.Expr)):
        raise CodegenError(f"size {d!r} is not an integer expression")
    return simplify_dim(d)
