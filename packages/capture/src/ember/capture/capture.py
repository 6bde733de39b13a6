"""The entry point: capture one call of a function, bound method or nn.Module."""

from __future__ import annotations

import inspect
import re
import types
from dataclasses import replace
from typing import Any

import torch

from ember.capture import contexts
from ember.capture.errors import (
    CaptureUnhandled,
    StopCapture,
    Unhandled,
    UserError,
    unhandled,
)
from ember.capture.guards import Guard, GuardKind
from ember.capture.outputs import OutputSpecs
from ember.capture.result import (
    Captured,
    OutSeq,
    OutSource,
)
from ember.capture.resume import Broken, find_site, split
from ember.capture.side_effects import collect as collect_effects
from ember.capture.side_effects import value_spec
from ember.capture.sources import ArgSource, ArgsSource, KwargSource, KwargsSource, SelfSource
from ember.capture.symbolic import (
    BoundUnbacked,
    Narrow,
    Policy,
    Restarts,
    ShapeEnv,
    Specialize,
    Unbacked,
    reset_env,
    reset_policy,
    using_env,
    using_policy,
)
from ember.capture.symgraph import NotSymbolic, finish, same
from ember.capture.tracer import Tracer
from ember.capture.variables import (
    FunctionVar,
    MethodVar,
    Var,
)


def target_code(target: Any) -> types.CodeType | None:
    """The code object a capture of `target` starts in (its cache key)."""
    if isinstance(target, torch.nn.Module):
        fwd = type(target).forward
        return getattr(fwd, "__code__", None)
    fn = getattr(target, "__func__", target)
    return getattr(fn, "__code__", None)


def graph_name(target: Any) -> str:
    if isinstance(target, torch.nn.Module):
        name = "forward"
    else:
        name = getattr(target, "__name__", "fn")
    name = re.sub(r"[^A-Za-z0-9_]", "_", name) or "fn"
    return name if not name[0].isdigit() else "g_" + name


def _param_names(target: Any, nargs: int) -> list[str]:
    fn = type(target).forward if isinstance(target, torch.nn.Module) else target
    try:
        sig = inspect.signature(fn)
    except (TypeError, ValueError):
        return [f"arg{i}" for i in range(nargs)]
    names: list[str] = []
    params = list(sig.parameters.values())
    if isinstance(target, torch.nn.Module) and params:
        params = params[1:]  # self
    star = None
    for p in params:
        if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD):
            names.append(p.name)
        elif p.kind is p.VAR_POSITIONAL:
            star = p.name
    out = names[:nargs]
    out += [f"{star or 'arg'}_{i}" for i in range(len(out), nargs)]
    return out


def capture(target: Any, args: tuple[Any, ...], kwargs: dict[str, Any], *,
            dynamic: Policy | None = None) -> Captured | Broken | Unhandled:
    """Capture one call `target(*args, **kwargs)` into an aten graph with guards.

    `target` is a Python function, a bound method (its `self` is the call's `S`), or an
    nn.Module (called as `module(*args)`, hooks refused). Nothing real is mutated and nothing of
    the user's code runs for real; the result is a `Captured`; a `Broken` (the graph up to a
    construct capture does not cover, and the code that runs it and resumes after it: see
    `ember.capture.resume`); or, where the frame cannot be split there, an `Unhandled` naming
    the construct and the user's source line.

    With a dynamic-shape `dynamic` policy, the input dims it names become size symbols where
    the whole function is captured (symbolic.py); otherwise shapes are static.
    """
    code = target_code(target)
    if dynamic is not None:
        dynamic.unbacked_reason = None
        got = _capture_dynamic(target, args, kwargs, code, dynamic)
        if got is not None:
            return got
    tx = Tracer(graph_name(target))
    try:
        return _capture(tx, target, args, kwargs, code)
    except CaptureUnhandled as e:
        why = dynamic.unbacked_reason if dynamic is not None else None
        if why and "_local_scalar_dense" in e.reason:  # say why .item() is not a symbol
            e.reason = f".item() breaks the graph here: {why}"
        file, line = e.file, e.line
        if file is None and e.stack:  # only torch's own frames: report the innermost
            file, line = _split_where(e.stack[-1])
        elif file is None and code is not None:
            file, line = code.co_filename, code.co_firstlineno
        un = Unhandled(e.reason, file or "<unknown>", line, e.opname, tuple(e.stack),
                       tuple(tx.guards.guards))
        return _graph_break(target, args, kwargs, code, e, un)
    except UserError as e:
        file = e.file or (code.co_filename if code else "<unknown>")
        return Unhandled(f"the function raises {type(e.exc).__name__}: {e.exc}", file, e.line,
                         None, tuple(e.stack), tuple(tx.guards.guards))


