"""Recording: torch operations run on fake tensors under a dispatch mode; every ATen operator
that reaches the mode becomes a node of the graph being built, with the user's source location.

The mode sits above torch's FakeTensorMode, so it sees ATen after composite ops have decomposed
(linear arrives as t + addmm). Metadata queries (`prim.*`) are passed through unrecorded. Real
tensors that reach an operator (`torch.tensor([...])` literals, tensors held by library code) are
lifted to graph inputs that the compiled code holds by reference.

In-place operators on fresh intermediates that nothing else aliases (what dropout, `x += 1` on a
temporary, or cross_entropy's internals do) become their functional form, and the tensor's value
is rebound to the result. In-place updates of inputs or of views are refused here: full
functionalization (alias tracking, view inverses, write-back) is capture part 2.
"""

from __future__ import annotations

import contextlib
from collections import Counter
from collections.abc import Callable, Iterator
from typing import Any

import torch
from torch._subclasses.fake_tensor import FakeTensor, FakeTensorMode
from torch.utils._python_dispatch import TorchDispatchMode

from ember.capture.errors import unhandled
from ember.capture.sources import ConstantSource, Source, param_name
from ember.ir import DType, GraphBuilder, Loc, Module, TensorType, Value
from ember.ir.types import device_text

_LIFT = ("aten::lift_fresh", "aten::lift_fresh_copy")


