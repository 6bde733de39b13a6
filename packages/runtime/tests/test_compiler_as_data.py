"""The compiler as data (issue 13): named pipelines, decomposition tables as values, compile()
options. The plugin package that changes a decomposition and a fusion decision for both
`ember opt` and `compile()` with no edit to ember is examples/ember-plugin-example, tested as
installed in test_plugin_example.py.
"""

from __future__ import annotations

import warnings
from collections.abc import Iterator
from pathlib import Path

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

import ember.runtime as er
from ember.ir import Module
from ember.ir.passes import (
    PassRegistry,
    PipelineError,
    default_pass_registry,
    expand_pipeline,
    parse_pipeline,
    register_pass,
    register_pipeline,
)
from ember.prims.decomp import DECOMPOSITIONS
from ember.prims.decomp.table import (
    DecompositionTable,
    decomposition_table,
    decomposition_tables,
    register_decomposition_table,
)
from ember.runtime.cli import main

# ---- compile() options and modes -----------------------------------------------------------

def test_unknown_option_lists_the_valid_ones() -> None:
    with pytest.raises(ValueError, match="unknown compile option.*'fast'.*valid options: "
                                         "pipeline, decompositions, verify_each"):
        er.compile(lambda x: x, options={"fast": True})


def test_unknown_mode_raises_and_planned_modes_say_so() -> None:
    with pytest.raises(ValueError, match="unknown mode 'fastest'; valid modes: None, "
                                         "'default', 'reduce-overhead'"):
        er.compile(lambda x: x, mode="fastest")
    c = er.compile(lambda x: x + 1, mode="max-autotune")
    assert c(torch.ones(2)).tolist() == [2.0, 2.0]
    assert any("max-autotune" in n and "inductor runs" in n for n in c.history.notes)


