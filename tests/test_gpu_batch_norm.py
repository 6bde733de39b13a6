"""Batch norm in the forms a GPU capture records (issue 16: CUDA training fell back with "no
decomposition for aten.cudnn_batch_norm.default").

On a CUDA machine aten.batch_norm dispatches f32/f16 inputs to `aten.cudnn_batch_norm` (ROCm:
`aten.miopen_batch_norm`), which the recorder sees instead of native_batch_norm. Neither has a
CPU kernel, but capture records through fake tensors: a function calling the op directly is
captured on the CPU as a CUDA capture would record it. Compiled through the inductor (training:
ember's autograd), it must match eager's F.batch_norm: output, input and parameter gradients,
and the running statistics written back (capture turns the training call into the functional
form, as it does native_batch_norm); in evaluation the running statistics are used as they are.
"""

from __future__ import annotations

import warnings

import pytest
import torch
import torch.nn.functional as F

import ember.runtime as er
from ember.capture import capture
from ember.runtime.fallbacks import FallbackWarning

FORMS = {"cudnn": torch.ops.aten.cudnn_batch_norm.default,
         "miopen": torch.ops.aten.miopen_batch_norm.default}


def _inputs(seed: int = 0) -> tuple[torch.Tensor, ...]:
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(4, 3, 5, 5, generator=g)
    w, b = torch.randn(3, generator=g), torch.randn(3, generator=g)
    rm, rv = torch.randn(3, generator=g), torch.rand(3, generator=g) + 0.5
    return x, w, b, rm, rv


@pytest.mark.parametrize("form", sorted(FORMS))
def test_capture_records_the_functional_form_with_running_stats(form: str) -> None:
    op = FORMS[form]

    def f(x, w, b, rm, rv):  # type: ignore[no-untyped-def]
        return op(x, w, b, rm, rv, True, 0.1, 1e-5)[0]
    c = capture(f, _inputs(), {})
    ops = [n.op for g in c.module.graphs.values() for n in g.nodes]
    assert "aten._native_batch_norm_legit_functional.default" in ops
    assert op.name().replace("::", ".") + ".default" not in ops


@pytest.mark.parametrize("training", [True, False])
@pytest.mark.parametrize("form", sorted(FORMS))
def test_compiled_gpu_batch_norm_trains_like_eager(form: str, training: bool) -> None:
    op = FORMS[form]

    def f(x, w, b, rm, rv):  # type: ignore[no-untyped-def]
        return (op(x, w, b, rm, rv, training, 0.1, 1e-5)[0] * 1.5).relu()

    def ref(x, w, b, rm, rv):  # type: ignore[no-untyped-def]
        return (F.batch_norm(x, rm, rv, w, b, training, 0.1, 1e-5) * 1.5).relu()
    got_in, want_in = _inputs(), _inputs()
    for t in (*got_in[:3], *want_in[:3]):
        t.requires_grad_(True)
    cf = er.compile(f, backend="inductor")
    with warnings.catch_warnings():
        warnings.simplefilter("error", FallbackWarning)  # a fallback fails the test
        got = cf(*got_in)
    want = ref(*want_in)
    torch.testing.assert_close(got, want)
    cot = torch.randn_like(want)
    got_g = torch.autograd.grad(got, got_in[:3], cot)
    want_g = torch.autograd.grad(want, want_in[:3], cot)
    torch.testing.assert_close(got_g, want_g, rtol=1e-4, atol=1e-5)
    torch.testing.assert_close(got_in[3:], want_in[3:])  # running stats written back
    report = er.explain(cf)
    assert "0 fallback(s)" in str(report), report


def test_compiled_cudnn_batch_norm_without_running_stats() -> None:
    """Training without running statistics (track_running_stats=False): the op itself is
    recorded and decomposed, the reserve result an empty uint8 buffer as cuDNN's."""
    op = FORMS["cudnn"]

    def f(x, w, b):  # type: ignore[no-untyped-def]
        out, mean, invstd, reserve = op(x, w, b, None, None, True, 0.1, 1e-5)
        return out, mean, invstd, reserve
    x, w, b, _, _ = _inputs()
    cf = er.compile(f, backend="inductor")
    with warnings.catch_warnings():
        warnings.simplefilter("error", FallbackWarning)
        out, mean, invstd, reserve = cf(x, w, b)
    want = torch.ops.aten.native_batch_norm(x, w, b, None, None, True, 0.1, 1e-5)
    torch.testing.assert_close([out, mean, invstd], list(want))
    assert reserve.dtype == torch.uint8 and reserve.shape == (0,)
