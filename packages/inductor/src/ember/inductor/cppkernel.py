"""The loop structure of one C++ kernel: OpenMP across the outer loops, `omp simd` inner loops,
reductions computed once per outer index with vectorisable accumulators.

A kernel is a `loop.pointwise` node (its body may return several values: a multi-output kernel)
or a `loop.reduction` node. Every `loop.reduce` reachable from the body (also inside the bodies of
other reductions: softmax's sum reads its max) is collected once, keyed by its body and buffers,
and computed at depth k = len(its ranges) of the outer loops, before what reads it:

    #pragma omp parallel for                 (the outer loops, when the work is large)
    for i0:                                  (depth 0 .. k-1)
      red0 = amax over r of x[i0, r]         (the reductions of depth k, in dependency order;
      red1 = sum over r of exp(x - red0)      independent ones over the same domain share a loop)
      #pragma omp simd
      for i1: out0[i0, i1] = exp(x - red0) / red1

Float sums and max/min accumulate per SIMD lane (`omp simd reduction`) in blocks of `BLOCK`
elements whose partial sums are added in double: vectorised, and as accurate as eager's cascade
sum. max/min propagate NaN through a separate flag. prod, argmax and argmin keep one scalar
accumulator (double for float prod).
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

from ember.inductor.body import body_signature
from ember.inductor.cpp import (
    ACC_INIT,
    COMBINE,
    CodegenError,
    _cname,
    _describe,
    _int,
    _round,
    _store,
    _tensor,
    body_statements,
    cexpr,
    ctypes_of,
    dclass,
)
from ember.inductor.indexing import flat_offset, ivar, rvar
from ember.ir import DType, Graph, Node, Ref, Value

BLOCK = 4096  # elements per vectorised partial sum (then added in double)
PARALLEL_WORK = 32768  # element-steps below which a kernel stays on one thread
SIMD_KINDS = ("sum", "amax", "amin")

Key = tuple[object, ...]


@dataclass
class _Reduce:
    key: Key
    j: int  # the C++ names: red<j>, acc<j>, n<j>_...
    node: Node
    body: Graph
    args: dict[Value, str]
    kind: str
    k: int
    red: list[int]
    var: str
    deps: set[Key] = field(default_factory=set)

    @property
    def elem(self) -> DType:
        return _tensor(self.body.outputs[0]).dtype

    @property
    def rdt(self) -> DType:
        return _tensor(self.node.results[0]).dtype

    @property
    def simd(self) -> bool:
        return self.kind in SIMD_KINDS and dclass(self.elem) in ("f", "i")


class _Writer:
    def __init__(self, bodies: Mapping[str, object]):
        self.bodies = bodies
        self.reduces: dict[Key, _Reduce] = {}  # insertion order is a dependency order

    def sub(self, n: Node) -> Graph:
        ref = n.args[0]
        g = self.bodies.get(ref.name) if isinstance(ref, Ref) else None
        if not isinstance(g, Graph):
            raise CodegenError(f"loop.reduce: body {ref} not found")
        return g

    def key(self, n: Node, args: Mapping[Value, str]) -> Key:
        """Equal for reductions that compute the same thing: the same body (compared by
        structure: fusion may have copied it) over the same buffers and domains."""
        return (body_signature(self.bodies, self.sub(n)),
                tuple(args[a] for a in n.args[1:] if isinstance(a, Value)),
                str(n.kwargs["ranges"]), str(n.kwargs["reduce_ranges"]),
                n.kwargs["reduction"])

    def collect(self, body: Graph, args: Mapping[Value, str]) -> set[Key]:
        """Register every reduction `body` reads (nested ones first); its direct ones' keys."""
        direct: set[Key] = set()
        for n in body.nodes:
            if n.op != "loop.reduce":
                continue
            key = self.key(n, args)
            direct.add(key)
            if key in self.reduces:
                continue
            sub = self.sub(n)
            sargs = {sp: args[a] for sp, a in zip(sub.params, n.args[1:], strict=True)
                     if isinstance(a, Value)}
            deps = self.collect(sub, sargs)
            k = len(n.kwargs["ranges"])  # type: ignore[arg-type]
            if any(self.reduces[d].k > k for d in deps):
                raise CodegenError("a reduction reads one over a longer outer domain")
            red = [_int(d) for d in n.kwargs["reduce_ranges"]]  # type: ignore[union-attr]
            j = len(self.reduces)
            self.reduces[key] = _Reduce(key, j, n, sub, sargs, str(n.kwargs["reduction"]), k,
                                        red, f"red{j}", deps)
        return direct

    def value(self, args: Mapping[Value, str]) -> object:
        return lambda n: self.reduces[self.key(n, args)].var

    # ---- reductions ------------------------------------------------------------------------
    def level(self, k: int) -> list[str]:
        """The statements computing the reductions of depth k, grouped: independent SIMD
        reductions over the same domain share one pass."""
        groups: list[list[_Reduce]] = []
        for r in (r for r in self.reduces.values() if r.k == k):
            g = groups[-1] if groups else None
            if g is not None and r.simd and g[0].simd and g[0].red == r.red \
                    and not any(x.key in r.deps for x in g):
                g.append(r)
            else:
                groups.append([r])
        out: list[str] = []
        for g in groups:
            out += self.simd_group(g) if g[0].simd else self.scalar(g[0])
        return out

    def statements(self, r: _Reduce, j: int) -> list[str]:
        return body_statements(r.body, r.args, f"n{j}_", self.value(r.args))  # type: ignore

    def header(self, g: list[_Reduce]) -> list[str]:
        out = []
        for r in g:
            out.append(f"// {_describe(r.node)} @{r.body.name}: a reduction fused here")
            out.append(f"{ctypes_of(r.rdt)[1]} {r.var};")
        return out

    def simd_group(self, g: list[_Reduce]) -> list[str]:
        red = g[0].red or [1]
        inner = red[-1]
        init, lane, step, merge, final, clauses = [], [], [], [], [], []
        for r in g:
            j = r.j
            ct = ctypes_of(r.elem)[1]
            v = _cname(r.body.outputs[0], f"n{j}_")
            if r.kind == "sum":
                acc_t = "double" if dclass(r.elem) == "f" else "int64_t"
                lane_t = ct if dclass(r.elem) == "f" else "int64_t"
                init.append(f"{acc_t} acc{j} = 0;")
                lane.append(f"{lane_t} a{j} = 0;")
                clauses.append(f"reduction(+:a{j})")
                step.append(f"a{j} += {v};")
                merge.append(f"acc{j} += a{j};")
                final.append(f"{r.var} = {_round(r.rdt, f'({ct})acc{j}')};")
                continue
            op, cmp = ("max", ">") if r.kind == "amax" else ("min", "<")
            start = ACC_INIT[r.kind][dclass(r.elem)].format(S=ct)
            init.append(f"{ct} acc{j} = {start};")
            lane.append(f"{ct} a{j} = {start};")
            clauses.append(f"reduction({op}:a{j})")
            step.append(f"a{j} = a{j} {cmp} {v} ? a{j} : {v};")
            merge.append(f"acc{j} = acc{j} {cmp} a{j} ? acc{j} : a{j};")
            if dclass(r.elem) == "f":
                init.append(f"int nan{j} = 0;")
                clauses.append(f"reduction(|:nan{j})")
                step.append(f"nan{j} |= ({v} != {v});")
                final.append(f"{r.var} = {_round(r.rdt, f'nan{j} ? ({ct})NAN : acc{j}')};")
            else:
                final.append(f"{r.var} = acc{j};")
        last = f"r{len(red) - 1}"
        stmts = [s for r in g for s in self.statements(r, r.j)]
        vec = [f"#pragma omp simd {' '.join(clauses)}",
               f"for (int64_t {last} = rb; {last} < re; ++{last}) {{",
               *["  " + s for s in [*stmts, *step]], "}"]
        if inner > BLOCK:
            blocked = [f"for (int64_t rb = 0; rb < {inner}; rb += {BLOCK}) {{",
                       f"  const int64_t re = std::min<int64_t>(rb + {BLOCK}, {inner});",
                       *["  " + s for s in [*lane, *vec, *merge]], "}"]
        else:
            blocked = ["{", f"  const int64_t rb = 0, re = {inner};",
                       *["  " + s for s in [*lane, *vec, *merge]], "}"]
        body = loops("r", red[:-1], blocked)
        return [*self.header(g), "{", *["  " + s for s in [*init, *body, *final]], "}"]

    def scalar(self, r: _Reduce) -> list[str]:
        j = r.j
        cls = dclass(r.elem)
        if r.kind not in COMBINE or cls not in COMBINE[r.kind]:
            raise CodegenError(f"reduction {r.kind} over {r.elem.name} has no C++ form yet")
        acc_t = "double" if cls == "f" else "int64_t"
        if r.kind in ("amax", "amin", "argmax", "argmin"):
            acc_t = ctypes_of(r.elem)[1]
        init = ACC_INIT[r.kind][cls].format(S=acc_t)
        red = r.red or [1]
        roff = cexpr(flat_offset([rvar(k) for k in range(len(red))], red))
        v = _cname(r.body.outputs[0], f"n{j}_")
        body = loops("r", red, [*self.statements(r, j), f"{acc_t} v = {v};",
                                f"int64_t r = {roff}; (void)r;", COMBINE[r.kind][cls]])
        final = "arg" if r.kind in ("argmax", "argmin") else \
            _round(r.rdt, f"({ctypes_of(r.elem)[1]})acc")
        return [*self.header([r]), "{", f"  {acc_t} acc = {init};",
                "  int64_t arg = 0; (void)arg;", *["  " + s for s in body],
                f"  {r.var} = {final};", "}"]


