"""Straight-line Python for a compiled (kernels.*) graph: TorchInductor's output code `call()`.

The interpreter pays, on every node of every call, an op lookup, argument binding, a result type
check and (for `kernels.call`) the kernel's lookup and argument conversion. The wrapper does that
work once: it generates one Python function per graph that unpacks the inputs,
checks their dtypes and shapes, allocates each kernel's output with a constant shape on the call's
device (launch.out_buffer where it reuses a dead buffer), and calls the kernel's launcher
(launch.py; argument types set once) on the buffers' addresses or the tensors, as its ABI says. Nodes
other than `kernels.call` (`kernels.extern`, ops the C++ tables left to the reference) call their
op's reference directly, their tensor results checked like the interpreter checks them; an
extern whose op is a prim, a plain aten op or loop.index_select calls the torch function itself
(`direct`: constants converted once, no argument lists built per call). Where the checks of
`out_buffer` and `strided_view` hold by construction (a buffer reused at a static size, an
input's view with numeric coefficients) they are written into the source instead of called:
on a tiny transformer these per-call helpers were a fifth of the wrapper's time. A graph with
static shapes checks all its tensor inputs in one call where the runtime registered its C
checker (inputcheck.py), the per-input checks and copies running only where that check fails.
A kernel call on graph inputs alone (BatchNorm's folded scale and shift on the parameters)
runs only where those inputs changed since its last run (paramcache.py).

A graph with symbolic sizes binds its symbols once per call from the inputs' shapes (a few
attribute reads, `bind_sizes`), checks them against their declared ranges, and evaluates its
shapes (outputs allocated, inputs checked) and the kernels' size arguments as Python expressions
over them. A graph with random ops (%philox_seed/%philox_offset parameters) takes its other
inputs and draws from torch's seed at an offset it takes from the runner's counter
(random.PhiloxOffsets: one per runner, atomic; Wrapper.draw_from), as the interpreter's path
does. Graphs it does not cover raise `WrapperUnsupported`; the caller runs those through the
interpreter. The generated source comes only from this module's templates, value numbers,
the graph's integer shapes and size expressions (numbers, `s<digits>` names, operators:
`pyexpr`); IR text (value names in messages, attribute names) appears only as
`sanitize.py_str` literals, and every other constant is passed in the function's namespace,
never printed into the source.
"""

from __future__ import annotations

import keyword
import math
import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import sympy
import torch

from ember.inductor import paramcache
from ember.inductor.buffers import last_uses, out_call
from ember.inductor.inputcheck import InputCheck
from ember.inductor.launch import LoadedKernel, kernel, load_module, out_buffer, strided_view
from ember.inductor.sanitize import py_str, safe_text, short
from ember.ir import (
    Graph,
    Interpreter,
    Kernel,
    Module,
    Node,
    OpDef,
    Ref,
    RunResult,
    TensorType,
    Value,
)
from ember.ir.expr import PYTHON, as_sympy, is_loop_var, print_expr, simplify_dim
from ember.ir.graph import BIND_SYMBOL, is_unbacked, iter_values
from ember.ir.interpreter import bind_symbols, check_unbacked
from ember.ir.torch_ops import _as_declared, convert_args
from ember.prims import PRIMS_BY_OP
from ember.prims.decomp.random import PhiloxOffsets, philox_params


class WrapperUnsupported(Exception):
    """The graph needs the interpreter (the reason is the message)."""


class BoxedInputs(list[Any]):
    """Inputs handed over to a compiled graph (AOTAutograd's boxed calling convention): the
    generated call empties the list once it has unpacked it, and drops each input after its last
    use, so a training backward frees each saved tensor as soon as it is done with it."""


@dataclass
class Wrapper:
    graph: str
    source: str  # the generated Python, for dumps and debugging
    call: Callable[[Sequence[Any]], RunResult]

    def draw_from(self, offsets: PhiloxOffsets) -> Wrapper:
        """Random ops draw at `offsets` from now on (the runner's counter, shared by its
        graphs and its interpreter path; generate() gives each wrapper its own). Set here
        rather than passed to generate(): hooks that wrap generate() keep its signature."""
        globs = getattr(self.call, "__globals__", {})
        if "_take" in globs:
            globs["_take"] = offsets.take
        return self


# Extern ops that take their attributes once per node: op name -> bind(constant attributes)
# -> a callable of the node's operands (then, as keywords, the attributes that name values:
# attention's mask), returning its tensor result (a tuple of them where the node has several),
# contiguous (packed.py's convolution: the attribute checks and the argument list and dict the
# reference builds cost ~4 us a call, ~100 calls per CNN forward)
Binder = Callable[[dict[str, Any]], Callable[..., Any]]
_BINDERS: dict[str, Binder] = {}


def register_binder(op: str, bind: Binder) -> None:
    """Calls of extern op `op` in generated wrappers go through `bind(attributes)`."""
    _BINDERS[op] = bind


_SIZE_SYM = re.compile(r"[su][0-9]+")  # ir-v1's size symbols, which are Python names here


