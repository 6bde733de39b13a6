"""Issue 19 #6 and #16: `ember run` takes only inputs of exactly the declared types, writes
results and updated parameters under keys that cannot collide, and answers every user mistake
with one line (`... error: ...`, exit status 1 or 2), never `internal error` or a traceback.
"""

from __future__ import annotations

import contextlib
import io
import tempfile
from pathlib import Path

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from safetensors.torch import load_file, save_file

from ember.runtime import cli


def run(args: list[str]) -> tuple[int, str, str]:
    """cli.main with its output captured; a usage error's SystemExit becomes its code."""
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        try:
            rc = cli.main(args)
        except SystemExit as e:
            rc = e.code if isinstance(e.code, int) else 2
    return rc, out.getvalue(), err.getvalue()


def one_error(rc: int, err: str, *words: str) -> None:
    assert rc == 1, err
    assert err.count("\n") == 1 and " error: " in err, err
    assert "internal error" not in err and "Traceback" not in err, err
    for w in words:
        assert w in err, (w, err)


def ir(tmp: Path, body: str, name: str = "m.ir") -> Path:
    f = tmp / name
    f.write_text("ember.ir 1.0\n\n" + body)
    return f


def st_file(tmp: Path, name: str = "in.safetensors", **tensors: torch.Tensor) -> Path:
    f = tmp / name
    save_file(tensors, str(f))
    return f


UPDATES_OUT0 = """graph @f(%out0: f32[2], %g: f32[2]) -> (f32[2], f32[2]) attrs(input_updates=[[0, 0]]) {
  %q = aten.add.Tensor(%out0, %g) : f32[2]
  %r = aten.mul.Tensor(%out0, %g) : f32[2]
  return (%q, %r)
}
"""

SCALARS = """graph @f(%n: i64, %x: f64, %b: bool) -> (i64, f64, bool) {
  return (%n, %x, %b)
}
"""

NEG = """graph @f(%x: f32[2]) -> (f32[2]) {
  %y = aten.neg.default(%x) : f32[2]
  return (%y)
}
"""

BOUNDED = """symbol s0 hint=3 min=2 max=6

graph @f(%x: f32[s0], %y: f32[s0, 2]) -> (f32[s0]) {
  %z = aten.neg.default(%x) : f32[s0]
  return (%z)
}
"""

# ---- #6: result keys ----------------------------------------------------------------------


def test_updated_parameter_named_like_a_result_is_refused(tmp_path: Path) -> None:
    f = ir(tmp_path, UPDATES_OUT0)
    ins = st_file(tmp_path, out0=torch.ones(2), g=torch.full((2,), 2.0))
    out = tmp_path / "o.safetensors"
    rc, stdout, err = run(["run", str(f), "--inputs", str(ins), "--out", str(out)])
    one_error(rc, err, "%out0", "reserved", "rename")
    assert not out.exists() and stdout == ""  # refused before running
    # without a file to write, both are shown
    rc, stdout, err = run(["run", str(f), "--inputs", str(ins)])
    assert rc == 0, err
    assert stdout.splitlines() == ["out0: float32[2] [2.0, 2.0]", "out0: float32[2] [3.0, 3.0]"]


def test_updated_parameter_is_written_under_its_name(tmp_path: Path) -> None:
    f = ir(tmp_path, UPDATES_OUT0.replace("%out0", "%p"))
    ins = st_file(tmp_path, p=torch.ones(2), g=torch.full((2,), 2.0))
    out = tmp_path / "o.safetensors"
    rc, _, err = run(["run", str(f), "--inputs", str(ins), "--out", str(out)])
    assert rc == 0, err
    o = load_file(str(out))
    assert torch.equal(o["out0"], torch.full((2,), 2.0)) and torch.equal(o["p"], torch.full((2,), 3.0))


# ---- #6: inputs of exactly the declared type ------------------------------------------------

