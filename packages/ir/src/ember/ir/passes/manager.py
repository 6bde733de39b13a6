"""Pass records, the pass registry, named pipelines, pipeline strings and the pipeline runner."""

from __future__ import annotations

import inspect
import re
import typing
from collections.abc import Callable
from dataclasses import dataclass, field
from importlib.metadata import entry_points
from typing import Any

from ember.ir.graph import Module
from ember.ir.plugins import load_entry_points
from ember.ir.registry import OpRegistry, default_registry

PassFn = Callable[..., Module]
OptionValue = int | float | bool | str
_OPTION_TYPES: dict[Any, type] = {int: int, float: float, bool: bool, str: str}


class PipelineError(ValueError):
    """A pipeline string names an unknown pass or option, or is malformed."""

    def __init__(self, message: str, col: int = 0, *, within: str | None = None):
        super().__init__(f"pipeline col {col}: {message}" if col else message)
        self.col = col
        self.message = message
        self.within = within  # the named pipeline whose text holds the error, if any


@dataclass(frozen=True)
class Option:
    name: str
    type: type
    default: OptionValue


@dataclass(frozen=True)
class Pass:
    """A named pass: `fn(module, **options) -> Module`, pure (the input is not modified)."""

    name: str
    summary: str
    fn: PassFn
    options: dict[str, Option] = field(default_factory=dict)
    wants_registry: bool = False

    def __call__(self, module: Module, *, registry: OpRegistry | None = None,
                 **options: OptionValue) -> Module:
        for k in options:
            if k not in self.options:
                raise PipelineError(f"pass {self.name} has no option {k!r} "
                                    f"(options: {', '.join(self.options) or 'none'})")
        if self.wants_registry:
            return self.fn(module, registry=registry or default_registry(), **options)
        return self.fn(module, **options)


def make_pass(name: str, summary: str, fn: PassFn) -> Pass:
    """A Pass record from a function; its keyword-only parameters are its options."""
    hints = typing.get_type_hints(fn)
    options: dict[str, Option] = {}
    wants_registry = False
    for p in inspect.signature(fn).parameters.values():
        if p.kind is not inspect.Parameter.KEYWORD_ONLY:
            continue
        if p.name == "registry":
            wants_registry = True
            continue
        t = _OPTION_TYPES.get(hints.get(p.name))
        if t is None or p.default is inspect.Parameter.empty:
            raise TypeError(f"pass {name}: option {p.name} needs an int/float/bool/str "
                            f"annotation and a default")
        options[p.name] = Option(p.name, t, p.default)
    return Pass(name, summary, fn, options, wants_registry)


@dataclass(frozen=True)
class NamedPipeline:
    """A pipeline under a name (`inductor`, `to-prims`): usable wherever a pass name is, and
    expanded to its stages there. Its text may name other pipelines."""

    name: str
    text: str
    summary: str


class PluginWarning(UserWarning):
    """An `ember.passes` entry point could not be loaded: its passes are missing."""


