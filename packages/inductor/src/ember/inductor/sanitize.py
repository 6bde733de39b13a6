"""The one way IR-derived text enters generated source (C++ kernels, the Python wrapper).

An IR file is untrusted: value and graph names, `loc("...")` file names, attributes and types
are the file author's text. Generated C++ is compiled and run without `--allow-kernels`, so
text from the IR may appear in it only through these functions:

- `comment(text)`: a one-line `// text` comment from a safe alphabet (printable ASCII without
  `\\`, `?`, `"`; `*/` broken up). A newline cannot end the comment, a trailing backslash
  cannot splice the next line into it (phase 2), no `??/` trigraph can become one, and no
  `\"\"\"` can end the kernel block's string when the module is printed. Other characters are
  written as `<U+XXXX>`.
- `ident(name, prefix)`: a C++ identifier over `[A-Za-z0-9_]`, injective in `name` (so two IR
  values never share a C++ variable): letters, digits and `_` stay, `Z` -> `ZZ`, `.` -> `Zd`,
  any other character -> `Zx<hex>_` (a prefix-free code: it decodes one way). The prefix keeps it clear of C++ keywords, the prelude's and
  the loops' own names.
- `kernel_symbol(name)`: a kernel's `extern "C"` function name, `ember_k_` + ident: never a
  libc, OpenMP or prelude symbol whatever the graph is called.
- `py_str(text)`: a Python string literal (`repr`), for the generated wrapper; `safe_text`
  for labels (the wrapper's code object file name).
"""

from __future__ import annotations

import re

_COMMENT_SAFE = re.compile(r"[A-Za-z0-9 !#$%&'()*+,\-./:;<=>@\[\]^_`{|}~]")
_COMMENT_SAFE_TEXT = re.compile(r"[A-Za-z0-9 !#$%&'()*+,\-./:;<=>@\[\]^_`{|}~]*")
_IDENT_SAFE = re.compile(r"[A-Za-z0-9_]")
COMMENT_MAX = 240  # characters of a loc() file name copied into a comment
KERNEL_PREFIX = "ember_k_"
# what generated C++ identifiers look like (tests and the kernel loader check against it)
IDENT_RE = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")


def comment(text: str) -> str:
    """`// text` as one line: nothing the C++ preprocessor or the IR printer could read as the
    comment's (or the kernel string's) end."""
    return "// " + safe_text(text)


def safe_text(text: str) -> str:
    """`text` in the comment alphabet (also for labels such as a code object's file name)."""
    if _COMMENT_SAFE_TEXT.fullmatch(text) and "*/" not in text:
        return text  # the common case, one regex call (codegen writes thousands of comments)
    out: list[str] = []
    prev = ""
    for c in text:
        if _COMMENT_SAFE.fullmatch(c) and not (prev == "*" and c == "/"):
            out.append(c)
        else:
            out.append(f"<U+{ord(c):04X}>")
        prev = c
    return "".join(out)


def short(text: str) -> str:
    """IR text cut to COMMENT_MAX characters (a huge loc() is not copied into every line)."""
    return text if len(text) <= COMMENT_MAX else text[:COMMENT_MAX] + "..."


def ident(name: str, prefix: str) -> str:
    """An injective C++ identifier for the IR name `name`, after `prefix` (which must itself
    be an identifier that ends in `_`, so no two prefixes' names meet)."""
    if not IDENT_RE.fullmatch(prefix) or not prefix.endswith("_"):
        raise ValueError(f"bad identifier prefix {prefix!r}")
    out = [prefix]
    for c in name:
        if c == "Z":
            out.append("ZZ")
        elif c == ".":
            out.append("Zd")
        elif _IDENT_SAFE.fullmatch(c):
            out.append(c)
        else:
            out.append(f"Zx{ord(c):x}_")
    return "".join(out)


def kernel_symbol(name: str) -> str:
    """The `extern "C"` symbol of the kernel block `@name`."""
    return ident(name, KERNEL_PREFIX)


def py_str(text: str) -> str:
    """A Python string literal with the value `text` (repr escapes quotes, backslashes,
    newlines and every non-printable character)."""
    return repr(str(text))
