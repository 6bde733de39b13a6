"""The canonical ir-v1 printer. `print_module(parse(t)) == t` for every `t` it produced."""

from __future__ import annotations

import json
import math
import re

import sympy

from ember.ir.dtypes import DTYPE_NAMES, DType
from ember.ir.expr import INT64_MAX, INT64_MIN, Dim, is_loop_var, loop_var_names, to_text
from ember.ir.graph import (
    LOOP_VARS_VERSION,
    UNBACKED_VERSION,
    Arg,
    Graph,
    Kernel,
    Loc,
    Module,
    Node,
    Ref,
    Symbol,
    Value,
    is_unbacked,
)
from ember.ir.types import TensorType, Type


class PrintError(ValueError):
    """The module holds something ir-v1 text cannot express (e.g. `\"\"\"` in a kernel)."""


# What the parser reads back; the printer refuses anything else rather than print unreadable text.
_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
_OPNAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*(\.[A-Za-z_][A-Za-z0-9_]*)+")
_VALUE = re.compile(r"[A-Za-z0-9_.]+")
_SYM = re.compile(r"[su][0-9]+")  # u<digits>: unbacked (1.2)
_DEVICE = re.compile(r"[A-Za-z_][A-Za-z0-9_]*(:[0-9]+)?")
_SURROGATE_PAIR = re.compile("[\ud800-\udbff][\udc00-\udfff]")


def _check(pattern: re.Pattern[str], name: str, what: str) -> str:
    if not isinstance(name, str) or not pattern.fullmatch(name):
        raise PrintError(f"{what} {name!r} is not valid ir-v1 (it would not read back)")
    return name


def print_module(m: Module) -> str:
    v = max(m.version, required_version(m))
    parts = [f"ember.ir {v[0]}.{v[1]}\n"]
    if m.symbols:
        parts.append("".join(print_symbol(s) + "\n" for s in m.symbols.values()))
    for item in m.items.values():
        parts.append(print_graph(item) if isinstance(item, Graph) else print_kernel(item))
    return "\n".join(parts)


def required_version(m: Module) -> tuple[int, int]:
    """The oldest ir-v1 minor whose grammar holds the module: 1.1 where a graph declares a
    domain or an argument names a loop variable, else 1.0; 1.2 where an unbacked symbol
    (`u0`) is declared."""
    if any(is_unbacked(n) for n in m.symbols):
        return UNBACKED_VERSION
    for g in m.graphs.values():
        if g.domain is not None or any(_uses_loop_vars(a) for n in g.nodes
                                       for a in [*n.args, *n.kwargs.values()]):
            return LOOP_VARS_VERSION
    return (1, 0)


def _uses_loop_vars(a: Arg) -> bool:
    if isinstance(a, list):
        return any(_uses_loop_vars(x) for x in a)
    return isinstance(a, sympy.Expr) and bool(loop_var_names(a))


def print_domain(domain: dict[str, Dim]) -> str:
    """` domain(i0 < 4, r0 < s0)`: a body's loops, in the order the parser requires."""
    names = list(domain)
    want = [f"i{k}" for k in range(sum(1 for v in names if v[:1] == "i"))]
    want += [f"r{k}" for k in range(len(names) - len(want))]
    if names != want:
        raise PrintError(f"domain {names}: ir-v1.1 lists i0, i1, ... then r0, r1, ...")
    for e in domain.values():
        _check_dim(e)
        if loop_var_names(e):
            raise PrintError(f"domain extent {to_text(e)} names a loop variable")
    return " domain(" + ", ".join(f"{v} < {to_text(e)}" for v, e in domain.items()) + ")"


def print_symbol(s: Symbol) -> str:
    text = f"symbol {_check(_SYM, s.name, 'symbol name')}"
    if s.hint is not None:
        text += f" hint={_uint(s.hint)}"
    if s.min is not None:
        text += f" min={_uint(s.min)}"
    if s.max is not None:
        text += " max=inf" if s.max == math.inf else f" max={_uint(int(s.max))}"
    return text


def print_kernel(k: Kernel) -> str:
    if '"""' in k.source:
        raise PrintError(f'kernel @{k.name}: its source contains """, which ir-v1 cannot hold')
    return (f"kernel @{_check(_NAME, k.name, 'kernel name')} "
            f'{_check(_NAME, k.lang, "kernel language")} """{k.source}"""\n')


