"""DenseNet's concatenations (up to 32 inputs) at compile time: one of more inputs than a loop
may be cut into (splitloops.MAX_INNER) is found too many before any piece's body is shifted
and simplified (the pieces made and then dropped were a large part of codegen), and each piece
of one that is cut keeps only its own input's load (the comparisons the piece's range decides,
and the selects by them, are gone: half of DenseNet's C++ source)."""

from __future__ import annotations

import pytest
import torch

import ember.inductor  # noqa: F401
from ember.inductor.kernels import compile_module, compiled_runner
from ember.inductor.targets.cpu import splitloops
from ember.ir import Interpreter, parse, verify


def _concat(k: int) -> str:
    """k inputs [2, 3, 4] concatenated along the last dim, plus one."""
    ins = ", ".join(f"%x{i}: f32[2, 3, 4]" for i in range(k))
    t = f"f32[2, 3, {4 * k}]"
    return (f"ember.ir 1.0\n\ngraph @f({ins}) -> ({t}) {{\n"
            f"  %c = prims.concatenate([{', '.join(f'%x{i}' for i in range(k))}], dim=2) : {t}\n"
            f"  %y = prims.add(%c, 1.0) : {t}\n  return (%y)\n}}\n")


@pytest.mark.parametrize("k", [6, 16])
def test_too_many_pieces_are_not_made(k: int, monkeypatch: pytest.MonkeyPatch) -> None:
    calls = []
    shifted = splitloops._shifted

    def counting(*a: object) -> object:
        calls.append(1)
        return shifted(*a)  # type: ignore[arg-type]
    monkeypatch.setattr(splitloops, "_shifted", counting)
    m = parse(_concat(k))
    verify(m)
    compiled = compile_module(m)
    if k <= splitloops.MAX_INNER:
        assert len(calls) >= k  # cut: one body per piece
    else:
        assert len(calls) <= 2  # the whole loop, then the fallback: no piece made
    inputs = [torch.randn(2, 3, 4) for _ in range(k)]
    want = Interpreter(m).run(inputs).outputs[0]
    got = compiled_runner(compiled)(None, inputs).outputs[0]
    torch.testing.assert_close(got, want)


def test_each_piece_of_a_concatenation_reads_its_own_input_only() -> None:
    """Cut at its inputs' boundaries, a concatenation's pieces keep no decided comparison and
    no select: each piece loads one input (k loads for k inputs, not k * k)."""
    k = 6
    m = parse(_concat(k))
    compiled = compile_module(m)
    src = "\n".join(kern.source for kern in compiled.kernels.values())
    body = src[src.index('extern "C" void ember_k_'):]
    assert body.count("= loop.load") == k
    assert "prims.where" not in body and "prims.lt" not in body
    inputs = [torch.randn(2, 3, 4) for _ in range(k)]
    want = Interpreter(m).run(inputs).outputs[0]
    torch.testing.assert_close(compiled_runner(compiled)(None, inputs).outputs[0], want)
