"""Op traits: the facts passes key on are declared in the op records (ember.ir's registry,
ember.prims' PRIMS) and hold for the ops' own implementations.

- aliasing: every op of ember's dialects declares "fresh" or "alias"; every op declared
  "fresh" has a sample here (a new one without a sample fails) on which no result shares an
  operand's storage; plan-buffers reads it (an extern made "alias" frees fewer buffers).
- elementwise: the prims that declare it commute with any permutation of the elements; they
  are exactly the prims the inductor lowers as elementwise loop bodies.
- reduction: every `loop.reduction` kind is a prim declaring it; "associative" ones give the
  same value combining partials in another order, "positional" ones give the first index;
  the CPU target vectorises only associative kinds.
"""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Callable
from typing import Any

import pytest
import torch

import ember.autograd  # noqa: F401  (registers graph.stop_gradient)
import ember.inductor  # noqa: F401  (registers the loop and kernels dialects)
import ember.prims  # noqa: F401
import ember.runtime  # noqa: F401
from ember.inductor import lowering
from ember.inductor.backend import compiled_runner
from ember.inductor.loopir import REDUCTIONS
from ember.inductor.targets.cpu import cppkernel
from ember.ir import (
    DType,
    InferContext,
    Interpreter,
    Module,
    OpDef,
    OpRegistry,
    OpTypeError,
    TensorType,
    Value,
    default_registry,
    parse,
)
from ember.ir.passes import run_pipeline
from ember.ir.registry import ALIASING, EMBER_DIALECTS
from ember.ir.torch_ops import FRESH_TORCH_OPS, torch_opdef
from ember.prims import PRIMS, PRIMS_BY_OP
from ember.prims.ops import REDUCTION_TRAITS

Case = Callable[[], tuple[list[Any], dict[str, Any]]]


def _ember_ops() -> dict[str, Any]:
    return {n: op for n, op in default_registry().registered().items()
            if op.dialect in EMBER_DIALECTS}


def test_every_ember_op_declares_aliasing() -> None:
    ops = _ember_ops()
    assert {"prims.add", "loop.conv2d_nhwc", "kernels.call", "graph.call"} <= set(ops)
    undeclared = sorted(n for n, op in ops.items() if op.aliasing not in ALIASING)
    assert not undeclared, f"declare aliasing= in these ops' records: {undeclared}"


def test_torch_operators_say_alias_unless_listed_fresh() -> None:
    add, einsum = torch_opdef("aten.add.Tensor"), torch_opdef("aten.einsum.default")
    assert add is not None and add.aliasing == "alias"
    assert einsum is not None and not einsum.fresh  # einsum("ij->ji") returns a view
    for name in FRESH_TORCH_OPS:
        op = default_registry().lookup(name)
        assert op is not None and op.fresh, name


def test_registry_refuses_an_unknown_aliasing() -> None:
    bad = OpDef("t.op", "", lambda *a: [], lambda *a: None, aliasing="maybe")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="aliasing"):
        OpRegistry().register(bad)


# ---- aliasing="fresh" holds: samples (edge cases where an implementation might return its
# operand: no padding, one tensor concatenated, nothing flipped, a batch folded into rows) ----

def _r(*shape: int, dtype: torch.dtype = torch.float32) -> torch.Tensor:
    g = torch.Generator().manual_seed(sum(shape) + 1)
    return torch.randn(shape, generator=g).to(dtype)


def _idx(*shape: int, high: int) -> torch.Tensor:
    return torch.randint(0, high, shape, generator=torch.Generator().manual_seed(3))


def _attention_backward_case() -> tuple[list[Any], dict[str, Any]]:
    q, k, v = _r(1, 2, 4, 8), _r(1, 2, 4, 8), _r(1, 2, 4, 8)
    out, lse = torch.ops.aten._scaled_dot_product_flash_attention_for_cpu(q, k, v, 0.0, True)
    return ([_r(1, 2, 4, 8), q, k, v, out, lse, 0.0, True],
            {"kernel": "aten._scaled_dot_product_flash_attention_for_cpu_backward.default"})


def _conv_backward_case(mask: list[bool]) -> tuple[list[Any], dict[str, Any]]:
    return ([_r(1, 3, 5, 5), _r(1, 2, 5, 5), _r(3, 2, 3, 3), None, [1, 1], [1, 1], [1, 1],
             False, [0, 0], 1, mask], {})


