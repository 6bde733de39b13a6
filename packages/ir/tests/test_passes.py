"""Passes: pipeline strings, pass registries and plugins, the pipeline runner, dce and cse."""

from __future__ import annotations

import textwrap
from collections.abc import Iterable

import pytest

from ember.ir import (
    DType,
    Module,
    OpRegistry,
    TensorType,
    VerificationError,
    default_registry,
    parse,
    register_op,
    verify,
)
from ember.ir.passes import (
    Pass,
    PassRegistry,
    PipelineError,
    default_pass_registry,
    parse_pipeline,
    register_pass,
    run_pipeline,
)
from ember.ir.passes import manager as manager_mod


def ir(text: str) -> str:
    return textwrap.dedent(text).lstrip("\n")


def ops(m: Module, graph: str | None = None) -> list[str]:
    return [n.op for n in m.graph(graph).nodes]


# ---- a private registry with a pass that has options ---------------------------------------

def make_registry() -> PassRegistry:
    reg = PassRegistry()
    reg._plugins_loaded = True  # no entry points for private registries in these tests

    @register_pass("tag", "append a note of its options to each graph's attrs", registry=reg)
    def tag(module: Module, *, n: int = 1, ratio: float = 0.5, flag: bool = False,
            label: str = "x", registry: OpRegistry) -> Module:
        assert isinstance(registry, OpRegistry)
        out = module.clone()
        for g in out.graphs.values():
            g.attrs["note"] = [n, ratio, flag, label]
        return out

    @register_pass("nothing", "return the module unchanged", registry=reg)
    def nothing(module: Module) -> Module:
        return module.clone()

    return reg


def test_pipeline_builtin_passes() -> None:
    assert [str(s) for s in parse_pipeline("dce,cse")] == ["dce", "cse"]
    assert [str(s) for s in parse_pipeline("  dce ,\tcse  ")] == ["dce", "cse"]
    assert parse_pipeline("") == []
    assert set(default_pass_registry().all()) >= {"dce", "cse"}


def test_pipeline_options_are_converted() -> None:
    reg = make_registry()
    (st,) = parse_pipeline("tag{n=3,ratio=2,flag=true,label=hello}", reg)
    assert st.options == {"n": 3, "ratio": 2.0, "flag": True, "label": "hello"}
    assert [type(v) for v in st.options.values()] == [int, float, bool, str]
    assert str(st) == "tag{n=3,ratio=2.0,flag=true,label=hello}"
    (st,) = parse_pipeline("tag{ flag = false , n=-4, ratio=1e-3 }", reg)
    assert st.options == {"flag": False, "n": -4, "ratio": 0.001}
    stages = parse_pipeline("nothing,tag{n=1},tag", reg)
    assert [str(s) for s in stages] == ["nothing", "tag{n=1}", "tag"]


def test_options_run_and_defaults_apply() -> None:
    reg = make_registry()
    m = parse("ember.ir 1.0\ngraph @f() -> () {\n  return ()\n}\n")
    out = run_pipeline(m, parse_pipeline("tag{n=7,flag=true}", reg))
    assert out.graph().attrs["note"] == [7, 0.5, True, "x"]
    assert "note" not in m.graph().attrs


@pytest.mark.parametrize(("text", "message", "col"), [
    ("dce,nosuch", "unknown pass 'nosuch' (known: ", 5),
    ("nosuch", "unknown pass 'nosuch'", 1),
    ("dce,", "expected a pass name after ','", 5),
    ("dce,,cse", "expected a pass name", 5),
    (",dce", "expected a pass name", 1),
    ("dce cse", "expected ','", 5),
    ("dce;cse", "expected ','", 4),
    ("dce{x=1}", "pass dce has no option 'x' (options: none)", 5),
])
def test_pipeline_errors(text: str, message: str, col: int) -> None:
    with pytest.raises(PipelineError) as ei:
        parse_pipeline(text)
    assert message in str(ei.value)
    assert ei.value.col == col
    assert str(ei.value).startswith(f"pipeline col {col}: ")