def kernel_source(name: str, node: Node, body: Graph, provenance: str,
                  bodies: Mapping[str, object] | None = None) -> str:
    """One `extern "C"` function computing the loop node `node` whose body is `body`
    (`bodies`: the module's items, where `loop.reduce` nodes find their bodies). Its parameters
    are the body's buffers, then one pointer per output."""
    w = _Writer(bodies or {})
    ins = [f"const {ctypes_of(_tensor(p).dtype)[0]}* __restrict__ in{k}"
           for k, p in enumerate(body.params)]
    outs = [_tensor(r) for r in node.results]
    sig = ", ".join([*ins, *(f"{ctypes_of(t.dtype)[0]}* __restrict__ out{j}"
                             for j, t in enumerate(outs))])
    args = {p: f"in{k}" for k, p in enumerate(body.params)}
    ranges = [_int(d) for d in node.kwargs["ranges"]]  # type: ignore[union-attr]
    lines = [f"// kernel @{name}: {node.op} of {provenance}",
             *(f"// computes %{r.name}: {r.type}" for r in node.results),
             f'extern "C" void {name}({sig}) {{']
    off = cexpr(flat_offset([ivar(k) for k in range(len(ranges))], ranges))
    if node.op == "loop.pointwise":
        w.collect(body, args)
        stmts = body_statements(body, args, reduce_value=w.value(args))  # type: ignore
        store = [f"out{j}[{off}] = {_store(_tensor(o).dtype, _cname(o))};"
                 for j, o in enumerate(body.outputs)]
        inner = [*stmts, *store]
    else:  # loop.reduction: one reduce of depth len(ranges), stored
        red = [_int(d) for d in node.kwargs["reduce_ranges"]]  # type: ignore[union-attr]
        deps = w.collect(body, args)
        elem = _tensor(body.outputs[0]).dtype
        key: Key = ("@" + body.name, tuple(args.values()), "", "", "")
        j = len(w.reduces)
        w.reduces[key] = _Reduce(key, j, node, body, args, str(node.kwargs["reduction"]),
                                 len(ranges), red, f"red{j}", deps)
        var = w.reduces[key].var
        value = var if node.kwargs["reduction"] in ("argmax", "argmin") else _store(elem, var)
        inner = [f"out0[{off}] = {value};"]
    work = math.prod(ranges) + sum(math.prod(ranges[:r.k]) * max(1, math.prod(r.red))
                                   for r in w.reduces.values())
    parallel = bool(ranges) and work >= PARALLEL_WORK
    lines += ["  " + x for x in _nest(w, ranges, inner, parallel)]
    lines.append("}")
    return "\n".join(lines) + "\n"


