"""The parser on untrusted text: any input either parses (and then prints to a fixed point) or
raises one `IRParseError` with a 1-based line and column inside the text and a message; never
another exception, and never the parser's "internal error" wrapper (that is a parser bug)."""

from __future__ import annotations

import re

import pytest
from hypothesis import given
from hypothesis import strategies as st

from ember.ir import IRParseError, Module, parse, print_module
from ember.ir.expr import INT64_MIN
from packages.ir.tests import runnable_modules as R
from packages.ir.tests import strategies as S
from packages.ir.tests.strategies import SPEC_EXAMPLE


def check_parse(text: str) -> Module | None:
    """Parse untrusted text: a module, or None after checking the error it raised."""
    try:
        m = parse(text)
    except IRParseError as e:
        assert type(e.line) is int and type(e.col) is int, (e.line, e.col)
        lines = text.split("\n")
        assert 1 <= e.line <= len(lines), (e.line, len(lines), e)
        assert 1 <= e.col <= len(lines[e.line - 1]) + 1, (e.col, lines[e.line - 1][:80], e)
        assert isinstance(e.message, str) and e.message.strip()
        assert not e.message.startswith("internal error"), e.message
        return None
    # whatever parses prints canonically, and the canonical text is a fixed point
    out = print_module(m)
    assert print_module(parse(out)) == out
    return m


# ---- mutations ---------------------------------------------------------------------------

SNIPPETS = [
    "(", ")", "[", "]", "{", "}", ",", ":", "=", "@", "%", "-", "+", "*", "//", "->", '"', '"""',
    "#", "\n", " ", "\t", "\r", "\x00", "é", "\u2028", "😀", "\ufeff", "\\", "\\u", "\\ud800",
    "inf", "nan", "-inf", "-nan", "s0", "s99", "u0", "max(", "mod(", "min(", "1e999", "1e-999",
    "0.", "1.5e", ".5", "1e", "graph", "kernel", "symbol", "return", "attrs(", "loc(", "true",
    "none", "f32[", "i64", "bool", "b8[]", "%x", "@g", "9223372036854775807",
    "9223372036854775808", "-9223372036854775808", str(10**30), "ember.ir 2.0", "ember.ir 1.0",
    "0 // 0", "mod(1, 0)", "max(0 // 0, 1)", "s0 * -9223372036854775808", "{}", "@cuda:",
    "hint=", "max=inf", "input_updates=[[0, 0]]", "graph.call(@", "%0 = a.b() : f32[]",
    "\"\\\"\"", "'", "0" * 30,
]
_HUGE = ["9" * 5000, "0" * 5000, "1" + "0" * 4400, "1e" + "9" * 5000, "0." + "0" * 5000 + "1",
         "s" + "1" * 5000]


@st.composite
def nesting(draw: st.DrawFn) -> str:
    n = draw(st.sampled_from([65, 100, 1000, 10000]))
    unit = draw(st.sampled_from(["(", "[", "-", "max(", "[[", "(-"]))
    close = draw(st.booleans())
    inner = draw(st.sampled_from(["1", "s0", "%x", "", "1.5"]))
    closing = {"(": ")", "[": "]", "-": "", "max(": ", 1)", "[[": "]]", "(-": ")"}[unit]
    return unit * n + inner + (closing * n if close else "")


_tokens = re.compile(r"\s+|[A-Za-z_][A-Za-z0-9_.]*|%[A-Za-z0-9_.]+|[0-9][0-9.eE+-]*|\"[^\"]*\"|.",
                     re.S)


@st.composite
def mutate(draw: st.DrawFn, text: str) -> str:
    n = len(text)
    i = draw(st.integers(0, n))
    kind = draw(st.sampled_from(["delete", "insert", "duplicate", "swap", "token_swap",
                                 "token_delete", "token_dup", "huge", "nest", "truncate",
                                 "replace_number", "insert_text"]))
    if kind == "delete":
        return text[:i] + text[min(n, i + draw(st.integers(1, 8))):]
    if kind == "insert":
        return text[:i] + draw(st.sampled_from(SNIPPETS)) + text[i:]
    if kind == "insert_text":
        return text[:i] + draw(st.text(max_size=4)) + text[i:]
    if kind == "duplicate":
        j = min(n, i + draw(st.integers(1, 40)))
        return text[:j] + text[i:j] + text[j:]
    if kind == "swap" and n >= 2:
        a, b = sorted((draw(st.integers(0, n - 1)), draw(st.integers(0, n - 1))))
        return text[:a] + text[b] + text[a + 1:b] + text[a] + text[b + 1:] if a != b else text
    if kind.startswith("token"):
        toks = _tokens.findall(text)
        if len(toks) < 2:
            return text
        a = draw(st.integers(0, len(toks) - 1))
        b = draw(st.integers(0, len(toks) - 1))
        if kind == "token_swap":
            toks[a], toks[b] = toks[b], toks[a]
        elif kind == "token_delete":
            del toks[a]
        else:
            toks.insert(b, toks[a])
        return "".join(toks)
    if kind == "huge":
        return text[:i] + draw(st.sampled_from(_HUGE)) + text[i:]
    if kind == "nest":
        return text[:i] + draw(nesting()) + text[i:]
    if kind == "replace_number":
        nums = list(re.finditer(r"[0-9]+", text))
        if not nums:
            return text
        m = draw(st.sampled_from(nums))
        new = draw(st.sampled_from(["9223372036854775808", str(10**30), "0" * 50, "1e999",
                                    "-1", "0", "18446744073709551616", "1.5"]))
        return text[:m.start()] + new + text[m.end():]
    return text[:i]  # truncate