class PassRegistry:
    def __init__(self) -> None:
        self._passes: dict[str, Pass] = {}
        self._pipelines: dict[str, NamedPipeline] = {}
        self._plugins_loaded = False
        self._loaded_eps: set[tuple[str, str]] = set()

    def add(self, p: Pass) -> Pass:
        if p.name in self._passes:
            raise ValueError(f"pass {p.name} is already registered")
        if p.name in self._pipelines:
            raise ValueError(f"pass {p.name}: a pipeline of that name is already registered")
        self._passes[p.name] = p
        return p

    def add_pipeline(self, pl: NamedPipeline, *, replace: bool = False) -> NamedPipeline:
        """Register a named pipeline; `replace=True` redefines one (never a pass's name)."""
        if pl.name in self._passes:
            raise ValueError(f"pipeline {pl.name}: a pass of that name is already registered")
        if pl.name in self._pipelines and not replace:
            raise ValueError(f"pipeline {pl.name} is already registered (pass replace=True to "
                             f"redefine it)")
        if not _TOKEN_NAME.fullmatch(pl.name):
            raise ValueError(f"pipeline name {pl.name!r} is not a valid pass name")
        self._pipelines[pl.name] = pl
        return pl

    def get(self, name: str) -> Pass:
        self.load_plugins()
        try:
            return self._passes[name]
        except KeyError:
            raise PipelineError(f"unknown pass {name!r} ({self._known()})") from None

    def pipeline(self, name: str) -> NamedPipeline | None:
        self.load_plugins()
        return self._pipelines.get(name)

    def _known(self) -> str:
        text = f"known: {', '.join(sorted(self._passes)) or 'none'}"
        if self._pipelines:
            text += f"; pipelines: {', '.join(sorted(self._pipelines))}"
        return text

    def all(self) -> dict[str, Pass]:
        self.load_plugins()
        return dict(sorted(self._passes.items()))

    def pipelines(self) -> dict[str, NamedPipeline]:
        self.load_plugins()
        return dict(sorted(self._pipelines.items()))

    def load_plugins(self, *, refresh: bool = False) -> None:
        """Load third-party passes and pipelines from the `ember.passes` entry point group,
        once (`refresh=True` looks again and loads only entry points not loaded before). An
        entry point names a `Pass`, a `NamedPipeline`, or a callable that registers into this
        registry; one that fails to load is skipped with a `PluginWarning`."""
        if self._plugins_loaded and not refresh:
            return
        self._plugins_loaded = True

        def register(ep: Any, obj: Any) -> None:
            if isinstance(obj, Pass):
                if obj.name not in self._passes:
                    self.add(obj)
            elif isinstance(obj, NamedPipeline):
                if obj.name not in self._pipelines and obj.name not in self._passes:
                    self.add_pipeline(obj)
            elif callable(obj):
                obj(self)

        if not load_entry_points("ember.passes", entry_points(group="ember.passes"),
                                 self._loaded_eps, register, PluginWarning):
            self._plugins_loaded = False


_DEFAULT = PassRegistry()


def default_pass_registry() -> PassRegistry:
    return _DEFAULT


def register_pass(name: str, summary: str, *, registry: PassRegistry | None = None
                  ) -> Callable[[PassFn], Pass]:
    """Decorator: declare `fn` as the pass `name` with a one-line `summary`."""

    def deco(fn: PassFn) -> Pass:
        return (registry or _DEFAULT).add(make_pass(name, summary, fn))

    return deco


def register_pipeline(name: str, text: str, summary: str, *,
                      registry: PassRegistry | None = None, replace: bool = False
                      ) -> NamedPipeline:
    """Declare the pipeline `name` = `text` (a pipeline string, which may name pipelines),
    listed by `ember passes` and usable in any pipeline string. The text is checked for syntax
    now; its names are resolved when it is used (a plugin may define them later)."""
    _parse(text, registry or _DEFAULT, (), syntax_only=True)
    return (registry or _DEFAULT).add_pipeline(NamedPipeline(name, text, summary),
                                               replace=replace)


@dataclass(frozen=True)
class PipelineStage:
    pass_: Pass
    options: dict[str, OptionValue]

    def __str__(self) -> str:
        if not self.options:
            return self.pass_.name
        opts = ",".join(f"{k}={_fmt(v)}" for k, v in self.options.items())
        return f"{self.pass_.name}{{{opts}}}"


def _fmt(v: OptionValue) -> str:
    return ("true" if v else "false") if isinstance(v, bool) else str(v)


_TOKEN = re.compile(r"\s*(?:(?P<name>[A-Za-z_][A-Za-z0-9_\-]*)|(?P<punct>[{},=])|"
                    r"(?P<word>[^\s{},=]+))")


_TOKEN_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_\-]*")


def _tokens(text: str) -> list[tuple[str, str, int]]:
    toks: list[tuple[str, str, int]] = []
    i = 0
    while i < len(text):
        m = _TOKEN.match(text, i)
        if not m or m.end() == i:
            if text[i:].strip() == "":
                break
            raise PipelineError(f"unexpected {text[i]!r}", i + 1)
        kind = m.lastgroup or "word"
        toks.append((kind, m.group(kind), m.start(kind) + 1))
        i = m.end()
    return toks


def parse_pipeline(text: str, registry: PassRegistry | None = None) -> list[PipelineStage]:
    """`"dce,cse,fuse{max_nodes=64}"` -> stages, with options converted to their types. A
    name of a registered pipeline stands for its stages (expanded, recursively)."""
    return _parse(text, registry or _DEFAULT, ())


