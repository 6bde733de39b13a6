"""Each prim's type rule against its reference: the interpreter checks every result of the
reference against the types the rule gave (dtype and shape), over hypothesis samples. Also:
misuse is an OpTypeError naming the prim, and Philox matches its known answers and layout."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st

import ember.prims  # noqa: F401
from ember.ir import (
    BuildError,
    DType,
    GraphBuilder,
    Interpreter,
    Module,
    OpTypeError,
    TensorType,
    parse,
    verify,
)
from ember.prims import PRIMS, PRIMS_BY_OP, philox
from ember.testing import strategies as S

EW_KINDS = {  # which dtypes each elementwise prim takes (its dtype rule says the same)
    "f": S.FLOATS,
    "i": S.INTS,
    "b": (torch.bool,),
}


def _kinds(prim_name: str) -> tuple[torch.dtype, ...]:
    doc = PRIMS_BY_OP[f"prims.{prim_name}"].dtype.__doc__ or ""
    out: list[torch.dtype] = []
    if "float" in doc:
        out += EW_KINDS["f"]
    if "integer" in doc:
        out += EW_KINDS["i"]
    if "b8 dtype" in doc or "/b8" in doc:
        out += EW_KINDS["b"]
    return tuple(out)


def run_prim(op: str, args: list[Any], kwargs: dict[str, Any] | None = None) -> list[Any]:
    """Build a one-prim graph (types from the prim's rule), verify, round-trip and run it."""
    m = Module()
    gb = GraphBuilder(m, "f")
    inputs: list[Any] = []

    def bind(v: Any) -> Any:
        if isinstance(v, torch.Tensor):
            inputs.append(v)
            return gb.param(f"a{len(inputs)}", TensorType.of(v))
        if isinstance(v, list) and v and isinstance(v[0], torch.Tensor):
            return [bind(x) for x in v]
        return v

    res = gb.emit(op, [bind(a) for a in args], {k: bind(v) for k, v in (kwargs or {}).items()})
    gb.ret(res)
    verify(m)
    assert str(parse(str(m))) == str(m)
    return Interpreter(m).run(inputs).outputs  # check_types: reference vs rule


ELEMENTWISE = [p for p in PRIMS if p.group.startswith("elementwise") or p.group == "comparison"]


@pytest.mark.parametrize("prim", [p for p in ELEMENTWISE if p.name != "where"],
                         ids=lambda p: p.name)
def test_elementwise_rule_matches_reference(prim: Any) -> None:
    arity = prim.signature.count(",") + 1
    dts = _kinds(prim.name)
    assert dts, prim.name

    @given(st.data())
    def run(data: st.DataObject) -> None:
        dt = data.draw(S.dtypes(dts))
        shape = data.draw(S.shapes())
        xs: list[Any] = [data.draw(S.tensors(shape, dt, low=0.1 if dt.is_floating_point else 1,
                                             high=3)) for _ in range(arity)]
        if arity == 2 and data.draw(st.booleans()):
            xs[1] = data.draw(S.scalars(dt).filter(lambda v: v != 0))
        if prim.name in ("shift_left", "shift_right"):
            xs[1] = xs[1] if not isinstance(xs[1], torch.Tensor) else xs[1].abs() % 4
            if not isinstance(xs[1], torch.Tensor):
                xs[1] = abs(int(xs[1])) % 4
        if prim.name in ("pow",) and not dt.is_floating_point:
            xs[1] = xs[1].abs() if isinstance(xs[1], torch.Tensor) else abs(int(xs[1]))
        run_prim(prim.op, xs)

    run()


def test_where_and_convert() -> None:
    c = torch.tensor([True, False, True])
    x = torch.tensor([1.0, 2.0, 3.0])
    (out,) = run_prim("prims.where", [c, x, -1.5])
    assert out.tolist() == [1.0, -1.5, 3.0]
    (out,) = run_prim("prims.convert_element_type", [x], {"dtype": DType.i32})
    assert out.dtype == torch.int32


SHAPE_CASES: list[tuple[str, Callable[[], tuple[list[Any], dict[str, Any]]], Any]] = [
    ("broadcast_in_dim", lambda: ([torch.randn(3, 1)], {"shape": [2, 3, 4],
                                                        "broadcast_dims": [1, 2]}), (2, 3, 4)),
    ("reshape", lambda: ([torch.randn(2, 6)], {"shape": [3, 4]}), (3, 4)),
    ("permute", lambda: ([torch.randn(2, 3, 4)], {"dims": [2, 0, 1]}), (4, 2, 3)),
    ("slice", lambda: ([torch.randn(5, 7)], {"start": [1, 0], "limit": [5, 7],
                                             "step": [2, 3]}), (2, 3)),
    ("pad", lambda: ([torch.randn(3, 4), 0.5], {"config": [[1, -1, 1], [0, 2, 0]]}), (5, 6)),
    ("concatenate", lambda: ([[torch.randn(2, 3), torch.randn(4, 3)]], {"dim": 0}), (6, 3)),
    ("squeeze", lambda: ([torch.randn(1, 3, 1)], {"dims": [0, 2]}), (3,)),
    ("unsqueeze", lambda: ([torch.randn(3)], {"dims": [0, 2]}), (1, 3, 1)),
    ("rev", lambda: ([torch.randn(3, 2)], {"dims": [0]}), (3, 2)),
    ("iota", lambda: ([], {"length": 5, "start": 2, "step": 3, "dtype": DType.i32}), (5,)),
    ("full", lambda: ([], {"shape": [2, 2], "value": 1.5, "dtype": DType.f16}), (2, 2)),
    ("sum", lambda: ([torch.randn(2, 3, 4)], {"dims": [0, 2]}), (3,)),
    ("argmax", lambda: ([torch.randn(2, 3)], {"dim": 1}), (2,)),
    ("cumsum", lambda: ([torch.randn(2, 3)], {"dim": 1}), (2, 3)),
    ("gather", lambda: ([torch.randn(3, 4), torch.randint(0, 4, (3, 2))], {"dim": 1}), (3, 2)),
    ("scatter_add", lambda: ([torch.zeros(3, 4), torch.randint(0, 4, (3, 2)),
                              torch.ones(3, 2)], {"dim": 1}), (3, 4)),
    ("matmul", lambda: ([torch.randn(2, 3, 4), torch.randn(2, 4, 5)], {}), (2, 3, 5)),
    ("convolution", lambda: ([torch.randn(1, 4, 7, 7), torch.randn(6, 2, 3, 3)],
                             {"stride": [2, 1], "padding": [1, 0], "dilation": [1, 2],
                              "groups": 2}), (1, 6, 4, 3)),
    ("sort", lambda: ([torch.randn(3, 5)], {"dim": 1, "descending": True}), (3, 5)),
    ("topk", lambda: ([torch.randn(3, 5)], {"k": 2, "dim": 1}), (3, 2)),
    ("philox_uniform", lambda: ([7, 100], {"shape": [2, 3], "dtype": DType.bf16}), (2, 3)),
]


@pytest.mark.parametrize("name,case,shape", SHAPE_CASES, ids=[c[0] for c in SHAPE_CASES])
def test_structured_prim_rule_matches_reference(name: str, case: Callable[[], Any],
                                                shape: Any) -> None:
    args, kwargs = case()
    outs = run_prim(f"prims.{name}", args, kwargs)
    assert tuple(outs[0].shape) == shape


def test_every_prim_is_exercised_here_or_by_decompositions() -> None:
    here = {p.name for p in ELEMENTWISE} | {c[0] for c in SHAPE_CASES} | {
        "where", "convert_element_type"}
    assert len(PRIMS) < 100
    missing = {p.name for p in PRIMS} - here - {"prod", "amax", "amin", "argmin", "cumprod",
                                                  "scatter"}
    assert not missing, missing


@pytest.mark.parametrize("op,args,kwargs,needle", [
    ("prims.add", "f32[2]; f32[3]", {}, "shapes differ"),
    ("prims.add", "f32[2]; f64[2]", {}, "dtypes differ"),
    ("prims.exp", "i32[2]", {}, "floating"),
    ("prims.sum", "f32[2, 3]", {"dims": [2]}, "out of range"),
    ("prims.reshape", "f32[2, 3]", {"shape": [4]}, "cannot reshape"),
    ("prims.matmul", "f32[2, 3]; f32[4, 5]", {}, "contraction"),
    ("prims.broadcast_in_dim", "f32[3]", {"shape": [2, 4], "broadcast_dims": [1]},
     "cannot broadcast"),
])
def test_misuse_is_an_op_type_error(op: str, args: str, kwargs: dict[str, Any],
                                    needle: str) -> None:
    m = Module()
    gb = GraphBuilder(m, "f")
    params = []
    for i, t in enumerate(args.split("; ")):
        dt, dims = t.rstrip("]").split("[")
        shape = tuple(int(d) for d in dims.split(",")) if dims else ()
        params.append(gb.param(f"p{i}", TensorType(DType[dt], shape)))
    with pytest.raises(BuildError, match=needle) as e:
        gb.emit(op, params, kwargs)
    assert op in str(e.value)
    with pytest.raises(OpTypeError):
        PRIMS_BY_OP[op].infer(None, params, kwargs)  # type: ignore[arg-type]


# ---- Philox ----------------------------------------------------------------------------------

def test_philox_known_answers() -> None:
    """Random123's published known-answer vectors for Philox4x32-10."""
    z = torch.zeros(1, dtype=torch.int64)
    assert [int(w) for w in philox.philox4x32(z, z, z, z, 0, 0)] == [
        0x6627E8D5, 0xE169C58D, 0xBC57AC4C, 0x9B00DBD8]
    f = torch.full((1,), 0xFFFFFFFF, dtype=torch.int64)
    assert [int(w) for w in philox.philox4x32(f, f, f, f, 0xFFFFFFFF, 0xFFFFFFFF)] == [
        0x408F276D, 0x41C83B0E, 0xA20BC7C6, 0x6D5451FD]
    pi = [torch.tensor([v], dtype=torch.int64) for v in
          (0x243F6A88, 0x85A308D3, 0x13198A2E, 0x03707344)]
    assert [int(w) for w in philox.philox4x32(*pi, 0xA4093822, 0x299F31D0)] == [
        0xD16CFE09, 0x94FDCCEB, 0x5001E420, 0x24126EA1]


@given(st.integers(0, 2**64 - 1), st.integers(0, 2**40), st.integers(1, 64),
       st.integers(0, 63))
def test_philox_counter_layout(seed: int, offset: int, n: int, k: int) -> None:
    """Element i uses counter offset + i: a stream read from offset + k is the tail."""
    k = min(k, n - 1)
    a = philox.uniform(seed, offset, (n,), torch.float32)
    b = philox.uniform(seed, offset + k, (n - k,), torch.float32)
    assert torch.equal(a[k:], b)


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16, torch.float32, torch.float64])
def test_philox_uniform_distribution(dtype: torch.dtype) -> None:
    u = philox.uniform(1234, 0, (200_000,), dtype).double()
    assert u.min() >= 0 and u.max() < 1
    assert abs(float(u.mean()) - 0.5) < 0.01
    assert abs(float(u.var()) - 1 / 12) < 0.01
    hist = torch.histc(u, bins=10, min=0, max=1) / u.numel()
    assert torch.all((hist - 0.1).abs() < 0.01)
