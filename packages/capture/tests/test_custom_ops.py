"""torch.library custom ops under compile(): one opaque node typed by the op's fake kernel, run
through torch by every backend (the inductor as an extern call); the ops capture cannot keep
(no fake kernel, written arguments, no tensor result) break the graph with a reason naming the
op, never a binding's internal name (issue 13 item 10, issue 18)."""

from __future__ import annotations

import sys
import textwrap
import uuid
from pathlib import Path
from typing import Any

import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st

import ember.runtime as er
from ember.capture.calls import callable_name
from ember.ir.effects import allow_effects
from ember.runtime.cli import main as cli_main
from ember.runtime.testing import check_against_eager

NS = "ember_test_co"


@torch.library.custom_op(f"{NS}::gmm", mutates_args=())
def gmm(x: torch.Tensor, ws: list[torch.Tensor], sizes: list[int]) -> torch.Tensor:
    """A MoE grouped matmul: rows of x split by `sizes`, each group times its own weight."""
    return torch.cat([a @ w for a, w in zip(x.split(sizes), ws, strict=True)])


@gmm.register_fake
def _(x: torch.Tensor, ws: list[torch.Tensor], sizes: list[int]) -> torch.Tensor:
    return x.new_empty(x.shape[0], ws[0].shape[1])


@torch.library.custom_op(f"{NS}::act", mutates_args=())
def act(x: torch.Tensor, kind: str) -> torch.Tensor:
    return x.relu() if kind == "relu" else x.tanh()


@act.register_fake
def _(x: torch.Tensor, kind: str) -> torch.Tensor:
    return torch.empty_like(x)


@torch.library.custom_op(f"{NS}::nofake", mutates_args=())
def nofake(x: torch.Tensor) -> torch.Tensor:
    return x * 2


@torch.library.custom_op(f"{NS}::scale_", mutates_args=("x",))
def scale_(x: torch.Tensor, s: float) -> None:
    x.mul_(s)


@scale_.register_fake
def _(x: torch.Tensor, s: float) -> None:
    return None


torch.library.define(f"{NS}::twice", "(Tensor x) -> Tensor")
torch.library.impl(f"{NS}::twice", "cpu", lambda x: x * 2)
torch.library.register_fake(f"{NS}::twice", lambda x: torch.empty_like(x))


def _moe(x: torch.Tensor, w1: torch.Tensor, w2: torch.Tensor) -> torch.Tensor:
    return gmm(x, [w1, w2], [2, 3]).relu() + 1


def _ops(h: Any) -> dict[str, int]:
    return dict(sum((list(g.op_counts.items()) for g in h.graphs), []))


@pytest.mark.parametrize("backend", ["eager", "prims", "inductor"])
def test_custom_op_is_one_node_on_every_backend(backend: str) -> None:
    x, w1, w2 = torch.randn(5, 4), torch.randn(4, 6), torch.randn(4, 6)
    h = check_against_eager(_moe, x, w1, w2, backend=backend, calls=2)
    assert not h.breaks
    assert _ops(h)[f"{NS}.gmm.default"] == 1
    if backend == "inductor":  # compiled, the custom op an extern call
        assert any("extern call" in n for n in h.notes), h.notes


def test_ops_namespace_calls_capture_without_break() -> None:
    def f(x: torch.Tensor) -> torch.Tensor:
        y = torch.ops.ember_test_co.twice(x) + torch.ops.ember_test_co.twice.default(x)
        return torch.ops.aten.mul.Tensor(y, torch.ops.aten.add(x, 1))

    h = check_against_eager(f, torch.randn(3, 4))
    assert not h.breaks
    assert _ops(h)[f"{NS}.twice.default"] == 2


def test_custom_op_with_text_argument_runs_under_compile() -> None:
    # effects.py counts an unreviewed `str` argument as an effect: refused in IR files without
    # --allow-effects, but the user's own code calling it compiles and runs
    def f(x: torch.Tensor) -> torch.Tensor:
        return act(x, "relu") * 2 + torch.ops.ember_test_co.act(x, "tanh")

    x = torch.randn(3, 4)
    c = er.compile(f, backend="eager")
    assert torch.equal(c(x), f(x))
    r = er.explain(c)
    assert not r.breaks and not r.fallbacks
    assert f"{NS}.act.default" in r.graphs[0].ir


