"""Random programs: hypothesis writes small functions as source text (tensor ops mixed with
Python control flow on constants, shapes and flags, containers and helper calls), execs them,
and checks the compiled function against eager. Every program must capture without fallback."""

from __future__ import annotations

import os
import textwrap
from typing import Any

import pytest
import torch
from hypothesis import given, note, settings
from hypothesis import strategies as st

from ember.runtime.testing import check_against_eager

UNARY = ["torch.relu({a})", "{a}.sigmoid()", "-{a}", "{a}.abs()", "torch.tanh({a})",
         "{a} * {c}", "{a} + {c}", "{a}.exp().clamp(max=10.0)", "({a} ** 2)",
         "{a}.sum(dim=1, keepdim=True) + {a}", "{a}.mean(0, keepdim=True) * {a}",
         "{a}.t().t()", "{a}.reshape(-1).reshape({a}.shape)", "{a}.softmax(-1)",
         "{a}.transpose(0, 1).contiguous().transpose(0, 1)", "torch.clamp({a}, -1.0, 1.0)",
         "{a}[:, :1].expand_as({a})", "torch.cat([{a}, {a}], 0)[: {a}.shape[0]]",
         "{a}.float() * {n}", "{a}.max(dim=1, keepdim=True).values - {a}"]
BINARY = ["{a} + {b}", "{a} * {b}", "{a} - {b}", "torch.maximum({a}, {b})",
          "torch.where({a} > {b}, {a}, {b})", "{a} / ({b}.abs() + 1.0)",
          "torch.stack([{a}, {b}]).sum(0)", "helper({a}, {b})", "helper({a}, k={c})"]
STATEMENTS = ["plain", "if_flag", "if_shape", "for_range", "list_acc", "dict_acc", "unpack",
              "while"]

HELPER = '''
def helper(u, v=None, k=2.0):
    if v is None:
        return u * k
    return u + v * k
'''


@st.composite
def programs(draw: Any) -> str:
    names = ["x", "y"]
    lines: list[str] = []

    def expr() -> str:
        c = repr(draw(st.sampled_from([0.5, 2.0, -1.0, 3.0])))
        if draw(st.booleans()):
            return draw(st.sampled_from(UNARY)).format(a=draw(st.sampled_from(names)), c=c,
                                                       n="n")
        return draw(st.sampled_from(BINARY)).format(a=draw(st.sampled_from(names)),
                                                    b=draw(st.sampled_from(names)), c=c)

    for i in range(draw(st.integers(1, 6))):
        kind = draw(st.sampled_from(STATEMENTS))
        v = f"v{i}"
        if kind == "plain":
            lines.append(f"{v} = {expr()}")
        elif kind == "if_flag":
            lines += ["if flag:", f"    {v} = {expr()}", "else:", f"    {v} = {expr()}"]
        elif kind == "if_shape":
            lines += [f"if x.shape[0] > {draw(st.integers(1, 4))} and x.dtype == torch.float32:",
                      f"    {v} = {expr()}", "else:", f"    {v} = {expr()}"]
        elif kind == "for_range":
            lines += [f"{v} = {expr()}", f"for i in range({draw(st.integers(0, 3))}):",
                      f"    {v} = {v} * 0.5 + i"]
        elif kind == "list_acc":
            lines += [f"acc = [{expr()} for _ in range(2)]", f"acc.append({expr()})",
                      f"{v} = torch.stack(acc).sum(0) / len(acc)"]
        elif kind == "dict_acc":
            lines += [f"d = {{'a': {expr()}}}", f"d['b'] = {expr()}",
                      f"{v} = sum(d.values()) + d.get('c', 1.0)"]
        elif kind == "unpack":
            lines += [f"{v}, _tmp = ({expr()}, n)", f"{v} = {v} + _tmp"]
        else:
            lines += ["k = 0", f"{v} = {expr()}", "while k < n:", f"    {v} = {v} - 0.1",
                      "    k += 1"]
        names.append(v)
    ret = draw(st.lists(st.sampled_from(names), min_size=1, max_size=3))
    lines.append(f"return ({', '.join(ret)}, n * 2, {names[-1]}.shape)")
    body = textwrap.indent("\n".join(lines), "    ")
    return f"{HELPER}\n\ndef prog(x, y, n, flag):\n{body}\n"


def _check_program(src: str, rows: int, n: int, flag: bool, grad: bool) -> None:
    note(src)
    ns: dict[str, Any] = {"torch": torch}
    exec(compile(src, "<random program>", "exec"), ns)
    gen = torch.Generator().manual_seed(rows * 7 + n)
    x = torch.randn(rows, 3, generator=gen, requires_grad=grad)
    y = torch.randn(rows, 3, generator=gen, requires_grad=grad)
    check_against_eager(ns["prog"], x, y, n, flag, grad=grad, calls=2)


ARGS = dict(src=programs(), rows=st.integers(1, 5), n=st.integers(0, 3), flag=st.booleans(),
            grad=st.booleans())


@settings(max_examples=40)
@given(**ARGS)
def test_random_programs_match_eager(src: str, rows: int, n: int, flag: bool,
                                     grad: bool) -> None:
    _check_program(src, rows, n, flag, grad)


@pytest.mark.fuzz
@pytest.mark.skipif(os.environ.get("HYPOTHESIS_PROFILE") != "fuzz",
                    reason="long; `python3 dev.py fuzz` runs it")
@given(**ARGS)
def test_random_programs_match_eager_long(src: str, rows: int, n: int, flag: bool,
                                          grad: bool) -> None:
    _check_program(src, rows, n, flag, grad)