_ATTEMPTS = 8  # restarts of a dynamic capture (a range narrowed, a symbol made static)


def _capture_dynamic(target: Any, args: tuple[Any, ...], kwargs: dict[str, Any],
                     code: types.CodeType | None, policy: Policy) -> Captured | None:
    """The capture with the policy's dims symbolic, recorded twice at different probe sizes
    (both must give the same graph); the one static recording where no dim became a symbol;
    None where it does not capture whole (the caller captures with static shapes, graph
    breaks included)."""
    learnt = Restarts()
    for _ in range(_ATTEMPTS):
        runs: list[Captured] = []
        try:
            for run in (0, 1):
                env = ShapeEnv(run=run, learnt=learnt)
                tx = Tracer(graph_name(target))
                tokens = using_env(env), using_policy(policy)
                try:
                    cap = _capture(tx, target, args, kwargs, code)
                finally:
                    reset_policy(tokens[1])
                    reset_env(tokens[0])
                if not env.symbols and not env.unbacked:
                    # no dim became a symbol: this recording is the static capture (the
                    # caller would record the same graph again; a first call always is)
                    return cap
                runs.append(finish(cap, env, tx.recorder.sym_layouts))
        except Specialize as e:
            if learnt.tie(e.fact, env.symbols):
                continue  # two symbols at their real difference: one written as the other + c
            for n in e.names & env.symbols.keys():
                learnt.make_static(env.symbols[n])
            continue
        except BoundUnbacked as e:  # a slice bounded by .item(): assert it, probe below
            learnt.unbacked_le.setdefault(e.name, []).append(e.bound)
            learnt.unbacked_avoid |= e.avoid
            continue
        except Unbacked as e:  # .item() deciding control flow: the static capture breaks
            policy.static_reason = policy.unbacked_reason = e.why
            return None
        except Narrow as e:
            for o in env.symbols[e.name].origins:
                learnt.ranges[o] = (e.lo, e.hi)
            continue
        except UserError as e:
            # an op that fails only at the probe sizes (a dynamic dim meeting a static size of
            # a weight): the symbols whose probes the message names become static
            text = str(e.exc)
            if learnt.tie_from_error(text, env):
                continue  # two sizes equal at the real sizes only: tied the same way
            hits = [s for s in env.symbols.values() if str(s.probe) in text
                    and not set(s.origins) <= learnt.static]
            if hits:  # the newest first: it is usually the one that met a static size
                learnt.make_static(hits[-1])
                continue
            policy.static_reason = f"{type(e.exc).__name__}: {e.exc}"
            return None
        except (CaptureUnhandled, StopCapture, NotSymbolic) as e:
            policy.static_reason = f"{type(e).__name__}: {e}"
            return None
        if same(runs[0], runs[1]):
            policy.static_reason = None
            return runs[0]
        policy.static_reason = "two recordings at different probe sizes differ"
        return None
    policy.static_reason = f"no symbolic capture after {_ATTEMPTS} restarts"
    return None