class Recorder:
    """Builds one graph from the ATen operators run during capture."""

    def __init__(self, graph_name: str):
        self.module = Module()
        self.gb = GraphBuilder(self.module, graph_name)
        self.fake_mode = FakeTensorMode()
        self.mode = _RecordingMode(self)
        self._values: dict[int, Value] = {}
        self._keep: list[torch.Tensor] = []  # keeps ids in _values unique
        self.input_sources: list[Source] = []  # parallel to gb.params
        self.input_examples: list[torch.Tensor] = []
        self.op_counts: Counter[str] = Counter()
        self.where: Callable[[], Loc | None] = lambda: None  # the user's line, asked lazily
        self.entry_grad = torch.is_grad_enabled()
        self.grad_region = 0  # bumped at every grad-mode change: detaches are per region
        self._detached: dict[tuple[int, int], Value] = {}
        self._storage_users: dict[int, int] = {}  # storage -> how many tensors view it
        self._input_storages: set[int] = set()

    # -- inputs -----------------------------------------------------------------------------
    def lift(self, real: torch.Tensor, source: Source) -> FakeTensor:
        """Make `real` a graph input read from `source`; return its fake tensor."""
        if real.layout is not torch.strided:
            raise unhandled(f"a {real.layout} tensor input (only strided tensors are captured)")
        if type(real) not in (torch.Tensor, torch.nn.Parameter) and not isinstance(
                real, torch.nn.parameter.Buffer):
            raise unhandled(f"a tensor subclass input ({type(real).__qualname__})")
        with _no_modes():
            fake = self.fake_mode.from_tensor(real, static_shapes=True)
        name = param_name(source)
        v = self.gb.param(name, _type_of(fake))
        self._bind(fake, v)
        self._input_storages.add(_storage_key(fake))
        self.input_sources.append(source)
        self.input_examples.append(real)
        return fake

    def lift_constant(self, real: torch.Tensor) -> FakeTensor:
        """A real tensor reached without a source (a literal's data, a tensor held by library
        code): a graph input the compiled code holds by reference."""
        return self.lift(real, ConstantSource(real, "tensor"))

    # -- values -----------------------------------------------------------------------------
    def _bind(self, fake: torch.Tensor, v: Value) -> None:
        if id(fake) not in self._values:
            self._keep.append(fake)
            key = _storage_key(fake)
            self._storage_users[key] = self._storage_users.get(key, 0) + 1
        self._values[id(fake)] = v

    def value_of(self, fake: torch.Tensor) -> Value | None:
        return self._values.get(id(fake))

    def is_fake(self, t: Any) -> bool:
        return isinstance(t, FakeTensor) and t.fake_mode is self.fake_mode

    # -- running torch code -----------------------------------------------------------------
    @contextlib.contextmanager
    def active(self) -> Iterator[None]:
        with self.fake_mode, self.mode:
            yield

    def output(self, outputs: list[Value]) -> None:
        self.gb.ret(outputs)

    # -- the dispatch hook ------------------------------------------------------------------
    def dispatch(self, func: torch._ops.OpOverload, args: tuple[Any, ...],
                 kwargs: dict[str, Any]) -> Any:
        schema_name = func._schema.name
        if schema_name.startswith("prim::"):
            return func(*args, **kwargs)
        if schema_name in _LIFT:
            out = func(*args, **kwargs)
            src = args[0]
            if self.is_fake(src):
                v = self.value_of(src)
                if v is not None:
                    self._bind(out, v)
                return out
            fake = self.lift_constant(src)
            v = self.value_of(fake)
            assert v is not None
            self._bind(out, v)
            return out
        args, kwargs = self._lift_reals((args, kwargs))
        if func._schema.is_mutable:
            return self._inplace(func, args, kwargs)
        out = func(*args, **kwargs)
        results = _flat_results(out)
        if results is None:
            raise unhandled(f"operator {_ir_name(func)} returned {type(out).__name__}, "
                            f"which a graph node cannot hold")
        if not results:  # a query that returns a Python value: nothing to record
            return out
        ir_args = [self._arg(a) for a in args]
        ir_kwargs = {k: self._arg(v) for k, v in kwargs.items()}
        name = _ir_name(func)
        hint = schema_name.split("::")[-1]
        vals = self.gb.emit(name, ir_args, ir_kwargs, types=[_type_of(r) for r in results],
                            names=[hint] * len(results), loc=self.where())
        for r, v in zip(results, vals, strict=True):
            self._bind(r, v)
        self.op_counts[name] += 1
        return out

    def _lift_reals(self, tree: Any) -> Any:
        if isinstance(tree, torch.Tensor) and not self.is_fake(tree):
            if isinstance(tree, FakeTensor):
                raise unhandled("a fake tensor from another capture reached an operator")
            return self.lift_constant(tree)
        if isinstance(tree, (list, tuple)):
            out = [self._lift_reals(x) for x in tree]
            return tuple(out) if isinstance(tree, tuple) else out
        if isinstance(tree, dict):
            return {k: self._lift_reals(v) for k, v in tree.items()}
        return tree

    def _inplace(self, func: torch._ops.OpOverload, args: tuple[Any, ...],
                 kwargs: dict[str, Any]) -> Any:
        """`self.op_(...)` on a fresh, unaliased intermediate: emit `op(...)` and rebind."""
        name = _ir_name(func)
        written = [a.name for a in func._schema.arguments
                   if a.alias_info is not None and a.alias_info.is_write]
        target: Any = args[0] if args else None
        why = None
        if torch.Tag.inplace_view in func.tags:
            why = "it changes the tensor's shape or strides"
        elif written != [func._schema.arguments[0].name] or not isinstance(target, torch.Tensor):
            why = f"it writes {', '.join(written) or 'nothing visible'}"
        elif self.value_of(target) is None:
            why = "its target is not a recorded tensor"
        elif _storage_key(target) in self._input_storages:
            why = "it writes a graph input or a view of one"
        elif self._storage_users.get(_storage_key(target), 0) > 1:
            why = "its target shares memory with another tensor (a view)"
        elif not torch.is_grad_enabled() and target.requires_grad:
            why = "under no_grad it would hide the update from autograd"
        functional = None if why else functional_variant(func)
        if functional is None:
            why = why or "it has no functional variant"
            raise unhandled(f"in-place operator {name}: {why} (functionalization of inputs "
                            f"and views comes with capture part 2)")
        out = func(*args, **kwargs)  # keep the fake tensor's state as eager's
        args = _with_defaults(func, args, kwargs)
        res = functional(*args, **kwargs)
        ir_args = [self._arg(a) for a in args]
        ir_kwargs = {k: self._arg(v) for k, v in kwargs.items()}
        fname = _ir_name(functional)
        v = self.gb.op(fname, ir_args, ir_kwargs, type=_type_of(res),
                       name=func._schema.name.split("::")[-1].rstrip("_"), loc=self.where())
        self.op_counts[fname] += 1
        if res.dtype != target.dtype or tuple(res.shape) != tuple(target.shape):
            v = self.gb.op("aten._to_copy.default", [v], {"dtype": DType.from_torch(
                target.dtype)}, type=_type_of(target), name="cast", loc=self.where())
            self.op_counts["aten._to_copy.default"] += 1
        self._values[id(target)] = v
        return out

    def _arg(self, a: Any) -> Any:
        if isinstance(a, torch.Tensor):
            v = self.value_of(a)
            if v is None:
                raise unhandled("a tensor made outside the recorded operators reached an "
                                "operator")
            if not torch.is_grad_enabled() and self.entry_grad and a.requires_grad:
                v = self._detach(v)
            return v
        if isinstance(a, (list, tuple)):
            return [self._arg(x) for x in a]
        if a is None or isinstance(a, (bool, int, float, str)):
            return a
        if isinstance(a, torch.dtype):
            return DType.from_torch(a)
        if isinstance(a, torch.device):
            return device_text(a)
        if isinstance(a, (torch.layout, torch.memory_format)):
            return str(a).removeprefix("torch.")
        raise unhandled(f"an operator argument of kind {type(a).__name__} ({a!r}), which "
                        f"ir-v1 cannot write")

    def _detach(self, v: Value) -> Value:
        """Inside no_grad (entered from grad mode) an input that requires grad is cut from the
        autograd graph: running the graph then records no gradient through it, as in eager."""
        key = (id(v), self.grad_region)
        if key not in self._detached:
            self._detached[key] = self.gb.op("aten.detach.default", [v], type=v.type,
                                             name="detach", loc=self.where())
            self.op_counts["aten.detach.default"] += 1
        return self._detached[key]