@pytest.mark.parametrize(("text", "message", "col"), [
    ("tag{n=1,nope=2}", "pass tag has no option 'nope' (options: n, ratio, flag, label)", 9),
    ("tag{n=1.5}", "option n of tag wants a int, got '1.5'", 5),
    ("tag{n=abc}", "option n of tag wants a int, got 'abc'", 5),
    ("tag{ratio=fast}", "option ratio of tag wants a float, got 'fast'", 5),
    ("tag{flag=1}", "option flag of tag wants a bool, got '1'", 5),
    ("tag{flag=yes}", "option flag of tag wants a bool, got 'yes'", 5),
    ("tag{n=1,}", "expected an option name", 9),
    ("tag{n=}", "option n needs a value", 5),
    ("tag{n 1}", "expected '='", 7),
    ("tag{n=1", "expected ',' or '}'", 8),
    ("tag{n=1}}", "expected ','", 9),
    ("tag{", "expected an option name", 5),
])
def test_pipeline_option_errors(text: str, message: str, col: int) -> None:
    with pytest.raises(PipelineError) as ei:
        parse_pipeline(text, make_registry())
    assert message in str(ei.value)
    assert ei.value.col == col


def test_pass_declaration_errors() -> None:
    reg = PassRegistry()
    with pytest.raises(TypeError, match="option k needs an int/float/bool/str annotation"):
        @register_pass("bad", "no default", registry=reg)
        def bad(module: Module, *, k: int) -> Module:
            return module

    with pytest.raises(TypeError, match="option k needs"):
        @register_pass("bad2", "unsupported type", registry=reg)
        def bad2(module: Module, *, k: list[int] = []) -> Module:  # noqa: B006
            return module

    @register_pass("ok", "fine", registry=reg)
    def ok(module: Module) -> Module:
        return module

    with pytest.raises(ValueError, match="pass ok is already registered"):
        register_pass("ok", "again", registry=reg)(ok.fn)


def test_calling_a_pass_with_an_unknown_option() -> None:
    reg = make_registry()
    p = reg.get("tag")
    m = parse("ember.ir 1.0\n")
    with pytest.raises(PipelineError, match="pass tag has no option 'bogus'"):
        p(m, bogus=1)
    assert p(m, n=2).version == m.version


# ---- entry-point plugins ------------------------------------------------------------------

class FakeEntryPoint:
    def __init__(self, name: str, obj: object):
        self.name = name
        self.obj = obj
        self.loads = 0

    def load(self) -> object:
        self.loads += 1
        return self.obj


def _plugin_pass(module: Module, *, times: int = 1) -> Module:
    return module.clone()


def test_entry_point_plugins(monkeypatch: pytest.MonkeyPatch) -> None:
    plugin = manager_mod.make_pass("plugin_noop", "a pass from a plugin", _plugin_pass)

    def registers(reg: PassRegistry) -> None:
        register_pass("plugin_two", "registered by a callable", registry=reg)(
            lambda module: module.clone())

    eps = [FakeEntryPoint("one", plugin), FakeEntryPoint("two", registers)]
    groups: list[str] = []

    def fake_entry_points(*, group: str) -> Iterable[FakeEntryPoint]:
        groups.append(group)
        return eps

    monkeypatch.setattr(manager_mod, "entry_points", fake_entry_points)
    reg = PassRegistry()
    stages = parse_pipeline("plugin_noop{times=3},plugin_two", reg)
    assert [str(s) for s in stages] == ["plugin_noop{times=3}", "plugin_two"]
    assert groups == ["ember.passes"]
    parse_pipeline("plugin_two", reg)
    assert groups == ["ember.passes"]  # loaded once per registry
    assert [ep.loads for ep in eps] == [1, 1]
    assert set(reg.all()) == {"plugin_noop", "plugin_two"}
    m = parse("ember.ir 1.0\n")
    assert str(run_pipeline(m, stages)) == str(m)


def test_entry_point_plugin_does_not_replace_a_registered_pass(
        monkeypatch: pytest.MonkeyPatch) -> None:
    reg = make_registry()
    reg._plugins_loaded = False
    impostor = Pass("tag", "impostor", _plugin_pass)
    monkeypatch.setattr(manager_mod, "entry_points", lambda *, group: [FakeEntryPoint("t",
                                                                                      impostor)])
    assert reg.get("tag").summary != "impostor"


# ---- the runner: verify_each, print_after, purity -------------------------------------------

SIMPLE = ir("""
    ember.ir 1.0
    graph @f(%x: f32[4]) -> (f32[4]) {
      %a = aten.neg.default(%x) : f32[4]
      %b = aten.neg.default(%x) : f32[4]
      %dead = aten.relu.default(%x) : f32[4]
      %c = aten.add.Tensor(%a, %b) : f32[4]
      return (%c)
    }
""")