def _parse(text: str, reg: PassRegistry, outer: tuple[str, ...], *, syntax_only: bool = False
           ) -> list[PipelineStage]:
    """The stages of `text`; `syntax_only` checks the grammar alone (no name is looked up)."""
    toks = _tokens(text)
    stages: list[PipelineStage] = []
    k = 0

    def want(kind: str, what: str) -> tuple[str, str, int]:
        nonlocal k
        if k >= len(toks) or (toks[k][0] != kind and toks[k][1] != kind):
            col = toks[k][2] if k < len(toks) else len(text) + 1
            raise PipelineError(f"expected {what}", col)
        k += 1
        return toks[k - 1]

    while k < len(toks):
        _, name, col = want("name", "a pass name")
        named = None if syntax_only else reg.pipeline(name)
        if named is not None:
            if k < len(toks) and toks[k][1] == "{":
                raise PipelineError(f"{name} is a pipeline: it takes no options", toks[k][2])
            stages.extend(_expand(named, reg, outer, col))
        else:
            try:
                p = _ANY if syntax_only else reg.get(name)
            except PipelineError as e:
                raise PipelineError(e.message, col) from None
            opts: dict[str, OptionValue] = {}
            if k < len(toks) and toks[k][1] == "{":
                k += 1
                while True:
                    _, oname, ocol = want("name", "an option name")
                    want("=", "'='")
                    if k >= len(toks) or toks[k][1] in "{},=":
                        raise PipelineError(f"option {oname} needs a value", ocol)
                    raw = toks[k][1]
                    k += 1
                    if not syntax_only:
                        opts[oname] = _convert_option(p, oname, raw, ocol)
                    if k < len(toks) and toks[k][1] == ",":
                        k += 1
                        continue
                    want("}", "',' or '}'")
                    break
            if not syntax_only:
                stages.append(PipelineStage(p, opts))
        if k < len(toks):
            want(",", "','")
            if k >= len(toks):
                raise PipelineError("expected a pass name after ','", len(text) + 1)
    return stages


_ANY = Pass("", "", lambda module: module)  # stands for every pass in a syntax-only parse


def _expand(named: NamedPipeline, reg: PassRegistry, outer: tuple[str, ...], col: int
            ) -> list[PipelineStage]:
    """The stages of a named pipeline; errors inside its text are reported at the name's
    column in the text being parsed, saying which pipeline they come from."""
    if named.name in outer:
        cycle = " -> ".join((*outer[outer.index(named.name):], named.name))
        raise PipelineError(f"pipeline cycle: {cycle}", col)
    try:
        return _parse(named.text, reg, (*outer, named.name))
    except PipelineError as e:
        err = e
        if e.within is None:  # the error is in this pipeline's own text: say where
            at = f", col {e.col}" if e.col and not e.message.startswith("pipeline cycle") \
                else ""
            msg = e.message if e.message.startswith("pipeline cycle") \
                else f"in pipeline {named.name} ({named.text!r}{at}): {e.message}"
            err = PipelineError(msg, within=named.name)
        if outer:
            raise err from None
        raise PipelineError(err.message, col, within=err.within) from None


def expand_pipeline(text: str, registry: PassRegistry | None = None) -> str:
    """A pipeline string with every named pipeline replaced by its passes: what runs."""
    return ",".join(str(s) for s in parse_pipeline(text, registry))


def _convert_option(p: Pass, name: str, raw: str, col: int) -> OptionValue:
    opt = p.options.get(name)
    if opt is None:
        raise PipelineError(f"pass {p.name} has no option {name!r} "
                            f"(options: {', '.join(p.options) or 'none'})", col)
    try:
        if opt.type is bool:
            if raw not in ("true", "false"):
                raise ValueError
            return raw == "true"
        return opt.type(raw)  # type: ignore[no-any-return]
    except ValueError:
        raise PipelineError(f"option {name} of {p.name} wants a {opt.type.__name__}, "
                            f"got {raw!r}", col) from None


def run_pipeline(module: Module, pipeline: str | list[PipelineStage], *,
                 registry: OpRegistry | None = None, verify_each: bool = False,
                 print_after: Callable[[str, Module], None] | None = None,
                 allow_unregistered: bool = False) -> Module:
    """Run the stages in order. `verify_each` verifies after every stage; `print_after(stage,
    module)` is called after each stage (the CLI prints the IR there)."""
    from ember.ir.verifier import verify

    stages = parse_pipeline(pipeline) if isinstance(pipeline, str) else pipeline
    for st in stages:
        module = st.pass_(module, registry=registry, **st.options)
        if verify_each:
            verify(module, registry=registry, allow_unregistered=allow_unregistered)
        if print_after is not None:
            print_after(str(st), module)
    return module
