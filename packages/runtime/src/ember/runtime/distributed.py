"""Compiled models under torch.distributed: DDP and FSDP2 (docs/distributed.md).

- `DDP(compile(model))`: DDP runs the compiled module like any module. A training graph
  compiled while DDP's forward runs (`DistributedDataParallel._get_active_ddp_module()`, DDP's
  own hook for compilers) is cut at DDP's gradient buckets (`ember.autograd.buckets`), each
  piece its own autograd node, so the all-reduce of the later pieces' buckets overlaps the
  earlier pieces' backward; explain notes the cut and the dumps hold it as the stage `buckets`.
- `compile(DDP(model))`: DDP's own forward (input scatter, reducer bookkeeping, buffer
  broadcast) runs as it is, and the module it wraps runs compiled: the same as above.
- FSDP2: `fully_shard` a block, then compile it, or compile it and then `fully_shard` it. A
  compiled module with hooks of its own (FSDP2's all-gather before the forward, reshard after)
  runs them around its compiled forward, as `nn.Module.__call__` would; the forward sees the
  gathered parameters, and their gradients flow into FSDP2's reduce-scatter hooks.
"""

from __future__ import annotations

import contextlib
import types
from collections.abc import Callable, Iterator, Sequence
from typing import TYPE_CHECKING, Any

import torch
from torch import nn

from ember.autograd.buckets import piece_modules, split_buckets
from ember.ir import Interpreter, Module

if TYPE_CHECKING:
    from ember.runtime.compile import CompiledFunction
    from ember.runtime.training import GraphRunner

Runner = Callable[[Sequence[Any]], list[Any]]



def _ddp_class() -> Any:
    if not torch.distributed.is_available():
        return None
    from torch.nn.parallel import DistributedDataParallel

    return DistributedDataParallel


def is_ddp(obj: Any) -> bool:
    cls = _ddp_class()
    return cls is not None and isinstance(obj, cls)


def active_ddp() -> Any:
    """The DDP module whose forward is running (None outside one)."""
    cls = _ddp_class()
    return None if cls is None else cls._get_active_ddp_module()


@contextlib.contextmanager
def _kept_rng(examples: Sequence[Any]) -> Iterator[None]:
    devices = sorted({x.device.index or 0 for x in examples
                      if isinstance(x, torch.Tensor) and x.device.type == "cuda"})
    with torch.random.fork_rng(devices=devices):
        yield


def _piece_examples(split: Module, graph: str, examples: Sequence[Any]) -> list[list[Any]]:
    """Every piece's inputs on the first call: the pieces run once on the reference
    interpreter with autograd on, so each crossing value requires grad exactly where eager's
    would (random draws leave torch's generator as it was)."""
    top = split.graph(graph)
    interp = Interpreter(split, check_types=False)
    env: dict[Any, Any] = dict(zip(top.params, examples, strict=True))
    out: list[list[Any]] = []
    with _kept_rng(examples), torch.enable_grad():
        for n in top.nodes:
            args = [env[v] for v in n.args[1:]]
            out.append(args)
            name = n.args[0].name  # type: ignore[union-attr]
            got = interp.call(name, args)
            env.update(zip(n.results, got, strict=True))
    return [[x.detach().requires_grad_(x.requires_grad) if isinstance(x, torch.Tensor)
             else x for x in xs] for xs in out]


def split_training(cf: CompiledFunction, module: Module, examples: Sequence[Any],
                   compile_graph: Callable[[Module], tuple[GraphRunner, str]]
                   ) -> Runner | None:
    """A training graph compiled inside DDP's forward, as pieces at DDP's gradient buckets
    (one autograd node each, chained); None where it is one bucket (or outside DDP)."""
    ddp = active_ddp()
    if ddp is None:
        return None
    owned = {id(p) for p in ddp.module.parameters() if p.requires_grad}
    params = [i for i, x in enumerate(examples) if id(x) in owned]
    split, plan = split_buckets(module, params, int(ddp.bucket_bytes_cap))
    if len(plan.starts) < 2:
        return None
    top = split.graph(module.graph().name)
    pieces = piece_modules(split, top.name)
    feeds = _piece_examples(split, top.name, examples)
    # results eager computes outside autograd (running stats), per piece
    outer_no_grad = {top.outputs[i] for i in cf._no_grad_results}
    runners: list[Runner] = []
    for n, xs in zip(top.nodes, feeds, strict=True):
        name = n.args[0].name  # type: ignore[union-attr]
        no_grad = {i for i, r in enumerate(n.results) if r in outer_no_grad}
        runners.append(cf._training(pieces[name], xs, compile_graph, no_grad=no_grad,
                                    split=False))
    cf.history.note(f"graph @{top.name}: DDP (bucket cap {ddp.bucket_bytes_cap} bytes): cut "
                    f"into {plan.text()}; each piece is its own autograd node, so its "
                    f"buckets' all-reduce overlaps the backward of the pieces before it")
    cf._last_stages.append(("buckets", str(split)))
    calls = [(n.args[1:], n.results) for n in top.nodes]
    params_of_top, outputs = top.params, top.outputs

    def run(inputs: Sequence[Any]) -> list[Any]:
        env: dict[Any, Any] = dict(zip(params_of_top, inputs, strict=True))
        for (args, results), runner in zip(calls, runners, strict=True):
            env.update(zip(results, runner([env[v] for v in args]), strict=True))
        return [env[o] for o in outputs]

    return run


class CompiledDDP(nn.Module):
    """`compile(DDP(model))`: DDP's forward as it is, the module it wraps compiled (so the
    reducer's bookkeeping and its hooks stay DDP's own)."""

    def __init__(self, ddp: nn.Module, inner: nn.Module):
        super().__init__()
        self._orig_mod = ddp
        object.__setattr__(self, "_ember_inner", inner)

    @property
    def compiled(self) -> Any:
        return self._ember_inner.compiled

    def forward(self, *args: Any, **kwargs: Any) -> Any:
        ddp: Any = self._orig_mod
        inner = self._ember_inner

        def run_inner(*inputs: Any, **kw: Any) -> Any:
            # DDP's own _run_ddp_forward, with the compiled module in place of the original
            with ddp._inside_ddp_forward():
                return inner(*inputs, **kw)

        ddp.__dict__["_run_ddp_forward"] = run_inner
        try:
            return ddp(*args, **kwargs)
        finally:
            ddp.__dict__.pop("_run_ddp_forward", None)

    def __getattr__(self, name: str) -> Any:
        try:
            return super().__getattr__(name)
        except AttributeError:
            return getattr(self._modules["_orig_mod"], name)


def hooked_forward(mod: nn.Module) -> Callable[..., Any]:
    """The body a module with hooks of its own compiles: its class's forward, bound (its hooks
    run around it, eagerly: `run_with_hooks`)."""
    return types.MethodType(type(mod).forward, mod)


def run_with_hooks(mod: nn.Module, body: Callable[..., Any], args: tuple[Any, ...],
                   kwargs: dict[str, Any]) -> Any:
    """`mod(*args, **kwargs)` with `body` as its forward: nn.Module.__call__ runs the module's
    hooks (FSDP2's all-gather and reshard) around the compiled body."""
    had = "forward" in mod.__dict__
    old = mod.__dict__.get("forward")
    mod.__dict__["forward"] = body
    try:
        return mod(*args, **kwargs)
    finally:
        if had:
            mod.__dict__["forward"] = old
        else:
            mod.__dict__.pop("forward", None)