def _nest(w: _Writer, ranges: Sequence[int], inner: list[str], parallel: bool) -> list[str]:
    """Loops i0.. with each depth's reductions computed before the deeper loops, the pointwise
    part innermost. OpenMP splits the outer loops that hold no reductions between them (all of
    them but the innermost in a pure pointwise kernel); the innermost pointwise loop is SIMD."""
    depth = max((r.k for r in w.reduces.values()), default=0)
    levels = {d: w.level(d) for d in range(depth + 1)}
    # the outer loops OpenMP may collapse: up to the first level that computes something
    first = next((d for d in range(depth + 1) if levels[d]), depth)
    n_par = first if first > 0 else max(1, len(ranges) - 1) if depth == 0 else 0
    n_par = min(n_par, len(ranges))

    def pragma(d: int) -> list[str]:
        if not parallel or d != 0 or n_par == 0:
            return []
        coll = f" collapse({n_par})" if n_par > 1 else ""
        if d == len(ranges) - 1 and depth == 0:
            return [f"#pragma omp parallel for simd{coll}"]
        return [f"#pragma omp parallel for{coll}"]

    def build(d: int) -> list[str]:
        out = list(levels.get(d, [])) if d <= depth else []
        if d >= len(ranges):
            return [*out, *inner]
        if d >= depth:  # only pointwise loops below
            out += pragma(d) + _simd_loops(d, ranges, inner, pragma(d) != [])
            return out
        out += pragma(d) + [f"for (int64_t i{d} = 0; i{d} < {ranges[d]}; ++i{d}) {{",
                            *["  " + s for s in build(d + 1)], "}"]
        return out
    return build(0)


def _simd_loops(d: int, ranges: Sequence[int], inner: list[str], has_pragma: bool
                ) -> list[str]:
    """Loops i<d>.. with `omp simd` on the innermost (unless it already carries the parallel
    pragma as `parallel for simd`)."""
    n = len(ranges)
    out = []
    for k in range(d, n):
        if k == n - 1 and not (has_pragma and k == d):
            out.append("  " * (k - d) + "#pragma omp simd")
        out.append("  " * (k - d) + f"for (int64_t i{k} = 0; i{k} < {ranges[k]}; ++i{k}) {{")
    out += ["  " * (n - d) + s for s in inner]
    out += ["  " * (k - d) + "}" for k in reversed(range(d, n))]
    return out


def loops(var: str, ranges: Sequence[int], inner: list[str]) -> list[str]:
    if not ranges:
        return list(inner)
    head = [f"for (int64_t {var}{k} = 0; {var}{k} < {cexpr(n)}; ++{var}{k}) {{"
            for k, n in enumerate(ranges)]
    return head + ["  " + x for x in inner] + ["}"] * len(ranges)