@pytest.mark.parametrize("options, message", [
    ({"pipeline": "nope"}, "unknown pass 'nope'.*pipelines: .*inductor"),
    ({"pipeline": 3}, "pipeline must be"),
    ({"decompositions": "nope"}, "unknown decomposition table 'nope'.*default"),
    ({"pipeline": "decompose{table=nope}"}, "unknown decomposition table 'nope'"),
    ({"decompositions": 1.5}, "table name or a DecompositionTable"),
    ({"verify_each": "yes"}, "verify_each must be a bool"),
    ({"cache_limit": 0}, "cache_limit must be an int >= 1"),
    ({"cache_limit": True}, "cache_limit must be an int >= 1"),
    ({"dump_each": True}, "dump_each needs dump_dir"),
])
def test_bad_option_values(options: dict[str, object], message: str,
                           monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("EMBER_DUMP", raising=False)
    with pytest.raises(ValueError, match=message):
        er.compile(lambda x: x, options=options)


def test_pipeline_options_need_the_inductor_backend() -> None:
    with pytest.raises(ValueError, match="pipeline apply to the inductor backend only"):
        er.compile(lambda x: x, backend="eager", options={"pipeline": "to-prims"})
    c = er.compile(lambda x: x * 2, backend="eager", options={"cache_limit": 1})
    c(torch.ones(2))
    with pytest.warns(UserWarning, match="recompiled 1 times"):
        c(torch.ones(3))


def test_pipeline_option_runs_through_the_default_policy(tmp_path: Path) -> None:
    """A pipeline that stops at prims: the interpreter runs it, explain says what ran."""
    x = torch.randn(3, 4)
    c = er.compile(lambda x: torch.sigmoid(x) * 2, options={"pipeline": "to-prims",
                                                            "dump_dir": str(tmp_path)})
    torch.testing.assert_close(c(x), torch.sigmoid(x) * 2)
    notes = " ".join(c.history.notes)
    assert "decompose,cse,dce" in notes and "prims." in notes
    assert "prims." in (tmp_path / "_lambda__0.kernels.ir").read_text() or \
        any("prims." in p.read_text() for p in tmp_path.glob("*.kernels.ir"))


def test_table_object_and_verify_each(tmp_path: Path) -> None:
    calls: list[str] = []
    exact = DECOMPOSITIONS.get("aten.sigmoid.default")
    assert exact is not None

    def counted(ctx, self):  # type: ignore[no-untyped-def]
        calls.append("sigmoid")
        return exact(ctx, self)

    table = DECOMPOSITIONS.copy().replace("aten.sigmoid.default", counted)
    x = torch.randn(5)
    c = er.compile(lambda x: torch.sigmoid(x), options={"decompositions": table,
                                                        "verify_each": True})
    torch.testing.assert_close(c(x), torch.sigmoid(x))
    assert calls == ["sigmoid"] and DECOMPOSITIONS.get("aten.sigmoid.default") is exact
    assert any("verified after every stage" in n for n in c.history.notes)


@pytest.fixture
def breaking_pass() -> Iterator[str]:
    def break_types(module: Module) -> Module:
        out = module.clone()
        for g in out.graphs.values():
            for n in g.nodes:
                for r in n.results:
                    r.type = g.params[0].type if g.params else r.type
                    r.name = r.name  # keep names; only the declared type changes
            g.result_types = [g.params[0].type for _ in g.outputs]
        return out

    register_pass("test-break-types", "test only: declares wrong result types")(break_types)
    yield "test-break-types"
    default_pass_registry()._passes.pop("test-break-types")


def test_verify_each_catches_a_bad_pass(breaking_pass: str) -> None:
    x = torch.ones(2, 3)
    c = er.compile(lambda x: x.sum(0), options={"pipeline": f"to-prims,{breaking_pass}",
                                                "verify_each": True})
    torch.testing.assert_close(c(x), x.sum(0))  # the eager backend ran it, with the reason
    assert any("VerificationError" in n and "eager backend ran it" in n
               for n in c.history.notes)


# ---- named pipelines -----------------------------------------------------------------------

def test_named_pipelines_expand() -> None:
    assert expand_pipeline("inductor") == ("decompose{keep_attention=true},cse,dce,"
                                           "cache-inplace,dce,window-reduce,group-linears,"
                                           "conv-nhwc,lower-loops,fuse,schedule-cpu,"
                                           "codegen-cpp,plan-buffers")
    assert expand_pipeline("to-prims,inductor-cpu") == ("decompose,cse,dce,cache-inplace,dce,"
                                                        "window-reduce,group-linears,conv-nhwc,"
                                                        "lower-loops,fuse,schedule-cpu,"
                                                        "codegen-cpp,plan-buffers")
    from ember.inductor.kernels import DEFAULT_PIPELINE
    assert DEFAULT_PIPELINE == default_pass_registry().pipelines()["inductor"].text


def test_pipeline_errors() -> None:
    reg = PassRegistry()
    reg._plugins_loaded = True  # this registry only: not the installed plugins' entry points
    register_pass("noop", "nothing", registry=reg)(lambda module: module.clone())
    register_pipeline("a", "noop,b", "a", registry=reg)
    register_pipeline("b", "noop,c", "b", registry=reg)
    register_pipeline("c", "a", "c", registry=reg)
    register_pipeline("typo", "noop,nop", "typo", registry=reg)
    with pytest.raises(PipelineError, match=r"col 6: pipeline cycle: a -> b -> c -> a"):
        parse_pipeline("noop,a", reg)
    with pytest.raises(PipelineError, match=r"in pipeline typo .*unknown pass 'nop' \(known: "
                                            r"noop; pipelines: a, b, c, typo\)"):
        parse_pipeline("typo", reg)
    with pytest.raises(PipelineError, match="a is a pipeline: it takes no options"):
        parse_pipeline("a{x=1}", reg)
    with pytest.raises(ValueError, match="already registered"):
        register_pipeline("a", "noop", "again", registry=reg)
    with pytest.raises(ValueError, match="a pass of that name"):
        register_pipeline("noop", "noop", "clash", registry=reg)
    with pytest.raises(PipelineError, match="expected a pass name"):
        register_pipeline("bad", "noop,,noop", "syntax", registry=reg)
    register_pipeline("a", "noop", "redefined", registry=reg, replace=True)
    assert [str(s) for s in parse_pipeline("a,a", reg)] == ["noop", "noop"]


@settings(max_examples=40, deadline=None)
@given(st.data())
def test_expansion_is_substitution(data: st.DataObject) -> None:
    """Pipelines p0..pn where pi names only pj with j < i (no cycle): parsing expands each name
    to its own expansion; redefining p0 to name the last one makes a cycle exactly when the
    last one reaches p0, and the error names it."""
    reg = PassRegistry()
    for name in ("x", "y"):
        register_pass(name, name, registry=reg)(lambda module: module.clone())
    n = data.draw(st.integers(1, 5))
    flat: dict[str, list[str]] = {}
    reach: dict[str, set[str]] = {}  # the pipelines a pipeline's expansion goes through
    for i in range(n):
        items = data.draw(st.lists(st.sampled_from(["x", "y", *[f"p{j}" for j in range(i)]]),
                                   min_size=1, max_size=4))
        register_pipeline(f"p{i}", ",".join(items), "", registry=reg)
        flat[f"p{i}"] = [s for it in items for s in flat.get(it, [it])]
        reach[f"p{i}"] = {f"p{i}"}.union(*(reach.get(it, set()) for it in items))
    top = f"p{n - 1}"
    assert [str(s) for s in parse_pipeline(top, reg)] == flat[top]
    register_pipeline("p0", f"x,{top}", "", registry=reg, replace=True)
    if "p0" in reach[top]:
        with pytest.raises(PipelineError, match="pipeline cycle: p"):
            parse_pipeline(top, reg)
    else:
        assert [str(s) for s in parse_pipeline("p0", reg)] == ["x", *flat[top]]


def test_passes_lists_pipelines_and_tables(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["passes"]) == 0
    out = capsys.readouterr().out
    assert "pipelines:" in out and "= decompose{keep_attention=true},cse,dce,inductor-cpu" in out
    assert "inductor-cpu" in out and "to-prims" in out and "default " in out
    assert main(["backends"]) == 0
    assert "decompose{keep_attention=true},cse,dce,inductor-cpu" in capsys.readouterr().out


def test_ember_opt_reports_bad_names(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    f = tmp_path / "g.ir"
    f.write_text("ember.ir 1.0\n\ngraph @g(%x: f32[4]) -> (f32[4]) {\n"
                 "  %y = aten.gelu.default(%x) : f32[4]\n  return (%y)\n}\n")
    assert main(["opt", str(f), "-p", "decompose{table=nope}"]) == 1
    err = capsys.readouterr().err
    assert "unknown decomposition table 'nope'" in err and "internal error" not in err
    assert main(["opt", str(f), "-p", "inductr"]) == 1
    assert "pipelines: " in capsys.readouterr().err


# ---- decomposition tables as values --------------------------------------------------------

def test_tables_copy_override_and_register() -> None:
    gelu = DECOMPOSITIONS.get("aten.gelu.default")
    assert gelu is not None

    def other(ctx, self, approximate="none"):  # type: ignore[no-untyped-def]
        return gelu(ctx, self, approximate)

    with pytest.raises(ValueError, match="already has a decomposition.*override=True"):
        DECOMPOSITIONS.register("aten.gelu.default")(other)
    t = DECOMPOSITIONS.copy()
    t.register("aten.gelu.default", override=True)(other)
    assert t.get("aten.gelu.default") is other and DECOMPOSITIONS.get("aten.gelu.default") is gelu
    assert len(t) == len(DECOMPOSITIONS)
    with pytest.raises(ValueError, match="no decomposition in this table to replace"):
        DecompositionTable().replace("aten.gelu.default", other)
    with pytest.raises(ValueError, match="the table 'default' is ember's own"):
        register_decomposition_table("default", t)
    register_decomposition_table("test-gelu", t)
    try:
        assert decomposition_table("test-gelu") is t and t.name == "test-gelu"
        with pytest.raises(ValueError, match="already registered"):
            register_decomposition_table("test-gelu", t.copy())
        with pytest.raises(ValueError, match="cannot be written"):
            register_decomposition_table("a,b", t.copy())
    finally:
        decomposition_tables()._tables.pop("test-gelu")
    with pytest.raises(KeyError, match="known: default"):
        decomposition_table("test-gelu")


def test_a_broken_plugin_is_a_warning(monkeypatch: pytest.MonkeyPatch) -> None:
    import ember.prims.decomp.table as table_mod

    class Broken:
        name, value = "broken", "nowhere:nothing"

        def load(self) -> object:
            raise ImportError("no module named nowhere")

    monkeypatch.setattr(table_mod, "entry_points", lambda *, group: [Broken()])
    tables = table_mod.DecompositionTables()
    with warnings.catch_warnings(record=True) as w:
        warnings.simplefilter("always")
        assert tables.all() == {}
    assert any("broken" in str(x.message) and "ImportError" in str(x.message) for x in w)


def test_lowering_tables_by_name(tmp_path: Path) -> None:
    """A lowering table without exp's rule: exp stays an extern call; results unchanged."""
    from ember.inductor.lowering import LOWERING_TABLES, LOWERINGS, register_lowering_table

    rules = {k: v for k, v in LOWERINGS.items() if k != "prims.exp"}
    register_lowering_table("test-no-exp", rules)
    try:
        with pytest.raises(ValueError, match="already registered"):
            register_lowering_table("default", rules)
        x = torch.randn(3, 4)
        fn = lambda x: torch.exp(x) + 1  # noqa: E731
        pipeline = "to-prims,lower-loops{table=test-no-exp},fuse,codegen-cpp,plan-buffers"
        c = er.compile(fn, options={"pipeline": pipeline, "dump_dir": str(tmp_path)})
        torch.testing.assert_close(c(x), fn(x))
        compiled = next(tmp_path.glob("*.kernels.ir")).read_text()
        assert 'kernels.extern(' in compiled and 'op="prims.exp"' in compiled
        with pytest.raises(ValueError, match="unknown lowering table 'nope'.*default"):
            er.compile(fn, options={"pipeline": "to-prims,lower-loops{table=nope}"})
    finally:
        LOWERING_TABLES.pop("test-no-exp")


def test_lowering_tables_entry_point_group(monkeypatch: pytest.MonkeyPatch) -> None:
    """`ember.lowerings`: a dict entry point is a table under its name, a callable registers
    its own, a broken one is a warning naming it and leaves the others."""
    import ember.inductor.lowering_plugins as lp
    from ember.inductor.lowering import LOWERING_TABLES, LOWERINGS

    class EP:
        def __init__(self, name: str, obj: object) -> None:
            self.name, self.value, self.obj = name, f"test:{name}", obj

        def load(self) -> object:
            if isinstance(self.obj, Exception):
                raise self.obj
            return self.obj

    def adds(register: object) -> None:
        register("t-called", dict(LOWERINGS))  # type: ignore[operator]

    eps = [EP("t-dict", dict(LOWERINGS)), EP("t-fn", adds), EP("t-broken", ImportError("x"))]
    monkeypatch.setattr(lp, "entry_points", lambda *, group: eps if group == lp.GROUP else [])
    monkeypatch.setattr(lp, "_loaded", set())
    try:
        with pytest.warns(lp.LoweringPluginWarning, match="t-broken.*ImportError"):
            assert lp.lowering_table("t-dict") is not None
        assert {"t-dict", "t-called"} <= set(lp.lowering_tables())
        with pytest.raises(ValueError, match="unknown lowering table 'nope'"):
            er.compile(lambda x: x + 1, options={"pipeline": "to-prims,lower-loops{table=nope}"})
    finally:
        LOWERING_TABLES.pop("t-dict", None)
        LOWERING_TABLES.pop("t-called", None)
