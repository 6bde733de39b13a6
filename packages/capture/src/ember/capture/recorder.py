"""Recording: torch operations run on fake tensors under a dispatch mode; every ATen operator
that reaches the mode becomes a node of the graph being built, with the user's source location.

The mode sits above torch's FakeTensorMode, so it sees ATen after composite ops have decomposed
(linear arrives as t + addmm). Metadata queries (`prim.*`) are passed through unrecorded. Real
tensors that reach an operator (`torch.tensor([...])` literals, tensors held by library code) are
lifted to graph inputs that the compiled code holds by reference.

Mutation is functionalized (`functionalize.py`): a view operator's results remember their parent
and how they were made; an in-place operator, an `out=` operator or batch norm's running-stat
update becomes its functional form, and the new value flows to the written tensor's root through
view inverses. Written graph inputs become `input_updates`; returned tensors that alias inputs or
each other become an output plan the runtime replays as views (`result.OutAlias`).
"""

from __future__ import annotations

import contextlib
from collections import Counter
from collections.abc import Callable, Iterator
from typing import Any

import torch
from torch._subclasses.fake_tensor import FakeTensor, FakeTensorMode
from torch.utils._python_dispatch import TorchDispatchMode

from ember.capture.customops import custom_op_problem, torch_op_effect
from ember.capture.errors import unhandled
from ember.capture.functionalize import Aliases, ViewStep, storage_key, view_steps
from ember.capture.quiet import quiet_torch_errors
from ember.capture.result import OutAlias, OutResult, OutSpec, OutTensor, Update
from ember.capture.sources import (
    ConstantSource,
    ModuleMemberSource,
    Source,
    describe,
    param_name,
)
from ember.capture.symbolic import (
    Layout,
    current_env,
    current_policy,
    note_slice,
    symbolic_layout,
)
from ember.ir import BOOL, F64, I64, DType, GraphBuilder, Loc, Module, TensorType, Type, Value
from ember.ir.expr import symbol
from ember.ir.graph import BIND_SYMBOL
from ember.ir.torch_ops import ir_name
from ember.ir.types import device_text

_LIFT = ("aten::lift_fresh", "aten::lift_fresh_copy")
# batch norm overloads that update running statistics in training (native_batch_norm's schema
# does not say so): (index of `training` or None when always training, of momentum, of eps)
_BATCH_NORMS = {"aten.native_batch_norm.default": (5, 6, 7),
                "aten._native_batch_norm_legit.default": (5, 6, 7),
                "aten._batch_norm_with_update.default": (None, 5, 6),
                # what aten.batch_norm dispatches to on a GPU (f32/f16 on cuDNN, ROCm's MIOpen)
                "aten.cudnn_batch_norm.default": (5, 6, 7),
                "aten.miopen_batch_norm.default": (5, 6, 7)}
