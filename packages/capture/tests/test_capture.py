"""capture(): the graph (aten ops, input names, source locations), the input sources, the
output spec and the guards; constants lifted; grad regions and autocast recorded; in-place
updates of temporaries functionalized; nothing real mutated."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from ember.capture import (
    Captured,
    GuardKind,
    OutConst,
    OutSeq,
    OutTensor,
    Unhandled,
    capture,
    describe,
)
from ember.capture.resume import Broken
from ember.ir import Interpreter, parse, verify


def cap(fn, *args, **kwargs) -> Captured:
    r = capture(fn, args, kwargs)
    assert isinstance(r, Captured), r
    verify(r.module)
    assert str(parse(str(r.module))) == str(r.module)
    return r


def ops(r: Captured) -> list[str]:
    return [n.op for n in r.graph.nodes]


def f_basic(x, y):
    z = x + y * 2  # L+1
    return torch.relu(z), z.shape[0]  # L+2


def test_graph_inputs_outputs_and_locations() -> None:
    r = cap(f_basic, torch.randn(3, 4), torch.randn(3, 4))
    assert [p.name for p in r.graph.params] == ["l_x", "l_y"]
    assert ops(r) == ["aten.mul.Tensor", "aten.add.Tensor", "aten.relu.default"]
    first = f_basic.__code__.co_firstlineno
    assert [n.loc.line for n in r.graph.nodes] == [first + 1, first + 1, first + 2]
    assert all(n.loc.file == __file__ for n in r.graph.nodes)
    assert r.output == OutSeq(tuple, (OutTensor(0), OutConst(3)))
    assert [describe(s) for s in r.input_sources] == ["x", "y"]
    out = Interpreter(r.module).run(r.input_examples).outputs[0]
    x, y = r.input_examples
    torch.testing.assert_close(out, torch.relu(x + y * 2))


def test_guards_cover_tensors_and_global_state() -> None:
    r = cap(f_basic, torch.randn(3, 4), torch.randn(3, 4))
    kinds = [g.kind for g in r.guards]
    assert kinds[:2] == [GuardKind.GRAD_MODE, GuardKind.DEFAULT_DTYPE]
    assert kinds.count(GuardKind.TENSOR_MATCH) == 2
    texts = [g.text() for g in r.guards]
    assert "x: tensor float32[3, 4] stride=[4, 1] on cpu" in texts


class Block(nn.Module):
    def __init__(self):
        super().__init__()
        self.linear = nn.Linear(4, 4)
        self.register_buffer("shift", torch.ones(4))

    def forward(self, x):
        return self.linear(x) + self.shift


def test_parameters_and_buffers_are_inputs_named_by_path() -> None:
    m = Block()
    r = cap(m, torch.randn(2, 4))
    assert [p.name for p in r.graph.params] == ["l_x", "l_self_linear_weight",
                                                "l_self_linear_bias", "l_self_shift"]
    assert r.input_examples[1] is m.linear.weight  # by reference, not a copy
    assert "aten.addmm.default" in ops(r)
    texts = [g.text() for g in r.guards]
    assert any(t.startswith("self.linear.weight: tensor Parameter") for t in texts)
    assert any(t.startswith("self.linear is ") for t in texts)


def test_tensor_literals_are_lifted_constants() -> None:
    def f(x):
        return x * torch.tensor([1.0, 2.0])

    r = cap(f, torch.randn(2))
    assert [p.name for p in r.graph.params] == ["l_x", "c_tensor"]
    assert r.input_examples[1].tolist() == [1.0, 2.0]
    assert ops(r) == ["aten.mul.Tensor"]


def test_no_grad_region_detaches_its_inputs() -> None:
    def f(x):
        with torch.no_grad():
            y = x * 2
        return y + x

    r = cap(f, torch.randn(3, requires_grad=True))
    assert ops(r) == ["aten.detach.default", "aten.mul.Tensor", "aten.add.Tensor"]
    x = torch.randn(3, requires_grad=True)
    out = Interpreter(r.module).run([x]).outputs[0]
    out.sum().backward()
    torch.testing.assert_close(x.grad, torch.ones(3))  # no gradient through the no_grad part


def test_autocast_casts_are_recorded() -> None:
    def f(a, b):
        with torch.autocast("cpu", dtype=torch.bfloat16):
            return a @ b

    r = cap(f, torch.randn(2, 2), torch.randn(2, 2))
    assert ops(r).count("aten._to_copy.default") == 2
    assert str(r.graph.result_types[0]).startswith("bf16")


def test_inplace_on_temporary_is_functionalized() -> None:
    def f(x):
        y = x * 2
        y += 1
        y.relu_()
        return y

    r = cap(f, torch.randn(4))
    assert ops(r) == ["aten.mul.Tensor", "aten.add.Tensor", "aten.relu.default"]
    x = r.input_examples[0]
    torch.testing.assert_close(Interpreter(r.module).run([x]).outputs[0], f(x.clone()))


def test_dropout_training_is_captured() -> None:
    r = cap(lambda x: F.dropout(x, 0.5, training=True), torch.randn(8))
    assert "aten.bernoulli.p" in ops(r) and not any(op.endswith("_") for op in ops(r))


def test_inplace_on_input_is_an_update_and_nothing_is_mutated() -> None:
    def f(x, xs):
        x.add_(1)
        return x

    x = torch.zeros(3)
    r = capture(f, (x, []), {})
    assert isinstance(r, Captured) and r.graph.input_updates == [(0, 0)]  # functionalized
    assert x.tolist() == [0.0, 0.0, 0.0]  # capture ran on fake tensors


LOG: list[int] = []


def f_log(x, out):
    y = x + 1
    LOG.append(1)
    out.append(y)
    return y


def test_side_effects_are_recorded_not_performed() -> None:
    out: list[torch.Tensor] = []
    r = capture(f_log, (torch.randn(2), out), {})
    assert isinstance(r, Captured)
    assert LOG == [] and out == []  # replayed by the runtime after the graph, not during capture
    targets = [(e.kind, describe(e.target).rsplit(".", 1)[-1]) for e in r.effects]
    assert sorted(targets) == [("list", "LOG"), ("list", "out")]


def test_unhandled_carries_the_guards_so_far() -> None:
    def f(x):
        if x.shape[0] > 1:
            return x.sum().item()
        return 0

    r = capture(f, (torch.randn(3),), {})
    assert isinstance(r, Broken) and "needs a tensor's data" in r.unhandled.reason
    assert any(g.kind is GuardKind.TENSOR_MATCH for g in r.unhandled.guards)
    assert any(g.kind is GuardKind.TENSOR_MATCH for g in r.captured.guards)


def test_generators_and_comprehensions_inline() -> None:
    def gen(xs):
        for v in xs:
            yield v * 2

    def f(a, b):
        return sum(gen([a, b])), [v + 1 for v in (a, b)][1], {k: v for k, v in zip("ab", [a, b])}

    r = cap(f, torch.randn(2), torch.randn(2))
    assert ops(r).count("aten.mul.Tensor") == 2


def test_unused_inputs_are_pruned() -> None:
    def f(x, unused, xs):
        return x + 1

    r = cap(f, torch.randn(2), torch.randn(2), [torch.randn(2), torch.randn(2)])
    assert [p.name for p in r.graph.params] == ["l_x"]
    assert not any(g.kind is GuardKind.TENSOR_MATCH and describe(g.source) == "unused"
                   for g in r.guards)


def test_autograd_state_changes_are_refused() -> None:
    def f(x):
        y = x * 2
        y.requires_grad_()
        return y

    r = capture(f, (torch.randn(2),), {})
    assert isinstance(r, Unhandled) and "requires_grad_()" in r.reason


def test_inplace_under_no_grad_on_grad_tensor_is_refused() -> None:
    def f(x):
        y = x * 2
        with torch.no_grad():
            y.add_(1)
        return y * 3

    r = capture(f, (torch.randn(2, requires_grad=True),), {})
    # a graph break: the update runs in plain Python, under no_grad, as in eager
    assert isinstance(r, Broken) and "under no_grad" in r.unhandled.reason
