"""Issue 19 #1: IR text never becomes code in generated source.

Running an IR file with `--backend inductor` compiles C++ generated from it without
`--allow-kernels`, so every piece of IR text that reaches generated source (value, graph and
kernel names, `loc()` file names, types, attributes) must land in a comment or a string literal
that it cannot end, or in an identifier made from a safe alphabet. These tests push hostile text
through every code generator (`codegen-cpp`'s kernels, the Python wrapper) and check the
generated source line by line; the end-to-end tests run the original exploit (a `loc()` holding
a newline and C++ that creates a marker file) through `ember run` and `ember check`.
"""

from __future__ import annotations

import ast
import json
import re
from pathlib import Path
from typing import Any

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

import ember.inductor  # noqa: F401  (registers the passes and the backend)
from ember.inductor.kernels import PRELUDE_NAME, compile_module, compiled_runner
from ember.inductor.sanitize import IDENT_RE, comment, ident, kernel_symbol, py_str
from ember.inductor.wrapper import generate
from ember.ir import DType, Loc, Module, TensorType, parse, print_module
from ember.ir.builder import GraphBuilder
from ember.ir.passes import run_pipeline
from ember.runtime import cli

MARK = "PWN"  # every payload carries it; it may survive only inside comments and strings
PAYLOADS = [
    f"a.py\n{MARK}();\n//",
    f"x\\\n{MARK}();",  # a trailing backslash would splice the next line into the comment
    f"*/ {MARK}(); /*",
    f'"""\n{MARK}',  # would end the kernel block's string in a printed module
    f"??/\n{MARK}();",  # a trigraph backslash
    f"\x00{MARK}\x00",
    f"\r{MARK}();",
    f"\u2028{MARK}\u2029",
    f"{MARK}\\",
    f"\u00e9\u202e{MARK}",
    f'"); {MARK}(); //',
    f"\t#include <cstdio>\n{MARK}",
    f"'); {MARK}(); ('",  # a quote of the wrapper's Python
]
hostile = st.one_of(st.sampled_from(PAYLOADS), st.text(max_size=24).map(lambda s: s + MARK),
                    st.text(max_size=24))
SAFE_COMMENT = re.compile(r"// [A-Za-z0-9 !#$%&'()*+,\-./:;<=>@\[\]^_`{|}~]*")
# identifiers the generator makes from IR names (they may spell anything in [A-Za-z0-9_])
GENERATED_IDENT = re.compile(r"\b(?:v_|n[0-9]+_|ember_k_)\w*")
FAST = settings(max_examples=25, deadline=None)


pytestmark = pytest.mark.usefixtures("kernel_cache")  # (conftest.py)


def check_cpp(source: str) -> None:
    """A generated kernel's C++: comments from the safe alphabet, one line each; code lines
    printable ASCII with no comment, string, preprocessor or splice syntax of their own, and
    the payload marker only inside generated identifiers."""
    for line in source.splitlines():
        text = line.strip()
        if text.startswith("//"):
            assert SAFE_COMMENT.fullmatch(text), line
            assert "*/" not in text and "??" not in text, line
            continue
        assert all(" " <= c <= "~" for c in line), line
        code = text.replace('extern "C"', "")
        for bad in ("//", "/*", "*/", '"', "'", "\\", "??"):
            assert bad not in code, line
        assert not code.startswith("#") or code.startswith("#pragma omp "), line
        assert MARK not in GENERATED_IDENT.sub("", code), line


def check_module(m: Module) -> None:
    kernels = [k for k in m.kernels.values() if k.name != PRELUDE_NAME]
    assert kernels, "the program should have C++ kernels"
    for k in kernels:
        check_cpp(k.source)
        assert f'extern "C" void {kernel_symbol(k.name)}(' in k.source


# ---- the sanitizer itself ----------------------------------------------------------------------

@FAST
@given(hostile)
def test_comment_is_one_safe_line(text: str) -> None:
    c = comment(text)
    assert SAFE_COMMENT.fullmatch(c) and "\n" not in c
    assert "*/" not in c and "??" not in c and not c.endswith("\\")


@FAST
@given(hostile, hostile, st.sampled_from(["v_", "n0_", "n12_", "ember_k_"]))
def test_ident_is_injective_and_safe(a: str, b: str, prefix: str) -> None:
    ia, ib = ident(a, prefix), ident(b, prefix)
    assert IDENT_RE.fullmatch(ia) and ia.startswith(prefix)
    assert (ia == ib) == (a == b)


