"""The C caller of the CPU kernels' pointer ABI (targets/cpu/trampoline.py): the generated
wrapper's kernel lines call it instead of ctypes; it passes every argument count up to
MAX_ARGS, pointers and int64 sizes (negative ones too) in order, checks the count and the
argument types, and the compiled results equal eager's."""

from __future__ import annotations

import ctypes
import json
from pathlib import Path

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

import ember.inductor  # noqa: F401
from ember.inductor.kernels import compile_module
from ember.inductor.targets.cpu import cache, trampoline
from ember.inductor.wrapper import generate
from ember.ir import parse

# writes sum(i * a[i]) over its n arguments into *a[0]: each argument's value and position
_SUMS = "#include <cstdint>\n" + "\n".join(
    f'extern "C" void ember_test_sum{n}(' + ", ".join(f"int64_t a{i}" for i in range(n))
    + ") { *(int64_t*)a0 = " + (" + ".join(f"{i} * a{i}" for i in range(n)) or "0") + "; }"
    for n in range(1, trampoline.MAX_ARGS + 1))


def _sum_kernel(n: int) -> object:
    fn = getattr(cache.load(_SUMS), f"ember_test_sum{n}")
    fn.restype = None
    return fn


@settings(max_examples=25, deadline=None)
@given(st.integers(1, trampoline.MAX_ARGS), st.data())
def test_every_argument_arrives_in_order(n: int, data: st.DataObject) -> None:
    call = trampoline.caller(_sum_kernel(n), n)
    assert call is not None
    out = torch.zeros(1, dtype=torch.int64)
    rest = data.draw(st.lists(st.integers(-2**40, 2**40), min_size=n - 1, max_size=n - 1))
    call(out.data_ptr(), *rest)
    want = sum(i * v for i, v in enumerate(rest, 1))  # (position 0: the address, times 0)
    assert int(out) == want


def test_the_count_and_types_are_checked() -> None:
    call = trampoline.caller(_sum_kernel(3), 3)
    assert call is not None
    out = torch.zeros(1, dtype=torch.int64)
    with pytest.raises(TypeError, match="3 arguments"):
        call(out.data_ptr(), 1)
    with pytest.raises(TypeError):
        call(out.data_ptr(), 1.5, 2)
    with pytest.raises(OverflowError):
        call(out.data_ptr(), 2**70, 2)
    call(out.data_ptr(), True, torch.tensor(5).item())  # (ints as ctypes takes them)
    assert int(out) == 1 + 2 * 5
    assert trampoline.caller(_sum_kernel(3), trampoline.MAX_ARGS + 1) is None


GRAPH = """ember.ir 1.0

graph @f(%x: f32[6, 10], %y: f32[10]) -> (f32[6, 10]) {
  %a = aten.mul.Tensor(%x, %y) : f32[6, 10]
  %b = aten.relu.default(%a) : f32[6, 10]
  return (%b)
}
"""


def test_the_wrappers_kernel_lines_call_it() -> None:
    w = generate(compile_module(parse(GRAPH)))
    kernels = [v for v in w.call.__globals__.values()
               if str(getattr(v, "__name__", "")).startswith("ember_k_")]
    assert kernels and all(not isinstance(k, ctypes._CFuncPtr) for k in kernels), kernels
    g = torch.Generator().manual_seed(0)
    x, y = torch.randn(6, 10, generator=g), torch.randn(10, generator=g)
    (out,) = w.call([x, y]).outputs
    torch.testing.assert_close(out, torch.relu(x * y))


def test_a_corrupt_cache_entry_of_the_caller_is_rebuilt(tmp_path: Path,
                                                        monkeypatch: pytest.MonkeyPatch) -> None:
    """The caller's library is looked up in the kernel cache as kernels are (not kept because
    the process loaded it once): a damaged entry is rebuilt on the next lookup."""
    monkeypatch.setenv("EMBER_CACHE_DIR", str(tmp_path))
    cache.forget_loaded()
    try:
        assert trampoline.caller(_sum_kernel(2), 2) is not None
        src = trampoline._library_source()
        assert src is not None
        meta = tmp_path / "inductor" / f"{cache.cache_key(src)}.json"
        meta.write_text("[1, 2]")
        cache.forget_loaded()
        call = trampoline.caller(_sum_kernel(2), 2)
        assert call is not None and isinstance(json.loads(meta.read_text()), dict)
        out = torch.zeros(1, dtype=torch.int64)
        call(out.data_ptr(), 7)
        assert int(out) == 7
    finally:
        cache.forget_loaded()