def test_custom_op_without_fake_kernel_breaks_with_reason() -> None:
    def f(x: torch.Tensor) -> torch.Tensor:
        return nofake(x + 1) * 3

    x = torch.randn(3)
    c = er.compile(f, backend="eager")
    assert torch.equal(c(x), f(x))
    reasons = [b.reason for b in er.explain(c).breaks]
    assert reasons == [f"{NS}::nofake has no fake kernel (register one with "
                       f"torch.library.register_fake)"]


def test_mutating_custom_op_breaks_and_writes_like_eager() -> None:
    def f(x: torch.Tensor) -> torch.Tensor:
        y = x + 1
        scale_(y, 3.0)
        return y

    h = check_against_eager(f, torch.randn(4), expect_graphs=None)
    assert any(f"custom op {NS}::scale_ writes its argument x" in b.reason for b in h.breaks)


def test_reasons_never_name_a_binding_internal() -> None:
    class Fake:
        __qualname__ = "pybind11_detail_function_record_v1_system_libstdcpp_gxx_abi_1xxx."
        __module__ = "torch._ops.myns"

    assert "pybind11" not in callable_name(Fake())
    assert callable_name(len) == "len"
    assert callable_name(torch.Tensor.add) == "TensorBase.add"


@given(st.integers(1, 4), st.integers(1, 4))
def test_grouped_matmul_property(rows: int, cols: int) -> None:
    x = torch.randn(rows + 1, cols)
    w1, w2 = torch.randn(cols, 3), torch.randn(cols, 3)

    def f(x: torch.Tensor, w1: torch.Tensor, w2: torch.Tensor) -> torch.Tensor:
        return gmm(x, [w1, w2], [rows, 1])

    c = er.compile(f, backend="eager")
    torch.testing.assert_close(c(x, w1, w2), f(x, w1, w2), rtol=0, atol=0)
    assert not er.explain(c).breaks


def test_cli_load_registers_ops_before_parsing(tmp_path: Path, monkeypatch: Any,
                                               capsys: Any) -> None:
    ns = f"ember_load_{uuid.uuid4().hex[:8]}"
    mod = f"ops_{ns}"
    (tmp_path / f"{mod}.py").write_text(textwrap.dedent(f"""
        import torch
        @torch.library.custom_op("{ns}::twice", mutates_args=())
        def twice(x: torch.Tensor) -> torch.Tensor:
            return x * 2
        @twice.register_fake
        def _(x):
            return torch.empty_like(x)
    """))
    ir = tmp_path / "m.ir"
    ir.write_text(f"ember.ir 1.0\n\ngraph @f(%x: f32[3]) -> (f32[3]) {{\n"
                  f"  %y = {ns}.twice.default(%x) : f32[3]\n  return (%y)\n}}\n")
    monkeypatch.chdir(tmp_path)
    assert cli_main(["run", str(ir), "--random"]) == 1  # unknown op without --load
    assert cli_main(["run", str(ir), "--random", "--load", mod]) == 0
    assert cli_main(["check", str(ir), "--load", mod, "-p", "decompose",
                     "--backend", "inductor"]) == 0
    assert cli_main(["run", str(ir), "--random", "--load", "no_such_module_xyz"]) == 1
    err = capsys.readouterr().err
    assert "--load no_such_module_xyz: ModuleNotFoundError" in err
    assert "Traceback" not in err
    sys.modules.pop(mod, None)


def test_effectful_custom_op_still_needs_allow_effects_in_ir_files(tmp_path: Path) -> None:
    from ember.ir import check, parse

    text = (f"ember.ir 1.0\n\ngraph @f(%x: f32[3]) -> (f32[3]) {{\n"
            f"  %y = {NS}.act.default(%x, \"relu\") : f32[3]\n  return (%y)\n}}\n")
    assert check(parse(text))  # refused: takes text ember has not reviewed
    with allow_effects():
        assert not check(parse(text))
