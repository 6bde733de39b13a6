"""Resume functions made by `bytecode_gen.resume_code`, run directly in plain Python: the
original code entered mid-way with its value stack and live locals passed as arguments."""

from __future__ import annotations

import types
from importlib.metadata import version
from typing import Any

import pytest

from ember.capture import bytecode_gen as bg
from ember.capture.frame import PY_VERSION, code_info


def _produce(v: int) -> int:
    return v * 10


def many_locals(x: int) -> tuple[int, ...]:
    a0, a1, a2, a3, a4, a5, a6, a7 = x, x + 1, x + 2, x + 3, x + 4, x + 5, x + 6, x + 7
    a8, a9, a10, a11, a12, a13, a14, a15 = x + 8, x + 9, x + 10, x + 11, x + 12, x + 13, x + 14, x + 15
    t = _produce(x)
    # 3.13 reads a13 and a14 (locals 14 and 15) with one LOAD_FAST_LOAD_FAST (4 bits per index)
    return (a13, a14, t, a0 + a1 + a2 + a3 + a4 + a5 + a6 + a7 + a8 + a9 + a10 + a11 + a12
            + a15)


def _resume_after_call(fn: Any, stored: str) -> tuple[types.FunctionType, list[str]]:
    """The resume function of `fn` entered at the STORE_FAST of `stored` (right after a call),
    with the call's result as the one stack value and every local bound before as arguments."""
    code = fn.__code__
    instrs = code_info(code).instrs
    target = next(i for i, ins in enumerate(instrs)
                  if ins.opname == "STORE_FAST" and ins.argval == stored)
    names = [n for n in code.co_varnames if n != stored]
    rc = bg.resume_code(code, target, [bg.Slot("value")], names, "__resume_test")
    return types.FunctionType(rc, fn.__globals__, rc.co_name), names


def test_resume_with_more_than_16_locals_reads_the_right_ones() -> None:
    # the stack argument comes first, so a13/a14 become locals 15 and 16: past 3.13's 4-bit
    # fields of LOAD_FAST_LOAD_FAST. resume_code splits those superinstructions; the
    # `bytecode` package (0.19) splits them only past index 16 and packs 16 into a wrong local.
    f, names = _resume_after_call(many_locals, "t")
    x = 3
    values = {n: x + int(n[1:]) if n != "x" else x for n in names}
    assert f(_produce(x), *(values[n] for n in names)) == many_locals(x)
    if PY_VERSION >= (3, 13):
        assert not {i.opname for i in code_info(f.__code__).instrs} & set(bg._LOCAL_PAIRS)


def _pair_reader(*, split: bool) -> types.FunctionType:
    """`return (v15, v16)` over 17 arguments with one LOAD_FAST_LOAD_FAST (3.13), assembled by
    the `bytecode` package, after resume_code's split or not."""
    from bytecode import Bytecode, Instr
    bc = Bytecode([Instr("RESUME", 0), Instr("LOAD_FAST_LOAD_FAST", ("v15", "v16")),
                   Instr("BUILD_TUPLE", 2), Instr("RETURN_VALUE")])
    if split:
        bg._split_local_pairs(bc)
    bc.argnames = [f"v{i}" for i in range(17)]
    bc.argcount = 17
    return types.FunctionType(bc.to_code(), {})


@pytest.mark.skipif(PY_VERSION < (3, 13), reason="3.13's two-local superinstructions")
def test_the_bytecode_package_still_mispacks_local_16() -> None:
    """Why bytecode_gen._split_local_pairs stays: `bytecode` packs locals (15, 16) as
    15 << 4 | 16 = 256, which CPython reads as (16, 0). A skip here says the installed
    `bytecode` packs them right and the split can go (the test above still guards resuming)."""
    got = _pair_reader(split=False)(*range(17))
    if got == (15, 16):
        pytest.skip(f"bytecode {version('bytecode')} packs local 16 right: "
                    f"bytecode_gen._split_local_pairs can go")
    assert got == (16, 0), got
    assert _pair_reader(split=True)(*range(17)) == (15, 16)
