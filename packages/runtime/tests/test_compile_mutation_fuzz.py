"""Random mutation programs: hypothesis writes straight-line functions that take views of inputs
and intermediates and write through them in place, compiled with backend="eager" and compared
with eager on outputs, the inputs afterwards, and which outputs share memory with which inputs
and outputs (with eager's strides and offsets). Each drawn line is dry-run eagerly first and
dropped if eager rejects it (writes through expanded views, bad shapes)."""

from __future__ import annotations

import textwrap
from typing import Any

import torch
from hypothesis import given, note, settings
from hypothesis import strategies as st

import ember.runtime as er
from ember.runtime.compile import compiled_function_of
from ember.runtime.testing import assert_same

VIEWS = ["{a}[{i}]", "{a}[{i}:]", "{a}[:, {i}:]", "{a}[::2]", "{a}.t()", "{a}.transpose(0, 1)",
         "{a}.view(-1)", "{a}.view(2, -1)", "{a}.unsqueeze(0)", "{a}.squeeze()",
         "{a}.diagonal()", "{a}.unbind(0)[{i}]", "{a}.split(2)[{i}]", "{a}.chunk(2, 1)[1]",
         "{a}.narrow(0, 1, 2)", "{a}.permute(1, 0)", "{a}.expand(2, *{a}.shape)",
         "{a}.as_strided((2, 2), (1, 2))", "{a}.detach()", "{a}[..., {i}]"]
WRITES = ["{a}.add_({c})", "{a}.mul_({c})", "{a}.zero_()", "{a}.fill_({c})",
          "{a}.clamp_(min={c})", "{a}.add_({b})", "{a}.copy_({b})", "{a}[{i}] = {c}",
          "{a}.sub_({b}, alpha=2)", "{a}.masked_fill_({a} > 0, {c})", "{a}.relu_()",
          "{a}.div_(2.0)", "{a}[{a} < 0] = 1.0"]
FRESH = ["{a} * {c}", "{a}.clone()", "{a} + {b}", "{a}.exp()"]


def _run(src: str, x: torch.Tensor, y: torch.Tensor) -> bool:
    env: dict[str, Any] = {"torch": torch}
    try:
        exec(compile(src, "<dry run>", "exec"), env)  # test-generated source only
        env["f"](x.clone(), y.clone())
    except Exception:
        return False
    return True


def _source(lines: list[str], names: list[str]) -> str:
    body = "\n".join(lines + [f"return ({', '.join(names)},)"])
    return "def f(x, y):\n" + textwrap.indent(body, "    ") + "\n"


@st.composite
def programs(draw: Any) -> str:
    x, y = torch.randn(4, 4), torch.randn(4, 4)
    names, lines = ["x", "y"], []
    root = {"x": "x", "y": "y"}  # which memory each name views
    for k in range(draw(st.integers(2, 9))):
        kind = draw(st.sampled_from(["view", "view", "write", "write", "write", "fresh"]))
        a, b = draw(st.sampled_from(names)), draw(st.sampled_from(names))
        if kind == "write" and root[a] == root[b]:
            # eager's result then depends on the order its kernel visits the elements
            b = "y" if root[a] != "y" else "x"
        fill = {"a": a, "b": b, "i": draw(st.integers(0, 1)),
                "c": repr(draw(st.sampled_from([2.0, -1.5, 0.5])))}
        if kind == "write":
            line = draw(st.sampled_from(WRITES)).format(**fill)
        else:
            table = VIEWS if kind == "view" else FRESH
            line = f"v{k} = " + draw(st.sampled_from(table)).format(**fill)
        new = names + ([f"v{k}"] if kind != "write" else [])
        if _run(_source(lines + [line], new), x, y):
            lines.append(line)
            names = new
            root[f"v{k}"] = root[a] if kind == "view" else f"v{k}"
    return _source(lines, names)


def _sharing(outs: tuple[Any, ...], ins: list[torch.Tensor]) -> list[Any]:
    """For each output: which inputs and earlier outputs it shares memory with, its offset into
    that memory, its strides, and whether it is the very input object."""
    every = ins + list(outs)
    rel = []
    for o in outs:
        st_ = o.untyped_storage().data_ptr()
        same = [i for i, t in enumerate(every) if t.untyped_storage().data_ptr() == st_
                and t is not o]
        rel.append((same, o.data_ptr() - st_, o.stride(), [i for i, t in enumerate(ins)
                                                            if t is o]))
    return rel


@settings(max_examples=40)
@given(programs())
def test_random_mutation_programs(src: str) -> None:
    note(src)
    env: dict[str, Any] = {"torch": torch}
    exec(compile(src, "<generated>", "exec"), env)  # test-generated source only
    f = env["f"]
    x, y = torch.randn(4, 4), torch.randn(4, 4)
    ex, ey, cx, cy = x.clone(), y.clone(), x.clone(), y.clone()
    expected = f(ex, ey)
    c = er.compile(f, backend="eager")
    actual = c(cx, cy)
    cf = compiled_function_of(c)
    assert cf is not None
    assert not cf.history.fallbacks, cf.history.fallbacks[0]
    assert_same(expected, actual)
    assert_same([ex, ey], [cx, cy], "inputs after the call")
    assert _sharing(actual, [cx, cy]) == _sharing(expected, [ex, ey])
    # a second call hits the cache and writes again, as eager does
    again = c(cx, cy)
    assert_same(f(ex, ey), again)
    assert_same([ex, ey], [cx, cy], "inputs after a second call")
