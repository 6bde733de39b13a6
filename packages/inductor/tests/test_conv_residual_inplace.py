"""A packed convolution whose residual dies there adds into the residual's storage
(plan-buffers' INTO_FORMS, packed.py's into_residual=true: oneDNN's in-place binary post-op,
TorchInductor's `_convolution_pointwise_.binary` under freezing), so no new output is
allocated. Never where the residual is read later, is a graph input or output, or is also the
convolution's input; results equal eager either way."""

from __future__ import annotations

import os
import subprocess
import sys
from typing import Any

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from torch.utils._python_dispatch import TorchDispatchMode

import ember.inductor  # noqa: F401  (registers the CPU target)
from ember.inductor.kernels import compile_module, compiled_runner
from ember.inductor.targets.cpu import packed
from ember.ir import Module, parse
from ember.runtime.compile import compile as ember_compile

pytestmark = pytest.mark.skipif(packed._INTO is None,
                                reason="oneDNN's in-place convolution post-op is not built")


class _Convs(TorchDispatchMode):
    """Per oneDNN convolution call: the op, and whether its result is the storage of its
    first operand (the in-place form's `other`)."""

    def __init__(self) -> None:
        super().__init__()
        self.calls: list[tuple[str, bool]] = []

    def __torch_dispatch__(self, func: Any, types: Any, args: Any = (),
                           kwargs: Any = None) -> Any:
        ptr = args[0].untyped_storage().data_ptr() if args and isinstance(
            args[0], torch.Tensor) else None
        out = func(*args, **(kwargs or {}))
        if "_convolution_pointwise" in str(func):
            self.calls.append((str(func), out.untyped_storage().data_ptr() == ptr))
        return out


def _into(m: Module) -> list[bool]:
    return [n.kwargs.get("into_residual") is True for n in m.graph().nodes
            if n.op == "kernels.extern" and n.kwargs.get("residual") is True]


def _graph(ret: str, extra: str = "", params: str = "") -> str:
    """Two convolutions meeting in one add (a ResNet's downsample and main branch): one takes
    the add as its post-op, the other's result is its residual."""
    t = "f32[2, 4, 6, 5]"
    return f"""ember.ir 1.0

graph @f(%x: {t}, %w1: f32[4, 4, 3, 3], %w3: f32[4, 4, 1, 1]{params}) -> ({ret}) {{
  %c1 = prims.convolution(%x, %w1, stride=[1, 1], padding=[1, 1], dilation=[1, 1], groups=1) : {t}
  %c3 = prims.convolution(%x, %w3, stride=[1, 1], padding=[0, 0], dilation=[1, 1], groups=1) : {t}
  %s = prims.add(%c1, %c3) : {t}
{extra}}}
"""


T = "f32[2, 4, 6, 5]"
DIES = _graph(T, "  return (%s)\n")
READ_LATER = _graph(f"{T}, {T}", f"  %u = prims.mul(%c3, 2.0) : {T}\n  return (%s, %u)\n")
IS_OUTPUT = _graph(f"{T}, {T}", "  return (%s, %c3)\n")
INPUT_RES = f"""ember.ir 1.0

graph @f(%x: {T}, %w1: f32[4, 4, 3, 3], %y: f32[2, 6, 5, 4]) -> ({T}) {{
  %c1 = prims.convolution(%x, %w1, stride=[1, 1], padding=[1, 1], dilation=[1, 1], groups=1) : {T}
  %yp = prims.permute(%y, dims=[0, 3, 1, 2]) : {T}
  %s = prims.add(%c1, %yp) : {T}
  return (%s)
}}
"""


def _inputs(*shapes: list[int]) -> list[torch.Tensor]:
    g = torch.Generator().manual_seed(0)
    return [torch.randn(s, generator=g) for s in shapes]


def _eager(x: torch.Tensor, w1: torch.Tensor, w3: torch.Tensor) -> tuple[torch.Tensor, ...]:
    c3 = torch.conv2d(x, w3)
    return torch.conv2d(x, w1, padding=1) + c3, c3


def test_a_dying_residual_is_added_into_in_place() -> None:
    m = compile_module(parse(DIES))
    assert _into(m) == [True]
    run = compiled_runner(m)
    x, w1, w3 = _inputs([2, 4, 6, 5], [4, 4, 3, 3], [4, 4, 1, 1])
    with _Convs() as seen:
        got = run(None, [x, w1, w3]).outputs[0]
    assert [c for c in seen.calls if "_convolution_pointwise_" in c[0]] == [
        ("mkldnn._convolution_pointwise_.binary", True)], seen.calls
    torch.testing.assert_close(got, _eager(x, w1, w3)[0])
    again = run(None, [x, w1, w3]).outputs[0]  # a second call writes new storage
    torch.testing.assert_close(got, _eager(x, w1, w3)[0])
    assert again.untyped_storage().data_ptr() != got.untyped_storage().data_ptr()


