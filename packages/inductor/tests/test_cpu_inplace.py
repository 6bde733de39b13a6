"""CPU pointwise kernels written over the operand they read (targets/cpu/inplace.py,
buffers.py): a GEMM's activation kernel reads the product only at the element it writes
and the product dies there, so the kernel writes into the product's storage (no new buffer per
call: page faults and cold writes). An operand read at another element, read again later, or
a graph input is never overwritten. Outputs as eager's / the reference interpreter's."""

from __future__ import annotations

import re
from pathlib import Path

import torch

import ember.inductor  # noqa: F401  (registers the CPU target)
from ember.inductor.kernels import compile_module, compiled_runner
from ember.ir import Interpreter, Module, parse
from ember.runtime.compile import compile as ember_compile


class MLP(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.a = torch.nn.Linear(64, 256)
        self.b = torch.nn.Linear(256, 64)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        # (the biases, and a GELU, are the packed linear's own (linear_epilogue.py): the SiLU
        # and the scaling after the products stay kernels)
        return self.b(torch.nn.functional.silu(self.a(x))) * 2


def test_the_activation_writes_over_the_product(tmp_path: Path) -> None:
    torch.manual_seed(0)
    m = MLP().eval()
    x = torch.randn(2, 33, 64)
    f = ember_compile(m, options={"dump_dir": str(tmp_path)})
    with torch.no_grad():
        for _ in range(2):
            torch.testing.assert_close(f(x), m(x))
    text = next(tmp_path.glob("*.kernels.ir")).read_text()
    # both kernels (the SiLU's and the scaling's) take the product's storage
    calls = re.findall(r"= kernels\.call\(@(\w+), %(\w+), .*inplace=\[0\], "
                       r"reuse=\[%(\w+)\]", text)
    assert len(calls) == 2 and all(read == reused for _, read, reused in calls), text
    for k, _, _ in calls:  # the shared operand and the output are not restrict pointers
        assert re.search(rf"void ember_k_{k}\(const float\* in0, float\* out0\)", text), text


GRAPH = """ember.ir 1.0

graph @f(%x: f32[16, 16], %w: f32[16, 16]) -> (f32[16, 16], f32[16, 16], f32[16, 16]) {{
  %m = prims.matmul(%x, %w) : f32[16, 16]
  %p = prims.permute(%m, dims=[1, 0]) : f32[16, 16]
  %t = prims.exp(%p) : f32[16, 16]
  %n = prims.matmul(%w, %x) : f32[16, 16]
  %a = prims.{op}(%n) : f32[16, 16]
  %b = prims.matmul(%a, %n) : f32[16, 16]
  %i = prims.sin(%x) : f32[16, 16]
  return (%t, %b, %i)
}}
"""


def _calls(m: Module) -> dict[str, tuple[object, list[str]]]:
    return {n.results[0].name: (n.kwargs.get("inplace"),
                                [r.name for r in n.kwargs.get("reuse", [])])  # type: ignore
            for n in m.graph().nodes if n.op == "kernels.call"}


def test_never_over_a_transposed_read_a_later_read_or_an_input() -> None:
    src = parse(GRAPH.format(op="tanh"))
    m = compile_module(src)
    calls = _calls(m)
    # %t reads %m across: not a candidate; %a's operand %n is read again by the matmul;
    # %i's operand is the graph's input
    # (each may still take a dead buffer's storage: %m's, %a's)
    assert calls["t"][0] is None and "m" not in calls["t"][1], calls
    assert calls["a"][0] == [0] and "n" not in calls["a"][1], calls
    assert calls["i"][0] == [0] and "x" not in calls["i"][1], calls
    g = torch.Generator().manual_seed(0)
    inputs = [torch.randn(16, 16, generator=g), torch.randn(16, 16, generator=g) / 4]
    x0 = inputs[0].clone()
    want = Interpreter(src).run(inputs).outputs
    got = compiled_runner(m)(None, inputs).outputs
    for a, b in zip(got, want, strict=True):
        torch.testing.assert_close(a, b)
    torch.testing.assert_close(inputs[0], x0, rtol=0, atol=0)  # the input is untouched
