"""The ir-v1 parser: text -> Module, by recursive descent over the grammar in ir-v1.md.

Nothing is evaluated: expressions are built from ember's own expression grammar. Any malformed
input raises `IRParseError` (line, column, what was expected) and nothing else.
"""

from __future__ import annotations

import math
import operator
import re
from collections.abc import Callable

import sympy

from ember.ir.dtypes import DTYPE_NAMES, DType
from ember.ir.expr import (
    INT64_MAX,
    INT64_MIN,
    Dim,
    FloorDiv,
    PyMod,
    as_sympy,
    is_loop_var,
    simplify_dim,
    symbol,
)
from ember.ir.graph import (
    IR_LATEST,
    IR_VERSION,
    LOOP_VARS_VERSION,
    UNBACKED_VERSION,
    Arg,
    Graph,
    Kernel,
    Loc,
    Module,
    Node,
    Pos,
    Ref,
    Symbol,
    Value,
)
from ember.ir.lexer import IRParseError, Token, tokenize
from ember.ir.types import BOOL, F64, I64, TensorType, Type

RESERVED = frozenset(
    "true false none inf nan max min mod loc attrs symbol graph kernel return".split()
) | DTYPE_NAMES
MAX_DEPTH = 64
_SYM = re.compile(r"s[0-9]+")
_RESERVED_SYM = re.compile(r"u[0-9]+")  # unbacked symbols (ember.ir 1.2)
_BINARY = ("+", "-", "*", "//")
MAX_EXPR_TOKENS = 4096  # a standalone expression (compiled indices have a few dozen tokens)


def parse_expression(text: str, *, loop_vars: bool = True) -> Dim:
    """One expression, read by the module parser's own expression grammar (`expr.parse_expr`
    is the public name). Size symbols need no declaration; loop variables are allowed unless
    `loop_vars` is False. Raises only `IRParseError` (line and column inside `text`)."""
    if not isinstance(text, str):
        raise IRParseError(f"expected text (str), got {type(text).__name__}", 1, 1, "str")
    toks = tokenize(text)
    if len(toks) > MAX_EXPR_TOKENS:  # sympy sums grow quadratically: bound the work
        t = toks[MAX_EXPR_TOKENS]
        raise IRParseError(f"expression longer than {MAX_EXPR_TOKENS} tokens", t.line, t.col)
    p = _Parser(toks, free_symbols=True)
    p.module_.version = IR_LATEST
    p.loop_ok = loop_vars
    try:
        e = p.expr()
        if p.peek().kind != "EOF":
            raise p.error("an operator or the end of the expression")
        return e
    except IRParseError:
        raise
    except RecursionError:
        t = p.peek()
        raise IRParseError("input nested too deeply", t.line, t.col) from None
    except Exception as e:  # as in parse(): never anything but a parse error
        t = p.peek()
        raise IRParseError(f"internal error while parsing: {type(e).__name__}: {e}",
                           t.line, t.col) from None


def parse(text: str) -> Module:
    """Parse ir-v1 text into a Module. Raises only `IRParseError`."""
    if not isinstance(text, str):
        raise IRParseError(f"expected text (str), got {type(text).__name__}", 1, 1, "str")
    try:
        toks = tokenize(text)
    except IRParseError:
        raise
    except Exception as e:  # as below: a lexer bug still surfaces as a parse error
        raise IRParseError(f"internal error while reading tokens: {type(e).__name__}: {e}",
                           1, 1) from None
    p = _Parser(toks)
    try:
        return p.module()
    except IRParseError:
        raise
    except RecursionError:
        t = p.peek()
        raise IRParseError("input nested too deeply", t.line, t.col) from None
    except Exception as e:  # a bug here must still surface as a parse error, never a crash
        t = p.peek()
        raise IRParseError(f"internal error while parsing: {type(e).__name__}: {e}",
                           t.line, t.col) from None