def print_type(t: Type) -> str:
    if isinstance(t, TensorType):
        for d in t.shape + (t.strides or ()):
            _check_dim(d)
        if t.strides is not None and not t.strides:
            raise PrintError(f"{t}: ir-v1 has no empty strides '{{}}' (a rank-0 layout)")
        _check(_DEVICE, t.device, "device")
    try:
        return str(t)
    except ValueError as e:  # a dim that is no ir-v1 expression (e.g. sympy's floor(s0/2))
        raise PrintError(f"{t!r}: {e}") from None


def _check_dim(d: object) -> None:
    if isinstance(d, sympy.Expr):
        for n in d.atoms(sympy.Integer):
            _int(int(n))
    elif isinstance(d, int):
        _int(d)


def print_graph(g: Graph) -> str:
    params = ", ".join(f"%{_check(_VALUE, p.name, 'value name')}: {print_type(p.type)}"
                       for p in g.params)
    results = ", ".join(print_type(t) for t in g.result_types)
    head = f"graph @{_check(_NAME, g.name, 'graph name')}({params}) -> ({results})"
    if g.domain is not None:
        head += print_domain(g.domain)
    if g.attrs:
        head += " attrs(" + ", ".join(f"{_check(_NAME, k, 'attribute name')}={print_arg(v)}"
                                      for k, v in g.attrs.items()) + ")"
    lines = [head + " {"]
    lines += ["  " + print_node(n) for n in g.nodes]
    lines.append("  return (" + ", ".join(f"%{o.name}" for o in g.outputs) + ")")
    lines.append("}")
    return "\n".join(lines) + "\n"


def print_node(n: Node) -> str:
    if not n.results:
        raise PrintError(f"{n.op}: a node needs at least one result in ir-v1")
    res = ", ".join(f"%{_check(_VALUE, r.name, 'value name')}" for r in n.results)
    args = [print_arg(a) for a in n.args] + [f"{_check(_NAME, k, 'keyword name')}={print_arg(v)}"
                                             for k, v in n.kwargs.items()]
    text = (f"{res} = {_check(_OPNAME, n.op, 'op name')}({', '.join(args)}) : "
            f"{print_rtype([r.type for r in n.results])}")
    if n.loc is not None:
        text += " " + print_loc(n.loc)
    return text


def print_rtype(types: list[Type]) -> str:
    if len(types) == 1:
        return print_type(types[0])
    return "(" + ", ".join(print_type(t) for t in types) + ")"


def print_loc(loc: Loc) -> str:
    text = f"loc({_string(loc.file)}:{_uint(loc.line)}"
    if loc.col is not None:
        text += f":{_uint(loc.col)}"
    return text + ")"


def _int(v: int) -> str:
    if not INT64_MIN <= v <= INT64_MAX:
        raise PrintError(f"integer {v} does not fit in 64 bits")
    return str(int(v))


def _uint(v: int) -> str:
    """An INT where the grammar has no sign: symbol bounds, loc line and column."""
    if v < 0:
        raise PrintError(f"{v}: a symbol bound or a loc line/column is never negative")
    return _int(v)


def _float(x: float) -> str:
    x = float(x)  # repr of a float subclass (numpy's) is not the literal
    if math.isnan(x) and math.copysign(1.0, x) < 0:
        return "-nan"  # repr drops a NaN's sign; the grammar has `-nan`
    return repr(x)  # exactly Python's repr: round-trips the float's bits


def _string(s: str) -> str:
    if _SURROGATE_PAIR.search(s):  # JSON reads "\ud83d\ude00" back as one character
        raise PrintError(f"{s!r}: a surrogate pair in a str is not text ir-v1 can hold")
    return json.dumps(s)


def print_arg(a: Arg) -> str:
    if isinstance(a, Value):
        return f"%{a.name}"
    if isinstance(a, Ref):
        return f"@{_check(_NAME, a.name, 'reference')}"
    if a is None:
        return "none"
    if isinstance(a, bool):
        return "true" if a else "false"
    if isinstance(a, int):
        return _int(a)
    if isinstance(a, float):
        return _float(a)
    if isinstance(a, str):
        return _string(a)
    if isinstance(a, DType):
        return a.name
    if isinstance(a, list):
        return "[" + ", ".join(print_arg(x) for x in a) + "]"
    if isinstance(a, sympy.Expr):
        _check_dim(a)
        try:
            text = to_text(a)
        except ValueError as e:
            raise PrintError(str(e)) from None
        # a lone loop variable spelled like a dtype (i8, i16, i32, i64) would read back as the
        # dtype: parenthesised, it is an expression
        return f"({text})" if text in DTYPE_NAMES and is_loop_var(text) else text
    raise PrintError(f"{type(a).__name__} is not an ir-v1 argument: {a!r}")
