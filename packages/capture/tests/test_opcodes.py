"""The opcode table: per-version registration, names checked against `dis`, explicit unhandled
results naming the opcode and the line."""

from __future__ import annotations

import dis

import pytest
import torch

from ember.capture import Captured, Unhandled, capture
from ember.capture.frame import PY_VERSION, code_info
from ember.capture.opcodes import (
    NOT_HANDLED,
    ONLY_312,
    PY311,
    PY312,
    handler,
    registered,
    table,
)


def test_table_names_exist_in_this_pythons_dis() -> None:
    t = table()
    assert t and all(name in dis.opmap for name in t)


def test_both_versions_have_tables_and_version_specific_entries() -> None:
    t311, t312 = table(PY311) if PY_VERSION == PY311 else None, None
    reg = registered()
    names311 = {n for (n, v) in reg if v == PY311}
    names312 = {n for (n, v) in reg if v == PY312}
    assert {"PRECALL", "LOAD_METHOD", "JUMP_IF_TRUE_OR_POP", "LIST_TO_TUPLE",
            "POP_JUMP_FORWARD_IF_TRUE", "UNARY_POSITIVE"} <= names311 - names312
    assert {"LOAD_FAST_CHECK", "LOAD_FAST_AND_CLEAR", "LOAD_SUPER_ATTR", "BINARY_SLICE",
            "STORE_SLICE", "RETURN_CONST", "CALL_INTRINSIC_1", "END_FOR",
            "POP_JUMP_IF_TRUE"} <= names312 - names311
    assert {"LOAD_ATTR", "CALL", "BINARY_OP", "FOR_ITER"} <= names311 & names312
    # LOAD_ATTR has a different handler per version (3.12's method bit)
    assert reg[("LOAD_ATTR", PY311)] is not reg[("LOAD_ATTR", PY312)]
    del t311, t312


def test_duplicate_registration_is_an_error() -> None:
    registered()  # the families must be loaded first, whatever ran before this test
    with pytest.raises(ValueError, match="already has a handler"):
        handler("NOP", versions=ONLY_312)(lambda tx, frame, inst: None)


def test_deliberately_unhandled_opcodes_have_no_handler() -> None:
    t = table()
    assert not set(NOT_HANDLED) & set(t)


def _opnames(fn: object) -> set[str]:
    code = fn.__code__  # type: ignore[attr-defined]
    names = {i.opname for i in code_info(code).instrs}
    for c in code.co_consts:
        if hasattr(c, "co_code"):
            names |= {i.opname for i in code_info(c).instrs}
    return names


def sample(x, ys, *args, k=2, **kw):
    with torch.no_grad():
        y = x + 1
    try:
        z = [i * 2 for i in ys if i]
    except KeyError:
        z = 0
    s = sum(v for v in ys)
    a, *b = ys
    d = {"a": 1, **kw}
    assert x is not None, "msg"
    name = f"{k!r:>3}"
    return y, z, s, a, b, d, name, (lambda q: q + k), args[1:], not k, -k


def test_common_code_only_uses_handled_opcodes() -> None:
    missing = _opnames(sample) - set(table())
    assert not missing


def test_class_statement_is_unhandled_by_opcode_and_line() -> None:
    def f(x):
        class Local:  # line +1
            pass
        return x

    r = capture(f, (torch.randn(2),), {})
    assert isinstance(r, Unhandled)
    assert "LOAD_BUILD_CLASS" in r.reason and r.opname == "LOAD_BUILD_CLASS"
    assert r.line == f.__code__.co_firstlineno + 1
    assert str(r).endswith(f"{r.file}:{r.line})")


def test_store_global_is_a_recorded_side_effect() -> None:
    r = capture(_set_global, (torch.randn(2),), {})
    assert isinstance(r, Captured) and G == 0
    assert [(e.kind, e.name) for e in r.effects] == [("global", "G")]


G = 0


def _set_global(x):
    global G
    G = 1
    return x


def test_a_python_without_an_opcode_table_is_refused_by_name(
        monkeypatch: pytest.MonkeyPatch) -> None:
    import ember.capture.tracer as tracer

    monkeypatch.setattr(tracer, "PY_VERSION", (3, 14))
    monkeypatch.setattr(tracer, "table", lambda: {})
    out = capture(lambda x: x + 1, (torch.randn(2),), {})
    assert isinstance(out, Unhandled)
    assert "Python 3.14: capture has opcode tables for 3.11, 3.12 only" in out.reason
