"""Backend "inductor" (compiled C++) vs eager torch: pointwise chains and reductions over
hypothesis shapes (0/1-sized dims, broadcasting, non-contiguous inputs) and dtypes."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
from hypothesis import given, settings
from hypothesis import strategies as st

import ember.inductor  # noqa: F401
from ember.ir import DType, GraphBuilder, Module, TensorType, Value
from ember.ir.backends import default_backends

FLOATS = [torch.float32, torch.float64, torch.float16, torch.bfloat16]
INTS = [torch.int32, torch.int64]


def run_inductor(build: Callable[[GraphBuilder, list[Value]], list[Value]],
                 inputs: list[torch.Tensor]) -> list[Any]:
    m = Module()
    gb = GraphBuilder(m, "f")
    params = [gb.param(f"x{i}", TensorType(DType.from_torch(x.dtype), tuple(x.shape)))
              for i, x in enumerate(inputs)]
    gb.ret(build(gb, params))
    run = default_backends().get("inductor").prepare(m)
    got = run(None, inputs).outputs
    assert all(n.op.startswith("kernels.") for n in _compiled(m).graph("f").nodes)
    return got


def _compiled(m: Module) -> Module:
    from ember.inductor.kernels import compile_module
    return compile_module(m)


def _tensor(shape: tuple[int, ...], dtype: torch.dtype, seed: int, transpose: bool
            ) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    if dtype.is_floating_point:
        x = torch.randn(shape[::-1] if transpose else shape, generator=g).to(dtype)
    else:
        x = torch.randint(-20, 20, shape[::-1] if transpose else shape, generator=g).to(dtype)
    return x.mT if transpose and x.dim() >= 2 else x


shapes2 = st.tuples(st.sampled_from([0, 1, 3, 5]), st.sampled_from([1, 4, 7]))


@settings(max_examples=12)
@given(shape=shapes2, dtype=st.sampled_from(FLOATS + INTS), transpose=st.booleans(),
       bcast=st.booleans(), seed=st.integers(0, 2**16))
def test_pointwise_chain(shape: tuple[int, int], dtype: torch.dtype, transpose: bool,
                         bcast: bool, seed: int) -> None:
    x = _tensor(shape, dtype, seed, transpose)
    y = _tensor((shape[1],) if bcast else shape, dtype, seed + 1, False)

    def build(gb: GraphBuilder, p: list[Value]) -> list[Value]:
        a = gb.op("aten.mul.Tensor", [p[0], p[1]])
        b = gb.op("aten.add.Tensor", [a, p[0]], {"alpha": 2})
        c = gb.op("aten.maximum.default", [b, p[1]])
        d = gb.op("aten.where.self", [gb.op("aten.gt.Scalar", [c, 1]), c, a])
        return [gb.op("aten.neg.default", [d])]

    got = run_inductor(build, [x, y])
    a = x * y
    c = torch.maximum(a + 2 * x, y)
    torch.testing.assert_close(got[0], -torch.where(c > 1, c, a), equal_nan=True)


@settings(max_examples=8)
@given(shape=shapes2, dtype=st.sampled_from(FLOATS), transpose=st.booleans(),
       seed=st.integers(0, 2**16))
def test_float_math_chain(shape: tuple[int, int], dtype: torch.dtype, transpose: bool,
                          seed: int) -> None:
    x = _tensor(shape, dtype, seed, transpose)

    def build(gb: GraphBuilder, p: list[Value]) -> list[Value]:
        e = gb.op("aten.exp.default", [gb.op("aten.tanh.default", [p[0]])])
        s = gb.op("aten.sigmoid.default", [p[0]])
        return [gb.op("aten.div.Tensor", [e, gb.op("aten.add.Scalar", [s, 0.5])])]

    got = run_inductor(build, [x])
    torch.testing.assert_close(got[0], torch.exp(torch.tanh(x)) / (torch.sigmoid(x) + 0.5))


REDUCTIONS: dict[str, Callable[[torch.Tensor, int], torch.Tensor]] = {
    "aten.sum.dim_IntList": lambda x, d: x.sum(d),
    "aten.amax.default": lambda x, d: x.amax(d),
    "aten.argmax.default": lambda x, d: x.argmax(d),
}


@settings(max_examples=12)
@given(shape=st.tuples(st.sampled_from([1, 3]), st.sampled_from([1, 4, 6])),
       dtype=st.sampled_from(FLOATS + INTS), op=st.sampled_from(sorted(REDUCTIONS)),
       dim=st.sampled_from([0, 1]), transpose=st.booleans(), seed=st.integers(0, 2**16))
def test_reduction_with_pointwise_producer(shape: tuple[int, int], dtype: torch.dtype, op: str,
                                           dim: int, transpose: bool, seed: int) -> None:
    x = _tensor(shape, dtype, seed, transpose)
    if op == "aten.sum.dim_IntList" and not dtype.is_floating_point:
        expect = (x * 3).sum(dim)
    else:
        expect = REDUCTIONS[op](x * 3, dim)

    def build(gb: GraphBuilder, p: list[Value]) -> list[Value]:
        y = gb.op("aten.mul.Tensor", [p[0], 3])
        if op == "aten.argmax.default":
            return [gb.op(op, [y], {"dim": dim})]
        return [gb.op(op, [y, [dim]])]

    got = run_inductor(build, [x])
    tol = {"rtol": 2e-2, "atol": 2e-2} if dtype in (torch.float16, torch.bfloat16) else {}
    torch.testing.assert_close(got[0], expect, **tol)


def test_nan_propagating_max_and_python_floor_mod() -> None:
    x = torch.tensor([[1.0, float("nan"), 3.0], [2.0, 5.0, -1.0]])
    a = torch.tensor([-7, 7, -8, 9, 0], dtype=torch.int64)
    b = torch.tensor([2, -3, 3, 4, 5], dtype=torch.int64)

    def build(gb: GraphBuilder, p: list[Value]) -> list[Value]:
        return [gb.op("aten.amax.default", [p[0], [1]]),
                gb.op("aten.maximum.default", [p[0], gb.op("aten.flip.default", [p[0], [1]])]),
                gb.op("aten.remainder.Tensor", [p[1], p[2]]),
                gb.op("aten.floor_divide.default", [p[1], p[2]])]

    got = run_inductor(build, [x, a, b])
    torch.testing.assert_close(got[0], x.amax(1), equal_nan=True)
    torch.testing.assert_close(got[1], torch.maximum(x, x.flip(1)), equal_nan=True)
    torch.testing.assert_close(got[2], torch.remainder(a, b))
    torch.testing.assert_close(got[3], torch.floor_divide(a, b))