_BN_FUNCTIONAL = torch.ops.aten._native_batch_norm_legit_functional.default


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
        self.aliases = Aliases(self)
        self._param_of: dict[int, Value] = {}  # input fake id -> its graph parameter
        # what the caller gets back, by OutTensor index: before `output`, (fake, root, steps)
        self._plan_keys: dict[int, int] = {}
        self._plan_src: list[tuple[torch.Tensor, torch.Tensor, list[ViewStep]]] = []
        self.plan: list[OutResult | OutAlias] = []
        self.updates: list[Update] = []
        self.pinned: list[Value] = []  # parameters the runtime reads (view bases): never pruned
        self._pending: list[tuple[str, Value, int, bool]] = []
        # dynamic inputs: source -> (symbolic shape, symbolic strides)
        self.sym_layouts: dict[Source, tuple[tuple[Any, ...], tuple[Any, ...]]] = {}
        # fakes whose metadata the function read (`y.shape`): kept guarded when pruned
        self.observed: set[int] = set()

    # -- inputs -----------------------------------------------------------------------------
    def lift(self, real: torch.Tensor, source: Source) -> FakeTensor:
        """Make `real` a graph input read from `source`; return its fake tensor."""
        if real.layout is not torch.strided:
            raise unhandled(f"a {real.layout} tensor input (only strided tensors are captured)")
        if type(real) not in (torch.Tensor, torch.nn.Parameter) and not isinstance(
                real, torch.nn.parameter.Buffer):
            raise unhandled(f"a tensor subclass input ({type(real).__qualname__})")
        layout = self._symbolic_layout(real, source)
        with _no_modes():
            if layout is None:
                fake = self.fake_mode.from_tensor(real, static_shapes=True)
            else:  # dynamic dims at their probe sizes (symbolic.py)
                with self.fake_mode:
                    fake = torch.empty_strided(  # type: ignore[assignment]
                        layout[2], layout[3], dtype=real.dtype, device=real.device)
                fake.requires_grad_(real.requires_grad)
                self.sym_layouts[source] = (layout[0], layout[1])
        name = param_name(source)
        v = self.gb.param(name, TensorType.of(fake))
        self._bind(fake, v)
        self._param_of[id(fake)] = v
        self.aliases.add_input(fake)
        self.input_sources.append(source)
        self.input_examples.append(real)
        return fake

    def _symbolic_layout(self, real: torch.Tensor, source: Source) -> Layout | None:
        """The symbolic layout of a dynamic input: plain tensors the caller passes, dense and
        alone in their storage (a view of another input keeps its static shape). A module's
        buffers stay static, as its parameters do (a rotary table's size is not a sequence
        length, whatever `dynamic=True` says; torch keeps module tensors static too)."""
        env, policy = current_env(), current_policy()
        if env is None or policy is None or type(real) is not torch.Tensor or \
                isinstance(source, ConstantSource) or real.storage_offset() != 0 or \
                isinstance(source, ModuleMemberSource) and source.table == "_buffers" or \
                real.untyped_storage().nbytes() != real.numel() * real.element_size():
            return None
        where = describe(source)
        dims = policy.dims(where, real)
        if not dims:
            return None
        return symbolic_layout(env, tuple(real.shape), tuple(real.stride()), dims, where)

    def lift_constant(self, real: torch.Tensor) -> FakeTensor:
        """A real tensor reached without a source (a literal's data, a tensor held by library
        code): a graph input the compiled code holds by reference."""
        return self.lift(real, ConstantSource(real, "tensor"))

    # -- values -----------------------------------------------------------------------------
    def _bind(self, fake: torch.Tensor, v: Value) -> None:
        if id(fake) not in self._values:
            self._keep.append(fake)
        self._values[id(fake)] = v

    def rebind(self, fake: torch.Tensor, v: Value) -> None:
        """`fake` now holds `v` (after a write, or a view regenerated after one)."""
        self._bind(fake, v)

    def value_of(self, fake: torch.Tensor) -> Value | None:
        v = self._values.get(id(fake))
        if v is None:
            return None
        return self.aliases.current(fake, v)

    def is_fake(self, t: Any) -> bool:
        return isinstance(t, FakeTensor) and t.fake_mode is self.fake_mode

    def emit(self, op: str, args: list[Any], kwargs: dict[str, Any], type: TensorType,
             name: str) -> Value:
        """One node whose tensor arguments are IR values already (functionalization's own)."""
        ir_args = [a if isinstance(a, Value) else self._arg(a) for a in args]
        ir_kwargs = {k: a if isinstance(a, Value) else self._arg(a) for k, a in kwargs.items()}
        self.op_counts[op] += 1
        return self.gb.op(op, ir_args, ir_kwargs, type=type, name=name, loc=self.where())

    # -- running torch code -----------------------------------------------------------------
    @contextlib.contextmanager
    def active(self) -> Iterator[None]:
        with quiet_torch_errors(), self.fake_mode, self.mode:
            yield

    # -- outputs ----------------------------------------------------------------------------
    def output_tensor(self, fake: torch.Tensor) -> OutSpec:
        """The caller's view of a returned tensor: an index into the output plan."""
        key = id(fake)
        if key not in self._plan_keys:
            if self.value_of(fake) is None:
                raise unhandled("returning a tensor made outside the recorded operators")
            root, steps = self.aliases.chain(fake)
            self._plan_keys[key] = len(self._plan_src)
            self._plan_src.append((fake, root, steps))
        return OutTensor(self._plan_keys[key])

    def output(self) -> None:
        """End the graph: the returned tensors' values (a view's base, for views), then the new
        values of the written graph inputs."""
        results: list[Value] = []
        index: dict[int, int] = {}

        def result(v: Value) -> int:
            if id(v) not in index:
                index[id(v)] = len(results)
                results.append(v)
            return index[id(v)]

        env = current_env()
        for fake, root, steps in self._plan_src:
            if steps and env is not None and env.symbols and id(root) not in self.aliases.inputs:
                steps = []  # symbolic view sizes: returned as the result it is (no `_base`)
            if id(root) in self.aliases.inputs:  # a view of (or the very) caller's tensor
                p = self._param_of[id(root)]
                self.pinned.append(p)
                self._pending.append(("alias-input", p, len(self.plan), False))
                self.plan.append(OutAlias(None, None, tuple(steps), None))
                continue
            base = fake if not steps else root
            v = self.value_of(base)
            assert v is not None
            r = result(v)
            stride = _stride(base)
            self.plan.append(OutResult(r, stride) if not steps else
                             OutAlias(None, r, tuple(steps), stride))
        for root in self.aliases.written.values():
            if id(root) not in self.aliases.inputs:
                continue
            p = self._param_of[id(root)]
            v = self.value_of(root)
            assert v is not None
            if v is p:
                continue
            # an input only written (`out=` into an argument) is read by no node; the runtime
            # still needs it to write back into
            self.pinned.append(p)
            self._pending.append(("update", p, len(results), bool(root.requires_grad)))
            results.append(v)  # never shared: an update result is not returned to the caller
        self.gb.ret(results)

    def finish(self) -> None:
        """After inputs are pruned: parameter indices for updates and aliased outputs."""
        g = self.module.graph()
        pindex = {id(p): i for i, p in enumerate(g.params)}
        for kind, p, at, grad in self._pending:
            if kind == "update":
                self.updates.append(Update(pindex[id(p)], at, grad))
            else:
                a = self.plan[at]
                assert isinstance(a, OutAlias)
                self.plan[at] = OutAlias(pindex[id(p)], None, a.steps, None)
        if self.updates:
            g.attrs["input_updates"] = [[u.param, u.result] for u in self.updates]

    # -- the dispatch hook ------------------------------------------------------------------
    def dispatch(self, func: torch._ops.OpOverload, args: tuple[Any, ...],
                 kwargs: dict[str, Any]) -> Any:
        schema_name = func._schema.name
        if schema_name.startswith("prim::"):
            return func(*args, **kwargs)
        effect = torch_op_effect(func)  # before running it: fake tensors would drop the effect
        if effect is not None:
            raise unhandled(effect)
        if not schema_name.startswith("aten::"):  # a custom op: one opaque node, if it can be
            why = custom_op_problem(func)
            if why is not None:
                raise unhandled(why)
        if schema_name == "aten::_local_scalar_dense":
            return self._item(func, args, kwargs)
        if schema_name == "aten::nonzero" and not kwargs and len(args) == 1:
            got = self._nonzero(func, args[0])
            if got is not None:
                return got
        if func is torch.ops.aten.index.Tensor and not kwargs and len(args) == 2:
            got = self._mask_index(func, args[0], args[1])
            if got is not None:
                return got
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
        name = ir_name(func)
        if name in _BATCH_NORMS:
            out = self._batch_norm(func, args, kwargs)
            if out is not None:
                return out
        if func._schema.is_mutable:
            return self._mutation(func, args, kwargs)
        out = func(*args, **kwargs)
        if name == "aten.slice.Tensor" and len(args) > 2 and isinstance(out, torch.Tensor):
            d = args[1] if isinstance(args[1], int) else 0
            note_slice(args[0].shape[d], args[2], args[3] if len(args) > 3 else None,
                       out.shape[d])
        results = _flat_results(out)
        types: list[Type] | None = None
        at: list[int] | None = None
        if results is None:
            mixed = _mixed_results(out)
            if mixed is None:
                raise unhandled(f"operator {name} returned {type(out).__name__}, "
                                f"which a graph node cannot hold")
            results, types, at = mixed
        if not results:  # a query that returns a Python value: nothing to record
            return out
        ir_args = [self._arg(a) for a in args]
        ir_kwargs = {k: self._arg(v) for k, v in kwargs.items()}
        base = args[0] if args and isinstance(args[0], torch.Tensor) else None
        is_view = base is not None and any(storage_key(r) == storage_key(base)
                                           for r in results)
        if base is not None and is_view and self.aliases.written_since_made(base) and \
                name in ("aten.view.default", "aten._unsafe_view.default"):
            name = "aten.reshape.default"  # the written base's value may have any layout
        if is_view and name == "aten.as_strided.default":
            assert base is not None
            # no storage_offset means the argument's own: say it, since the node (and the view
            # step an output replays) reads the root
            if (len(args) < 4 or args[3] is None) and kwargs.get("storage_offset") is None:
                ir_args = [*ir_args[:3], base.storage_offset()]
                ir_kwargs.pop("storage_offset", None)
                args = (*args[:3], base.storage_offset())
                kwargs = {k: v for k, v in kwargs.items() if k != "storage_offset"}
            base, ir_args[0] = self.aliases.as_strided_base(base)
        hint = schema_name.split("::")[-1]
        if types is None:
            types = [TensorType.of(r) for r in results]
        vals = self.gb.emit(name, ir_args, ir_kwargs, types=types, names=[hint] * len(types),
                            loc=self.where())
        if at is not None:
            vals = [vals[i] for i in at]
        for r, v in zip(results, vals, strict=True):
            self._bind(r, v)
        if is_view:
            assert base is not None
            self.aliases.add_views(base, results, view_steps(func, args, kwargs, results))
        self.op_counts[name] += 1
        return out

    def _item(self, func: torch._ops.OpOverload, args: tuple[Any, ...],
              kwargs: dict[str, Any]) -> Any:
        """`.item()` of a one-element integer tensor, in a capture with a shape environment:
        an unbacked symbol (symbolic.py) bound by `graph.bind_symbol`; its probe value is what
        the Python code sees (read back as the symbol). Anything else needs the data: the fake
        tensor raises, and capture breaks the graph there."""
        env = current_env()
        t = args[0] if args else None
        if env is None or kwargs or not isinstance(t, torch.Tensor) or not self.is_fake(t) or \
                t.numel() != 1 or t.dtype.is_floating_point or t.dtype.is_complex or \
                t.dtype == torch.bool or self.value_of(t) is None:
            return func(*args, **kwargs)
        loc = self.where()
        avoid = {d for v in self.gb.params + [r for n in self.gb.nodes for r in n.results]
                 if isinstance(v.type, TensorType) for d in v.type.shape if isinstance(d, int)}
        name, probe, le = env.unbacked_symbol(f"{loc.file}:{loc.line}" if loc else ".item()",
                                              avoid)
        ir_kwargs: dict[str, Any] = {"le": list(le)} if le else {}
        self.gb.op(BIND_SYMBOL, [self._arg(t), symbol(name)], ir_kwargs, type=I64, name=name,
                   loc=loc)
        self.op_counts[BIND_SYMBOL] += 1
        return probe

    def _nonzero(self, func: torch._ops.OpOverload, x: Any) -> Any:
        """`torch.nonzero(x)` in a capture with a shape environment: its row count is an
        unbacked symbol, bound from `(x != 0).sum()` before the op (the op's result is then
        declared `i64[u0, rank]`). None: not such a call (the fake tensor raises)."""
        env = current_env()
        if env is None or not self.is_fake(x) or self.value_of(x) is None or x.is_complex():
            return None
        xv = self._arg(x)
        dev = device_text(x.device)
        ne = self.emit("aten.ne.Scalar", [xv, 0], {}, TensorType(DType.b8, tuple(x.shape),
                                                                 None, dev), "ne")
        count = self.emit("aten.sum.default", [ne], {"dtype": torch.int64},
                          TensorType(DType.i64, (), None, dev), "count")
        loc = self.where()
        avoid = {d for v in self.gb.params + [r for n in self.gb.nodes for r in n.results]
                 if isinstance(v.type, TensorType) for d in v.type.shape if isinstance(d, int)}
        name, probe, le = env.unbacked_symbol(f"{loc.file}:{loc.line}" if loc else "nonzero",
                                              avoid)
        self.gb.op(BIND_SYMBOL, [count, symbol(name)], {"le": list(le)} if le else {},
                   type=I64, name=name, loc=loc)
        self.op_counts[BIND_SYMBOL] += 1
        out = torch.empty((probe, x.dim()), dtype=torch.int64, device=x.device)
        self._bind(out, self.emit(ir_name(func), [xv], {}, TensorType.of(out), "nonzero"))
        return out

    def _mask_index(self, func: torch._ops.OpOverload, x: Any, indices: Any) -> Any:
        """`x[mask]` (one boolean mask among the indices, the rest None or absent) in a capture
        with a shape environment: `x[nonzero(mask) columns]`, integer indexing on the mask's
        nonzero indices, whose count is an unbacked symbol (`_nonzero`). None otherwise."""
        if current_env() is None or not isinstance(indices, (list, tuple)):
            return None
        masks = [i for i, t in enumerate(indices) if isinstance(t, torch.Tensor)]
        if len(masks) != 1 or indices[masks[0]].dtype != torch.bool:
            return None
        p, mask = masks[0], indices[masks[0]]
        nz = self._nonzero(torch.ops.aten.nonzero.default, mask)
        if nz is None:
            return None
        nzv = self.value_of(nz)
        cols = []
        for k in range(mask.dim()):
            col = torch.ops.aten.select.int(nz, 1, k)
            self._bind(col, self.emit("aten.select.int", [nzv, 1, k], {}, TensorType.of(col),
                                      "col"))
            cols.append(col)
        new = [*indices[:p], *cols, *indices[p + 1:]]
        out = func(x, new)
        self._bind(out, self.emit(ir_name(func), [x, new], {}, TensorType.of(out), "index"))
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

    def _mutation(self, func: torch._ops.OpOverload, args: tuple[Any, ...],
                  kwargs: dict[str, Any]) -> Any:
        """An operator that writes its arguments: `self.op_(...)` or `op(..., out=t)` runs as
        its functional form, and each written tensor takes the result through its views."""
        name = ir_name(func)
        schema = func._schema
        written = [a for a in schema.arguments
                   if a.alias_info is not None and a.alias_info.is_write]
        functional: torch._ops.OpOverload | None
        if torch.Tag.inplace_view in func.tags:
            return self._metadata_mutation(func, args, kwargs)
        if name == "aten.index_put_.default":
            out = self._masked_put(func, args, kwargs)
            if out is not None:
                return out
        if [a.name for a in written] == [schema.arguments[0].name] and \
                schema.name.endswith("_"):
            functional = functional_variant(func)
            targets = [args[0]] if args else []
            fargs, fkwargs = _with_defaults(func, args, kwargs), kwargs
        elif written and all(a.kwarg_only for a in written):
            functional = out_variant_functional(func)
            outs = {a.name for a in written}
            targets = [kwargs.get(a.name) for a in written]
            fargs, fkwargs = args, {k: v for k, v in kwargs.items() if k not in outs}
        else:
            raise unhandled(f"operator {name} writes "
                            f"{', '.join(a.name for a in written) or 'its arguments'}")
        if functional is None:
            raise unhandled(f"in-place operator {name}: it has no functional variant")
        if not all(isinstance(t, torch.Tensor) and self.value_of(t) is not None
                   for t in targets):
            raise unhandled(f"operator {name}: its target is not a recorded tensor")
        # the functional form first: an `out=` of another shape is resized by the op (with a
        # deprecation warning unless empty), which capture leaves to eager (a graph break)
        # before the op has resized the fake tensor or warned
        res = _flat_results(functional(*fargs, **fkwargs))
        if not res or len(res) != len(targets):
            raise unhandled(f"operator {name}: its functional form {ir_name(functional)} "
                            f"returns {len(res or [])} tensors for {len(targets)} targets")
        for t, r in zip(targets, res, strict=True):
            if tuple(r.shape) != tuple(t.shape):
                raise unhandled(f"operator {name} resizes its output tensor from "
                                f"{list(t.shape)} to {list(r.shape)}")
        out = func(*args, **kwargs)  # the fake tensors' state and errors are eager's
        fname = ir_name(functional)
        vals = self.gb.emit(fname, [self._arg(a) for a in fargs],
                            {k: self._arg(v) for k, v in fkwargs.items()},
                            types=[TensorType.of(r) for r in res],
                            names=[schema.name.split("::")[-1].rstrip("_")] * len(res),
                            loc=self.where())
        self.op_counts[fname] += 1
        for t, r, v in zip(targets, res, vals, strict=True):
            if r.dtype != t.dtype:
                v = self.emit("aten._to_copy.default", [v], {"dtype": t.dtype}, TensorType.of(t),
                              "cast")
            self.aliases.write(t, v)
        return out

    def _metadata_mutation(self, func: torch._ops.OpOverload, args: tuple[Any, ...],
                           kwargs: dict[str, Any]) -> Any:
        """`y.t_()`, `y.transpose_(0, 1)`, `y.unsqueeze_(0)`, `y.as_strided_(...)`: y becomes
        a view (by the functional view op) of a snapshot of itself, which takes y's place in
        the alias chains; later writes through y reach its storage as through any view."""
        name = ir_name(func)
        functional = functional_variant(func)
        t = args[0] if args else None
        if functional is None or not isinstance(t, torch.Tensor):
            raise unhandled(f"in-place operator {name}: it changes the tensor's shape or "
                            f"strides, and ember knows no view operator doing the same")
        v = self.value_of(t)
        if v is None:
            raise unhandled(f"operator {name}: its target is not a recorded tensor")
        if id(t) in self.aliases.inputs:
            raise unhandled(f"in-place operator {name} on an input: it changes the caller's "
                            f"tensor's shape or strides, which a graph cannot return")
        snap = torch.ops.aten.alias.default(t)  # y as it is now (fake mode only: no node)
        self._bind(snap, v)
        self.aliases.take_place(t, snap)
        out = func(*args, **kwargs)  # the fake tensor's metadata changes as eager's does
        base, ir_base = snap, v
        if name == "aten.as_strided_.default":
            base, ir_base = self.aliases.as_strided_base(snap)
        fname = ir_name(functional)
        nv = self.gb.op(fname, [ir_base, *[self._arg(a) for a in args[1:]]],
                        {k: self._arg(x) for k, x in kwargs.items()}, type=TensorType.of(t),
                        name=func._schema.name.split("::")[-1].rstrip("_"), loc=self.where())
        self.op_counts[fname] += 1
        self.aliases.add_views(base, [t], view_steps(functional, (base, *args[1:]), kwargs,
                                                     [t]))
        self._bind(t, nv)
        return out

    def _masked_put(self, func: torch._ops.OpOverload, args: tuple[Any, ...],
                    kwargs: dict[str, Any]) -> Any:
        """`x[mask] = v` (one boolean mask over x's leading dims, one value): a `where`, which
        has no data-dependent size, unlike index_put with a mask. None: not such a call."""
        x, indices, values, accumulate = _bound(func, args, kwargs)
        if accumulate or len(indices) != 1 or not isinstance(indices[0], torch.Tensor):
            return None
        m = indices[0]
        if m.dtype != torch.bool or values.numel() != 1 or \
                tuple(m.shape) != tuple(x.shape[:m.dim()]) or self.value_of(x) is None:
            return None
        out = func(*args, **kwargs)
        mv = self._arg(m)
        if m.dim() < x.dim():
            shape = list(m.shape) + [1] * (x.dim() - m.dim())
            mv = self.emit("aten.reshape.default", [mv, shape], {},
                           TensorType(DType.b8, tuple(shape), None, device_text(m.device)),
                           "mask")
        vv = self._arg(values)
        if values.dim() or values.dtype != x.dtype:
            vv = self.emit("aten._to_copy.default", [vv], {"dtype": x.dtype},
                           TensorType(DType.from_torch(x.dtype), tuple(values.shape), None,
                                      device_text(values.device)), "value")
            if values.dim():
                vv = self.emit("aten.reshape.default", [vv, []], {},
                               TensorType(DType.from_torch(x.dtype), (), None,
                                          device_text(values.device)), "value")
        self.aliases.write(x, self.emit("aten.where.self", [mv, vv, self._arg(x)], {},
                                        TensorType.of(x), "index_put"))
        return out

    def _batch_norm(self, func: torch._ops.OpOverload, args: tuple[Any, ...],
                    kwargs: dict[str, Any]) -> Any:
        """Batch norm in training with running statistics: the functional form, whose updated
        statistics are written to running_mean and running_var. None: not such a call."""
        i_train, i_mom, i_eps = _BATCH_NORMS[ir_name(func)]
        a = _bound(func, args, kwargs)
        training = True if i_train is None else bool(a[i_train])
        rm, rv = a[3], a[4]
        if not training or not isinstance(rm, torch.Tensor) or not isinstance(rv, torch.Tensor):
            return None
        out = func(*args, **kwargs)
        fargs = (a[0], a[1], a[2], rm, rv, True, a[i_mom], a[i_eps])
        res = _flat_results(_BN_FUNCTIONAL(*fargs))
        assert res is not None
        fname = ir_name(_BN_FUNCTIONAL)
        vals = self.gb.emit(fname, [self._arg(x) for x in fargs], {},
                            types=[TensorType.of(r) for r in res],
                            names=["bn", "mean", "invstd", "running_mean", "running_var"],
                            loc=self.where())
        self.op_counts[fname] += 1
        orig = _flat_results(out) or []
        for i, o in enumerate(orig):
            if i < 3 and TensorType.of(o) == TensorType.of(res[i]):
                self._bind(o, vals[i])
            else:  # the reserve buffer of _batch_norm_with_update: empty
                self._bind(o, self.emit("aten.empty.memory_format", [list(o.shape)],
                                        {"dtype": o.dtype, "device": o.device}, TensorType.of(o),
                                        "reserve"))
        self.aliases.write(rm, vals[3])
        self.aliases.write(rv, vals[4])
        return out

    def _arg(self, a: Any) -> Any:
        if isinstance(a, torch.Tensor):
            v = self.value_of(a)
            if v is None:
                raise unhandled("a tensor made outside the recorded operators reached an "
                                "operator")
            self.aliases.check_read(a)
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