_BASES = st.one_of(
    S.text_modules().map(print_module),
    R.runnable_cases(max_nodes=4, updates=True).map(lambda c: print_module(c.module)),
    st.just(SPEC_EXAMPLE),
)


@st.composite
def mutated_texts(draw: st.DrawFn, max_mutations: int = 3) -> str:
    text = draw(_BASES)
    for _ in range(draw(st.integers(1, max_mutations))):
        text = draw(mutate(text))
    return text


@S.slow_draws
@given(mutated_texts())
def test_mutated_texts_raise_only_parse_errors(text: str) -> None:
    check_parse(text)


@pytest.mark.fuzz
@S.slow_draws
@given(mutated_texts(max_mutations=8))
def test_fuzz_mutated_texts(text: str) -> None:
    """Long run: `HYPOTHESIS_PROFILE=fuzz pytest -m fuzz` (100k examples)."""
    check_parse(text)


@given(st.text(max_size=200))
def test_arbitrary_text_raises_only_parse_errors(text: str) -> None:
    check_parse(text)
    check_parse("ember.ir 1.0\n" + text)


@S.slow_draws
@given(S.text_modules(), st.data())
def test_truncations_raise_only_parse_errors(m: Module, data: st.DataObject) -> None:
    text = print_module(m)
    for i in data.draw(st.lists(st.integers(0, len(text)), max_size=20)):
        check_parse(text[:i])


def test_every_truncation_of_the_spec_example() -> None:
    for i in range(len(SPEC_EXAMPLE) + 1):
        check_parse(SPEC_EXAMPLE[:i])


# ---- explicit error cases ------------------------------------------------------------------


def parse_error(text: str) -> IRParseError:
    with pytest.raises(IRParseError) as info:
        parse(text)
    e = info.value
    assert not e.message.startswith("internal error"), e.message
    return e


HEAD = "ember.ir 1.0\n\n"


@pytest.mark.parametrize("text, line, col, words", [
    ("", 1, 1, "header"),
    ("ember.ir", 1, 9, "version"),
    ("ember.ir 1", 1, 10, "version"),
    (HEAD + "graph @g() -> () {\n  return (%x)\n}\n", 4, 11, "undefined value %x"),
    (HEAD + "graph @g(%x: f32[s0]) -> () {\n  return ()\n}\n", 3, 18, "undeclared symbol s0"),
    (HEAD + "graph @g(%x: f32[2]) -> () {\n  %y = a.b(%x) f32[2]\n  return ()\n}\n", 4, 16,
     "':'"),
    (HEAD + "graph @g() -> () {\n  %y = relu(1) : f32[]\n  return ()\n}\n", 4, 8, "op name"),
    (HEAD + "graph @g() -> () {\n  %y, %z = a.b() : f32[]\n  return ()\n}\n", 4, 3,
     "2 result name(s) but 1 result type(s)"),
    (HEAD + "graph @g() -> () {\n  %y = a.b() : (f32[])\n  return ()\n}\n", 4, 22, "second"),
    (HEAD + "graph @g() -> () {\n  %y = a.b() : (f32[], )\n  return ()\n}\n", 4, 24, "type"),
    (HEAD + "graph @g() -> () {\n  %y = a.b(k=1, 2) : f32[]\n  return ()\n}\n", 4, 17,
     "keyword"),
    (HEAD + "graph @g() -> () {\n  return ()\n}\ngraph @g() -> () {\n  return ()\n}\n", 6, 8,
     "twice"),
    (HEAD + "symbol s0\nsymbol s0\n", 4, 8, "twice"),
    (HEAD + "symbol s0 hint=-1\n", 3, 16, "integer"),
    (HEAD + 'kernel @k cpp """abc', 3, 15, '"""'),
    (HEAD + "graph @g() -> () attrs(a=u1) {\n  return ()\n}\n", 3, 26, "needs ember.ir 1.2"),
    (HEAD + "graph @g() -> () attrs(a=\"\\x\") {\n  return ()\n}\n", 3, 26, "string"),
    (HEAD + "graph @g() -> () attrs(a=1, a=2) {\n  return ()\n}\n", 3, 29, "repeated"),
    (HEAD + "graph @g() -> () attrs(a=%x) {\n  return ()\n}\n", 3, 26, "literal"),
    (HEAD + "graph @g(%x: bool[2]) -> () {\n  return ()\n}\n", 3, 14, "b8"),
    (HEAD + "graph @g(%x: f32[2]{}) -> () {\n  return ()\n}\n", 3, 21, "stride"),
    (HEAD + "graph @g() -> () {\n  %x = a.b() : f32[]\n  %x = a.b() : f32[]\n  return ()\n}\n",
     5, 3, "defined twice"),
    (HEAD + "graph @g() -> () {\n\x00}", 4, 1, "unexpected character"),
    (HEAD + "graph @g() -> () {\n  return ()\n}\n é", 6, 2, "unexpected character"),
])
def test_error_positions(text: str, line: int, col: int, words: str) -> None:
    e = parse_error(text)
    assert (e.line, e.col) == (line, col), e
    assert words in e.message, e.message