SCALAR_CASES = [  # (parameter, stored tensor, accepted value or None when refused)
    ("n", torch.tensor(2.7), None), ("n", torch.tensor(2.0), None), ("n", torch.tensor(True), None),
    ("n", torch.tensor(7, dtype=torch.int32), 7), ("n", torch.tensor([7]), None),
    ("x", torch.tensor(True), None), ("x", torch.tensor(3), 3.0),
    ("x", torch.tensor(2**53 + 1), None), ("x", torch.tensor(0.5, dtype=torch.float32), 0.5),
    ("x", torch.tensor(1j), None), ("b", torch.tensor(1), None), ("b", torch.tensor(True), True),
]


@pytest.mark.parametrize(("param", "stored", "want"), SCALAR_CASES)
def test_scalar_parameters_take_lossless_values_only(tmp_path: Path, param: str,
                                                     stored: torch.Tensor,
                                                     want: object) -> None:
    f = ir(tmp_path, SCALARS)
    given_ = {"n": torch.tensor(1), "x": torch.tensor(1.0, dtype=torch.float64),
              "b": torch.tensor(False)}
    given_[param] = stored
    ins = st_file(tmp_path, **given_)
    out = tmp_path / "o.safetensors"
    rc, _, err = run(["run", str(f), "--inputs", str(ins), "--out", str(out)])
    if want is None:
        declared = {"n": "i64", "x": "f64", "b": "bool"}[param]
        one_error(rc, err, f"%{param}", declared, "the file holds")
    else:
        assert rc == 0, err
        got = load_file(str(out))[f"out{'nxb'.index(param)}"].item()
        assert got == want and type(got) is type(want)


def _lossless(kind: str, dt: torch.dtype, v: float) -> bool:
    integer = not (dt.is_floating_point or dt.is_complex or dt == torch.bool)
    if kind == "b":
        return dt == torch.bool
    if kind == "n":
        return integer
    return dt.is_floating_point or (integer and float(v) == v)


@settings(max_examples=40)
@given(kind=st.sampled_from("nxb"),
       dt=st.sampled_from([torch.bool, torch.int8, torch.int32, torch.int64, torch.uint8,
                           torch.float16, torch.float32, torch.float64]),
       v=st.integers(-(2**62), 2**62) | st.floats(-1e6, 1e6, allow_nan=False))
def test_scalar_conversions_property(kind: str, dt: torch.dtype, v: float) -> None:
    stored = torch.tensor(v).to(dt)
    with tempfile.TemporaryDirectory() as d:
        tmp = Path(d)
        given_ = {"n": torch.tensor(1), "x": torch.tensor(1.0, dtype=torch.float64),
                  "b": torch.tensor(False), kind: stored}
        ins = st_file(tmp, **given_)
        out = tmp / "o.safetensors"
        rc, _, err = run(["run", str(ir(tmp, SCALARS)), "--inputs", str(ins), "--out", str(out)])
        if _lossless(kind, dt, stored.item()):
            assert rc == 0, err
            assert load_file(str(out))[f"out{'nxb'.index(kind)}"].item() == stored.item()
        else:
            one_error(rc, err, f"%{kind}")


def test_tensor_dtype_and_rank_must_match(tmp_path: Path) -> None:
    f = ir(tmp_path, NEG)
    for x, words in ((torch.zeros(2, dtype=torch.float64), ("%x", "f32[2]", "f64[2]")),
                     (torch.zeros(2, 1), ("%x", "rank 1", "f32[2, 1]")),
                     (torch.zeros(3), ("%x", "dim 0 is 3"))):
        ins = st_file(tmp_path, x=x)
        for backend in ("reference", "prims", "inductor"):
            rc, _, err = run(["run", str(f), "--inputs", str(ins), "--backend", backend])
            one_error(rc, err, *words)


