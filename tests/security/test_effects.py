"""Issue 19 #2: an IR file must not reach files, the terminal or process state through torch ops
with effects outside the graph (`aten.from_file`, `aten.save`, `aten._print`, seeding, ...).

Parsing and verifying never call into torch for such an op; `ember opt`, `run` (every backend)
and `check` refuse it with one line naming the op, its line:col and why, unless
`--allow-effects`; the reference refuses to run it however it is reached. The registry scan
keeps `ember.ir.effects` complete over every schema torch registers.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import warnings
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from safetensors.torch import load_file

import ember.inductor  # noqa: F401  (kernels.extern, loop.extern)
import ember.ir.torch_ops as torch_ops
from ember.ir import Interpreter, InterpretError, VerificationError, parse, verify
from ember.ir.effects import (
    EFFECT_NAMESPACES,
    EFFECT_OPS,
    STR_ARGS,
    EffectError,
    allow_effects,
    classify,
    classify_schema,
)
from ember.ir.torch_ops import resolve
from ember.runtime import cli

SECRET = torch.tensor([11.0, 22.0, 33.0, 44.0])


@pytest.fixture
def torch_calls(monkeypatch: pytest.MonkeyPatch) -> Iterator[list[str]]:
    """Every torch op ember.ir's references call, by name (effect ops reach torch only here)."""
    calls: list[str] = []
    real = torch_ops.call_torch

    def spy(op: Any, args: list[Any], kwargs: dict[str, Any]) -> Any:
        calls.append(str(op._schema.name))
        return real(op, args, kwargs)

    monkeypatch.setattr(torch_ops, "call_torch", spy)
    yield calls