@pytest.mark.parametrize("version", ["2.0", "0.9", "17.3"])
def test_other_major_versions_are_refused_by_name(version: str) -> None:
    e = parse_error(f"ember.ir {version}\n")
    assert f"version {version}" in e.message and "not readable" in e.message
    assert (e.line, e.col) == (1, 10)


def test_newer_minor_version_is_read() -> None:
    m = parse("ember.ir 1.12\n")
    assert m.version == (1, 12)
    assert print_module(m) == "ember.ir 1.12\n"


def attr(value: str) -> object:
    m = parse(f"{HEAD}symbol s0\n\ngraph @g() -> () attrs(a={value}) {{\n  return ()\n}}\n")
    return m.graph("g").attrs["a"]


def test_int_range() -> None:
    assert attr("-9223372036854775808") == INT64_MIN
    assert attr("9223372036854775807") == 2**63 - 1
    assert attr("0" * 5000) == 0  # leading zeros: still a 64-bit INT
    assert attr("0" * 5000 + "7") == 7
    for bad in ("9223372036854775808", "-9223372036854775809", "--9223372036854775808",
                "1 - 9223372036854775808", str(10**30), "9" * 5000, "9223372036854775807 + 1",
                "s0 * 9223372036854775807 * 2", "-9223372036854775808 - 1"):
        e = parse_error(f"{HEAD}symbol s0\ngraph @g() -> () attrs(a={bad}) {{\n  return ()\n}}\n")
        assert "64 bits" in e.message or "overflow" in e.message, (bad, e.message)


def test_float_overflow_is_an_error() -> None:
    for bad in ("1e999", "-1e999", "1" * 400 + ".0", "1e" + "9" * 5000):
        e = parse_error(f"{HEAD}graph @g() -> () attrs(a={bad}) {{\n  return ()\n}}\n")
        assert "overflows" in e.message
        assert (e.line, e.col) == (3, 26 + bad.startswith("-"))
    assert attr("1e-999") == 0.0  # underflow is not an error: it is the nearest float
    assert attr("inf") == float("inf") and attr("-inf") == float("-inf")


def test_deep_nesting_is_a_parse_error() -> None:
    for unit, close in (("(", ")"), ("[", "]"), ("-", ""), ("max(", ", 1)")):
        for n in (65, 100, 10_000):
            e = parse_error(f"{HEAD}symbol s0\ngraph @g() -> () attrs(a={unit * n}1{close * n}) "
                            "{\n  return ()\n}\n")
            assert "nest" in e.message, e.message
    ok = attr("(" * 60 + "1" + ")" * 60)
    assert ok == 1


def test_undeclared_and_reserved_symbols() -> None:
    e = parse_error(f"{HEAD}graph @g() -> () attrs(a=s0 + 1) {{\n  return ()\n}}\n")
    assert "undeclared symbol s0" in e.message and (e.line, e.col) == (3, 26)
    e = parse_error(f"{HEAD}symbol s0\ngraph @g(%x: f32[s1]) -> () {{\n  return ()\n}}\n")
    assert "undeclared symbol s1" in e.message and (e.line, e.col) == (4, 18)


def test_not_text_is_a_parse_error() -> None:
    e = parse_error(b"ember.ir 1.0\n")  # type: ignore[arg-type]
    assert (e.line, e.col) == (1, 1)


def test_max_min_of_a_constant_division_by_zero_parses() -> None:
    # sympy's Max cannot compare `0 // 0`; the parser keeps it for the verifier to report
    m = check_parse(f"{HEAD}graph @g() -> () attrs(a=max(0 // 0, 1), b=min(mod(1, 0), "
                    "max(2, 3 // 0))) {\n  return ()\n}\n")
    assert m is not None