def breaking_registry() -> PassRegistry:
    reg = make_registry()

    @register_pass("break_types", "declare every node result as i64 (wrong)", registry=reg)
    def break_types(module: Module) -> Module:
        out = module.clone()
        for g in out.graphs.values():
            for n in g.nodes:
                for r in n.results:
                    assert isinstance(r.type, TensorType)
                    r.type = TensorType(DType.i64, r.type.shape)
        return out

    return reg


def test_verify_each_catches_a_pass_that_breaks_the_ir() -> None:
    m = parse(SIMPLE)
    stages = parse_pipeline("nothing,break_types,nothing", breaking_registry())
    with pytest.raises(VerificationError, match="3:3: aten.neg.default: result %a is declared "
                       "i64\\[4\\], but the op gives f32\\[4\\]"):
        run_pipeline(m, stages, verify_each=True)
    broken = run_pipeline(m, stages)  # without verify_each the broken module comes back
    with pytest.raises(VerificationError):
        verify(broken)


def test_verify_each_allow_unregistered() -> None:
    text = SIMPLE.replace("aten.relu.default", "mydialect.frob")
    with pytest.raises(VerificationError, match="unregistered op mydialect.frob"):
        run_pipeline(parse(text), "cse", verify_each=True)
    out = run_pipeline(parse(text), "cse", verify_each=True, allow_unregistered=True)
    assert "mydialect.frob" in ops(out)


def test_print_after_is_called_per_stage() -> None:
    seen: list[tuple[str, str]] = []
    stages = parse_pipeline("nothing,tag{n=2},nothing", make_registry())
    out = run_pipeline(parse(SIMPLE), stages, print_after=lambda st, m: seen.append((st, str(m))))
    assert [s for s, _ in seen] == ["nothing", "tag{n=2}", "nothing"]
    assert "note" not in seen[0][1] and "attrs(note=[2, 0.5, false, \"x\"])" in seen[1][1]
    assert seen[2][1] == str(out)

    seen.clear()
    run_pipeline(parse(SIMPLE), "dce,cse", print_after=lambda st, m: seen.append((st, str(m))))
    assert [s for s, _ in seen] == ["dce", "cse"]
    assert "%dead" not in seen[0][1] and "%b = " in seen[0][1]
    assert "%b = " not in seen[1][1]


@pytest.mark.parametrize("pipeline", ["dce", "cse", "dce,cse", "cse,dce", "tag{n=3}", "nothing"])
def test_passes_are_pure(pipeline: str) -> None:
    m = parse(SIMPLE)
    before = str(m)
    out = run_pipeline(m, parse_pipeline(pipeline, _with_builtins()), verify_each=True)
    assert str(m) == before
    assert out is not m
    verify(m)


def _with_builtins() -> PassRegistry:
    reg = make_registry()
    for name in ("dce", "cse"):
        reg.add(default_pass_registry().get(name))
    return reg


# ---- dce --------------------------------------------------------------------------------------

def test_dce_removes_unused_pure_nodes() -> None:
    out = run_pipeline(parse(SIMPLE), "dce", verify_each=True)
    assert ops(out) == ["aten.neg.default", "aten.neg.default", "aten.add.Tensor"]


def test_dce_keeps_mutating_op() -> None:
    assert default_registry().lookup("aten.add_.Tensor").has_side_effects  # type: ignore[union-attr]
    text = ir("""
        ember.ir 1.0
        graph @f(%x: f32[4], %y: f32[4]) -> (f32[4]) {
          %u = aten.neg.default(%y) : f32[4]
          %m = aten.add_.Tensor(%x, %u) : f32[4]
          %d = aten.relu.default(%m) : f32[4]
          return (%y)
        }
    """)
    out = run_pipeline(parse(text), "dce", verify_each=True)
    assert ops(out) == ["aten.neg.default", "aten.add_.Tensor"]


def test_dce_keeps_unknown_ops() -> None:
    text = SIMPLE.replace("aten.relu.default", "mydialect.frob")
    out = run_pipeline(parse(text), "dce", verify_each=True, allow_unregistered=True)
    assert "mydialect.frob" in ops(out)


