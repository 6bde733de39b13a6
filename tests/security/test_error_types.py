"""Issue 19 #11: an error that comes from the data raises what eager PyTorch raises.

An out-of-range index makes eager raise IndexError (index_select, x[idx], embedding) or
RuntimeError (gather); the reference interpreter, the "prims" IR backend and compile() with
backend="eager"/"prims" must raise the same type (and message), with the IR node in a note,
not the interpreter's InterpretError. In-range indices give eager's values.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from ember.ir import Interpreter, InterpretError, Module, parse, verify
from ember.ir.backends import default_backends
from ember.ir.interpreter import failed_node
from ember.runtime import compile as ember_compile

# op name -> (IR node text for %x: f32[N, 2] and %i: i64[K], result type, eager function)
OPS: dict[str, tuple[str, str, Callable[[torch.Tensor, torch.Tensor], torch.Tensor]]] = {
    "index_select": ("aten.index_select.default(%x, 0, %i)", "f32[{k}, 2]",
                     lambda x, i: torch.index_select(x, 0, i)),
    "index": ("aten.index.Tensor(%x, [%i])", "f32[{k}, 2]", lambda x, i: x[i]),
    "embedding": ("aten.embedding.default(%x, %i)", "f32[{k}, 2]",
                  lambda x, i: torch.nn.functional.embedding(i, x)),
    "gather": ("aten.gather.default(%x, 0, %j)", "f32[{k}, 2]",
               lambda x, i: torch.gather(x, 0, i[:, None].expand(-1, 2))),
}


@functools.cache
def module(op: str, n: int, k: int) -> Module:
    node, ty, _ = OPS[op]
    ty = ty.format(k=k)
    pre = ""
    if "%j" in node:  # gather takes an index of the result's shape
        pre = (f"  %u = aten.unsqueeze.default(%i, 1) : i64[{k}, 1]\n"
               f"  %j = aten.expand.default(%u, [{k}, 2]) : i64[{k}, 2]\n")
    m = parse(f"ember.ir 1.0\n\ngraph @g(%x: f32[{n}, 2], %i: i64[{k}]) -> ({ty}) {{\n"
              f"{pre}  %y = {node} : {ty}\n  return (%y)\n}}\n")
    verify(m)
    return m


@functools.cache
def prims_runner(op: str, n: int, k: int) -> Any:
    return default_backends().get("prims").prepare(module(op, n, k))


def outcome(f: Callable[[], Any]) -> tuple[str, Any]:
    try:
        return "ok", f()
    except Exception as e:  # noqa: BLE001  (the type is what the test compares)
        return type(e).__name__, e


def check_same(eager: tuple[str, Any], got: tuple[str, Any], what: str) -> None:
    assert got[0] == eager[0], f"{what}: {got[0]} ({got[1]}) where eager raises {eager[0]}"
    if eager[0] == "ok":
        torch.testing.assert_close(got[1], eager[1], rtol=0, atol=0)
    else:
        assert not isinstance(got[1], InterpretError)
        assert str(got[1]) == str(eager[1]), what


indices = st.integers(1, 5).flatmap(lambda n: st.tuples(
    st.just(n), st.lists(st.integers(-2 * n - 1, 2 * n + 1), min_size=1, max_size=4)))


@settings(max_examples=60)
@given(op=st.sampled_from(sorted(OPS)), case=indices)
def test_ir_backends_raise_what_eager_raises(op: str, case: tuple[int, list[int]]) -> None:
    n, idx = case
    x, i = torch.randn(n, 2), torch.tensor(idx, dtype=torch.int64)
    eager = outcome(lambda: OPS[op][2](x, i))
    m = module(op, n, len(idx))
    ref = outcome(lambda: Interpreter(m).run([x, i]).outputs[0])
    check_same(eager, ref, f"reference interpreter, {op}{idx} of {n}")
    prims = outcome(lambda: prims_runner(op, n, len(idx))(None, [x, i]).outputs[0])
    check_same(eager, prims, f"prims backend, {op}{idx} of {n}")


def test_out_of_range_index_keeps_eager_type_and_names_the_node() -> None:
    m = module("index_select", 3, 2)
    with pytest.raises(IndexError, match="index out of range in self") as ei:
        Interpreter(m).run([torch.zeros(3, 2), torch.tensor([0, 7])])
    node = failed_node(ei.value)
    assert node is not None and node.op == "aten.index_select.default"
    assert any("aten.index_select.default at line 4:3" in n for n in ei.value.__notes__)
    # the prims backend fails inside prims.gather, yet raises what index_select raises
    with pytest.raises(IndexError, match="index out of range in self"):
        prims_runner("index_select", 3, 2)(None, [torch.zeros(3, 2), torch.tensor([0, 7])])


def test_integer_division_by_zero_matches_eager() -> None:
    m = parse("ember.ir 1.0\n\ngraph @g(%a: i64[2], %b: i64[2]) -> (i64[2]) {\n"
              "  %c = aten.floor_divide.default(%a, %b) : i64[2]\n  return (%c)\n}\n")
    a, b = torch.tensor([1, 2]), torch.tensor([1, 0])
    with pytest.raises(RuntimeError) as eager:
        torch.floor_divide(a, b)
    for run in (lambda: Interpreter(m).run([a, b]),
                lambda: default_backends().get("prims").prepare(m)(None, [a, b])):
        with pytest.raises(RuntimeError) as ei:
            run()
        assert type(ei.value) is type(eager.value) and str(ei.value) == str(eager.value)


def test_ir_errors_stay_interpret_errors() -> None:
    m = parse("ember.ir 1.0\n\ngraph @g(%x: f32[2]) -> (f32[2]) {\n"
              "  %y = mydialect.frob(%x) : f32[2]\n  return (%y)\n}\n")
    with pytest.raises(InterpretError, match="unknown op mydialect.frob"):
        Interpreter(m).run([torch.zeros(2)])
    with pytest.raises(InterpretError, match="takes 1 inputs, got 2"):
        Interpreter(m).run([torch.zeros(2), torch.zeros(2)])


COMPILED = {name: fn for name, (_, _, fn) in OPS.items()}


@pytest.mark.parametrize("backend", ["eager", "prims"])
@pytest.mark.parametrize("op", sorted(OPS))
def test_compile_raises_what_eager_raises(op: str, backend: str) -> None:
    fn = COMPILED[op]
    x = torch.randn(4, 2)
    compiled = ember_compile(fn, backend=backend)
    for idx in ([0, 3, 1], [1, 9, 0], [-9, 0, 1]):  # the same shapes: one capture
        i = torch.tensor(idx)
        check_same(outcome(lambda i=i: fn(x, i)), outcome(lambda i=i: compiled(x, i)),
                   f"compile(backend={backend!r}) {op}{idx}")