FRESH_CASES: dict[str, list[Case]] = {
    "prims.pad": [lambda: ([_r(3, 4), 0.0], {"config": [[0, 0, 0], [0, 0, 0]]}),
                  lambda: ([_r(3, 4), 1.5], {"config": [[1, -1, 1], [0, 2, 0]]})],
    "prims.concatenate": [lambda: ([[_r(2, 3)]], {"dim": 0}),
                          lambda: ([[_r(2, 3), _r(1, 3)]], {"dim": 0})],
    "prims.rev": [lambda: ([_r(3, 2)], {"dims": []}), lambda: ([_r(3, 2)], {"dims": [0]})],
    "prims.iota": [lambda: ([], {"length": 4, "dtype": DType.i64})],
    "prims.full": [lambda: ([], {"shape": [2], "value": 1.0, "dtype": DType.f32})],
    "prims.argmax": [lambda: ([_r(1)], {"dim": 0}), lambda: ([_r(2, 3)], {"dim": 1})],
    "prims.argmin": [lambda: ([_r(2, 3)], {"dim": 0})],
    "prims.cumsum": [lambda: ([_r(1, 3)], {"dim": 0})],
    "prims.cumprod": [lambda: ([_r(2, 1)], {"dim": 1})],
    "prims.gather": [lambda: ([_r(3, 4), _idx(3, 4, high=4)], {"dim": 1})],
    "prims.scatter": [lambda: ([_r(3, 4), _idx(3, 2, high=4), _r(3, 2)], {"dim": 1})],
    "prims.scatter_add": [lambda: ([_r(3, 4), _idx(3, 2, high=4), _r(3, 2)], {"dim": 1})],
    "prims.philox_uniform": [lambda: ([1, 0], {"shape": [3], "dtype": DType.f32})],
    "prims.matmul": [lambda: ([_r(2, 3, 4), _r(2, 4, 5)], {}),
                     lambda: ([_r(1, 1, 1), _r(1, 1, 1)], {})],
    "prims.convolution": [lambda: ([_r(1, 2, 5, 5), _r(3, 2, 3, 3)],
                                   {"stride": [1, 1], "padding": [1, 1], "dilation": [1, 1]})],
    "prims.sort": [lambda: ([_r(1)], {"dim": 0}), lambda: ([_r(2, 3)], {"dim": 1})],
    "prims.topk": [lambda: ([_r(3)], {"k": 3, "dim": 0})],
    "loop.conv2d_nhwc": [lambda: ([_r(1, 5, 5, 2), _r(3, 2, 3, 3), _r(3)],
                                  {"stride": [1, 1], "padding": [1, 1], "dilation": [1, 1],
                                   "relu": True})],
    "loop.conv2d_packed": [lambda: ([_r(1, 5, 5, 2), _r(3, 2, 3, 3), _r(3), _r(3)],
                                    {"stride": [1, 1], "padding": [1, 1], "dilation": [1, 1],
                                     "groups": 1, "scale": True, "bias": True,
                                     "relu": True})],
    "loop.conv2d_backward_nhwc": [
        lambda m=m: ([_r(1, 5, 5, 3), _r(1, 5, 5, 2), _r(3, 2, 3, 3)],  # type: ignore[misc]
                     {"stride": [1, 1], "padding": [1, 1], "dilation": [1, 1], "groups": 1,
                      "mask": m}) for m in ([True, False], [False, True], [True, True])],
    # the CUDA target's one-row GEMV (gemv.py; torch.mm off the GPU)
    "loop.gemv": [lambda: ([_r(1, 8), _r(5, 8)], {}), lambda: ([_r(1, 1), _r(1, 1)], {})],
    # two of them in one launch with bias/GELU epilogues (gemv_group.py)
    "loop.gemv_group": [lambda: ([_r(1, 8), _r(5, 8), _r(5), _r(1, 6), _r(3, 6)],
                                 {"epilogues": ["bias+gelu", "none"]})],
    # x @ w.T on oneDNN's packed Parameter w (CPU linear.py; torch.mm when small)
    "loop.linear_packed": [lambda: ([_r(3, 8), _r(5, 8)], {}),
                           lambda: ([_r(64, 128), torch.nn.Parameter(_r(256, 128),
                                                                      requires_grad=False)], {}),
                           lambda: ([_r(64, 128), torch.nn.Parameter(_r(128, 256),
                                                                      requires_grad=False)],
                                    {"kn": True}),
                           # with its bias and GELU folded (linear_epilogue.py)
                           lambda: ([_r(64, 128), torch.nn.Parameter(_r(256, 128),
                                                                      requires_grad=False),
                                     _r(256)], {"bias": True, "act": "gelu"}),
                           lambda: ([_r(3, 8), _r(5, 8), _r(5)],
                                    {"bias": True, "act": "gelu"})],
    # x @ cat(w_i).T + cat(b_i) (group-linears' one product, group_linear.py)
    "loop.linear_grouped": [lambda: ([_r(3, 8), _r(5, 8), _r(2, 8)], {"parts": 2}),
                            lambda: ([_r(64, 128), torch.nn.Parameter(_r(256, 128),
                                                                       requires_grad=False),
                                      torch.nn.Parameter(_r(128, 128), requires_grad=False),
                                      _r(256), _r(128)], {"parts": 2, "bias": True})],
    "loop.index_select": [lambda: ([_r(5, 3), _idx(4, high=5)], {"dim": 0}),
                          lambda: ([_r(2, 3), torch.tensor([0, 1])], {"dim": 0})],
    "loop.conv2d": [lambda: ([_r(1, 2, 5, 5), _r(3, 2, 3, 3), _r(3), 2.0],
                             {"steps": ["prims.add", "prims.mul"], "relu": True,
                              "stride": [1, 1], "padding": [1, 1], "dilation": [1, 1]})],
    "aten._scaled_dot_product_flash_attention_for_cpu.default": [
        lambda: ([_r(1, 2, 4, 8), _r(1, 2, 4, 8), _r(1, 2, 4, 8)], {})],
    # the forward's output and logsumexp returned as the [B, L, H, E] / [B, L, H] buffers
    "loop.attention_heads_last_cpu": [
        lambda: ([_r(1, 2, 4, 8), _r(1, 2, 4, 8), _r(1, 2, 4, 8)],
                 {"kernel": "aten._scaled_dot_product_flash_attention_for_cpu.default"})],
    # training's attention backward, its gradients returned as the [B, L, H, E] buffers
    "loop.attention_grads_heads_last": [lambda: _attention_backward_case()],
    # training's convolution gradients (grad_output, input, weight, ..., output_mask)
    "aten.convolution_backward.default": [
        functools.partial(_conv_backward_case, mask)
        for mask in ([True, False, False], [False, True, False], [True, True, False])],
}
# Fresh ops whose kernels exist only on a GPU (no CPU sample can run them), with where they are
# checked instead.
DEVICE_ONLY = {
    "loop.attention_heads_last": "kernel= is a CUDA fused attention op; its fresh [B, L, H, E] "
                                 "result is checked by packages/inductor/tests/"
                                 "test_cuda_attention_extern.py (CPU stand-in) and on the device",
    "loop.cuda_attention_grads": "kernel= is a CUDA fused attention backward; its fresh "
                                 "gradients are checked by packages/inductor/tests/"
                                 "test_cuda_training_interp.py (CPU stand-ins) and on the device",
}
# Fresh ops checked on whole graphs: their results live in modules (bodies, kernels).
GRAPH_CASES = {
    "loop.reduction": "lower-loops",
    "kernels.call": "inductor",
}
REDUCE_TEXT = """ember.ir 1.0

graph @f(%x: f32[4, 6]) -> (f32[4]) {
  %s = prims.sum(%x, dims=[1]) : f32[4]
  return (%s)
}
"""


