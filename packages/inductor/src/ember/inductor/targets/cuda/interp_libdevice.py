"""`libdevice` for Triton's interpreter (TRITON_INTERPRET=1), which has none.

A kernel rendered for the interpreter (`codegen-triton{interpret=true}`) imports this module
as `libdevice`, so the kernels that call libdevice on the GPU (tanh, expm1, fmod, pow, ...)
run in the interpreter too: each function applies numpy's (or Python's math) function to the
interpreter's numpy data. What this checks is the kernel around the call (indices, masks,
dtypes, rounding after each op); libdevice's own accuracy is checked on the device
(benchmarks/gpu_cuda_suite.py). Only the interpreter's tensors (numpy data in
`TensorHandle`) are accepted: on a GPU the kernels import triton's libdevice.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

import numpy as np
import torch
import triton.language as tl
from triton.runtime.interpreter import TensorHandle


def _data(x: Any) -> Any:
    if isinstance(x, tl.core.tensor):
        return x.handle.data
    if isinstance(x, tl.constexpr):
        return x.value
    return x


def _apply(fn: Callable[..., Any], *xs: Any) -> tl.core.tensor:
    tensors = [x for x in xs if isinstance(x, tl.core.tensor)]
    # the result has the block's shape: the widest operand (a scalar `tl.full([], ...)` may
    # come first, as in remainder(1.0, x))
    t = max(tensors, key=lambda x: x.handle.data.size)
    dt = t.handle.data.dtype
    with np.errstate(all="ignore"):  # inf/nan results are values here, as on the GPU
        out = np.asarray(fn(*[np.asarray(_data(x), dtype=dt) for x in xs]), dtype=dt)
    out = np.ascontiguousarray(np.broadcast_to(out, t.handle.data.shape))
    return tl.core.tensor(TensorHandle(out, t.handle.dtype), t.type)


def _vec(fn: Callable[[float], float]) -> Callable[[Any], Any]:
    def elementwise(a: Any) -> Any:  # math's functions take one float: per element
        flat = np.asarray(a).reshape(-1)
        return np.array([_safe(fn, float(v)) for v in flat]).reshape(np.shape(a))
    return elementwise


def _safe(fn: Callable[[float], float], v: float) -> float:
    try:
        return fn(v)
    except (ValueError, OverflowError):  # math raises where libdevice returns inf or nan
        return _limit(fn, v)


def _limit(fn: Callable[[float], float], v: float) -> float:
    if fn is math.lgamma:  # poles at 0, -1, -2, ...: +inf, as libdevice
        return math.inf
    return math.nan


def _unary(np_fn: Callable[[Any], Any]) -> Callable[[Any], tl.core.tensor]:
    return lambda x: _apply(np_fn, x)


def _binary(np_fn: Callable[[Any, Any], Any]) -> Callable[[Any, Any], tl.core.tensor]:
    return lambda x, y: _apply(np_fn, x, y)


expm1 = _unary(np.expm1)
log1p = _unary(np.log1p)
log10 = _unary(np.log10)
tan = _unary(np.tan)
asin = _unary(np.arcsin)
acos = _unary(np.arccos)
atan = _unary(np.arctan)
sinh = _unary(np.sinh)
cosh = _unary(np.cosh)
tanh = _unary(np.tanh)
asinh = _unary(np.arcsinh)
acosh = _unary(np.arccosh)
atanh = _unary(np.arctanh)
erfc = _unary(_vec(math.erfc))
lgamma = _unary(_vec(math.lgamma))
erfinv = _unary(lambda a: torch.special.erfinv(torch.from_numpy(np.asarray(a))).numpy())
sqrt = _unary(np.sqrt)
trunc = _unary(np.trunc)
nearbyint = _unary(np.rint)  # half to even, as libdevice's nearbyint in the default mode
fmod = _binary(np.fmod)
pow = _binary(np.power)  # noqa: A001  (libdevice's name)
atan2 = _binary(np.arctan2)
fast_dividef = _binary(np.divide)  # div.approx on the GPU (2 ulp where |b| < 2**126)
copysign = _binary(np.copysign)
fast_expf = _unary(np.exp)  # ex2.approx.ftz on the GPU
exp2 = _unary(np.exp2)  # ex2.approx.ftz on the GPU
