"""The C++ reduction loop orders against eager (cppkernel.py): outer reductions (the reduced
dims outer in memory: rows outside, columns vectorised), split full reductions (per-thread
partials), and softmax's rescale (the sum's pass stores the numerators). Each test also checks
that the generated code took the path it is about, so it fails when the path is removed."""

from __future__ import annotations

from collections.abc import Callable

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

import ember.inductor  # noqa: F401
from ember.inductor.kernels import compile_module, compiled_runner, module_source
from ember.ir import DType, GraphBuilder, Module, TensorType, Value

FLOATS = [torch.float32, torch.float64, torch.float16, torch.bfloat16]
INTS = [torch.int32, torch.int64]
COLUMNS = "const int64_t ib = b * "  # an outer reduction's block of columns
SPLIT = "omp_get_thread_num()"  # a reduction split over threads
RESCALE = "the sum's pass stored the numerators"

Build = Callable[[GraphBuilder, list[Value]], list[Value]]


def compile_run(build: Build, inputs: list[torch.Tensor]) -> tuple[list[torch.Tensor], str]:
    """The outputs of the compiled module (all of it C++ kernels) and its C++ source."""
    m = Module()
    gb = GraphBuilder(m, "f")
    params = [gb.param(f"x{i}", TensorType(DType.from_torch(x.dtype), tuple(x.shape)))
              for i, x in enumerate(inputs)]
    gb.ret(build(gb, params))
    compiled = compile_module(m)
    assert all(n.op.startswith("kernels.") for n in compiled.graph("f").nodes)
    out = list(compiled_runner(compiled)(None, inputs).outputs)
    return out, module_source(compiled)


def tensor(shape: tuple[int, ...], dtype: torch.dtype, seed: int, transpose: bool = False
           ) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    full = shape[::-1] if transpose else shape
    if dtype.is_floating_point:
        x = (torch.randn(full, generator=g) * 2 + 1).to(dtype)
    else:
        x = torch.randint(-50, 50, full, generator=g).to(dtype)
    return x.permute(*reversed(range(x.dim()))) if transpose else x


def tol(dtype: torch.dtype) -> dict[str, float]:
    return {"rtol": 2e-2, "atol": 2e-2} if dtype in (torch.float16, torch.bfloat16) else \
        {"rtol": 1e-4, "atol": 1e-4} if dtype == torch.float32 else {}


OPS: dict[str, Callable[[torch.Tensor, list[int]], torch.Tensor]] = {
    "sum": lambda x, d: x.sum(d),
    "mean": lambda x, d: x.mean(d),
    "amax": lambda x, d: x.amax(d),
    "amin": lambda x, d: x.amin(d),
    "var": lambda x, d: x.var(d),
    "prod": lambda x, d: x.prod(d[0]),
    "argmax": lambda x, d: x.argmax(d[0]),
    "argmin": lambda x, d: x.argmin(d[0]),
}


def _build(op: str, dims: list[int]) -> Build:
    def build(gb: GraphBuilder, p: list[Value]) -> list[Value]:
        if op in ("argmax", "argmin"):
            return [gb.op(f"aten.{op}.default", [p[0]], {"dim": dims[0]})]
        if op == "prod":
            return [gb.op("aten.prod.dim_int", [p[0], dims[0]])]
        if op == "var":
            return [gb.op("aten.var.correction", [p[0], dims], {"correction": 1})]
        name = {"sum": "aten.sum.dim_IntList", "mean": "aten.mean.dim",
                "amax": "aten.amax.default", "amin": "aten.amin.default"}[op]
        return [gb.op(name, [p[0], dims])]
    return build


@pytest.mark.filterwarnings("ignore:var.*degrees of freedom:UserWarning")
@settings(max_examples=16, deadline=None)
@given(shape=st.sampled_from([(0, 5), (3, 0), (1, 1), (2, 3), (7, 17), (300, 130),
                              (5, 3, 40), (9, 4, 2)]),
       op=st.sampled_from(sorted(OPS)), dtype=st.sampled_from(FLOATS + INTS),
       dims=st.sampled_from([[0], [0, 1], [1]]), transpose=st.booleans(),
       seed=st.integers(0, 2**16))
