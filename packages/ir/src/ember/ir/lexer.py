"""Tokens of ir-v1 text. Errors carry 1-based line and column (in characters)."""

from __future__ import annotations

import json
import re
from dataclasses import dataclass


class IRParseError(Exception):
    """Malformed ir-v1 text: `.line`, `.col` (1-based) and `.expected` say where and what."""

    def __init__(self, message: str, line: int, col: int, expected: str = ""):
        super().__init__(f"{line}:{col}: {message}")
        self.message = message
        self.line = line
        self.col = col
        self.expected = expected


@dataclass(frozen=True)
class Token:
    kind: str  # INT FLOAT STRING STRING3 VALUE NAME DOTTED PUNCT EOF
    text: str
    line: int
    col: int
    value: object = None  # INT: int, FLOAT: float, STRING/STRING3: str, VALUE: name

    def describe(self) -> str:
        if self.kind == "EOF":
            return "end of input"
        if self.kind in ("PUNCT", "NAME", "DOTTED"):
            return f"'{self.text}'"
        shown = self.text if len(self.text) <= 24 else self.text[:21] + "..."
        return f"{self.kind.lower()} {shown!r}"


_WS = re.compile(r"[ \t\r\n]+")
_NUMBER = re.compile(r"[0-9]+(\.[0-9]*)?([eE][+-]?[0-9]+)?")
_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*(\.[A-Za-z_][A-Za-z0-9_]*)*")
_VALUE = re.compile(r"%[A-Za-z0-9_.]+")
_STRING = re.compile(r'"(?:[^"\\\x00-\x1f]|\\["\\/bfnrt]|\\u[0-9a-fA-F]{4})*"')
_PUNCT = ("->", "//", "(", ")", "[", "]", "{", "}", ",", ":", "=", "@", "+", "-", "*",
          "<")  # '<': ir-v1.1 domains, `domain(i0 < 4)`
_INT_LIMIT = 2**63  # an INT may be 2**63 only when a minus precedes it; the parser checks


def tokenize(text: str) -> list[Token]:
    toks: list[Token] = []
    i, line, line_start, n = 0, 1, 0, len(text)

    def err(msg: str, at: int, expected: str = "") -> IRParseError:
        return IRParseError(msg, line, at - line_start + 1, expected)

    while True:
        m = _WS.match(text, i)
        if m:
            for j in range(i, m.end()):
                if text[j] == "\n":
                    line, line_start = line + 1, j + 1
            i = m.end()
        if i >= n:
            toks.append(Token("EOF", "", line, i - line_start + 1))
            return toks
        c, col = text[i], i - line_start + 1
        if c == "#":
            j = text.find("\n", i)
            i = n if j < 0 else j
            continue
        if text.startswith('"""', i):
            end = text.find('"""', i + 3)
            if end < 0:
                raise err('unterminated """ string', i, '"""')
            while end + 3 < n and text[end + 3] == '"':  # the closing delimiter is a run's last 3
                end += 1
            body = text[i + 3 : end]
            toks.append(Token("STRING3", text[i : end + 3], line, col, body))
            for j in range(i, end + 3):
                if text[j] == "\n":
                    line, line_start = line + 1, j + 1
            i = end + 3
            continue
        if c == '"':
            m = _STRING.match(text, i)
            if not m:
                raise err("malformed string literal", i, "a JSON string")
            toks.append(Token("STRING", m.group(), line, col, json.loads(m.group())))
            i = m.end()
            continue
        if c.isascii() and c.isdigit():
            m = _NUMBER.match(text, i)
            assert m is not None
            s = m.group()
            if m.group(1) is None and m.group(2) is None:
                digits = s.lstrip("0") or "0"  # int() refuses over 4300 digits, zeros included
                if len(digits) > 19 or int(digits) > _INT_LIMIT:
                    raise err(f"integer {s[:30]} does not fit in 64 bits", i)
                toks.append(Token("INT", s, line, col, int(digits)))
            else:
                f = float(s)
                if f == float("inf"):
                    raise err(f"float literal {s[:30]} overflows", i)
                toks.append(Token("FLOAT", s, line, col, f))
            i = m.end()
            continue
        if c == "%":
            m = _VALUE.match(text, i)
            if not m:
                raise err("'%' must be followed by a value name [A-Za-z0-9_.]+", i + 1, "a name")
            toks.append(Token("VALUE", m.group(), line, col, m.group()[1:]))
            i = m.end()
            continue
        m = _NAME.match(text, i) if c.isascii() else None
        if m:
            s = m.group()
            toks.append(Token("DOTTED" if "." in s else "NAME", s, line, col))
            i = m.end()
            continue
        for p in _PUNCT:
            if text.startswith(p, i):
                toks.append(Token("PUNCT", p, line, col))
                i += len(p)
                break
        else:
            raise err(f"unexpected character {c!r}", i)