@settings(max_examples=30)
@given(nx=st.integers(0, 9), ny=st.integers(0, 9))
def test_symbol_bounds_and_consistency_enforced(nx: int, ny: int) -> None:
    with tempfile.TemporaryDirectory() as d:
        tmp = Path(d)
        ins = st_file(tmp, x=torch.zeros(nx), y=torch.zeros(ny, 2))
        rc, out, err = run(["run", str(ir(tmp, BOUNDED)), "--inputs", str(ins)])
        if nx != ny:
            one_error(rc, err, "s0")
        elif not 2 <= nx <= 6:
            one_error(rc, err, f"symbol s0 is bound to {nx}", "[2, 6]")
        else:
            assert rc == 0 and out.startswith(f"out0: float32[{nx}]"), err


def test_symbol_range_enforced_by_the_interpreter_too() -> None:
    from ember.ir import Interpreter, InterpretError, parse

    m = parse("ember.ir 1.0\n\n" + BOUNDED)
    with pytest.raises(InterpretError, match=r"s0 is bound to 7 .* \[2, 6\]"):
        Interpreter(m).run([torch.zeros(7), torch.zeros(7, 2)])


def test_missing_and_extra_inputs_named(tmp_path: Path) -> None:
    f = ir(tmp_path, BOUNDED)
    rc, _, err = run(["run", str(f), "--inputs", str(st_file(tmp_path, x=torch.zeros(3)))])
    one_error(rc, err, "no tensor for parameter(s) y")
    ins = st_file(tmp_path, x=torch.zeros(3), y=torch.zeros(3, 2), z=torch.zeros(1))
    rc, _, err = run(["run", str(f), "--inputs", str(ins)])
    one_error(rc, err, "z name no parameter", "x, y")


# ---- #16: user mistakes are one line ------------------------------------------------------


def test_output_paths_checked_before_running(tmp_path: Path) -> None:
    f = ir(tmp_path, NEG)
    for flag in ("--out", "--save-inputs"):
        for path, words in ((tmp_path / "no" / "o.st", ("no such directory",)),
                            (tmp_path, ("is a directory",))):
            rc, out, err = run(["run", str(f), "--random", flag, str(path)])
            one_error(rc, err, flag, *words)
            assert out == ""  # nothing ran
    same = str(tmp_path / "same.st")
    rc, _, err = run(["run", str(f), "--random", "--out", same, "--save-inputs", same])
    one_error(rc, err, "same file")
    rc, _, err = run(["opt", str(f), "-o", str(tmp_path / "no" / "o.ir")])
    one_error(rc, err, "-o", "no such directory")


def test_unknown_or_absent_devices(tmp_path: Path) -> None:
    for dev, words in (("foo", ("unknown device 'foo'",)), ("cuda", ("not available",)),
                       ("meta", ("holds no data",))):
        if dev == "cuda" and torch.cuda.is_available():
            continue
        f = ir(tmp_path, NEG.replace("f32[2]", f"f32[2]@{dev}"))
        rc, _, err = run(["run", str(f), "--random"])
        one_error(rc, err, "%x", *words)
        rc, _, err = run(["run", str(f), "--inputs", str(st_file(tmp_path, x=torch.zeros(2)))])
        one_error(rc, err, "%x", *words)
    f = ir(tmp_path, NEG.replace("aten.neg.default(%x)", 'aten.zeros.default([2], device="foo")'))
    rc, _, err = run(["run", str(f), "--random"])
    one_error(rc, err, "unknown device 'foo'", ":4:3:")