class _RecordingMode(TorchDispatchMode):
    def __init__(self, recorder: Recorder):
        super().__init__()
        self.recorder = recorder

    def __torch_dispatch__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None
                           ) -> Any:
        return self.recorder.dispatch(func, tuple(args), dict(kwargs or {}))


@contextlib.contextmanager
def _no_modes() -> Iterator[None]:
    from torch.utils._python_dispatch import _disable_current_modes

    with _disable_current_modes():
        yield


def _flat_results(out: Any) -> list[torch.Tensor] | None:
    """The tensors an operator returned, in order; [] for a non-tensor result; None when the
    result mixes tensors with other things."""
    if isinstance(out, torch.Tensor):
        return [out]
    if isinstance(out, (list, tuple)):
        if out and all(isinstance(o, torch.Tensor) for o in out):
            return list(out)
        if any(isinstance(o, torch.Tensor) for o in out):
            return None
        return []
    return []


def _storage_key(t: torch.Tensor) -> int:
    return int(t.untyped_storage()._cdata)


def _with_defaults(op: torch._ops.OpOverload, args: tuple[Any, ...], kwargs: dict[str, Any]
                   ) -> tuple[Any, ...]:
    """Positional arguments with the schema's defaults filled in (the functional variant may
    not share them)."""
    out = list(args)
    for a in op._schema.arguments[len(args):]:
        if a.kwarg_only or a.name in kwargs or not a.has_default_value():
            break
        out.append(a.default_value)
    return tuple(out)


def functional_variant(op: torch._ops.OpOverload) -> torch._ops.OpOverload | None:
    """The out-of-place overload with the same arguments as in-place `op` (add_.Tensor ->
    add.Tensor, bernoulli_.float -> bernoulli.p), or None."""
    ns, name = op._schema.name.split("::")
    if not name.endswith("_"):
        return None
    packet = getattr(getattr(torch.ops, ns), name[:-1], None)
    if packet is None:
        return None
    want = [(a.name, str(a.type)) for a in op._schema.arguments]
    for overload in packet.overloads():
        cand = getattr(packet, overload)
        sch = cand._schema
        if sch.is_mutable or len(sch.returns) != 1:
            continue
        if [(a.name, str(a.type)) for a in sch.arguments] == want:
            return cand  # type: ignore[no-any-return]
    return None


def _type_of(t: torch.Tensor) -> TensorType:
    return TensorType(DType.from_torch(t.dtype), tuple(int(s) for s in t.shape), None,
                      device_text(t.device))


def _ir_name(op: torch._ops.OpOverload) -> str:
    return str(op._schema.name).replace("::", ".") + "." + (op._overloadname or "default")