class _Parser:
    def __init__(self, toks: list[Token], free_symbols: bool = False):
        self.toks = toks
        self.i = 0
        self.module_: Module = Module()
        self.scope: dict[str, Value] | None = None
        self.depth = 0
        self.free_symbols = free_symbols  # size symbols need no declaration (parse_expression)
        self.loop_ok = False  # loop variables are read only in a node's arguments
        # while reading a node's arguments: the path to the current one, and where each
        # expression or string argument starts (Node.arg_pos)
        self.path: list[str | int] = []
        self.arg_pos: dict[tuple[str | int, ...], Pos] | None = None

    # ---- token helpers ----
    def peek(self, k: int = 0) -> Token:
        return self.toks[min(self.i + k, len(self.toks) - 1)]

    def next(self) -> Token:
        t = self.peek()
        self.i = min(self.i + 1, len(self.toks) - 1)
        return t

    def error(self, expected: str, t: Token | None = None) -> IRParseError:
        t = t or self.peek()
        return IRParseError(f"expected {expected}, found {t.describe()}", t.line, t.col, expected)

    def at(self, text: str, k: int = 0) -> bool:
        t = self.peek(k)
        return t.kind in ("PUNCT", "NAME") and t.text == text

    def expect(self, text: str) -> Token:
        if not self.at(text):
            raise self.error(f"'{text}'")
        return self.next()

    def skip(self, k: int) -> None:
        for _ in range(k):
            self.next()

    def accept(self, text: str) -> bool:
        if self.at(text):
            self.next()
            return True
        return False

    def name(self, what: str = "a name") -> str:
        t = self.peek()
        if t.kind != "NAME":
            raise self.error(what)
        return self.next().text

    def int_(self, what: str = "an integer") -> int:
        t = self.peek()
        if t.kind != "INT":
            raise self.error(what)
        v = self.next().value
        assert isinstance(v, int)
        if v > INT64_MAX:
            raise IRParseError(f"integer {v} does not fit in 64 bits", t.line, t.col)
        return v

    def enter(self) -> None:
        self.depth += 1
        if self.depth > MAX_DEPTH:
            t = self.peek()
            raise IRParseError(f"nesting deeper than {MAX_DEPTH} levels", t.line, t.col)

    def leave(self) -> None:
        self.depth -= 1

    # ---- module ----
    def module(self) -> Module:
        t = self.peek()
        if t.kind != "DOTTED" or t.text != "ember.ir":
            raise self.error("the header 'ember.ir 1.0'")
        self.next()
        v = self.peek()
        if v.kind != "FLOAT" or not re.fullmatch(r"[0-9]+\.[0-9]+", v.text):
            raise self.error("a version MAJOR.MINOR")
        major_s, minor_s = v.text.split(".")
        if len(major_s) > 9 or len(minor_s) > 9:
            raise IRParseError("version number too large", v.line, v.col)
        major, minor = int(major_s), int(minor_s)
        if major != IR_VERSION[0]:
            raise IRParseError(
                f"ember.ir version {major}.{minor} is not readable by this reader "
                f"(reads {IR_VERSION[0]}.x)", v.line, v.col, f"version {IR_VERSION[0]}.x")
        self.next()
        self.module_.version = (major, minor)
        while self.peek().kind != "EOF":
            if self.at("symbol"):
                self.symbol_decl()
            elif self.at("graph"):
                self.graph()
            elif self.at("kernel"):
                self.kernel()
            else:
                raise self.error("'symbol', 'graph', 'kernel' or end of input")
        return self.module_

    def symbol_decl(self) -> None:
        self.expect("symbol")
        t = self.peek()
        if t.kind == "NAME" and _RESERVED_SYM.fullmatch(t.text):
            self.need_version(UNBACKED_VERSION, f"unbacked symbol {t.text}", t)
        elif t.kind != "NAME" or not _SYM.fullmatch(t.text):
            raise self.error("a symbol name s<digits> (or u<digits>, ember.ir 1.2)")
        self.next()
        if t.text in self.module_.symbols:
            raise IRParseError(f"symbol {t.text} is declared twice", t.line, t.col)
        sym = Symbol(t.text)
        if self.at("hint") and self.at("=", 1):
            self.skip(2)
            sym.hint = self.int_()
        if self.at("min") and self.at("=", 1):
            self.skip(2)
            sym.min = self.int_()
        if self.at("max") and self.at("=", 1):
            self.skip(2)
            sym.max = math.inf if self.accept("inf") else self.int_("an integer or 'inf'")
        self.module_.symbols[sym.name] = sym

    def item_name(self) -> tuple[str, Token]:
        self.expect("@")
        t = self.peek()
        name = self.name("a name after '@'")
        if name in self.module_.items:
            raise IRParseError(f"@{name} is defined twice", t.line, t.col)
        return name, t

    def kernel(self) -> None:
        start = self.expect("kernel")
        name, _ = self.item_name()
        lang = self.name("the kernel's language (cpp, triton, ...)")
        t = self.peek()
        if t.kind != "STRING3":
            raise self.error('the kernel source in """...""""')
        self.next()
        assert isinstance(t.value, str)
        self.module_.items[name] = Kernel(name, lang, t.value, Pos(start.line, start.col))

    def graph(self) -> None:
        start = self.expect("graph")
        name, _ = self.item_name()
        self.scope = {}
        self.expect("(")
        params: list[Value] = []
        if not self.at(")"):
            while True:
                params.append(self.param())
                if not self.accept(","):
                    break
        self.expect(")")
        self.expect("->")
        self.expect("(")
        results: list[Type] = []
        if not self.at(")"):
            results.append(self.type_())
            while self.accept(","):
                results.append(self.type_())
        self.expect(")")
        domain = self.domain() if self.at("domain") and self.at("(", 1) else None
        attrs: dict[str, Arg] = {}
        if self.accept("attrs"):
            self.expect("(")
            while True:
                kt = self.peek()
                k, v = self.kwarg(allow_values=False)
                if k in attrs:
                    raise IRParseError(f"graph attribute '{k}' is repeated", kt.line, kt.col)
                attrs[k] = v
                if not self.accept(","):
                    break
            self.expect(")")
        self.expect("{")
        nodes: list[Node] = []
        while not self.at("return"):
            if self.peek().kind != "VALUE":
                raise self.error("a node '%name = op(...) : type' or 'return'")
            nodes.append(self.node())
        self.expect("return")
        self.expect("(")
        outputs: list[Value] = []
        if not self.at(")"):
            outputs.append(self.use())
            while self.accept(","):
                outputs.append(self.use())
        self.expect(")")
        self.expect("}")
        self.scope = None
        g = Graph(name, params, results, nodes, outputs, attrs, Pos(start.line, start.col),
                  domain)
        self.module_.items[name] = g

    def domain(self) -> dict[str, Dim]:
        """`domain(i0 < 4, i1 < s0, r0 < 8)` (ir-v1.1): i-variables first, then r-variables,
        each numbered from 0 in order; an extent is an expression over size symbols."""
        t = self.peek()
        self.need_loop_version("a domain(...)", t)
        self.skip(2)
        out: dict[str, Dim] = {}
        while not self.at(")"):
            if out:
                self.expect(",")
            v = self.peek()
            nr = sum(1 for k in out if k[0] == "r")
            ok = [f"r{nr}"] if nr else [f"i{len(out)}", "r0"]  # i0, i1, ..., then r0, r1, ...
            if v.kind != "NAME" or v.text not in ok:
                raise self.error(f"the loop variable {' or '.join(ok)} (a domain lists i0, i1, "
                                 f"... then r0, r1, ...)")
            self.next()
            self.expect("<")
            e = self.expr()
            out[v.text] = e
        self.expect(")")
        return out

    def need_loop_version(self, what: str, t: Token) -> None:
        self.need_version(LOOP_VARS_VERSION, what, t)

    def need_version(self, version: tuple[int, int], what: str, t: Token) -> None:
        if self.module_.version < version:
            have = ".".join(map(str, self.module_.version))
            want = f"{version[0]}.{version[1]}"
            raise IRParseError(f"{what} needs ember.ir {want} (this text says {have})", t.line,
                               t.col, f"the header 'ember.ir {want}'")

    def param(self) -> Value:
        t = self.peek()
        if t.kind != "VALUE":
            raise self.error("a parameter '%name: type'")
        self.next()
        assert self.scope is not None and isinstance(t.value, str)
        if t.value in self.scope:
            raise IRParseError(f"value %{t.value} is defined twice", t.line, t.col)
        self.expect(":")
        v = Value(t.value, self.type_())
        self.scope[t.value] = v
        return v

    def use(self) -> Value:
        t = self.peek()
        if t.kind != "VALUE":
            raise self.error("a value name '%name'")
        self.next()
        assert self.scope is not None and isinstance(t.value, str)
        v = self.scope.get(t.value)
        if v is None:
            raise IRParseError(f"use of undefined value %{t.value}", t.line, t.col,
                               "a value defined earlier in the graph")
        return v

    def node(self) -> Node:
        first = self.peek()
        names = [self.next()]
        while self.accept(","):
            if self.peek().kind != "VALUE":
                raise self.error("a value name '%name'")
            names.append(self.next())
        self.expect("=")
        op_t = self.peek()
        if op_t.kind != "DOTTED":
            raise self.error("an op name 'dialect.op' (e.g. aten.add.Tensor)")
        self.next()
        self.expect("(")
        args: list[Arg] = []
        kwargs: dict[str, Arg] = {}
        self.loop_ok, self.arg_pos = True, {}
        if not self.at(")"):
            while True:
                if self.peek().kind == "NAME" and self.at("=", 1):
                    kt = self.peek()
                    self.path = [kt.text]
                    k, v = self.kwarg(allow_values=True)
                    if k in kwargs:
                        raise IRParseError(f"keyword argument '{k}' is repeated", kt.line, kt.col)
                    kwargs[k] = v
                else:
                    if kwargs:
                        raise self.error("a keyword argument (positional ones come first)")
                    self.path = [len(args)]
                    args.append(self.value(allow_values=True))
                if not self.accept(","):
                    break
        self.expect(")")
        arg_pos, self.loop_ok, self.arg_pos = self.arg_pos or None, False, None
        self.expect(":")
        types = self.rtype()
        if len(types) != len(names):
            raise IRParseError(f"{len(names)} result name(s) but {len(types)} result type(s)",
                               first.line, first.col, f"{len(names)} result type(s)")
        loc = self.loc() if self.at("loc") else None
        node = Node(op_t.text, args, kwargs, [], loc, Pos(first.line, first.col), arg_pos)
        assert self.scope is not None
        for i, (nt, ty) in enumerate(zip(names, types, strict=True)):
            assert isinstance(nt.value, str)
            if nt.value in self.scope:
                raise IRParseError(f"value %{nt.value} is defined twice", nt.line, nt.col)
            v = Value(nt.value, ty, node, i)
            self.scope[nt.value] = v
            node.results.append(v)
        return node

    def rtype(self) -> list[Type]:
        if self.accept("("):
            types = [self.type_()]
            while self.accept(","):
                types.append(self.type_())
            if len(types) < 2:
                raise self.error("',' and a second type (a single result type has no parentheses)")
            self.expect(")")
            return types
        return [self.type_()]

    def loc(self) -> Loc:
        self.expect("loc")
        self.expect("(")
        t = self.peek()
        if t.kind != "STRING":
            raise self.error("a file name string")
        self.next()
        self.expect(":")
        line = self.int_("a line number")
        col = self.int_("a column number") if self.accept(":") else None
        self.expect(")")
        assert isinstance(t.value, str)
        return Loc(t.value, line, col)

    # ---- types ----
    def type_(self) -> Type:
        t = self.peek()
        if t.kind != "NAME" or (t.text not in DTYPE_NAMES and t.text != "bool"):
            raise self.error("a type (e.g. f32[2, 3], i64, f64, bool)")
        self.next()
        if not self.at("["):
            scalar = {"i64": I64, "f64": F64, "bool": BOOL}.get(t.text)
            if scalar is None:
                raise self.error(f"'[' after {t.text} (only i64, f64 and bool are scalar types)")
            return scalar
        if t.text == "bool":
            raise self.error("a type (tensors of booleans are 'b8[...]')", t)
        self.expect("[")
        shape = self.expr_list("]")
        strides = None
        if self.accept("{"):
            if self.at("}"):
                raise self.error("at least one stride")
            strides = self.expr_list("}")
        device = "cpu"
        if self.accept("@"):
            device = self.name("a device name (cuda, cpu, ...)")
            if self.accept(":"):
                device += f":{self.int_('a device index')}"
        return TensorType(DType[t.text], tuple(shape), tuple(strides) if strides else None, device)

    def expr_list(self, close: str) -> list[Dim]:
        out: list[Dim] = []
        if not self.at(close):
            out.append(self.expr())
            while self.accept(","):
                out.append(self.expr())
        self.expect(close)
        return out

    # ---- values ----
    def kwarg(self, allow_values: bool) -> tuple[str, Arg]:
        k = self.name("a keyword name")
        self.expect("=")
        return k, self.value(allow_values)

    def value(self, allow_values: bool) -> Arg:
        t = self.peek()
        if t.kind == "VALUE":
            if not allow_values:
                raise self.error("a literal (values cannot appear in graph attributes)")
            return self.use()
        if self.at("@"):
            self.next()
            return Ref(self.name("a graph or kernel name after '@'"))
        if self.at("["):
            self.enter()
            self.next()
            items: list[Arg] = []
            self.path.append(0)
            if not self.at("]"):
                items.append(self.value(allow_values))
                while self.accept(","):
                    self.path[-1] += 1  # type: ignore[operator]
                    items.append(self.value(allow_values))
            self.path.pop()
            self.expect("]")
            self.leave()
            return items
        if t.kind == "STRING":
            self.next()
            self.mark(t)
            return t.value
        if t.kind == "FLOAT":
            self.next()
            return t.value
        if t.kind == "NAME":
            if t.text in ("true", "false", "none"):
                self.next()
                return {"true": True, "false": False, "none": None}[t.text]
            if t.text in ("inf", "nan"):
                self.next()
                return float(t.text)
            # i8 ... i64 are dtypes, unless an operator follows (`i8 + 1`: loop variable i8)
            if t.text in DTYPE_NAMES and not (self.loop_ok and is_loop_var(t.text)
                                              and self.peek(1).text in _BINARY
                                              and self.peek(1).kind == "PUNCT"):
                self.next()
                return DType[t.text]
        if self.at("-"):
            n = self.peek(1)
            if n.kind == "FLOAT" or (n.kind == "NAME" and n.text in ("inf", "nan")):
                self.skip(2)
                f = n.value if n.kind == "FLOAT" else float(n.text)
                assert isinstance(f, float)
                return -f
        if t.kind in ("INT",) or (t.kind == "NAME" and (_is_expr_start(t.text)
                                                        or is_loop_var(t.text))) or \
                self.at("-") or self.at("("):
            e = self.expr()
            self.mark(t)
            return e
        raise self.error("a value (%name, @name, literal, expression or [list])")

    def mark(self, t: Token) -> None:
        if self.arg_pos is not None:
            self.arg_pos[tuple(self.path)] = Pos(t.line, t.col)

    # ---- expressions ----
    def expr(self) -> Dim:
        start = self.peek()
        self.enter()
        e = self.term()
        while self.at("+") or self.at("-"):
            op = self.next().text
            rhs = self.term()
            e = self.fold(e, rhs, op, start)
        self.leave()
        return e

    def term(self) -> Dim:
        start = self.peek()
        e = self.factor()
        while self.at("*") or self.at("//"):
            op = self.next().text
            rhs = self.factor()
            e = self.fold(e, rhs, op, start)
        return e

    def factor(self) -> Dim:
        t = self.peek()
        if t.kind == "INT":
            return self.int_()
        if self.at("-"):
            self.next()
            self.enter()
            if self.peek().kind == "INT" and self.peek().value == 2**63:
                self.next()
                self.leave()
                return INT64_MIN
            f = self.factor()
            self.leave()
            return self.fold(0, f, "-", t)
        if self.at("("):
            self.next()
            e = self.expr()
            self.expect(")")
            return e
        if t.kind == "NAME" and t.text in ("max", "min", "mod"):
            self.next()
            self.expect("(")
            a = self.expr()
            self.expect(",")
            b = self.expr()
            self.expect(")")
            return self.fold(a, b, t.text, t)
        if t.kind == "NAME" and is_loop_var(t.text):
            if not self.loop_ok:
                raise IRParseError(f"loop variable {t.text} outside a node's arguments (loop "
                                   f"variables index loads; sizes use symbols)", t.line, t.col,
                                   "a size expression")
            self.need_loop_version(f"loop variable {t.text}", t)
            self.next()
            return symbol(t.text)
        if t.kind == "NAME" and _RESERVED_SYM.fullmatch(t.text):
            self.need_version(UNBACKED_VERSION, f"unbacked symbol {t.text}", t)
        if t.kind == "NAME" and (_SYM.fullmatch(t.text) or _RESERVED_SYM.fullmatch(t.text)):
            if t.text not in self.module_.symbols and not self.free_symbols:
                raise IRParseError(f"undeclared symbol {t.text}", t.line, t.col,
                                   "a symbol declared with 'symbol' before its use")
            self.next()
            return symbol(t.text)
        raise self.error("an integer, a symbol, '-', '(' or max/min/mod(...)")

    def fold(self, a: Dim, b: Dim, op: str, at: Token) -> Dim:
        if isinstance(a, int) and isinstance(b, int):
            if op in ("//", "mod") and b == 0:  # left unevaluated for the verifier to report
                return (FloorDiv if op == "//" else PyMod)(sympy.Integer(a), sympy.Integer(0))
            r = _INT_OPS[op](a, b)
            if not INT64_MIN <= r <= INT64_MAX:
                raise IRParseError("integer overflow in expression", at.line, at.col)
            return r
        try:
            e = _SYM_OPS[op](as_sympy(a), as_sympy(b))
        except ValueError:
            if op not in ("max", "min"):
                raise
            # sympy's Max/Min refuse a constant division by zero ("not comparable"): keep it
            # unevaluated, for the verifier to report like any other division by zero.
            e = (sympy.Max if op == "max" else sympy.Min)(as_sympy(a), as_sympy(b),
                                                          evaluate=False)
        for n in e.atoms(sympy.Integer):
            if not INT64_MIN <= int(n) <= INT64_MAX:
                raise IRParseError("integer overflow in expression", at.line, at.col)
        return simplify_dim(e)


_INT_OPS: dict[str, Callable[[int, int], int]] = {
    "+": operator.add, "-": operator.sub, "*": operator.mul, "//": operator.floordiv,
    "mod": operator.mod, "max": max, "min": min,
}
_SYM_OPS: dict[str, Callable[[sympy.Expr, sympy.Expr], sympy.Expr]] = {
    "+": operator.add, "-": operator.sub, "*": operator.mul, "//": FloorDiv, "mod": PyMod,
    "max": sympy.Max, "min": sympy.Min,
}


def _is_expr_start(name: str) -> bool:
    return name in ("max", "min", "mod") or bool(_SYM.fullmatch(name) or
                                                 _RESERVED_SYM.fullmatch(name))