def _elementwise_call(name: str) -> tuple[list[Any], dict[str, Any]]:
    """A call of an elementwise prim: operands of one dtype its rule accepts (a binary prim's
    second operand a number, as extern calls with a size symbol have)."""
    p = PRIMS_BY_OP[name]
    if p.name == "where":
        return [torch.tensor([True, False, True]), _r(3), 0.5], {}
    if p.name == "convert_element_type":
        return [_r(3)], {"dtype": DType.f64}
    arity = p.signature.count(",") + 1
    for dt in (torch.float32, torch.int64, torch.bool):
        args = [_r(3, dtype=dt) for _ in range(arity)]
        try:
            p.infer(InferContext(), [Value(f"a{i}", TensorType.of(a))
                                     for i, a in enumerate(args)], {})
        except OpTypeError:
            continue
        return (args if arity == 1 else [args[0], 1 if dt != torch.float32 else 1.5]), {}
    raise AssertionError(f"{name}: no dtype fits")


def _tensors(x: Any) -> list[torch.Tensor]:
    if isinstance(x, torch.Tensor):
        return [x]
    if isinstance(x, (list, tuple)):
        return [t for a in x for t in _tensors(a)]
    return []


def _shares_storage(results: Any, operands: Any) -> bool:
    ptrs = {t.untyped_storage().data_ptr() for t in _tensors(operands) if t.numel()}
    return any(t.untyped_storage().data_ptr() in ptrs for t in _tensors(results) if t.numel())


def _fresh_ops() -> list[str]:
    return sorted({n for n, op in _ember_ops().items() if op.fresh} | FRESH_TORCH_OPS)


def test_every_fresh_op_has_a_sample_here() -> None:
    elementwise = {p.op for p in PRIMS if p.elementwise}
    missing = [n for n in _fresh_ops()
               if n not in FRESH_CASES and n not in GRAPH_CASES and n not in elementwise
               and n not in DEVICE_ONLY]
    assert not missing, f"add samples for these fresh ops to FRESH_CASES: {missing}"