@FAST
@given(hostile)
def test_py_str_is_one_literal(text: str) -> None:
    tree = ast.parse(py_str(text), mode="eval")
    assert isinstance(tree.body, ast.Constant) and tree.body.value == text


# ---- hostile IR through the code generators ----------------------------------------------------

def _api_module(names: list[str], files: list[str], graph: str, attr: str) -> Module:
    """Built through the Python API: names and locations are any text."""
    m = Module()
    gb = GraphBuilder(m, graph)
    x = gb.param(names[0], TensorType(DType.f32, (4, 8)))
    w = gb.param(names[1], TensorType(DType.f32, (8, 8)))
    e = gb.op("prims.exp", [x], name=names[2], loc=Loc(files[0], 1))
    s = gb.op("prims.sum", [e], {"dims": [1]}, name=names[3], loc=Loc(files[1], 2, 3))
    a = gb.op("prims.argmax", [x], {"dim": 1}, name=names[4], loc=Loc(files[2], 3))
    y = gb.op("prims.mul", [e, x], name=names[5], loc=Loc(files[0], 4))
    mm = gb.op("prims.matmul", [x, w], name=names[6], loc=Loc(files[1], 5))
    gb.ret([s, a, y, mm], attrs={"note": attr})
    return m


@FAST
@given(st.lists(hostile, min_size=7, max_size=7, unique=True),
       st.lists(hostile, min_size=3, max_size=3), hostile, hostile)
def test_api_names_and_locs_never_become_code(names: list[str], files: list[str], graph: str,
                                              attr: str) -> None:
    m = _api_module(names, files, graph or "g", attr)
    compiled = run_pipeline(m, "lower-loops,fuse,codegen-cpp,plan-buffers")
    check_module(compiled)


_NAME = st.from_regex(r"[A-Za-z_][A-Za-z0-9_]{0,8}", fullmatch=True)
_VALUE = st.from_regex(r"[A-Za-z0-9_.]{1,10}", fullmatch=True)


@FAST
@given(st.lists(_VALUE, min_size=5, max_size=5, unique=True),
       st.lists(hostile, min_size=3, max_size=3), _NAME, hostile)
def test_ir_file_text_never_becomes_code(names: list[str], files: list[str], graph: str,
                                         attr: str) -> None:
    """Through the parser (the CLI's path): locs are JSON strings, names the lexer's."""
    x, w, e, s, y = (f"%{n}" for n in names)
    loc = [f"loc({json.dumps(f)}:{k + 1})" for k, f in enumerate(files)]
    text = f"""ember.ir 1.0

graph @g_{graph}({x}: f32[4, 8], {w}: f32[8, 8]) -> (f32[4], f32[4, 8], f32[4, 8]) attrs(note={json.dumps(attr)}) {{
  {e} = aten.exp.default({x}) : f32[4, 8] {loc[0]}
  {s} = aten.sum.dim_IntList({e}, [1]) : f32[4] {loc[1]}
  {y} = aten.mm.default({e}, {w}) : f32[4, 8] {loc[2]}
  return ({s}, {e}, {y})
}}
"""
    compiled = run_pipeline(parse(text), "decompose,cse,dce,lower-loops,fuse,codegen-cpp")
    check_module(compiled)
    # the printed module (what `ember opt -o` writes) reads back with the same kernels
    again = parse(print_module(compiled))
    assert {k: v.source for k, v in again.kernels.items()} == \
        {k: v.source for k, v in compiled.kernels.items()}


@settings(max_examples=10, deadline=None)
@given(st.lists(hostile, min_size=7, max_size=7, unique=True),
       st.lists(hostile, min_size=3, max_size=3), hostile)
def test_wrapper_source_holds_ir_text_only_in_strings(names: list[str], files: list[str],
                                                      graph: str) -> None:
    """The generated Python call: IR names only inside string constants (an extern-only graph:
    no C++ build needed to generate it)."""
    m = Module()
    gb = GraphBuilder(m, graph or "g")
    x = gb.param(names[0], TensorType(DType.f32, (4, 8)))
    w = gb.param(names[1], TensorType(DType.f32, (8, 8)))
    mm = gb.op("prims.matmul", [x, w], name=names[2], loc=Loc(files[0], 1))
    gb.ret([mm])
    compiled = run_pipeline(m, "lower-loops,fuse,codegen-cpp")
    w_ = generate(compiled, graph or "g")
    for node in ast.walk(ast.parse(w_.source)):
        if isinstance(node, ast.Constant):
            continue
        for _, field in ast.iter_fields(node):  # names, attributes, argument names
            assert not isinstance(field, str) or MARK not in field, ast.dump(node)
    x_, w2 = torch.randn(4, 8), torch.randn(8, 8)
    torch.testing.assert_close(w_.call([x_, w2]).outputs[0], x_ @ w2)


