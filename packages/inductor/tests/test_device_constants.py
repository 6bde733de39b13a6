"""CPU constants moved to the device are computed on it (targets/device_constants.py).

Found on the H200: timm's edgenext builds `~torch.zeros(shape).to(device=...)`, captured as a
CPU `zeros` copied to cuda, and the CUDA graph was refused ("tensors on several devices"). No
GPU here: the meta device stands in for cuda (capture records the same nodes), and the checks
are on the rewritten graph's types (verified) and on what is left alone.
"""

from __future__ import annotations

from typing import Any

import pytest
import torch

from ember.capture import capture
from ember.inductor.targets import mixed_devices, scalar_inputs_to_device
from ember.ir import DType, Ref, TensorType, parse, verify
from ember.testing.triton_mode import NEEDS_CUDA


def _captured(fn: Any, *args: torch.Tensor) -> Any:
    with torch.no_grad():
        c = capture(fn, args, {})
    assert getattr(c, "module", None) is not None, c
    return c.module  # type: ignore[union-attr]


def made_then_moved(x: torch.Tensor) -> torch.Tensor:
    mask = ~torch.zeros(x.shape).to(device=x.device, dtype=torch.bool)
    return x * mask.cumsum(1, dtype=torch.float32)


def returned_on_cpu(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    z = torch.zeros(x.shape)
    return x + z.to(x.device), z


def test_a_cpu_constant_copied_to_the_device_is_made_there() -> None:
    m = _captured(made_then_moved, torch.randn(2, 3, device="meta"))
    assert set(mixed_devices(m)) == {"cpu", "meta"}
    moved = scalar_inputs_to_device(m)
    assert moved is not None and moved.positions == {}
    assert not mixed_devices(moved.module)
    zeros = next(n for n in moved.module.graph().nodes if n.op == "aten.zeros.default")
    assert zeros.kwargs["device"] == "meta"
    assert isinstance(zeros.results[0].type, TensorType)
    assert zeros.results[0].type.device == "meta"
    verify(parse(str(moved.module)))


def test_a_cpu_value_the_caller_gets_back_stays_refused() -> None:
    m = _captured(returned_on_cpu, torch.randn(2, 3, device="meta"))
    assert scalar_inputs_to_device(m) is None
    assert set(mixed_devices(m)) == {"cpu", "meta"}


def scaled_attention(q: torch.Tensor, k: torch.Tensor) -> torch.Tensor:
    # HF deberta-v2's `scaled_size_sqrt`: a CPU constant, a 0-dim mul and sqrt on the CPU, read
    # by the device's div as a scalar operand (found on the H200: "tensors on several devices")
    scale = torch.sqrt(torch.tensor(q.size(-1), dtype=torch.float) * 2)
    return torch.softmax(q @ (k.transpose(-1, -2) / scale), -1)


def randomly_scaled(x: torch.Tensor) -> torch.Tensor:
    return x * torch.rand(())


def _deberta_on(device: str) -> tuple[Any, tuple[torch.Tensor, torch.Tensor]]:
    q, k = torch.randn(2, 4, 8, device=device), torch.randn(2, 4, 8, device=device)
    return _captured(scaled_attention, q, k), (q, k)


def test_zero_dim_cpu_values_read_as_scalars_are_computed_on_the_device() -> None:
    m, _ = _deberta_on("meta")
    cpu = {u.producer for u in mixed_devices(m)["cpu"]}
    assert cpu == {"input", "aten.mul.Tensor", "aten.sqrt.default"}
    moved = scalar_inputs_to_device(m)
    assert moved is not None
    g = moved.module.graph()
    (at,) = moved.positions[g.name]  # the lifted constant, moved per call (once: same tensor)
    assert g.params[at].type == TensorType(DType.f32, (), None, "meta")
    sqrt = next(n for n in g.nodes if n.op == "aten.sqrt.default")
    assert sqrt.results[0].type == TensorType(DType.f32, (), None, "meta")
    assert not mixed_devices(moved.module)
    verify(parse(str(moved.module)))


def test_a_random_cpu_value_stays_refused() -> None:
    # the CPU's generator and the device's give different numbers: not moved
    m = _captured(randomly_scaled, torch.randn(2, 3, device="meta"))
    assert "cpu" in mixed_devices(m)
    assert scalar_inputs_to_device(m) is None


def test_the_cuda_target_compiles_the_scalar_chain_into_its_kernels() -> None:
    # code generation only (no GPU): the retyped graph on cuda:0 through inductor-cuda; the
    # sqrt of the moved constant is computed in a Triton kernel that takes it as an argument
    pytest.importorskip("triton", reason="the Triton target needs the triton package")
    import ember.inductor.targets.cuda  # noqa: F401  (the inductor-cuda pipelines)
    from ember.inductor.targets import module_devices
    from ember.ir.passes import run_pipeline

    m, _ = _deberta_on("meta")
    moved = scalar_inputs_to_device(m)
    assert moved is not None
    text = str(moved.module).replace("@meta", "@cuda:0").replace('"meta"', '"cuda:0"')
    on_cuda = parse(text)
    assert module_devices(on_cuda) == {"cuda:0"}  # one device: what target_for accepts
    out = run_pipeline(on_cuda, "decompose,cse,dce,inductor-cuda")
    g = out.graph()
    (c,) = [p for p in g.params if p.name.startswith("c_")]
    assert c.type == TensorType(DType.f32, (), None, "cuda:0")
    (call,) = [n for n in g.nodes if n.op == "kernels.call" and c in n.args]
    assert isinstance(call.args[0], Ref)
    name = call.args[0].name
    kernel = str(out).split(f"kernel @{name} ", 1)[1].split('"""', 2)[1]
    assert "tl.sqrt_rn(" in kernel and f"%{c.name}.load" in kernel


@NEEDS_CUDA
def test_deberta_scale_compiles_on_cuda_without_a_fallback() -> None:
    import ember.runtime as er

    q, k = torch.randn(2, 4, 8, device="cuda"), torch.randn(2, 4, 8, device="cuda")
    c = er.compile(scaled_attention)
    for _ in range(3):
        torch.testing.assert_close(c(q, k), scaled_attention(q, k))
    rep = er.explain(c)
    assert not rep.fallbacks, rep.fallback_summary