def test_outer_reductions(shape: tuple[int, ...], op: str, dtype: torch.dtype, dims: list[int],
                          transpose: bool, seed: int) -> None:
    if op in ("mean", "var") and not dtype.is_floating_point:
        dtype = torch.float32
    if len(shape) == 2 or op in ("prod", "argmax", "argmin"):
        dims = dims[:1] if dims[0] == 0 or len(shape) == 3 else [0]
    if op in ("amax", "amin", "argmax", "argmin") and any(shape[d] == 0 for d in dims):
        op = "sum"  # eager rejects a max over nothing
    x = tensor(shape, dtype, seed, transpose)
    if op == "prod" and dtype.is_floating_point:
        # near 1: a product of 300 values would leave float's range, where eager's float
        # accumulator overflows and ember's double one does not
        x = 1 + (x - 1) * 0.05
    (got,), src = compile_run(_build(op, dims), [x])
    want = OPS[op](x, dims)
    if op == "prod" and dtype in (torch.float16, torch.bfloat16):
        # eager's CPU prod rounds its accumulator to the half type at every step (9% off its
        # own f32 product over 300 bf16 rows); ember accumulates wider: compare with f32's
        want = OPS[op](x.float(), dims).to(dtype)
    torch.testing.assert_close(got, want, equal_nan=True, **tol(dtype))
    kept_inner = shape[-1]  # the kept innermost dim, contiguous in the buffer the kernel reads
    reduced = [shape[d] for d in dims]
    if kept_inner >= 2 and min(reduced) >= 2:
        assert COLUMNS in src, src


def test_outer_reduction_sums_rows_in_blocks_of_double() -> None:
    # 3000 rows of 1e4 then small values: a float running sum per column would lose them
    x = torch.cat([torch.full((1, 40), 1e4), torch.full((2999, 40), 1e-3)]).float()
    (got,), src = compile_run(_build("sum", [0]), [x])
    assert COLUMNS in src
    torch.testing.assert_close(got, x.double().sum(0).float())


@pytest.mark.filterwarnings("ignore:var.*degrees of freedom:UserWarning")
@settings(max_examples=14, deadline=None)
@given(shape=st.sampled_from([(0,), (1,), (5,), (40000,), (70001,), (300, 150), (3, 20000),
                              (2, 2, 9000)]),
       op=st.sampled_from(["sum", "mean", "amax", "amin", "var"]),
       dtype=st.sampled_from(FLOATS + INTS), transpose=st.booleans(),
       seed=st.integers(0, 2**16))
def test_full_reductions_split_over_threads(shape: tuple[int, ...], op: str,
                                            dtype: torch.dtype, transpose: bool,
                                            seed: int) -> None:
    if op in ("mean", "var") and not dtype.is_floating_point:
        dtype = torch.float64
    if op in ("amax", "amin") and 0 in shape:
        op = "sum"  # eager rejects a max over nothing
    x = tensor(shape, dtype, seed, transpose)
    if op in ("sum", "mean") and dtype.is_floating_point and x.numel() > 0:
        x[(0,) * x.dim()] = float("nan") if seed % 5 == 0 else x[(0,) * x.dim()]
    dims = list(range(len(shape)))
    (got,), src = compile_run(_build(op, dims), [x])
    want = OPS[op](x, dims)
    torch.testing.assert_close(got, want, equal_nan=True, **tol(dtype))
    if x.numel() >= 32768:
        assert SPLIT in src
        (again,), _ = compile_run(_build(op, dims), [x])
        assert torch.equal(got, again) or (got.isnan().all() and again.isnan().all())


def test_split_max_propagates_nan_from_any_thread() -> None:
    x = torch.randn(100000)
    x[77777] = float("nan")
    (got,), src = compile_run(_build("amax", [0]), [x])
    assert SPLIT in src and got.isnan()


def _softmax(gb: GraphBuilder, p: list[Value]) -> list[Value]:
    return [gb.op("aten._softmax.default", [p[0], -1, False])]