def test_dce_keeps_registered_side_effect_op() -> None:
    reg = OpRegistry()
    register_op("test.log", "print a tensor", lambda ctx, a, k: [a[0].type],  # type: ignore
                lambda interp, a, k: a[0], has_side_effects=True, registry=reg)
    register_op("test.pure", "identity", lambda ctx, a, k: [a[0].type],  # type: ignore
                lambda interp, a, k: a[0], registry=reg)
    text = ir("""
        ember.ir 1.0
        graph @f(%x: f32[4]) -> (f32[4]) {
          %a = test.log(%x) : f32[4]
          %b = test.pure(%x) : f32[4]
          %c = test.log(%x) : f32[4]
          return (%x)
        }
    """)
    out = run_pipeline(parse(text), "dce,cse", registry=reg, verify_each=True)
    assert ops(out) == ["test.log", "test.log"]


def test_dce_keeps_multi_result_node_when_one_result_is_used() -> None:
    text = ir("""
        ember.ir 1.0
        graph @f(%x: f32[4, 3]) -> (i64[4]) {
          %m, %i = aten.max.dim(%x, 1) : (f32[4], i64[4])
          %v, %j = aten.max.dim(%x, 0) : (f32[3], i64[3])
          return (%i)
        }
    """)
    out = run_pipeline(parse(text), "dce", verify_each=True)
    assert [[r.name for r in n.results] for n in out.graph().nodes] == [["m", "i"]]


# ---- cse --------------------------------------------------------------------------------------

def test_cse_merges_equal_nodes_and_chains() -> None:
    out = run_pipeline(parse(SIMPLE), "cse", verify_each=True)
    g = out.graph()
    assert [n.results[0].name for n in g.nodes] == ["a", "dead", "c"]
    assert [v.name for v in g.nodes[2].operands()] == ["a", "a"]


@pytest.mark.parametrize("op", ["aten.rand.default([4])", "aten.bernoulli.default(%x)",
                                "aten.bernoulli.p(%x, 0.5)", "aten.randn_like.default(%x)"])
def test_cse_does_not_merge_random_ops(op: str) -> None:
    text = ir(f"""
        ember.ir 1.0
        graph @f(%x: f32[4]) -> (f32[4], f32[4]) {{
          %a = {op} : f32[4]
          %b = {op} : f32[4]
          return (%a, %b)
        }}
    """)
    out = run_pipeline(parse(text), "cse", verify_each=True)
    assert len(out.graph().nodes) == 2


def test_cse_does_not_merge_side_effecting_ops() -> None:
    text = ir("""
        ember.ir 1.0
        graph @f(%x: f32[4], %y: f32[4]) -> (f32[4], f32[4]) {
          %a = aten.add_.Tensor(%x, %y) : f32[4]
          %b = aten.add_.Tensor(%x, %y) : f32[4]
          return (%a, %b)
        }
    """)
    assert len(run_pipeline(parse(text), "cse").graph().nodes) == 2


@pytest.mark.parametrize(("lit1", "lit2", "merged"), [
    ("0.0", "-0.0", False),
    ("0.0", "0", False),
    ("-0.0", "0", False),
    ("1", "true", False),
    ("0.5", "0.5", True),
    ("-0.0", "-0.0", True),
    ("nan", "nan", True),
    ("2", "2", True),
])
def test_cse_literal_kinds(lit1: str, lit2: str, merged: bool) -> None:
    text = ir(f"""
        ember.ir 1.0
        graph @f(%x: f32[4]) -> (f32[4], f32[4]) {{
          %a = aten.add.Scalar(%x, {lit1}) : f32[4]
          %b = aten.add.Scalar(%x, {lit2}) : f32[4]
          return (%a, %b)
        }}
    """)
    out = run_pipeline(parse(text), "cse", verify_each=True)
    assert len(out.graph().nodes) == (1 if merged else 2)


def test_cse_ignores_keyword_order() -> None:
    text = ir("""
        ember.ir 1.0
        graph @f(%x: f32[4, 3]) -> (f32[4], f32[4]) {
          %a = aten.sum.dim_IntList(%x, [1], keepdim=false, dtype=f32) : f32[4]
          %b = aten.sum.dim_IntList(%x, [1], dtype=f32, keepdim=false) : f32[4]
          return (%a, %b)
        }
    """)
    out = run_pipeline(parse(text), "cse", verify_each=True)
    assert out.graph().outputs[0] is out.graph().outputs[1]