def test_absurd_random_inputs_refused_with_a_way_out(tmp_path: Path,
                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    f = ir(tmp_path, NEG.replace("f32[2]", "f32[100000, 1000000]"))
    rc, _, err = run(["run", str(f), "--random"])
    one_error(rc, err, "400,000,000,000 bytes", "--max-input-bytes", "EMBER_MAX_INPUT_BYTES")
    small = ir(tmp_path, NEG, "small.ir")
    rc, _, err = run(["run", str(small), "--random", "--max-input-bytes", "7"])
    one_error(rc, err, "8 bytes", "limit of 7")
    assert run(["run", str(small), "--random", "--max-input-bytes", "8"])[0] == 0
    monkeypatch.setenv("EMBER_MAX_INPUT_BYTES", "4")
    one_error(*run(["run", str(small), "--random"])[::2], "limit of 4")
    monkeypatch.setenv("EMBER_MAX_INPUT_BYTES", "1K")
    assert run(["run", str(small), "--random"])[0] == 0
    rc, _, err = run(["run", str(small), "--random", "--max-input-bytes", "lots"])
    one_error(rc, err, "--max-input-bytes", "not a size")


def test_directories_and_bad_flags(tmp_path: Path) -> None:
    f = ir(tmp_path, NEG)
    one_error(*run(["run", str(f), "--inputs", str(tmp_path)])[::2], "is a directory")
    one_error(*run(["run", str(tmp_path), "--random"])[::2], "directory")
    one_error(*run(["run", str(f), "--random", "--seed", "-1"])[::2], "--seed")
    one_error(*run(["run", str(f), "--random", "--seed", str(2**70)])[::2], "--seed")
    one_error(*run(["run", str(f), "--random", "--graph", "g"])[::2], "no graph @g")
    c128 = ir(tmp_path, NEG.replace("f32", "c128"), "c.ir")
    one_error(*run(["run", str(c128), "--random", "--out", str(tmp_path / "o.st")])[::2],
              "safetensors cannot hold c128")


def test_data_errors_are_one_line_on_every_backend(tmp_path: Path) -> None:
    f = ir(tmp_path, "graph @f(%x: f32[3], %i: i64[2]) -> (f32[2]) {\n"
                     "  %y = aten.index_select.default(%x, 0, %i) : f32[2]\n  return (%y)\n}\n")
    ins = st_file(tmp_path, x=torch.zeros(3), i=torch.tensor([0, 7]))
    for backend in ("reference", "prims", "inductor"):
        rc, _, err = run(["run", str(f), "--inputs", str(ins), "--backend", backend])
        one_error(rc, err, "IndexError")


# ---- #16: a fuzz over the CLI: only rc 0, 1 or 2, never an internal error ------------------

DTYPES = {"f32": torch.float32, "f64": torch.float64, "i64": torch.int64, "b8": torch.bool,
          "c128": torch.complex128, "f16": torch.float16}
DIMS = ["2", "3", "0", "s0", "s0", "s0 * 2", "s0 - 5", "100000000000"]


def _result(op: str, dt: str, dims: list[str], dev: str) -> str:
    """The op's result type (right for the common cases: the fuzz wants IR that verifies)."""
    if op == "sum":
        return f"{'i64' if dt in ('i64', 'b8') else dt}[]{dev}"
    if op == "index_select":
        return f"{dt}[{', '.join(['2', *dims[1:]])}]{dev}"
    if op == "zeros":
        return "f32[2]"
    return f"{dt}[{', '.join(dims)}]{dev}"


OPS = {"neg": "aten.neg.default(%X)", "add": "aten.add.Tensor(%X, %X)",
       "index_select": "aten.index_select.default(%X, 0, %i)",
       "zeros": 'aten.zeros.default([2], device="foo")', "sum": "aten.sum.default(%X)",
       "floor_divide": "aten.floor_divide.default(%X, %X)", "mm": "aten.mm.default(%X, %X)",
       "unknown": "nope.op(%X)"}


@st.composite
def cases(draw: st.DrawFn) -> tuple[str, dict[str, torch.Tensor]]:
    """A small module (usually valid) and an inputs file (usually fitting it)."""
    dt = draw(st.sampled_from(sorted(DTYPES)))
    dims = draw(st.lists(st.sampled_from(DIMS), min_size=1, max_size=2))
    dev = draw(st.sampled_from(["", "", "", "@cuda", "@foo", "@meta"]))
    xname = draw(st.sampled_from(["x", "x", "out0"]))
    op = draw(st.sampled_from(sorted(OPS)))
    ty, rty = f"{dt}[{', '.join(dims)}]{dev}", _result(op, dt, dims, dev)
    upd = " attrs(input_updates=[[0, 0]])" if rty == ty and draw(st.booleans()) else ""
    sym = draw(st.sampled_from(["symbol s0 hint=3\n\n", "symbol s0 hint=3 min=2 max=4\n\n", ""]))
    text = (f"{sym}graph @f(%{xname}: {ty}, %i: i64[2], %n: i64) -> ({rty}){upd} {{\n"
            f"  %y = {OPS[op].replace('%X', '%' + xname)} : {rty}\n  return (%y)\n}}\n")
    text = draw(st.sampled_from([text] * 6 + [text[: len(text) // 2], text.replace("(%", "(")]))
    s0 = draw(st.integers(0, 6))
    sizes = [eval_dim(d, s0) for d in dims]
    inputs = {xname: _tensor(DTYPES[dt], sizes), "i": torch.tensor(draw(st.lists(
        st.integers(-4, 4), min_size=2, max_size=2))), "n": torch.tensor(draw(st.integers(-2, 2)))}
    for _ in range(draw(st.integers(0, 2))):  # a mistake or two
        name = draw(st.sampled_from([xname, "i", "n", "zz"]))
        if draw(st.booleans()):
            inputs.pop(name, None)
        else:
            d = draw(st.sampled_from([torch.float32, torch.float64, torch.int64, torch.bool]))
            inputs[name] = _tensor(d, draw(st.lists(st.integers(0, 3), max_size=2)))
    return text, inputs


def eval_dim(d: str, s0: int) -> int:
    v = {"s0": s0, "s0 * 2": 2 * s0, "s0 - 5": max(s0 - 5, 0)}.get(d)
    return v if v is not None else min(int(d), 3)


def _tensor(dt: torch.dtype, shape: list[int]) -> torch.Tensor:
    return torch.randint(-3, 5, shape).to(dt)


@settings(max_examples=80)
@given(case=cases(), data=st.data())
def test_cli_fuzz_never_crashes(case: tuple[str, dict[str, torch.Tensor]],
                                data: st.DataObject) -> None:
    text, inputs = case
    with tempfile.TemporaryDirectory() as d:
        tmp = Path(d)
        f = ir(tmp, text)
        ins = tmp / "in.safetensors"
        save_file({k: v for k, v in inputs.items() if v.dtype != torch.complex128}, str(ins))
        good = [str(tmp / "o.st")] * 4
        paths = st.sampled_from(good + [str(tmp), str(tmp / "no" / "o.st"), str(f), "-"])
        cmd = data.draw(st.sampled_from(["run", "run", "run", "check", "opt"]))
        args = [cmd, str(f)]
        if cmd == "run":
            args += data.draw(st.sampled_from([["--random"], ["--inputs", str(ins)]] * 3
                                              + [["--inputs", str(f)], []]))
            flags = {"--out": paths, "--save-inputs": st.sampled_from([str(tmp / "i.st")]) | paths,
                     "--seed": st.sampled_from(["0", "-3", str(2**65), "x", "7"]),
                     "--graph": st.sampled_from(["f", "g"]),
                     "--backend": st.sampled_from(["reference", "prims", "prims", "nope"]),
                     "--max-input-bytes": st.sampled_from(["1K", "0", "bad", "8G"])}
            for flag in data.draw(st.lists(st.sampled_from(sorted(flags)), unique=True,
                                           max_size=3)):
                args += [flag, data.draw(flags[flag])]
        elif cmd == "check":
            args += data.draw(st.sampled_from([["-p", "dce"], ["-p", "nosuch"],
                                               ["--backend", "prims"], []]))
        else:
            args += data.draw(st.sampled_from([["-p", "dce,cse"], ["-o", str(tmp / "no" / "o")],
                                               ["-p", "{"]]))
        rc, _, err = run(args)
        assert rc in (0, 1, 2), (args, err)
        assert "internal error" not in err and "Traceback" not in err, (args, text, err)