@settings(max_examples=14, deadline=None)
@given(shape=st.sampled_from([(0, 4), (3, 0), (1, 1), (3, 5), (64, 33), (2, 4100), (40000,),
                              (4, 3, 7)]),
       dtype=st.sampled_from(FLOATS), transpose=st.booleans(), seed=st.integers(0, 2**16))
def test_softmax_rescales_stored_numerators(shape: tuple[int, ...], dtype: torch.dtype,
                                            transpose: bool, seed: int) -> None:
    x = tensor(shape, dtype, seed, transpose) * 3
    if x.numel() and seed % 4 == 0:
        x[(0,) * x.dim()] = float("-inf")
    (got,), src = compile_run(_softmax, [x])
    torch.testing.assert_close(got, torch.softmax(x, -1), equal_nan=True, **tol(dtype))
    # f16/bf16 compute in float and round the result: storing e there would round it early
    if x.numel():
        assert (RESCALE in src) == (dtype in (torch.float32, torch.float64))


def test_division_by_a_different_sum_is_not_rescaled() -> None:
    x = tensor((6, 50), torch.float32, 3)

    def other(gb: GraphBuilder, p: list[Value]) -> list[Value]:
        e = gb.op("aten.exp.default", [p[0]])
        e2 = gb.op("aten.exp.default", [gb.op("aten.mul.Tensor", [p[0], 2.0])])
        return [gb.op("aten.div.Tensor", [e, gb.op("aten.sum.dim_IntList", [e2, [1], True])])]

    def same(gb: GraphBuilder, p: list[Value]) -> list[Value]:
        return [gb.op("aten.div.Tensor", [p[0], gb.op("aten.sum.dim_IntList",
                                                      [p[0], [1], True])])]

    (got,), src = compile_run(other, [x])
    torch.testing.assert_close(got, x.exp() / (2 * x).exp().sum(1, keepdim=True))
    assert RESCALE not in src
    (got,), src = compile_run(same, [x])
    torch.testing.assert_close(got, x / x.sum(1, keepdim=True))
    assert RESCALE in src


@settings(max_examples=6, deadline=None)
@given(shape=st.sampled_from([(1, 2, 3), (40, 33, 7), (3, 130, 1), (0, 5, 2)]),
       dtype=st.sampled_from([torch.float32, torch.float64, torch.bfloat16, torch.int64]),
       seed=st.integers(0, 2**16))
def test_outer_reduction_read_by_a_deeper_pointwise_kernel(shape: tuple[int, int, int],
                                                           dtype: torch.dtype,
                                                           seed: int) -> None:
    # y * x.sum(0)[:, None]: the column sums of x feed the loop over y's columns
    r, a, c = shape
    x, y = tensor((r, a), dtype, seed), tensor((a, c), dtype, seed + 1, transpose=seed % 2 == 0)

    def build(gb: GraphBuilder, p: list[Value]) -> list[Value]:
        s = gb.op("aten.sum.dim_IntList", [p[0], [0], True])
        return [gb.op("aten.mul.Tensor", [p[1], gb.op("aten.permute.default", [s, [1, 0]])])]

    (got,), src = compile_run(build, [x, y])
    torch.testing.assert_close(got, y * x.sum(0, keepdim=True).T, **tol(dtype))
    if r >= 2 and a >= 2:
        assert COLUMNS in src


@settings(max_examples=6, deadline=None)
@given(shape=st.sampled_from([(1, 1), (4, 9), (3, 4100), (2, 3, 17)]),
       dtype=st.sampled_from([torch.float32, torch.float64, torch.bfloat16]),
       seed=st.integers(0, 2**16))
