"""Pass records, the pass registry, pipeline strings and the pipeline runner."""

from __future__ import annotations

import inspect
import re
import typing
from collections.abc import Callable
from dataclasses import dataclass, field
from importlib.metadata import entry_points
from typing import Any

from ember.ir.graph import Module
from ember.ir.registry import OpRegistry, default_registry

PassFn = Callable[..., Module]
OptionValue = int | float | bool | str
_OPTION_TYPES: dict[Any, type] = {int: int, float: float, bool: bool, str: str}


class PipelineError(ValueError):
    """A pipeline string names an unknown pass or option, or is malformed."""

    def __init__(self, message: str, col: int = 0):
        super().__init__(f"pipeline col {col}: {message}" if col else message)
        self.col = col


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


class PassRegistry:
    def __init__(self) -> None:
        self._passes: dict[str, Pass] = {}
        self._plugins_loaded = False

    def add(self, p: Pass) -> Pass:
        if p.name in self._passes:
            raise ValueError(f"pass {p.name} is already registered")
        self._passes[p.name] = p
        return p

    def get(self, name: str) -> Pass:
        self.load_plugins()
        try:
            return self._passes[name]
        except KeyError:
            raise PipelineError(f"unknown pass {name!r} (known: {', '.join(sorted(self._passes))})")\
                from None

    def all(self) -> dict[str, Pass]:
        self.load_plugins()
        return dict(sorted(self._passes.items()))

    def load_plugins(self) -> None:
        """Load third-party passes from the `ember.passes` entry point group, once."""
        if self._plugins_loaded:
            return
        self._plugins_loaded = True
        for ep in entry_points(group="ember.passes"):
            obj = ep.load()
            if isinstance(obj, Pass):
                if obj.name not in self._passes:
                    self.add(obj)
            elif callable(obj):
                obj(self)


_DEFAULT = PassRegistry()


def default_pass_registry() -> PassRegistry:
    return _DEFAULT


def register_pass(name: str, summary: str, *, registry: PassRegistry | None = None
                  ) -> Callable[[PassFn], Pass]:
    """Decorator: declare `fn` as the pass `name` with a one-line `summary`."""

    def deco(fn: PassFn) -> Pass:
        return (registry or _DEFAULT).add(make_pass(name, summary, fn))

    return deco


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


def parse_pipeline(text: str, registry: PassRegistry | None = None) -> list[PipelineStage]:
    """`"dce,cse,fuse{max_nodes=64}"` -> stages, with options converted to their types."""
    reg = registry or _DEFAULT
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
        try:
            p = reg.get(name)
        except PipelineError as e:
            raise PipelineError(str(e), col) from None
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
                opts[oname] = _convert_option(p, oname, raw, ocol)
                if k < len(toks) and toks[k][1] == ",":
                    k += 1
                    continue
                want("}", "',' or '}'")
                break
        stages.append(PipelineStage(p, opts))
        if k < len(toks):
            want(",", "','")
            if k >= len(toks):
                raise PipelineError("expected a pass name after ','", len(text) + 1)
    return stages


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