@pytest.mark.parametrize("src", [READ_LATER, IS_OUTPUT], ids=["read_later", "output"])
def test_a_residual_read_later_or_returned_is_not_written(src: str) -> None:
    m = compile_module(parse(src))
    assert _into(m) == [False]
    run = compiled_runner(m)
    x, w1, w3 = _inputs([2, 4, 6, 5], [4, 4, 3, 3], [4, 4, 1, 1])
    with _Convs() as seen:
        s, u = run(None, [x, w1, w3]).outputs
    assert not any("_convolution_pointwise_" in c[0] for c in seen.calls)
    want_s, c3 = _eager(x, w1, w3)
    torch.testing.assert_close(s, want_s)
    torch.testing.assert_close(u, c3 * 2 if src is READ_LATER else c3)


@pytest.mark.parametrize("nhwc", [True, False])
def test_an_input_residual_is_not_written(nhwc: bool) -> None:
    """An NHWC graph input is the extern's residual operand as it is: never written. An NCHW
    one is copied to NHWC first, and that copy (the graph's own, dying there) is written."""
    src = INPUT_RES if nhwc else INPUT_RES.replace("%y: f32[2, 6, 5, 4]", f"%y: {T}").replace(
        f"  %yp = prims.permute(%y, dims=[0, 3, 1, 2]) : {T}\n", "").replace("%yp)", "%y)")
    m = compile_module(parse(src))
    assert _into(m) == [not nhwc]
    x, w1, y = _inputs([2, 4, 6, 5], [4, 4, 3, 3], [2, 6, 5, 4] if nhwc else [2, 4, 6, 5])
    kept = y.clone()
    got = compiled_runner(m)(None, [x, w1, y]).outputs[0]
    torch.testing.assert_close(y, kept, rtol=0, atol=0)
    torch.testing.assert_close(got, torch.conv2d(x, w1, padding=1)
                               + (y.permute(0, 3, 1, 2) if nhwc else y))


def test_a_residual_that_is_the_input_is_not_written() -> None:
    """conv(x) + x: the NHWC x is read by the convolution too (an alias of its input)."""
    src = DIES.replace("%s = prims.add(%c1, %c3)", "%s = prims.add(%c1, %x)")
    m = compile_module(parse(src))
    assert _into(m) == [False]
    x, w1, w3 = _inputs([2, 4, 6, 5], [4, 4, 3, 3], [4, 4, 1, 1])
    got = compiled_runner(m)(None, [x, w1, w3]).outputs[0]
    torch.testing.assert_close(got, torch.conv2d(x, w1, padding=1) + x)


def test_a_non_contiguous_residual_at_run_time_takes_the_out_of_place_path() -> None:
    call = packed.bind({"stride": [1, 1], "padding": [0, 0], "dilation": [1, 1], "groups": 1,
                        "residual": True, "into_residual": True})
    x, w, r = _inputs([2, 6, 5, 4], [4, 4, 1, 1], [2, 5, 6, 4])
    x = x.repeat(1, 1, 1, 8)  # [2, 6, 5, 32]: past the small product, oneDNN's path
    w = torch.randn(4, 32, 1, 1)
    rt = r.transpose(1, 2)  # [2, 6, 5, 4], not contiguous
    kept = rt.clone()
    got = call(x, w, rt)
    torch.testing.assert_close(rt, kept, rtol=0, atol=0)
    want = torch.conv2d(x.permute(0, 3, 1, 2), w) + kept.permute(0, 3, 1, 2)
    torch.testing.assert_close(got, want.permute(0, 2, 3, 1))


def test_into_residual_needs_residual() -> None:
    with pytest.raises(Exception, match="into_residual"):
        packed.bind({"stride": [1, 1], "padding": [0, 0], "dilation": [1, 1], "groups": 1,
                     "into_residual": True})