def _ember(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    rc = cli.main(list(argv))
    out, err = capsys.readouterr()
    return rc, out, err


def _refused(rc: int, err: str, ir: Path, line: int, col: int, op: str, why: str) -> None:
    assert rc == 1
    assert err.count("\n") == 1, err  # one line
    assert err.startswith(f"{ir}:{line}:{col}: error: {op} {why}"), err
    assert "--allow-effects" in err and "Traceback" not in err


def _read_ir(tmp: Path, data: Path) -> Path:
    ir = tmp / "read.ir"
    ir.write_text(f"""ember.ir 1.0
graph @f(%x: f32[4]) -> (f32[4]) {{
  %y = aten.from_file.default("{data}", false, 4, dtype=f32) : f32[4]
  %z = aten.add.Tensor(%x, %y) : f32[4]
  return (%z)
}}
""")
    return ir


# ---- the reproducers ------------------------------------------------------------------

@pytest.mark.parametrize("backend", ["reference", "prims", "inductor"])
def test_from_file_is_not_read_by_ember_run(tmp_path: Path, capsys: pytest.CaptureFixture[str],
                                            torch_calls: list[str], backend: str) -> None:
    data = tmp_path / "secret.bin"
    SECRET.numpy().tofile(data)
    ir = _read_ir(tmp_path, data)
    out = tmp_path / "out.safetensors"
    rc, stdout, err = _ember(capsys, "run", str(ir), "--random", "--backend", backend,
                             "--out", str(out))
    _refused(rc, err, ir, 3, 3, "aten.from_file.default", "reads a file")
    assert stdout == "" and not out.exists()
    assert "aten::from_file" not in torch_calls
    assert sorted(os.listdir(tmp_path)) == ["read.ir", "secret.bin"]


def test_from_file_shared_copy_does_not_rewrite_a_script(
        tmp_path: Path, capsys: pytest.CaptureFixture[str], torch_calls: list[str]) -> None:
    script = tmp_path / "job.sh"
    script.write_bytes(b"#!/bin/sh\necho original\n")
    before = (script.read_bytes(), script.stat().st_mtime_ns)
    n = len(before[0])
    ir = tmp_path / "write.ir"
    ir.write_text(f"""ember.ir 1.0
graph @f(%x: u8[{n}]) -> (u8[{n}]) {{
  %y = aten.from_file.default("{script}", true, {n}, dtype=u8) : u8[{n}]
  %z = aten.copy_.default(%y, %x) : u8[{n}]
  return (%z)
}}
""")
    for argv in (["run", str(ir), "--random"], ["check", str(ir), "-p", "dce,cse"],
                 ["opt", str(ir), "-p", "dce"]):
        rc, stdout, err = _ember(capsys, *argv)
        _refused(rc, err, ir, 3, 3, "aten.from_file.default", "reads a file")
        assert stdout == ""
    assert (script.read_bytes(), script.stat().st_mtime_ns) == before
    assert "aten::from_file" not in torch_calls


def test_ember_opt_creates_no_file(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    target = tmp_path / "created.bin"
    ir = tmp_path / "create.ir"
    ir.write_text(f"""ember.ir 1.0
graph @f(%x: f32[4]) -> (f32[4]) {{
  %y = aten.from_file.default("{target}", true, 4, dtype=f32) : f32[4]
  return (%y)
}}
""")
    rc, stdout, err = _ember(capsys, "opt", str(ir))
    _refused(rc, err, ir, 3, 3, "aten.from_file.default", "reads a file")
    assert not target.exists()
    # Even allowed, `opt` only types the op from its declaration: its kernel never runs.
    rc, stdout, err = _ember(capsys, "opt", str(ir), "--allow-effects", "-p", "dce,cse")
    assert rc == 0 and err == "" and "aten.from_file.default" in stdout
    assert not target.exists()


def test_allow_effects_is_the_explicit_opt_in(tmp_path: Path,
                                              capsys: pytest.CaptureFixture[str]) -> None:
    data = tmp_path / "data.bin"
    SECRET.numpy().tofile(data)
    ir = _read_ir(tmp_path, data)
    out = tmp_path / "out.safetensors"
    rc, _, err = _ember(capsys, "run", str(ir), "--random", "--allow-effects", "--out", str(out),
                        "--save-inputs", str(tmp_path / "in.safetensors"))
    assert rc == 0, err
    x = load_file(tmp_path / "in.safetensors")["x"]
    torch.testing.assert_close(load_file(out)["out0"], x + SECRET)
    for sub in ("opt", "run", "check"):
        with pytest.raises(SystemExit):
            cli.main([sub, "--help"])
        assert "--allow-effects" in capsys.readouterr().out


# ---- the Python API and every way to reach an op ---------------------------------------------

def test_verify_refuses_and_the_reference_refuses_without_verify(
        tmp_path: Path, torch_calls: list[str]) -> None:
    data = tmp_path / "secret.bin"
    SECRET.numpy().tofile(data)
    m = parse(_read_ir(tmp_path, data).read_text())
    with pytest.raises(VerificationError) as e:
        verify(m)
    assert (e.value.line, e.value.col) == (3, 3)
    assert str(e.value).startswith("3:3: aten.from_file.default reads a file")
    with pytest.raises(EffectError, match="aten.from_file.default reads a file"):
        Interpreter(m).run([torch.ones(4)])
    assert "aten::from_file" not in torch_calls
    with allow_effects():  # the same module, trusted
        verify(m)
        (z,) = Interpreter(m).run([torch.ones(4)]).outputs
    torch.testing.assert_close(z, SECRET + 1)
    with pytest.raises(VerificationError):  # the switch is scoped to the block
        verify(m)


@pytest.mark.parametrize("via", ["kernels.extern", "loop.extern"])
def test_indirect_calls_are_refused(tmp_path: Path, torch_calls: list[str], via: str) -> None:
    data = tmp_path / "secret.bin"
    SECRET.numpy().tofile(data)
    m = parse(f"""ember.ir 1.0
graph @f(%x: f32[4]) -> (f32[4]) {{
  %y = {via}("{data}", false, 4, op="aten.from_file.default", dtype=f32) : f32[4]
  return (%y)
}}
""")
    with pytest.raises(VerificationError, match="aten.from_file.default reads a file"):
        verify(m)
    with pytest.raises(InterpretError, match="aten.from_file.default reads a file"):
        Interpreter(m, check_types=False).run([torch.ones(4)])
    assert "aten::from_file" not in torch_calls


def test_typing_a_factory_never_allocates_it() -> None:
    # Typing ran aten.empty's real CPU kernel (1 TiB here) when no device was given.
    m = parse("""ember.ir 1.0
graph @f(%x: f32[4]) -> (f32[4]) {
  %y = aten.empty.memory_format([274877906944], dtype=f32) : f32[274877906944]
  %z = aten.ones.default([4], dtype=f32, device=none) : f32[4]
  return (%z)
}
""")
    verify(m)


# ---- the registry scan ------------------------------------------------------------------------

def _torch_schemas() -> list[Any]:
    """Every schema torch (and importing ember) registers, from a fresh interpreter: tests in
    this process register custom ops of their own (`ember_test_co::act(Tensor x, str kind)`),
    which are the user's and rightly count as effects, but are not torch's to review here."""
    code = ("import json, torch, ember.runtime, ember.inductor\n"
            "print(json.dumps([str(s) for s in torch._C._jit_get_all_schemas()]))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         check=True, timeout=300).stdout
    return [torch._C.parse_schema(t) for t in json.loads(out.splitlines()[-1])]


@pytest.fixture(scope="module")
def all_schemas() -> list[Any]:
    return _torch_schemas()


def test_every_str_argument_in_torch_is_reviewed(all_schemas: list[Any]) -> None:
    """A torch upgrade that adds a text argument (a file name, a message, a group) fails here
    until effects.STR_ARGS says whether it is safe; meanwhile such an op counts as an effect."""
    missing = sorted({f"{s.name}({a.name})" for s in all_schemas for a in s.arguments
                      if "str" in str(a.real_type) and a.name not in STR_ARGS})
    assert not missing, f"review these str arguments in ember.ir.effects.STR_ARGS: {missing}"


def test_registry_scan_classifies_every_op(all_schemas: list[Any]) -> None:
    names = {s.name for s in all_schemas}
    stale = sorted(set(EFFECT_OPS) - names)
    assert not stale, f"EFFECT_OPS names ops torch does not have: {stale}"
    for s in all_schemas:
        why = classify_schema(s)
        text = str(s)
        kinds = [str(a.real_type) for a in s.arguments]
        writes = any(a.alias_info is not None and a.alias_info.is_write for a in s.arguments)
        # Whatever names something outside the graph is an effect ...
        if any("Storage" in k or "__torch__." in k or k == "Generator" for k in kinds) or (
                not s.returns and not writes) or "(...)" in text:
            assert why is not None, text
        for a in s.arguments:
            if "str" in str(a.real_type) and not STR_ARGS.get(a.name, (False, ""))[0]:
                assert why is not None, text
        if s.name in EFFECT_OPS or s.name.split("::")[0] in EFFECT_NAMESPACES:
            assert why is not None, text


@pytest.mark.parametrize("name, effect", [
    ("aten.from_file.default", "reads a file"),
    ("aten.save.default", "writes a file"),
    ("aten._print.default", "prints"),
    ("aten.warn.default", "warning"),
    ("aten.manual_seed.default", "reseeds"),
    ("aten.set_grad_enabled.default", "autograd"),
    ("aten.set_.source_Storage", "Storage"),
    ("aten._assert_async.msg", "returns nothing"),
    ("profiler._record_function_enter.default", "profiler"),
    ("_c10d_functional.all_reduce.default", "other processes"),
    ("inductor._reinterpret_tensor.default", "bounds check"),
    ("debugprims.load_tensor.default", "disk"),
    ("aten.add.Tensor", None), ("aten.div.Tensor_mode", None), ("aten.einsum.default", None),
    ("aten.gelu.default", None), ("aten.searchsorted.Tensor", None),
    ("aten.linalg_norm.ord_str", None), ("aten.rand.default", None),
    ("aten.empty.memory_format", None), ("aten.copy_.default", None),
])
def test_known_ops(name: str, effect: str | None) -> None:
    op = resolve(name)
    assert op is not None
    why = classify(op)
    assert (why is None) if effect is None else (why is not None and effect in why), why


def test_an_unreviewed_text_argument_counts_as_an_effect() -> None:
    lib = torch.library.Library("ember_effects_probe", "FRAGMENT")
    lib.define("probe(Tensor x, str where) -> Tensor")
    op = resolve("ember_effects_probe.probe.default")
    assert op is not None
    why = classify(op)
    assert why is not None and "where" in why and "not reviewed" in why


@settings(max_examples=40, deadline=None)
@given(name=st.from_regex(r"[a-z_][a-z0-9_]{0,11}", fullmatch=True),
       ty=st.sampled_from(["str", "str?", "str[]", "str? "]), ns=st.sampled_from(
           ["aten", "ember_test_co", "user_ns"]))
def test_any_text_argument_classifies_without_raising(name: str, ty: str, ns: str) -> None:
    """Any schema classifies (a custom op another test registered in this process included);
    a text argument ember has not reviewed is an effect, never a KeyError."""
    if name in ("self", "out", "x") or name in {"def", "in", "is", "if", "or", "and", "not"}:
        return
    schema = torch._C.parse_schema(f"{ns}::probe(Tensor x, {ty.strip()} {name}) -> Tensor")
    why = classify_schema(schema)
    safe = STR_ARGS.get(name, (False, ""))[0]
    assert (why is None) if safe else (why is not None and name in why), why


def test_the_scan_ignores_custom_ops_of_this_process(all_schemas: list[Any]) -> None:
    lib = torch.library.Library("ember_effects_scan_probe", "FRAGMENT")
    lib.define("probe(Tensor x, str unreviewed_kind) -> Tensor")
    here = {s.name for s in torch._C._jit_get_all_schemas()}
    assert "ember_effects_scan_probe::probe" in here
    assert not any(s.name.startswith("ember_") for s in all_schemas)
    assert {s.name for s in all_schemas} >= {"aten::add", "aten::from_file", "prims::abs"}


# ---- property: parse + verify of any module never touches the world ------------------------

_PURE = ["aten.neg.default", "aten.abs.default", "aten.relu.default", "aten.exp.default",
         "aten.add.Tensor", "aten.mul.Tensor", "aten.sub.Tensor"]


def _effect_node(kind: str, d: Path, name: str, arg: str) -> tuple[str, str, str]:
    """(node text, ir op name, what the refusal says) for an effectful op writing under d."""
    f = d / "x.bin"
    return {
        "read": (f'%{name} = aten.from_file.default("{f}", false, 6, dtype=f32) : f32[2, 3]',
                 "aten.from_file.default", "reads a file"),
        "map": (f'%{name} = aten.from_file.default("{f}", true, 6, dtype=f32) : f32[2, 3]',
                "aten.from_file.default", "reads a file"),
        "save": (f'%{name} = aten.save.default(%{arg}, "{f}") : f32[2, 3]',
                 "aten.save.default", "writes a file"),
        "print": (f'%{name} = aten._print.default("ember-effects-probe") : f32[2, 3]',
                  "aten._print.default", "prints"),
        "seed": (f"%{name} = aten.manual_seed.default(1234) : f32[2, 3]",
                 "aten.manual_seed.default", "reseeds"),
        "warn": (f'%{name} = aten.warn.default("ember-effects-probe") : f32[2, 3]',
                 "aten.warn.default", "warning"),
    }[kind]


@settings(max_examples=25, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(ops=st.lists(st.sampled_from(_PURE), min_size=0, max_size=6),
       at=st.integers(0, 6), kind=st.sampled_from(["read", "map", "save", "print", "seed", "warn"]),
       allowed=st.booleans())
def test_parse_and_verify_never_touch_the_world(
        tmp_path_factory: pytest.TempPathFactory, capfd: pytest.CaptureFixture[str],
        ops: list[str], at: int, kind: str, allowed: bool) -> None:
    d = tmp_path_factory.mktemp("effects")
    seed = torch.initial_seed()
    lines, last = [], "x"
    at = min(at, len(ops))
    effect_line = 0
    for i in range(len(ops) + 1):
        if i == at:
            text, op, why = _effect_node(kind, d, f"e{i}", last)
            effect_line = 3 + len(lines)
            lines.append(text)
            last = f"e{i}"
        if i < len(ops):
            args = f"%{last}, %x" if ops[i].endswith(".Tensor") else f"%{last}"
            lines.append(f"%v{i} = {ops[i]}({args}) : f32[2, 3]")
            last = f"v{i}"
    body = "\n  ".join(lines)
    text = (f"ember.ir 1.0\ngraph @f(%x: f32[2, 3]) -> (f32[2, 3]) {{\n  {body}\n"
            f"  return (%{last})\n}}\n")
    m = parse(text)
    with allow_effects(allowed):
        if allowed:  # trusted: accepted, on its declared types, without running anything
            verify(m)
        else:
            with pytest.raises(VerificationError) as e:
                verify(m)
            assert (e.value.line, e.value.col) == (effect_line, 3)
            msg = e.value.errors[0].message
            assert msg.startswith(f"{op} ") and why in msg and "\n" not in msg
    assert os.listdir(d) == []
    out, err = capfd.readouterr()
    assert "ember-effects-probe" not in out + err
    assert torch.initial_seed() == seed


# ---- the user's own code is not IR from a file -------------------------------------------------

def test_compiled_user_code_still_runs_its_own_effects(tmp_path: Path,
                                                       capfd: pytest.CaptureFixture[str]) -> None:
    """Capture of a function that calls such an op is the user's code: it runs (eagerly) as
    before; only IR from files and text is refused."""
    import ember.runtime

    data = tmp_path / "mine.bin"
    SECRET.numpy().tofile(data)

    def f(x: torch.Tensor) -> torch.Tensor:
        torch.ops.aten._print.default("user-print")
        return x + torch.from_file(str(data), shared=False, size=4, dtype=torch.float32)

    compiled = ember.runtime.compile(f)
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # a graph break at each effect, not a fallback
        for _ in range(2):  # capture, then the cached graphs
            torch.testing.assert_close(compiled(torch.ones(4)), SECRET + 1)
            assert capfd.readouterr().out.count("user-print") == 1
    breaks = [b.reason for b in ember.runtime.explain(compiled, torch.ones(4)).breaks]
    assert any(r.startswith("aten::_print prints to standard output") for r in breaks), breaks
    assert any(r.startswith("aten::from_file reads a file") for r in breaks), breaks


@pytest.mark.parametrize("kind", ["print", "read", "seed"])
def test_each_effect_in_user_code_is_a_graph_break(
        tmp_path: Path, capfd: pytest.CaptureFixture[str], kind: str) -> None:
    """The effect sits between tensor work captured before and after it, and happens once per
    call, in order (fake tensors would have run it silently and dropped it from the graph)."""
    import ember.runtime

    data = tmp_path / "mine.bin"
    SECRET.numpy().tofile(data)
    name = str(data)

    def f(x: torch.Tensor) -> torch.Tensor:
        y = x * 2
        if kind == "print":
            torch.ops.aten._print.default("user-print")
            z = y
        elif kind == "read":
            z = y + torch.from_file(name, shared=False, size=4, dtype=torch.float32)
        else:
            torch.ops.aten.manual_seed.default(1234)
            z = y
        return z.sin()

    compiled = ember.runtime.compile(f)
    x = torch.arange(4.0)
    seed = torch.initial_seed()
    torch.manual_seed(seed + 1)
    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        out = compiled(x)
    assert torch.initial_seed() == (1234 if kind == "seed" else seed + 1)
    torch.manual_seed(seed)
    expect = ((x * 2 + SECRET) if kind == "read" else x * 2).sin()
    torch.testing.assert_close(out, expect)
    if kind == "print":
        assert capfd.readouterr().out.count("user-print") == 1
    warned = [str(w.message) for w in seen]
    assert not any("falls back" in w for w in warned), warned
    rep = ember.runtime.explain(compiled, x)
    op = {"print": "aten::_print", "read": "aten::from_file", "seed": "aten::manual_seed"}[kind]
    assert [b.reason.split(" ")[0] for b in rep.breaks] == [op]