def pyexpr(e: Any) -> str:
    """A size expression as Python source over the call's bound symbols (ir-v1's `//` and
    `mod` are Python's): only numbers, symbol names and operators are printed."""
    return print_expr(e, PYTHON, _size_name, WrapperUnsupported)


def _size_name(name: str) -> str:
    if not _SIZE_SYM.fullmatch(name):
        raise WrapperUnsupported(f"symbol {short(name)!r} is not a size symbol")
    return name


def _shape(shape: Sequence[Any]) -> str:
    """A shape as a Python tuple expression: a static one as its repr (as before symbolic
    sizes), else over the bound symbols."""
    if all(isinstance(d, int) for d in shape):
        return repr(tuple(int(d) for d in shape))
    items = [pyexpr(d) for d in shape]
    return "(" + ", ".join(items) + ("," if len(items) == 1 else "") + ")"


def _free(a: Any, out: set[str]) -> None:
    """The size symbols in an argument, type or list of them."""
    if isinstance(a, TensorType):
        for d in a.shape:
            _free(d, out)
    elif isinstance(a, (list, tuple)):
        for x in a:
            _free(x, out)
    elif isinstance(a, sympy.Expr) and not isinstance(a, bool):  # (a view's loop variables
        out.update(s.name for s in a.free_symbols if not is_loop_var(s.name))  # are no sizes)


def _body_symbols(m: Module, a: Any, out: set[str], seen: set[str]) -> None:
    """The size symbols a loop body `a` (a Ref; nested bodies too) uses: a body the reference
    interpreter runs (a kernel no target table took) may read a size as a value (`prims.add(
    %v, s0)`) that none of its buffers' shapes carries."""
    item = m.items.get(a.name) if isinstance(a, Ref) and a.name not in seen else None
    if not isinstance(item, Graph):
        return
    seen.add(a.name)
    for p in item.params:
        _free(p.type, out)
    for n in item.nodes:
        for x in [*n.args, *n.kwargs.values()]:
            _free(x, out)
            _body_symbols(m, x, out, seen)
        for r in n.results:
            _free(r.type, out)