@pytest.mark.parametrize("name", _fresh_ops())
def test_fresh_results_never_share_an_operands_storage(name: str) -> None:
    if name in DEVICE_ONLY:
        pytest.skip(DEVICE_ONLY[name])
    op = default_registry().lookup(name)
    assert op is not None and op.fresh
    interp = Interpreter(Module())
    if name in GRAPH_CASES:
        m = run_pipeline(parse(REDUCE_TEXT), GRAPH_CASES[name])
        assert any(n.op == name for n in m.graph().nodes), str(m)
        x = _r(4, 6)
        if name == "kernels.call":
            outs = compiled_runner(m)(None, [x]).outputs
        else:
            outs = Interpreter(m).run([x]).outputs
        assert not _shares_storage(outs, [x])
        return
    cases = FRESH_CASES.get(name) or [lambda: _elementwise_call(name)]
    for case in cases:
        args, kwargs = case()
        out = op.reference(interp, args, kwargs)
        assert not _shares_storage(out, args), (name, args, kwargs)


# ---- the inductor reads aliasing ---------------------------------------------------------------

# (a computed weight: on a graph-input weight the CPU target's matmul is its packed linear)
CHAIN = """ember.ir 1.0

graph @f(%x: f32[8, 16], %u: f32[16, 16]) -> (f32[8, 16]) {
  %w = prims.mul(%u, 2.0) : f32[16, 16]
  %a = prims.exp(%x) : f32[8, 16]
  %m = prims.matmul(%a, %w) : f32[8, 16]
  %b = prims.sin(%m) : f32[8, 16]
  %m2 = prims.matmul(%b, %w) : f32[8, 16]
  %c = prims.cos(%m2) : f32[8, 16]
  return (%c)
}
"""


def _reused(text: str) -> int:
    m = run_pipeline(parse(text), "inductor")
    return sum(len(r) for n in m.graph().nodes if isinstance(r := n.kwargs.get("reuse"), list))


def test_plan_buffers_frees_an_operand_only_after_a_fresh_extern(
        monkeypatch: pytest.MonkeyPatch) -> None:
    fresh = _reused(CHAIN)
    assert fresh > 0  # %a's buffer dies at the first matmul; %c takes it
    matmul = default_registry().lookup("prims.matmul")
    assert matmul is not None
    monkeypatch.setitem(default_registry()._ops, "prims.matmul",
                        dataclasses.replace(matmul, aliasing="alias"))
    assert _reused(CHAIN) < fresh  # the matmul's result may be %a: %a lives as long


# ---- elementwise -------------------------------------------------------------------------------

@pytest.mark.parametrize("prim", [p for p in PRIMS if p.elementwise], ids=lambda p: p.name)
def test_elementwise_prims_commute_with_a_permutation(prim: Any) -> None:
    args, kwargs = _elementwise_call(prim.op)
    perm = torch.tensor([2, 0, 1])
    out = prim.ref(*args, **kwargs)
    moved = [a[perm] if isinstance(a, torch.Tensor) else a for a in args]
    torch.testing.assert_close(prim.ref(*moved, **kwargs), out[perm], equal_nan=True)


def test_the_inductor_lowers_exactly_the_elementwise_prims_as_loop_bodies() -> None:
    ew = {op for op, rule in lowering.LOWERINGS.items() if rule is lowering._elementwise}
    assert ew == {p.op for p in PRIMS if p.elementwise}


# ---- reductions --------------------------------------------------------------------------------

def test_every_loop_reduction_kind_is_a_prim_declaring_its_reduction_trait() -> None:
    declared = {p.name: p.reduction for p in PRIMS if p.reduction is not None}
    assert set(declared) == set(REDUCTIONS)
    assert set(declared.values()) <= set(REDUCTION_TRAITS)
    assert lowering.REDUCTION_PRIMS == {f"prims.{k}": k for k in declared}


@pytest.mark.parametrize("prim", [p for p in PRIMS if p.reduction], ids=lambda p: p.name)
def test_reduction_traits_hold(prim: Any) -> None:
    x = torch.tensor([0.5, -2.0, 3.0, 3.0, 1.25, -2.0], dtype=torch.float64)
    if prim.reduction == "associative":  # partials combined in another order: same value
        whole = prim.ref(x, dims=[0])
        parts = torch.stack([prim.ref(x[3:], dims=[0]), prim.ref(x[:3], dims=[0])])
        torch.testing.assert_close(prim.ref(parts, dims=[0]), whole)
    else:  # the first extremum's index
        got = prim.ref(x, dim=0)
        assert got.dtype == torch.int64
        assert int(got) == {"argmax": 2, "argmin": 1}[prim.name]


def test_cpu_simd_reductions_are_associative() -> None:
    assert set(cppkernel.SIMD_KINDS) == {"sum", "amax", "amin"}
    assert all(PRIMS_BY_OP[f"prims.{k}"].reduction == "associative"
               for k in cppkernel.SIMD_KINDS)