def _mixed_results(out: Any) -> tuple[list[torch.Tensor], list[Type], list[int]] | None:
    """A flat tuple of tensors among Nones and numbers (the fused attention kernels on CUDA:
    (output, logsumexp, cum_seq_q=None, cum_seq_k=None, max_q, max_k, philox seed, ...)) as
    one node: its tensors, the node's result types as the op's type inference writes them (a
    None has no result, a number is a scalar result; the decompositions take them so), and
    each tensor's position among those results. None for anything else."""
    if not isinstance(out, (list, tuple)):
        return None
    tensors: list[torch.Tensor] = []
    types: list[Type] = []
    at: list[int] = []
    for o in out:
        if isinstance(o, torch.Tensor):
            if o.layout != torch.strided:
                return None
            at.append(len(types))
            tensors.append(o)
            types.append(TensorType.of(o))
        elif isinstance(o, (bool, torch.SymBool)):
            types.append(BOOL)
        elif isinstance(o, (int, torch.SymInt)):
            types.append(I64)
        elif isinstance(o, (float, torch.SymFloat)):
            types.append(F64)
        elif o is not None:
            return None
    return tensors, types, at


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


def _bound(op: torch._ops.OpOverload, args: tuple[Any, ...], kwargs: dict[str, Any]
           ) -> list[Any]:
    """Every argument of a call, positional, by the schema (defaults filled in)."""
    out: list[Any] = []
    for i, a in enumerate(op._schema.arguments):
        if i < len(args):
            out.append(args[i])
        elif a.name in kwargs:
            out.append(kwargs[a.name])
        else:
            out.append(a.default_value if a.has_default_value() else None)
    return out


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


def out_variant_functional(op: torch._ops.OpOverload) -> torch._ops.OpOverload | None:
    """The functional overload of an `out=` overload (add.out -> add.Tensor): same packet,
    the same arguments without the written keyword-only ones, returning new tensors."""
    ns, name = op._schema.name.split("::")
    packet = getattr(getattr(torch.ops, ns), name, None)
    if packet is None:
        return None
    want = [(a.name, str(a.type)) for a in op._schema.arguments
            if not (a.alias_info is not None and a.alias_info.is_write)]
    for overload in packet.overloads():
        cand = getattr(packet, overload)
        sch = cand._schema
        if not sch.is_mutable and [(a.name, str(a.type)) for a in sch.arguments] == want:
            return cand  # type: ignore[no-any-return]
    return None


def _stride(t: torch.Tensor) -> tuple[int, ...]:
    return tuple(int(s) for s in t.stride())