class _Bottleneck(torch.nn.Module):
    """torchvision's ResNet bottleneck (1x1, 3x3 with stride, 1x1 expanding, BatchNorm
    after each; a downsample branch where the shape changes), two of them in a row."""

    def __init__(self, cin: int, mid: int, stride: int) -> None:
        super().__init__()
        out = mid * 4

        def cbn(i: int, o: int, k: int, s: int = 1) -> list[torch.nn.Module]:
            return [torch.nn.Conv2d(i, o, k, s, k // 2, bias=False), torch.nn.BatchNorm2d(o)]
        self.body = torch.nn.Sequential(*cbn(cin, mid, 1), torch.nn.ReLU(),
                                        *cbn(mid, mid, 3, stride), torch.nn.ReLU(),
                                        *cbn(mid, out, 1))
        self.down = torch.nn.Sequential(*cbn(cin, out, 1, stride)) \
            if stride != 1 or cin != out else torch.nn.Identity()
        self.body2 = torch.nn.Sequential(*cbn(out, mid, 1), torch.nn.ReLU(),
                                         *cbn(mid, mid, 3), torch.nn.ReLU(), *cbn(mid, out, 1))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = torch.relu(self.body(x) + self.down(x))
        return torch.relu(self.body2(y) + y)


def _bottleneck(cin: int, mid: int, stride: int, seed: int) -> _Bottleneck:
    torch.manual_seed(seed)
    net = _Bottleneck(cin, mid, stride)
    for mod in net.modules():
        if isinstance(mod, torch.nn.BatchNorm2d):
            assert mod.running_mean is not None and mod.running_var is not None
            with torch.no_grad():
                mod.running_mean.uniform_(-0.5, 0.5)
                mod.running_var.uniform_(0.5, 2.0)
    return net.eval()


@settings(max_examples=6, deadline=None)
@given(cin=st.sampled_from([8, 16, 32]), mid=st.sampled_from([4, 8, 16]),
       stride=st.sampled_from([1, 2]), size=st.integers(5, 12), batch=st.integers(1, 2),
       seed=st.integers(0, 100))
def test_resnet_bottlenecks_equal_eager(cin: int, mid: int, stride: int, size: int,
                                        batch: int, seed: int) -> None:
    net = _bottleneck(cin, mid, stride, seed)
    x = torch.randn(batch, cin, size, size)
    f = ember_compile(net)
    with torch.no_grad():
        want = net(x)
        torch.testing.assert_close(f(x), want, rtol=1e-4, atol=1e-4)
        torch.testing.assert_close(f(x), want, rtol=1e-4, atol=1e-4)  # on the cached packs


def test_resnet_bottlenecks_take_the_in_place_path() -> None:
    """Large enough for oneDNN (past the small 1x1 product): both blocks' residual adds run
    in place (the first into its downsample's result, the second into the first block's
    output, which the second block's first convolution has read by then)."""
    net = _bottleneck(64, 32, 1, 0)
    x = torch.randn(2, 64, 28, 28)
    f = ember_compile(net)
    with torch.no_grad():
        f(x)
        with _Convs() as seen:
            got = f(x)
        torch.testing.assert_close(got, net(x), rtol=1e-4, atol=1e-4)
    assert [ok for op, ok in seen.calls if "_convolution_pointwise_" in op] == [True, True], \
        seen.calls


_VERBOSE = """
import torch
import ember.inductor
from ember.inductor.targets.cpu import packed
call = packed.bind({"stride": [1, 1], "padding": [0, 0], "dilation": [1, 1], "groups": 1,
                    "bias": True, "relu": True, "residual": True, "into_residual": True})
x, r = torch.randn(2, 14, 14, 64), torch.randn(2, 14, 14, 256)
w = torch.nn.Parameter(torch.randn(256, 64, 1, 1) / 8, requires_grad=False)
b = torch.randn(256)
call(x, w, b, r.clone())
print("TIMED", flush=True)
ptr = r.data_ptr()
y = call(x, w, b, r)
assert y.data_ptr() == ptr
print("DONE", flush=True)
"""


def test_the_in_place_call_is_one_fused_convolution() -> None:
    """oneDNN adds into the residual as the convolution's own sum post-op (one primitive),
    not torch's fallback (a separate output, then an add: what the in-place form does when it
    cannot fuse, which would allocate anyway)."""
    env = {**os.environ, "ONEDNN_VERBOSE": "1", "OMP_NUM_THREADS": "1"}
    out = subprocess.run([sys.executable, "-c", _VERBOSE], env=env, capture_output=True,
                         text=True, timeout=300, check=True).stdout
    part = out.split("TIMED")[1].split("DONE")[0]
    execs = [ln for ln in part.splitlines() if ln.startswith("onednn_verbose,v1,primitive,exec")]
    assert len(execs) == 1 and ",convolution," in execs[0] \
        and "attr-post-ops:sum" in execs[0], part