@settings(max_examples=4, deadline=None)
@given(st.lists(hostile, min_size=7, max_size=7, unique=True),
       st.lists(hostile, min_size=3, max_size=3), hostile)
def test_hostile_names_compile_and_compute(names: list[str], files: list[str], graph: str
                                           ) -> None:
    """Mangled names and sanitized comments still build and give eager's results."""
    m = _api_module(names, files, graph or "g", "")
    run = compiled_runner(compile_module(m, "lower-loops,fuse,codegen-cpp,plan-buffers"))
    x, w = torch.randn(4, 8), torch.randn(8, 8)
    s, a, y, mm = run(graph or "g", [x, w]).outputs
    torch.testing.assert_close(s, x.exp().sum(1))
    assert torch.equal(a, x.argmax(1))
    torch.testing.assert_close(y, x.exp() * x)
    torch.testing.assert_close(mm, x @ w)


# ---- the original exploit, end to end ----------------------------------------------------------

def _exploit(tmp: Path, marker: Path, payload_loc: str) -> Path:
    f = tmp / "evil.ir"
    f.write_text(f"""ember.ir 1.0

graph @f(%x: f32[4]) -> (f32[4]) {{
  %y = prims.exp(%x) : f32[4] loc({json.dumps(payload_loc)}:1)
  return (%y)
}}
""")
    return f


def _payloads(marker: Path) -> list[str]:
    # block-scope declarations bound to libc by asm labels: valid inside the kernel's body
    code = ('void* ember_fo(const char*, const char*) __asm__("fopen"); '
            'int ember_fc(void*) __asm__("fclose"); '
            f'{{ void* f = ember_fo("{marker}", "w"); if (f) ember_fc(f); }}')
    return [f"a.py\n{code}\n//", f"a.py\\\n{code}\n//", f"a.py\r\n{code}\r\n//"]


@pytest.mark.parametrize("argv", [
    ["run", "--random", "--backend", "inductor"],
    ["check", "--backend", "inductor"],
    ["check", "-p", "decompose,lower-loops,fuse,codegen-cpp"],
], ids=["run-inductor", "check-inductor", "check-codegen-pipeline"])
def test_loc_newline_exploit_runs_nothing(tmp_path: Path, capsys: pytest.CaptureFixture[str],
                                          argv: list[str]) -> None:
    marker = tmp_path / "PWNED"
    for k, payload in enumerate(_payloads(marker)):
        d = tmp_path / str(k)
        d.mkdir()
        f = _exploit(d, marker, payload)
        rc = cli.main([argv[0], str(f), *argv[1:]])
        out = capsys.readouterr()
        assert rc == 0, out.err
        assert not marker.exists(), f"the IR file's loc() text ran as C++ ({payload!r})"


def test_compiler_is_run_without_a_shell_or_ir_text(monkeypatch: pytest.MonkeyPatch) -> None:
    """g++ gets an argument list (no shell) naming files by content hash: no argument holds
    text of the IR (a hostile graph, value or loc name)."""
    import subprocess

    calls: list[tuple[Any, dict[str, Any]]] = []
    real_popen, real_run = subprocess.Popen, subprocess.run

    def popen(args: Any, **kw: Any) -> Any:
        calls.append((args, kw))
        return real_popen(args, **kw)

    def run(args: Any, **kw: Any) -> Any:
        calls.append((args, kw))
        return real_run(args, **kw)
    monkeypatch.setattr(subprocess, "Popen", popen)
    monkeypatch.setattr(subprocess, "run", run)
    name = f"g_{MARK}"
    m = _api_module([f"{MARK}{k}; rm -rf ~ `{MARK}` $({MARK})" for k in range(7)],
                    [f"$(touch {MARK})\n{MARK}"] * 3, name, MARK)
    run_ = compiled_runner(compile_module(m, "lower-loops,fuse,codegen-cpp"))
    run_(name, [torch.randn(4, 8), torch.randn(8, 8)])
    assert any("-o" in args for args, _ in calls), "expected a fresh g++ build"
    for args, kw in calls:
        assert isinstance(args, list) and not kw.get("shell"), (args, kw)
        assert not any(MARK in str(a) for a in args), args
