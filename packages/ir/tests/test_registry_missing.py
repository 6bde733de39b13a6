"""OpRegistry.register_missing: a dialect's ops registered on a registry that may already hold
some of them (loop, kernels and graph ops register themselves on whatever registry they meet)."""

from __future__ import annotations

from typing import Any

import pytest

from ember.ir.registry import OpDef, OpRegistry


def _op(name: str) -> OpDef:
    def infer(*_: Any) -> list[Any]:
        return []
    return OpDef(name, "a test op", infer, lambda *_: None, aliasing="fresh")


def test_registers_the_missing_ops_and_keeps_the_registered_ones() -> None:
    reg = OpRegistry()
    first = reg.register(_op("t.a"))
    reg.register_missing([_op("t.a"), _op("t.b")])  # t.a is there: no "already registered"
    assert reg.lookup("t.a") is first
    assert set(reg.registered()) == {"t.a", "t.b"}
    reg.register_missing([_op("t.b")])  # twice: nothing to do
    assert set(reg.registered()) == {"t.a", "t.b"}


def test_a_bad_op_is_still_refused() -> None:
    with pytest.raises(ValueError, match="dialect-qualified"):
        OpRegistry().register_missing([_op("unqualified")])