def test_masked_softmax_rescales_inside_a_where(shape: tuple[int, ...], dtype: torch.dtype,
                                                seed: int) -> None:
    # HF's safe softmax: rows that are all -inf give 0, the quotient sits inside a where
    x = tensor(shape, dtype, seed)
    x[..., ::3] = float("-inf")
    x[(0,) * (x.dim() - 1)] = float("-inf")

    def build(gb: GraphBuilder, p: list[Value]) -> list[Value]:
        m = gb.op("aten.amax.default", [p[0], [-1], True])
        dead = gb.op("aten.eq.Scalar", [m, float("-inf")])
        e = gb.op("aten.exp.default", [gb.op("aten.sub.Tensor", [
            p[0], gb.op("aten.masked_fill.Scalar", [m, dead, 0.0])])])
        q = gb.op("aten.div.Tensor", [e, gb.op("aten.sum.dim_IntList", [e, [-1], True])])
        return [gb.op("aten.masked_fill.Scalar", [q, dead, 0.0])]

    (got,), src = compile_run(build, [x])
    m = x.amax(-1, keepdim=True)
    e = (x - torch.where(m == float("-inf"), 0.0, m)).exp()
    want = torch.where(m == float("-inf"), 0.0, e / e.sum(-1, keepdim=True))
    torch.testing.assert_close(got, want, **tol(dtype))
    assert (RESCALE in src) == (dtype != torch.bfloat16)


def test_large_output_is_advised_huge_pages() -> None:
    # a 32 MB output: the kernel asks for 2 MB pages before writing it (no effect on values)
    x = tensor((2048, 4096), torch.float32, 5)
    (got,), src = compile_run(_softmax, [x])
    assert "ember_hugepages(out0, 33554432LL);" in src
    torch.testing.assert_close(got, torch.softmax(x, -1))
    (small,), src = compile_run(_softmax, [x[:64]])
    assert "ember_hugepages" not in src.split("// kernel", 1)[1]


SHORT = "simdlen(8)"  # a short row's reduction in 8 lanes


def _layer_norm(gb: GraphBuilder, p: list[Value]) -> list[Value]:
    n = _tensor_shape(p[0])[-1]
    return gb.emit("aten.native_layer_norm.default", [p[0], [n], None, None, 1e-5])[:1]


def _tensor_shape(v: Value) -> tuple[int, ...]:
    assert isinstance(v.type, TensorType)
    return tuple(int(d) for d in v.type.shape)


@settings(max_examples=16, deadline=None)
@given(rows=st.sampled_from([1, 3, 40]), n=st.sampled_from([1, 7, 16, 24, 42, 96, 256, 257, 768]),
       op=st.sampled_from(["sum", "amax", "amin", "layer_norm"]),
       dtype=st.sampled_from(FLOATS + INTS), seed=st.integers(0, 2**16))
def test_short_rows_reduce_in_eight_lanes(rows: int, n: int, op: str, dtype: torch.dtype,
                                          seed: int) -> None:
    """Rows of a constant length up to cppkernel.SHORT_ROW reduce in 8 SIMD lanes (g++'s
    serial combine of 16 lanes cost more than such a row's loop), longer ones at g++'s width;
    both as eager computes."""
    if op == "layer_norm" and not dtype.is_floating_point:
        dtype = torch.float32
    x = tensor((rows, n), dtype, seed)
    if op == "layer_norm":
        (got, *_), src = compile_run(_layer_norm, [x])
        wide = x.float() if dtype in (torch.float16, torch.bfloat16) else x
        want = torch.nn.functional.layer_norm(wide, (n,)).to(dtype)
        torch.testing.assert_close(got, want, **tol(dtype))
    else:
        (got,), src = compile_run(_build(op, [1]), [x])
        torch.testing.assert_close(got, OPS[op](x, [1]), **tol(dtype))
    assert (SHORT in src) == (n <= 256)


def test_short_rows_calling_math_keep_the_wide_loop() -> None:
    """softmax over 49: its max pass (loads only) reduces in 8 lanes, its sum of exp in 64 bytes
    of lanes (cppkernel.COSTLY_LANES: the wider exp saves more than the lane chain costs). 3
    rows: fewer than a row group (test_row_groups.py checks the same of grouped rows)."""
    x = tensor((3, 49), torch.float32, 5)
    (got,), src = compile_run(_softmax, [x])
    torch.testing.assert_close(got, torch.softmax(x, -1))
    assert f"reduction(max:a0) reduction(|:nan0) {SHORT}" in src
    assert "reduction(+:a1) simdlen(16)\n" in src