class _Gen:
    def __init__(self, module: Module, graph: Graph, interp: Interpreter):
        self.m, self.g, self.interp = module, graph, interp
        self.ns: dict[str, Any] = {"_empty": torch.empty, "RunResult": RunResult,
                                   "_interp": interp, "_unpack": _unpack, "_bad": _bad,
                                   "_contiguous": _contiguous, "_out": out_buffer}
        self.names: dict[Value, str] = {}
        self.params: set[Value] = set()
        self.buffers: set[Value] = set()  # contiguous by construction (kernel outputs)
        self.lines: list[str] = []
        self.table: dict[str, LoadedKernel] | None = None  # launch.load_module
        self.bound: list[str] = []  # the size symbols bound so far, as Python names
        self.batched = False  # the inputs' checks behind one batch check (`_ok`)
        self.kernel_only: set[Value] = set()  # inputs contiguous once checked (batch_check)
        self.cached: set[int] = set()  # kernel calls kept between calls (paramcache.py)
        self.kept: set[Value] = set()  # what may alias their results: never reused
        self.tests: list[str] = []  # their hit tests, placed before the first node's lines
        # buffers whose tensor keeps the shape of the buffer they reuse (`shape_free`)
        self.pyshape: dict[Value, list[Any]] = {}
        self.readers: dict[Value, list[Node]] = {}

    def const(self, x: Any) -> str:
        name = f"_c{len(self.ns)}"
        self.ns[name] = x
        return name

    def dtype(self, t: TensorType) -> str:
        name = f"_dt_{t.dtype.name}"
        self.ns[name] = t.dtype.torch
        return name

    def check(self, var: str, t: TensorType, what: str) -> None:
        shape = _shape(t.shape)
        self.lines.append(f"    if {var}.dtype is not {self.dtype(t)} or {var}.shape != "
                          f"{shape}: _bad({py_str(what)}, {var}, {self.const(t)})")

    def batch_check(self, params: list[str], start: int) -> None:
        """The input checks from line `start` on run only where one batch check of every
        tensor input fails (inputcheck.py): a graph with static shapes and tensor inputs."""
        tensors = [(p, n) for p, n in zip(self.g.params, params, strict=True)
                   if isinstance(p.type, TensorType)]
        types = [p.type for p, _ in tensors if isinstance(p.type, TensorType)]
        if not tensors or self.bound or any(not isinstance(d, int) for t in types
                                            for d in t.shape):
            return
        names = "".join(f"{n}, " for _, n in tensors)
        # inputs only kernels read: made contiguous once where the batch check fails (each
        # kernel call then takes the name as it is: no per-call copy line, no `del`)
        self.kernel_only = _kernel_operands_only(self.g)
        copies = [k for k, (p, _) in enumerate(tensors) if p in self.kernel_only]
        self.ns["_ic"] = InputCheck(types, [f"input %{p.name}" for p, _ in tensors], _bad,
                                    copies)
        # (the per-input checks, the lines from `start`, become InputCheck.each's loop)
        got = "".join(f"{tensors[k][1]}, " for k in copies)
        self.lines[start:] = [f"    _ok = _ic.check(_ic.types, ({names}), _ic.spec)",
                              f"    if not _ok: {got}{' = ' if got else ''}_ic.each(({names}))"]
        self.batched = True

    def bind_sizes(self, params: list[str]) -> None:
        """Bind the graph's size symbols from the inputs' shapes, once per call: a symbol that
        is some input's whole dim is read from it (after a rank check), any other one solved
        by the interpreter's binder; then each is checked against its declared range."""
        g = self.g
        used: set[str] = set()
        for p in g.params:
            _free(p.type, used)
        bodies: set[str] = set()
        for n in g.nodes:
            for a in [*n.args, *n.kwargs.values()]:
                _free(a, used)
                _body_symbols(self.m, a, used, bodies)
            for r in n.results:
                _free(r.type, used)
        used = {n for n in used if not is_unbacked(n)}  # bound by graph.bind_symbol (other())
        if not used:
            return
        for name in used:
            if not _SIZE_SYM.fullmatch(name):
                raise WrapperUnsupported(f"symbol {short(name)!r} is not a size symbol")
        where: dict[str, tuple[str, int]] = {}
        ranks: dict[str, int] = {}
        for p, pn in zip(g.params, params, strict=True):
            if not isinstance(p.type, TensorType):
                continue
            for i, d in enumerate(p.type.shape):
                if isinstance(d, sympy.Symbol) and d.name in used and d.name not in where:
                    where[d.name] = (pn, i)
                    ranks[pn] = p.type.rank
        for pn, rank in ranks.items():
            self.lines.append(f"    if len({pn}.shape) != {rank}: _bad('the rank of an input', "
                              f"{pn}, {rank})")
        rest = sorted(used - where.keys())
        inputs: set[str] = set()
        for p in g.params:
            _free(p.type, inputs)
        if set(rest) - inputs:
            raise WrapperUnsupported(f"size symbol(s) {', '.join(sorted(set(rest) - inputs))} "
                                     f"appear in no input's shape")
        if rest:  # symbols only inside compound dims (`s0 * 2`): the interpreter's solver
            self.ns["_bind"] = bind_symbols
            self.ns["_g"] = g  # (the parameters, not `inputs`: emptied when boxed)
            self.lines.append(f"    _env = _bind(_g, ({''.join(f'{p}, ' for p in params)}))")
        self.bound = sorted(used, key=lambda x: int(x[1:]))
        for name in self.bound:
            if name in where:
                pn, i = where[name]
                self.lines.append(f"    {name} = {pn}.shape[{i}]")
            else:
                self.lines.append(f"    {name} = _env[{py_str(name)}]")
            sym = self.m.symbols.get(name)
            lo = sym.min if sym is not None and sym.min is not None else 0
            hi = sym.max if sym is not None and isinstance(sym.max, int) else None
            cond = f"{name} < {int(lo)}" + (f" or {name} > {int(hi)}" if hi is not None else "")
            self.lines.append(f"    if {cond}: _bad_size({py_str(name)}, {name}, "
                              f"{self.const((lo, hi))})")
        self.ns["_bad_size"] = _bad_size

    def philox_inputs(self, params: list[str], rng: tuple[int, int, Any]) -> None:
        """Unpack the inputs of a graph with random ops: the caller gives the other inputs;
        the seed is torch's, the offset taken from the runner's counter, advanced by the
        graph's count (a size expression: once the sizes are bound, philox_take). A caller
        giving every parameter (a decomposed graph's own: `ember run`) gives the seed and
        offset itself, nothing taken (as random.run_with_philox)."""
        s, o, n = rng
        rest = [p for k, p in enumerate(params) if k not in (s, o)]
        self.ns["_seed"] = torch.initial_seed
        self.ns["_take"] = PhiloxOffsets().take  # (Wrapper.draw_from: the runner's)
        static = isinstance(n, int)
        self.lines.append(f"    if len(inputs) == {len(rest)}:")
        if rest:
            self.lines.append(f"        {', '.join(rest)}, = inputs")
        self.lines.append(f"        {params[s]}, {params[o]} = _seed(), "
                          f"{f'_take({int(n)})' if static else '0'}")
        if not static:
            self.lines.append("        _own = True")
        self.lines += ["    else:",
                       f"        if len(inputs) != {len(params)}: "
                       f"_bad('inputs', inputs, {len(rest)})",
                       f"        {', '.join(params)}, = inputs"]
        if not static:
            self.lines.append("        _own = False")

    def philox_take(self, offset: str, n: Any) -> None:
        """The offset of a call whose count is a size expression, over the bound sizes."""
        used: set[str] = set()
        _free(n, used)
        if used - set(self.bound):
            raise WrapperUnsupported(f"random ops count {short(str(n))} counters: a size "
                                     f"no input's shape binds")
        self.lines.append(f"    if _own: {offset} = _take({pyexpr(n)})")

    def name(self, v: Value) -> str:
        if v not in self.names:
            raise WrapperUnsupported(f"%{v.name} is used but not defined by the graph")
        return self.names[v]

    def arg(self, a: Any) -> str:
        if isinstance(a, Value):
            return self.name(a)
        if isinstance(a, list):
            return "[" + ", ".join(self.arg(x) for x in a) + "]"
        if isinstance(a, sympy.Expr) and not a.is_number:
            return pyexpr(a)  # a size over the call's bound symbols
        if isinstance(a, bool) or a is None or (isinstance(a, int) and not isinstance(a, bool)):
            return repr(a)
        return self.const(a)

    def generate(self) -> str:
        g = self.g
        params = [f"p{i}" for i in range(len(g.params))]
        self.params = set(g.params)
        for p, n in zip(g.params, params, strict=True):
            self.names[p] = n
        self.lines = ["def call(inputs):"]
        rng = philox_params(g)
        if rng is not None:
            self.philox_inputs(params, rng)
        else:
            self.lines.append(f"    if len(inputs) != {len(params)}: "
                              f"_bad('inputs', inputs, {len(params)})")
            if params:
                self.lines.append(f"    {', '.join(params)}, = inputs")
        self.lines.append("    if inputs.__class__ is _Boxed: inputs.clear()")
        self.ns["_Boxed"] = BoxedInputs
        start = len(self.lines)
        for p, n in zip(g.params, params, strict=True):
            if isinstance(p.type, TensorType):
                self.lines.append(f"    if {n}.__class__ is not _Tensor and not isinstance("
                                  f"{n}, _Tensor): _bad({py_str('input %' + p.name)}, {n}, "
                                  f"{self.const(p.type)})")
        self.bind_sizes(params)  # the shapes below may use the symbols
        if rng is not None and not isinstance(rng[2], int):
            self.philox_take(params[rng[1]], rng[2])
        for p, n in zip(g.params, params, strict=True):
            if isinstance(p.type, TensorType):
                self.check(n, p.type, f"input %{p.name}")
        self.batch_check(params, start)
        if paramcache.enabled() and not self.bound:
            self.cached, self.kept = paramcache.cacheable(g)
            self.ns["_store"] = paramcache.store
            self.ns["_key"] = paramcache.key
            self.ns["_same"] = paramcache.same
        self.ns["_Tensor"] = torch.Tensor
        top = len(self.lines)
        last = last_uses(g)
        for i, node in enumerate(g.nodes):
            if node.op == "kernels.call":
                self.kernel_call(i, node)
            else:
                self.other(i, node)
            # drop buffers as soon as they are dead: the allocator hands their (warm) memory
            # to the next allocations instead of faulting in fresh pages
            dead = [v for v in [*node.operands(), *node.results] if last.get(v, i) == i]
            if dead:
                self.lines.append(f"    del {', '.join(sorted({self.name(v) for v in dead}))}")
        self.lines[top:top] = self.tests
        skip = {r for _, r in g.input_updates}
        outs = [self.name(o) for k, o in enumerate(g.outputs) if k not in skip]
        ups = ", ".join(f"{p}: {self.name(g.outputs[r])}" for p, r in g.input_updates)
        self.lines.append(f"    return RunResult([{', '.join(outs)}], {{{ups}}})")
        return "\n".join(self.lines) + "\n"

    def kernel_call(self, i: int, node: Node) -> None:
        ref = node.args[0]
        assert isinstance(ref, Ref)
        if not isinstance(self.m.items.get(ref.name), Kernel):
            raise WrapperUnsupported(f"@{ref.name} is not a kernel")
        unknown = set(node.kwargs) - {"out_dtypes", "out_shapes", "reuse", "device", "sizes",
                                      "inplace"}
        if unknown:
            raise WrapperUnsupported(f"kernels.call with {', '.join(sorted(unknown))}")
        if self.table is None:
            self.table = load_module(self.m)
        k = kernel(self.table, ref.name)
        start = len(self.lines)
        dev = node.kwargs.get("device", "cpu")
        device = self.const(torch.device(dev if isinstance(dev, str) else "cpu"))
        ins: list[str] = []
        for j, a in enumerate(node.args[1:]):
            if not isinstance(a, Value):
                raise WrapperUnsupported(f"kernels.call takes buffers, got {a!r}")
            if a in self.buffers or a in self.kernel_only:  # (kernel_only: batch_check)
                ins.append(self.name(a))
            else:  # bound to a name, so the copy lives until the kernel has run
                name = f"c{i}_{j}"
                x = self.name(a)
                # (an input the batch check passed is contiguous: inputcheck.py)
                self.lines.append(f"    {name} = {x} if _ok else {x}.contiguous()"
                                  if self.batched and a in self.params
                                  else f"    {name} = {x}.contiguous()")
                ins.append(name)
        reuse = node.kwargs.get("reuse")
        reuse = reuse if isinstance(reuse, list) else []
        outs: list[str] = []
        for j, r in enumerate(node.results):
            if not isinstance(r.type, TensorType):
                raise WrapperUnsupported("kernels.call with a scalar result")
            name = f"v{i}_{j}"
            self.alloc(name, r, reuse[j] if j < len(reuse) else None, dev, device,
                       k.abi == "pointer")
            outs.append(name)
        given = node.kwargs.get("sizes")
        sizes = [pyexpr(s) for s in given] if isinstance(given, list) else []
        fn = self.const(k.launcher(len(ins) + len(outs), len(sizes)))
        # the kernel's ABI: data addresses ("pointer") or the tensors themselves, then the
        # size symbols' values
        conv = ".data_ptr()" if k.abi == "pointer" else ""
        self.lines.append(f"    {fn}({', '.join([*(f'{x}{conv}' for x in ins + outs), *sizes])})")
        copies = [x for x in ins if x.startswith("c")]
        if copies:
            self.lines.append(f"    del {', '.join(copies)}")
        if k.take_errors is not None:
            self.lines.append(f"    {self.const(k.check)}()")
        if i in self.cached:  # its inputs are graph inputs: run where they changed
            slot = self.const([paramcache.empty(len(node.args) - 1)])
            test, self.lines[start:] = paramcache.wrap(
                self.lines[start:], slot, [self.arg(a) for a in node.args[1:]], outs,
                len(self.tests) // 2)
            self.tests += test

    def alloc(self, name: str, r: Value, old: Any, dev: Any, device: str,
              loose: bool = False) -> None:
        """`name = ` a new buffer for result `r` (a tensor): `old`'s storage where reuse=
        names a dead buffer, else a new one (`loose`: a pointer-ABI kernel writes it)."""
        assert isinstance(r.type, TensorType)
        shape, dt = _shape(r.type.shape), self.dtype(r.type)
        if old in self.kept or r in self.kept:  # (a result kept between calls: paramcache)
            old = None
        if isinstance(old, Value) and isinstance(old.type, TensorType):
            # a dead buffer's storage, as the interpreter's kernels.call takes it
            new = self.reused(old, r, dev, loose) or \
                f"_out({shape}, {dt}, {device}, {self.name(old)})"
        else:  # (sizes as separate arguments: a tuple parses ~0.7 us slower)
            new = f"_empty({shape[1:-1].rstrip(',') or shape}, dtype={dt}, device={device})"
        self.lines.append(f"    {name} = {new}")
        self.names[r] = name
        self.buffers.add(r)

    def extern_out(self, i: int, node: Node) -> bool:
        """An extern with an out form (buffers.out_call) given a dead buffer by plan-buffers
        (reuse=): the form called with that buffer as out=, no allocation. False where it
        does not apply (the extern is then called as any other)."""
        reuse = node.kwargs.get("reuse")
        fn = out_call(node) if isinstance(reuse, list) and len(reuse) == 1 else None
        r = node.results[0]
        if fn is None or not isinstance(r.type, TensorType) or not isinstance(reuse, list):
            return False
        dev = r.type.device
        name = f"v{i}_0"
        self.alloc(name, r, reuse[0], dev, self.const(torch.device(dev)))
        args = ", ".join(self.arg(a) for a in node.args)
        self.lines.append(f"    {self.const(fn)}({args}, out={name})")
        return True

    def reused(self, old: Value, r: Value, dev: Any, loose: bool) -> str | None:
        """`out_buffer`'s reuse decided now, where its checks hold by construction: `old` is
        a buffer (contiguous: a kernel or made-contiguous extern output, its dtype checked),
        of the same dtype, device and static element count. A view of it then, no call; not
        even that where `loose` and `shape_free(r)`: `old` itself (a linear's [M, N] result
        an in-place kernel writes as [B, L, N]: the view and the reshape back to [M, N] for
        the next linear cost hf/mobilebert 84 lines, ~2.4 ms of 55 at 1 thread, cold)."""
        ot, t = old.type, r.type
        assert isinstance(t, TensorType)
        if old not in self.buffers or not isinstance(ot, TensorType) or ot.dtype != t.dtype \
                or ot.device != (dev if isinstance(dev, str) else "cpu") \
                or not all(isinstance(d, int) for d in (*ot.shape, *t.shape)) \
                or math.prod(ot.shape) != math.prod(t.shape):
            return None
        cur = self.pyshape.get(old, list(ot.shape))  # (the tensor's own shape)
        if cur == list(t.shape):
            return self.name(old)
        if loose and self.shape_free(r):
            self.pyshape[r] = cur
            return self.name(old)
        return f"{self.name(old)}.view({', '.join(str(int(d)) for d in t.shape) or '()'})"

    def shape_free(self, r: Value) -> bool:
        """Only pointer-ABI kernels (addresses) and reshapes (which give their own shape)
        read `r`, and it is no graph output: its tensor's shape need not be its type's."""
        if not self.readers:
            for n in self.g.nodes:
                for v in n.operands():
                    self.readers.setdefault(v, []).append(n)
        if any(o is r for o in self.g.outputs) or self.table is None:
            return False
        for n in self.readers.get(r, []):
            ref = n.args[0] if n.op == "kernels.call" else None
            if isinstance(ref, Ref) and ref.name in self.table \
                    and self.table[ref.name].abi == "pointer":
                continue
            if n.op != "kernels.view" or n.kwargs.get("op") != "prims.reshape" \
                    or any(v is r for v in iter_values(list(n.kwargs.values()))):
                return False
        return True

    def strided_view(self, i: int, node: Node) -> None:
        """A strided view of a buffer (any strides: an input's real ones are used); the index
        was checked against the buffer's shape by the type rule, and shapes are checked."""
        from ember.inductor.loopir import view_index
        x, r = node.args[0], node.results[0]
        if not isinstance(x, Value) or not isinstance(r.type, TensorType):
            raise WrapperUnsupported("kernels.view takes one buffer")
        _, (offsets, coefs) = view_index(node.args, node.kwargs)
        name = f"v{i}_0"
        shape = list(r.type.shape)
        rank = len(shape)
        perm = [row.index(1) for row in coefs] if all(
            sorted(row) == [0] * (rank - 1) + [1] for row in coefs) else []
        dims = [perm.index(k) for k in range(rank)] if sorted(perm) == list(range(rank)) \
            else []
        if dims and not any(offsets) and isinstance(x.type, TensorType) \
                and list(shape) == [x.type.shape[d] for d in dims]:
            # a permutation of the dims (a transposed weight), not a slice: cheapest call
            # (t() and separate ints parse faster than a list: ~0.9 / ~1.2 us vs ~1.8 us)
            how = "t()" if dims == [1, 0] else f"permute({', '.join(map(str, dims))})"
            self.lines.append(f"    {name} = {self.name(x)}.{how}")
        elif x in self.buffers and isinstance(x.type, TensorType):
            # a kernel or extern output: contiguous, so the strides are its shape's products
            st: list[Any] = [1] * x.type.rank
            for d in reversed(range(x.type.rank - 1)):
                st[d] = st[d + 1] * as_sympy(x.type.shape[d + 1])
            # simplify_dim/_shape: only numbers and size expressions are printed into the source
            strides = [simplify_dim(sum(c[k] * s for c, s in zip(coefs, st, strict=True)))
                       for k in range(len(shape))]
            off = simplify_dim(sum(o * s for o, s in zip(offsets, st, strict=True)))
            # (without an offset, as_strided keeps the tensor's own: one call less)
            at = "" if off == 0 else f", {self.name(x)}.storage_offset() + {pyexpr(off)}"
            self.lines.append(f"    {name} = {self.name(x)}.as_strided({_shape(shape)}, "
                              f"{_shape(strides)}{at})")
        elif all(isinstance(v, int) for v in [*offsets, *(c for row in coefs for c in row)]):
            # an input, numeric coefficients: launch.strided_view's sums written out over its
            # real strides (one stride() call, no Python helper)
            st_ = [f"_s[{j}]" for j in range(len(offsets))]
            sts = [_lin([(row[k], s) for row, s in zip(coefs, st_, strict=True)])
                   for k in range(len(shape))]
            off = _lin([(o, s) for o, s in zip(offsets, st_, strict=True)])
            xs = self.name(x)
            self.lines.append(f"    _s = {xs}.stride()")
            self.lines.append(f"    {name} = {xs}.as_strided({_shape(shape)}, "
                              f"({', '.join(sts)}{',' if len(sts) == 1 else ''})"
                              f"{'' if off == '0' else f', {xs}.storage_offset() + {off}'})")
        else:  # an input, symbolic coefficients: its real strides
            offs = _shape(offsets)
            cfs = "[" + ", ".join(_shape(row) for row in coefs) + "]"
            self.lines.append(f"    {name} = _strided({self.name(x)}, {_shape(shape)}, "
                              f"{offs}, {cfs})")
        self.ns["_strided"] = strided_view
        self.names[r] = name

    def bind_unbacked(self, i: int, node: Node) -> None:
        """`%n = graph.bind_symbol(%t, u0, le=[...])`: u0 is the tensor's value from here on,
        checked against its declared range and bounds (the interpreter's check)."""
        t, sym = node.args[0], node.args[1]
        if not isinstance(t, Value) or not isinstance(sym, sympy.Symbol) or \
                not _SIZE_SYM.fullmatch(sym.name):
            raise WrapperUnsupported("graph.bind_symbol takes a tensor and a symbol")
        le = node.kwargs.get("le", [])
        bounds = ", ".join(pyexpr(b) for b in le) if isinstance(le, list) else ""
        self.ns["_check_unbacked"] = check_unbacked
        name = sym.name
        self.lines.append(f"    {name} = int({self.name(t)}.item())")
        self.lines.append(f"    _check_unbacked({py_str(name)}, {name}, "
                          f"{self.const(self.m.symbols.get(name))}, [{bounds}])")
        self.lines.append(f"    v{i}_0 = {name}")  # (the node's value: dead values are deleted)
        self.bound.append(name)
        self.names[node.results[0]] = f"v{i}_0"

    def other(self, i: int, node: Node) -> None:
        if node.op == BIND_SYMBOL:
            self.bind_unbacked(i, node)
            return
        if node.op == "kernels.view" and node.kwargs.get("op") == "loop.view":
            self.strided_view(i, node)
            return
        rt = node.results[0].type if len(node.results) == 1 else None
        if node.op == "kernels.view" and node.kwargs.get("op") == "prims.reshape" \
                and isinstance(node.args[0], Value) and isinstance(rt, TensorType):
            # torch's reshape, as prims.reshape's reference, without the interpreter's call
            # (~25 us a view: a transformer training step has ~30); none where the tensor
            # has that shape already (a shape_free buffer; a product's [M, N] result that a
            # folded GELU's reshape pair leaves as it was; not an input or an output: eager
            # gives a new tensor)
            x = node.args[0]
            xt = x.type
            cur = self.pyshape.get(x)
            if cur is None and x in self.buffers and isinstance(xt, TensorType) \
                    and all(isinstance(d, int) for d in xt.shape) \
                    and not any(o is node.results[0] for o in self.g.outputs):
                cur = list(xt.shape)
            self.lines.append(f"    v{i}_0 = {self.name(x)}" if cur == list(rt.shape) else
                              f"    v{i}_0 = {self.name(x)}.reshape({_shape(list(rt.shape))})")
            self.names[node.results[0]] = f"v{i}_0"
            return
        if node.op == "kernels.extern" and self.extern_out(i, node):
            return
        kw = dict(node.kwargs)
        if node.op == "kernels.extern":
            kw.pop("reuse", None)
        name = kw.pop("op") if node.op == "kernels.extern" else node.op
        op = self.interp.registry.lookup(name) if isinstance(name, str) else None
        if op is None:
            raise WrapperUnsupported(f"unknown op {name}")
        names = [f"v{i}_{j}" for j in range(len(node.results))]
        direct = self.direct(op, node, kw) if node.op == "kernels.extern" else None
        tensors = all(isinstance(r.type, TensorType) for r in node.results)
        bind = _BINDERS.get(op.name) if node.op == "kernels.extern" else None
        late = {k: v for k, v in kw.items()  # attributes naming values: passed per call
                if next(iter_values([v]), None) is not None}
        if bind is not None and names and tensors and \
                all(k.isidentifier() and not keyword.iskeyword(k) for k in late):
            fn = self.const(bind({k: v for k, v in kw.items() if k not in late}))
            parts = [self.arg(a) for a in node.args] + [f"{k}={self.arg(v)}"
                                                        for k, v in late.items()]
            self.lines.append(f"    {', '.join(names)} = {fn}({', '.join(parts)})")
        elif direct is not None and len(names) == 1 and tensors:
            self.lines.append(f"    {names[0]} = {direct}.contiguous()")
        elif direct is not None and len(names) > 1 and tensors \
                and isinstance(op.torch_op, torch._ops.OpOverload):
            # a tuple of tensors; an undefined one (None: cuDNN attention's logsumexp) or a
            # count other than declared is the reference's to settle (torch_ops._as_declared)
            args = "[" + ", ".join(self.arg(a) for a in node.args) + "]"
            kwargs = "{" + ", ".join(f"{py_str(k)}: {self.arg(v)}" for k, v in kw.items()) + "}"
            bad = " or ".join(f"_r[{j}] is None" for j in range(len(names)))
            self.ns["_declared"] = _as_declared
            self.lines += [f"    _r = {direct}",
                           f"    if len(_r) != {len(names)} or {bad}: _r = _unpack(_declared("
                           f"{self.const(op.torch_op)}, {args}, {kwargs}, _r), {len(names)})",
                           f"    {', '.join(names)} = "
                           f"{', '.join(f'_r[{j}].contiguous()' for j in range(len(names)))}",
                           "    del _r"]
        else:
            args = "[" + ", ".join(self.arg(a) for a in node.args) + "]"
            kwargs = "{" + ", ".join(f"{py_str(k)}: {self.arg(v)}" for k, v in kw.items()) + "}"
            call = direct or f"{self.const(op.reference)}(_interp, {args}, {kwargs})"
            if direct is None and self.bound and any(isinstance(a, Ref) for a in node.args):
                # a loop body on the reference interpreter reads the call's sizes from its
                # env, as when the interpreter runs the whole graph (loopir.eval_body)
                env = ", ".join(f"{py_str(n)}: {n}" for n in self.bound)
                self.lines.append(f"    _interp.env = {{{env}}}")
            if node.op == "kernels.extern":  # extern results are buffers (kernels._extern_run)
                call = f"_contiguous({call})"
            self.lines.append(f"    {', '.join(names)}, = _unpack({call}, {len(names)})"
                              if names else f"    {call}")
        for r, n in zip(node.results, names, strict=True):
            self.names[r] = n
            if isinstance(r.type, TensorType):
                self.check(n, r.type, f"result of {node.op}")
                if node.op == "kernels.extern":  # made contiguous above
                    self.buffers.add(r)


    def direct(self, op: OpDef, node: Node, kw: dict[str, Any]) -> str | None:
        """An extern's call of its op's own callable, as its reference would call it: a
        prim's torch function (prims.matmul: torch.matmul; loop.index_select:
        torch.index_select), or an aten op's C++ entry with
        Tensor results, its constant arguments converted to torch's types now rather than
        on every call. None where the reference must run (other ops; aten ops with optional
        or list results)."""
        if not all(k.isidentifier() and not keyword.iskeyword(k) for k in kw):
            return None
        prim = PRIMS_BY_OP.get(op.name)
        t = op.torch_op
        if prim is not None and op.infer == prim.infer:  # registered by Prim.opdef
            fn: Any = _matmul_kernel(node) if op.name == "prims.matmul" else None
            fn = fn or prim.ref
            args, kwargs = list(node.args), kw
        elif isinstance(t, torch._ops.OpOverload) and op.effect is None and \
                [str(r.real_type) for r in t._schema.returns] == ["Tensor"] * len(node.results):
            fn = t._op  # what OpOverload.__call__ calls
            args, kwargs = convert_args(t, node.args, kw)
        elif op.name == "loop.index_select" and isinstance(kw.get("dim"), int) \
                and len(node.args) == 2:  # (loopir: torch.index_select(x, dim, ids))
            fn, args, kwargs = torch.index_select, [node.args[0], kw["dim"], node.args[1]], {}
        else:
            return None
        parts = [self.arg(a) for a in args] + [f"{k}={self.arg(v)}" for k, v in kwargs.items()]
        return f"{self.const(fn)}({', '.join(parts)})"


def _matmul_kernel(node: Node) -> Any:
    """torch.bmm (torch.mm) for a prims.matmul of two 3-d operands of one static batch size
    (two 2-d ones), its dtypes equal: what torch.matmul calls for them, without matmul's
    dispatch (~3 us a call on the 2-core Xeon, levit_128s's attention makes 16 a forward);
    None otherwise."""
    ts = [a.type for a in node.args if isinstance(a, Value)]
    if len(node.args) != 2 or len(ts) != 2 or node.kwargs.keys() - {"op", "reuse"} or \
            not all(isinstance(t, TensorType) for t in ts):
        return None
    a, b = ts
    assert isinstance(a, TensorType) and isinstance(b, TensorType)
    if a.dtype != b.dtype or a.rank != b.rank:
        return None
    if a.rank == 2:
        return torch.mm
    if a.rank == 3 and isinstance(a.shape[0], int) and a.shape[0] == b.shape[0]:
        return torch.bmm
    return None


def _lin(terms: list[tuple[int, str]]) -> str:
    """sum(c * name) as Python source over integer coefficients ("0" when empty)."""
    out = [n if c == 1 else f"{n} * {int(c)}" for c, n in terms if c != 0]
    return " + ".join(out) or "0"


def _kernel_operands_only(g: Graph) -> set[Value]:
    """The graph's inputs used only as operands of kernel calls (not returned, not read by
    any other node): a contiguous copy of one stands for it everywhere."""
    params = set(g.params)
    bad: set[Value] = {o for o in g.outputs if isinstance(o, Value)}
    used: set[Value] = set()
    for n in g.nodes:
        ops = n.args[1:] if n.op == "kernels.call" else []
        for a in ops:
            if isinstance(a, Value) and a in params:
                used.add(a)
        rest = [*(n.args if n.op != "kernels.call" else n.args[:1]), *n.kwargs.values()]
        bad.update(iter_values(rest))
    return (used - bad) & params


def _unpack(out: Any, n: int) -> list[Any]:
    """An op reference's return value as the node's list of results (as the interpreter does)."""
    if n == 1:
        if isinstance(out, (list, tuple)) and len(out) == 1:
            return [out[0]]
        return [out]
    outs = list(out) if isinstance(out, (list, tuple)) else [out]
    if len(outs) != n:
        raise RuntimeError(f"an op returned {len(outs)} results, the node declares {n}")
    return outs


def _contiguous(out: Any) -> Any:
    if isinstance(out, (list, tuple)):
        return tuple(x.contiguous() if isinstance(x, torch.Tensor) else x for x in out)
    return out.contiguous() if isinstance(out, torch.Tensor) else out


def _bad_size(name: str, v: int, bounds: tuple[int, int | None]) -> None:
    lo, hi = bounds
    raise RuntimeError(f"ember compiled graph: size symbol {name} is {v} by the inputs, outside "
                       f"its declared range [{lo}, {'inf' if hi is None else hi}]")


def _bad(what: str, x: Any, want: Any) -> None:
    got = (f"{x.dtype} {tuple(x.shape)}" if isinstance(x, torch.Tensor)
           else f"{len(x)}" if what == "inputs" else type(x).__name__)
    raise RuntimeError(f"ember compiled graph: {what} is {got}, expected {want}")


def generate(module: Module, graph: str | None = None,
             interp: Interpreter | None = None) -> Wrapper:
    """The straight-line `call(inputs) -> RunResult` of one graph of a compiled module (random
    ops draw at a counter of its own: Wrapper.draw_from shares the runner's)."""
    g = module.graph(graph)
    gen = _Gen(module, g, interp or Interpreter(module))
    source = gen.generate()
    code = compile(source, f"<ember wrapper @{safe_text(short(g.name))}>", "exec")
    ns = dict(gen.ns)
    exec(code, ns)  # our own generated source (see the module docstring), not user text
    return Wrapper(g.name, source, ns["call"])
