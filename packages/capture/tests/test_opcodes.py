"""The opcode table: per-version registration, names checked against `dis`, explicit unhandled
results naming the opcode and the line."""

from __future__ import annotations

import dis
import inspect
import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from ember.capture import Captured, Unhandled, capture
from ember.capture.frame import PY_VERSION, code_info
from ember.capture.opcodes import (
    NOT_HANDLED,
    ONLY_312,
    PY311,
    PY312,
    PY313,
    SUPPORTED,
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


def test_313_table_has_its_new_opcodes_and_drops_the_removed_ones() -> None:
    reg = registered()
    names312 = {n for (n, v) in reg if v == PY312}
    names313 = {n for (n, v) in reg if v == PY313}
    assert {"CALL_KW", "TO_BOOL", "LOAD_FAST_LOAD_FAST", "STORE_FAST_LOAD_FAST",
            "STORE_FAST_STORE_FAST", "SET_FUNCTION_ATTRIBUTE", "FORMAT_SIMPLE",
            "FORMAT_WITH_SPEC", "CONVERT_VALUE"} <= names313 - names312
    assert {"KW_NAMES", "FORMAT_VALUE", "LOAD_CLOSURE"} <= names312 - names313
    # kept from 3.12, with 3.12's handler
    for name in ("LOAD_FAST_CHECK", "LOAD_SUPER_ATTR", "RETURN_CONST", "CALL_INTRINSIC_1",
                 "POP_JUMP_IF_TRUE", "LOAD_ATTR"):
        assert reg[(name, PY313)] is reg[(name, PY312)]
    # same name, new meaning: END_FOR pops one value, MAKE_FUNCTION takes no flags
    for name in ("END_FOR", "MAKE_FUNCTION"):
        assert reg[(name, PY313)] is not reg[(name, PY312)]


def _other_python(version: tuple[int, int]) -> str | None:
    root = Path(__file__).resolve().parents[3]
    sys.path.insert(0, str(root))
    try:
        from tools import bootstrap
    finally:
        sys.path.remove(str(root))
    return bootstrap.find_python(version)


def _ask(python: str, script: str) -> object:
    out = subprocess.run([python, "-c", script], capture_output=True, text=True, check=True,
                         timeout=60)
    return json.loads(out.stdout)


_OPMAP = "import dis, json; print(json.dumps(sorted(dis.opmap)))"
# every opcode name in the code of the function a source text defines (and the code objects
# nested in it), as that Python compiles it
_OPNAMES = """
import dis, json, sys, types
def walk(c):
    yield from (i.opname for i in dis.get_instructions(c))
    for k in c.co_consts:
        if isinstance(k, types.CodeType):
            yield from walk(k)
module = compile(sys.stdin.read(), "sample", "exec")
fn = next(k for k in module.co_consts if isinstance(k, types.CodeType))
print(json.dumps(sorted(set(walk(fn)))))
"""


@pytest.mark.parametrize("version", SUPPORTED, ids=lambda v: "{}.{}".format(*v))
def test_each_table_matches_its_pythons_dis(version: tuple[int, int]) -> None:
    """Each table (not only the running Python's) against that Python's own `dis`, asked in a
    subprocess: its names exist there, and the sample below, compiled there, is covered."""
    python = _other_python(version)
    if python is None:
        pytest.skip("no python{}.{} on this machine".format(*version))
    ours = table(version)
    opmap = set(_ask(python, _OPMAP))  # type: ignore[arg-type]
    assert set(ours) <= opmap
    src = inspect.getsource(sample)
    out = subprocess.run([python, "-c", _OPNAMES], input=src, capture_output=True, text=True,
                         check=True, timeout=60)
    used = set(json.loads(out.stdout))
    assert {"CALL", "FOR_ITER", "LOAD_ATTR"} <= used
    assert not used - set(ours)


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
    a, s = s, a
    d = {"a": 1, **kw}
    assert x is not None, "msg"
    name = f"{k!r:>3}{a}{b!s}"
    for i in range(k):
        if i > 1 and not x.dim():
            break
    m = x.sum(dim=0, keepdim=True).view(*x.shape[:1])
    return (y, z, s, a, b, d, name, (lambda q, r=1: q + k + r), args[1:], not k, -k, m,
            max(k, 1, key=abs))


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
    assert "Python 3.14: capture has opcode tables for 3.11, 3.12, 3.13 only" in out.reason