def _graph_break(target: Any, args: tuple[Any, ...], kwargs: dict[str, Any],
                 code: types.CodeType | None, e: CaptureUnhandled, un: Unhandled
                 ) -> Broken | Unhandled:
    """Capture again, stopping before the break site in the compiled function's own frame,
    and split the frame there; `un` when it cannot be split."""
    fn = target_function(target)
    call = type(target).__call__ if isinstance(target, torch.nn.Module) else None
    if isinstance(call, types.FunctionType) and call is not torch.nn.Module.__call__:
        # a module class's own __call__ (transformers' GradientCheckpointingLayer) is the top
        # frame (modules.call_module), not forward: the break site is in its code
        fn, code = call, call.__code__
    site = find_site(code, e) if code is not None and fn is not None else None
    if site is None or fn is None:
        return un
    tx = Tracer(graph_name(target))
    tx.stop_at = site.step
    entry_grad = torch.is_grad_enabled()
    try:
        _capture(tx, target, args, kwargs, code)
    except StopCapture as stop:
        if stop.frame.code != code:  # (equal code objects share their decoded form)
            return un
        try:
            return split(tx, stop.frame, fn, site, un, entry_grad)
        except CaptureUnhandled as why:
            return replace(un, reason=f"{un.reason} (and no graph break there: {why.reason})")
    except (CaptureUnhandled, UserError):
        pass
    return un


def target_function(target: Any) -> types.FunctionType | None:
    """The Python function whose code a capture of `target` starts in."""
    fn = type(target).forward if isinstance(target, torch.nn.Module) else getattr(
        target, "__func__", target)
    return fn if isinstance(fn, types.FunctionType) else None


def _split_where(entry: str) -> tuple[str, int]:
    where = entry.rsplit(" in ", 1)[0]
    file, _, line = where.rpartition(":")
    return file, int(line) if line.isdigit() else 0


def _capture(tx: Tracer, target: Any, args: tuple[Any, ...], kwargs: dict[str, Any],
             code: types.CodeType | None) -> Captured:
    tx.guard(Guard(GuardKind.GRAD_MODE, None, torch.is_grad_enabled()))
    tx.guard(Guard(GuardKind.DEFAULT_DTYPE, None, torch.get_default_dtype()))
    for dev in ("cpu", "cuda"):
        if torch.is_autocast_enabled(dev):
            raise unhandled(f"a call under {dev} autocast (autocast at the call site is not "
                            f"captured yet; autocast inside the function is)")
    tx.guard(Guard(GuardKind.LENGTH, ArgsSource(), len(args)))
    tx.guard(Guard(GuardKind.DICT_KEYS, KwargsSource(), tuple(kwargs)))
    names = _param_names(target, len(args))
    arg_vars = [tx.wrap(a, ArgSource(i, names[i])) for i, a in enumerate(args)]
    kw_vars = {k: tx.wrap(v, KwargSource(k)) for k, v in kwargs.items()}
    fn: Var
    if isinstance(target, torch.nn.Module):
        fn = tx.wrap(target, SelfSource())
    elif isinstance(target, types.MethodType):
        fn = MethodVar(tx.wrap(target.__func__, None), tx.wrap(target.__self__, SelfSource()))
    elif isinstance(target, types.FunctionType):
        fn = FunctionVar(target)
    else:
        raise unhandled(f"compiling a {type(target).__name__} (a function, method or "
                        f"nn.Module is expected)")
    ret = tx.call(fn, arg_vars, kw_vars)
    if tx.open_grad_changes:
        raise unhandled("torch.set_grad_enabled(...) outside a `with` (a global state change)")
    if tx.autocast:
        raise unhandled("an autocast context left open")
    contexts.check_context_vars(tx)
    effects = collect_effects(tx)
    specs = OutputSpecs(tx)
    spec = specs.value(ret)
    if effects:  # the return value, then each effect's target and value (result.Captured)
        parts = [spec]
        for eff in effects:
            parts += [OutSource(eff.target), value_spec(eff, specs.value)]
        spec = OutSeq(tuple, tuple(parts))
    return specs.finish(spec, code, effects)
