"""The canonical ir-v1 printer. `print_module(parse(t)) == t` for every `t` it produced."""

from __future__ import annotations

import json
import math

import sympy

from ember.ir.dtypes import DType
from ember.ir.expr import INT64_MAX, INT64_MIN, to_text
from ember.ir.graph import Arg, Graph, Kernel, Loc, Module, Node, Ref, Symbol, Value
from ember.ir.types import Type


class PrintError(ValueError):
    """The module holds something ir-v1 text cannot express (e.g. `\"\"\"` in a kernel)."""


def print_module(m: Module) -> str:
    parts = [f"ember.ir {m.version[0]}.{m.version[1]}\n"]
    if m.symbols:
        parts.append("".join(print_symbol(s) + "\n" for s in m.symbols.values()))
    for item in m.items.values():
        parts.append(print_graph(item) if isinstance(item, Graph) else print_kernel(item))
    return "\n".join(parts)


def print_symbol(s: Symbol) -> str:
    text = f"symbol {s.name}"
    if s.hint is not None:
        text += f" hint={_int(s.hint)}"
    if s.min is not None:
        text += f" min={_int(s.min)}"
    if s.max is not None:
        text += " max=inf" if s.max == math.inf else f" max={_int(int(s.max))}"
    return text


def print_kernel(k: Kernel) -> str:
    if '"""' in k.source:
        raise PrintError(f'kernel @{k.name}: its source contains """, which ir-v1 cannot hold')
    return f'kernel @{k.name} {k.lang} """{k.source}"""\n'


def print_graph(g: Graph) -> str:
    params = ", ".join(f"%{p.name}: {p.type}" for p in g.params)
    results = ", ".join(str(t) for t in g.result_types)
    head = f"graph @{g.name}({params}) -> ({results})"
    if g.attrs:
        head += " attrs(" + ", ".join(f"{k}={print_arg(v)}" for k, v in g.attrs.items()) + ")"
    lines = [head + " {"]
    lines += ["  " + print_node(n) for n in g.nodes]
    lines.append("  return (" + ", ".join(f"%{o.name}" for o in g.outputs) + ")")
    lines.append("}")
    return "\n".join(lines) + "\n"


def print_node(n: Node) -> str:
    if not n.results:
        raise PrintError(f"{n.op}: a node needs at least one result in ir-v1")
    res = ", ".join(f"%{r.name}" for r in n.results)
    args = [print_arg(a) for a in n.args] + [f"{k}={print_arg(v)}" for k, v in n.kwargs.items()]
    text = f"{res} = {n.op}({', '.join(args)}) : {print_rtype([r.type for r in n.results])}"
    if n.loc is not None:
        text += " " + print_loc(n.loc)
    return text


def print_rtype(types: list[Type]) -> str:
    if len(types) == 1:
        return str(types[0])
    return "(" + ", ".join(str(t) for t in types) + ")"


def print_loc(loc: Loc) -> str:
    text = f"loc({json.dumps(loc.file)}:{_int(loc.line)}"
    if loc.col is not None:
        text += f":{_int(loc.col)}"
    return text + ")"


def _int(v: int) -> str:
    if not INT64_MIN <= v <= INT64_MAX:
        raise PrintError(f"integer {v} does not fit in 64 bits")
    return str(v)


def print_arg(a: Arg) -> str:
    if isinstance(a, Value):
        return f"%{a.name}"
    if isinstance(a, Ref):
        return f"@{a.name}"
    if a is None:
        return "none"
    if isinstance(a, bool):
        return "true" if a else "false"
    if isinstance(a, int):
        return _int(a)
    if isinstance(a, float):
        return repr(a)  # exactly Python's repr: round-trips the float's bits
    if isinstance(a, str):
        return json.dumps(a)
    if isinstance(a, DType):
        return a.name
    if isinstance(a, list):
        return "[" + ", ".join(print_arg(x) for x in a) + "]"
    if isinstance(a, sympy.Expr):
        return to_text(a)
    raise PrintError(f"{type(a).__name__} is not an ir-v1 argument: {a!r}")
