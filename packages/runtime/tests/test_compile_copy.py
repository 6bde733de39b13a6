"""`copy.deepcopy` of a compiled module or function (EMA copies, checkpoint averaging): the
copy compiles its own copy of the original, never running compiled state bound to the
original's parameters; `copy.copy` shares the original as nn.Module's shallow copy does;
state_dict round-trips through the compiled module."""

from __future__ import annotations

import copy

import pytest
import torch
from torch import nn

import ember.runtime as er
from ember.runtime.compile import compiled_function_of
from ember.runtime.testing import tiny_hf_model


class Scaled(nn.Module):
    scale = 1.0  # a class default the instance overrides (a forwarded attribute)

    def __init__(self) -> None:
        super().__init__()
        self.lin = nn.Linear(4, 8)
        self.out = nn.Linear(8, 3)
        self.scale = 2.0

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.out(torch.relu(self.lin(x))) * self.scale


def _bump(m: nn.Module, by: float) -> None:
    with torch.no_grad():
        for p in m.parameters():
            p.add_(by)


@pytest.mark.parametrize("backend", ["inductor", "eager"])
def test_deepcopy_of_a_compiled_module_follows_its_own_weights(backend: str) -> None:
    torch.manual_seed(0)
    m = Scaled()
    cm = er.compile(m, backend=backend)
    x = torch.randn(5, 4)
    with torch.no_grad():
        cm(x)  # compiled against the original's parameters first
        dup = copy.deepcopy(cm)
        assert isinstance(dup, Scaled) and isinstance(dup, er.CompiledModule)
        orig_copy = dup._modules["_orig_mod"]
        assert orig_copy is not m and dup.scale == 2.0
        assert not {id(p) for p in dup.parameters()} & {id(p) for p in m.parameters()}
        cf, dcf = compiled_function_of(cm), compiled_function_of(dup)
        assert dcf is not None and cf is not None and dcf is not cf
        assert dcf.target is orig_copy and not dcf.entries  # nothing compiled yet
        want = orig_copy(x)
        _bump(m, 1.0)  # the original's weights move; the copy's do not
        torch.testing.assert_close(dup(x), want)
        torch.testing.assert_close(cm(x), m(x))
        _bump(orig_copy, -0.5)  # the copy's move; the copy follows them
        torch.testing.assert_close(dup(x), orig_copy(x))
        dup.scale = 3.0  # attribute writes reach the copy's original, not the first one
        assert orig_copy.scale == 3.0 and m.scale == 2.0
        torch.testing.assert_close(dup(x), orig_copy(x))
    assert er.explain(dup).graph_count >= 1


def test_deepcopy_trains_its_own_parameters() -> None:
    torch.manual_seed(0)
    m = Scaled()
    cm = er.compile(m)
    x = torch.randn(5, 4)
    cm(x).sum().backward()
    m.zero_grad(set_to_none=True)
    dup = copy.deepcopy(cm)
    ref = copy.deepcopy(m)
    dup(x).square().sum().backward()
    ref(x).square().sum().backward()
    assert all(p.grad is None for p in m.parameters())
    for p, q in zip(dup.parameters(), ref.parameters(), strict=True):
        assert p.grad is not None and q.grad is not None
        torch.testing.assert_close(p.grad, q.grad)


def test_ema_copy_of_a_model_with_a_compiled_submodule() -> None:
    """`ema = copy.deepcopy(model)` where a block of the model is compiled: the EMA model's
    block is compiled afresh around the EMA's own weights."""
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(4, 4), Scaled())
    model[1] = er.compile(model[1])
    x = torch.randn(3, 4)
    with torch.no_grad():
        model(x)
        ema = copy.deepcopy(model)
        for pe, p in zip(ema.parameters(), model.parameters(), strict=True):
            assert pe is not p
        _bump(model, 0.25)
        for pe, p in zip(ema.parameters(), model.parameters(), strict=True):
            pe.mul_(0.9).add_(p, alpha=0.1)
        plain = nn.Sequential(nn.Linear(4, 4), Scaled())
        plain.load_state_dict({k.replace("_orig_mod.", ""): v
                               for k, v in ema.state_dict().items()})
        torch.testing.assert_close(ema(x), plain(x))
        torch.testing.assert_close(model[1](x), model[1]._orig_mod(x))


def test_deepcopy_keeps_hooks_and_mode_of_the_compiled_module() -> None:
    torch.manual_seed(0)
    cm = er.compile(Scaled())
    seen: list[int] = []
    cm.register_forward_hook(lambda mod, args, out: seen.append(out.shape[0]))
    cm.eval()
    dup = copy.deepcopy(cm)
    assert not dup.training and not dup._modules["_orig_mod"].training
    with torch.no_grad():
        dup(torch.randn(2, 4))
    assert seen == [2]


def test_deepcopy_of_compiled_functions() -> None:
    def f(x: torch.Tensor) -> torch.Tensor:
        """doc of f"""
        return torch.sin(x) * 2

    cf = er.compile(f)
    x = torch.randn(4)
    cf(x)
    dup = copy.deepcopy(cf)
    assert dup is not cf and dup.target is f and not dup.entries
    assert dup.__name__ == "f" and dup.__doc__ == "doc of f"
    torch.testing.assert_close(dup(x), f(x))

    # a compiled bound method is bound to the deep copy of its object
    torch.manual_seed(0)
    m = Scaled()
    holder = nn.Module()
    holder.m = m
    holder.fwd = er.compile(m.forward)
    with torch.no_grad():
        holder.fwd(torch.randn(2, 4))
        dh = copy.deepcopy(holder)
        assert dh.fwd.target.__self__ is dh.m
        _bump(m, 1.0)
        torch.testing.assert_close(dh.fwd(x.view(1, 4)), dh.m(x.view(1, 4)))


def test_shallow_copy_shares_the_original() -> None:
    """copy.copy of a compiled module is nn.Module's shallow copy: the same original, so the
    same parameters and the same compiled function."""
    torch.manual_seed(0)
    m = Scaled()
    cm = er.compile(m)
    x = torch.randn(3, 4)
    with torch.no_grad():
        cm(x)
        sh = copy.copy(cm)
        assert sh._modules["_orig_mod"] is m
        assert compiled_function_of(sh) is compiled_function_of(cm)
        _bump(m, 1.0)
        torch.testing.assert_close(sh(x), m(x))


def test_state_dict_round_trips_through_compiled_modules() -> None:
    torch.manual_seed(0)
    a, b = Scaled(), Scaled()
    ca, cb = er.compile(a), er.compile(b)
    x = torch.randn(3, 4)
    with torch.no_grad():
        ca(x)
        cb(x)
        # keys name the original under _orig_mod, as torch.compile's module does
        assert set(ca.state_dict()) == {f"_orig_mod.{k}" for k in a.state_dict()}
        ca.load_state_dict(cb.state_dict())
        torch.testing.assert_close(ca(x), b(x))
        dup = copy.deepcopy(ca)
        _bump(b, 1.0)
        dup.load_state_dict(cb.state_dict())  # into the copy only
        torch.testing.assert_close(dup(x), b(x))
        torch.testing.assert_close(ca(x), a(x))
        # parameters replaced by new objects (assign=True): the compiled module reads them
        a.load_state_dict(b.state_dict(), assign=True)
        torch.testing.assert_close(ca(x), b(x))


def test_deepcopy_of_a_compiled_hf_model_generates_with_its_own_weights() -> None:
    model, _ = tiny_hf_model("gpt2")
    cm = er.compile(model)
    ids = torch.randint(2, 100, (1, 4))
    with torch.no_grad():
        cm.generate(ids, max_new_tokens=4, do_sample=False)
        dup = copy.deepcopy(cm)
        ref = copy.deepcopy(model)
        _bump(model, 0.05)
        got = dup.generate(ids, max_new_tokens=6, do_sample=False)
        want = ref.generate(ids, max_new_tokens=6, do_sample=False)
    torch.testing.assert_close(got, want)
    assert er.explain(dup).graph_count >= 1


def _double(x: torch.Tensor) -> torch.Tensor:
    return torch.cos(x) * 2


def test_pickle_round_trip_compiles_the_loaded_original() -> None:
    """torch.save of a compiled model (its class is made per compile call, so it pickles as
    the original and compile's settings): the loaded module is compiled afresh around the
    loaded original, eval mode kept; a compiled module-level function pickles too."""
    import io
    import pickle
    torch.manual_seed(0)
    m = Scaled()
    cm = er.compile(m, dynamic=False)
    cm.eval()
    x = torch.randn(3, 4)
    with torch.no_grad():
        cm(x)
        buf = io.BytesIO()
        torch.save(cm, buf)
        buf.seek(0)
        back = torch.load(buf, weights_only=False)
        assert isinstance(back, Scaled) and isinstance(back, er.CompiledModule)
        assert not back.training and back._modules["_orig_mod"] is not m
        cf = compiled_function_of(back)
        assert cf is not None and cf.dynamic is False and not cf.entries
        torch.testing.assert_close(back(x), m(x))
        _bump(m, 1.0)
        torch.testing.assert_close(back(x), back._modules["_orig_mod"](x))
    f = pickle.loads(pickle.dumps(er.compile(_double)))
    assert compiled_function_of(f) is not None
    torch.testing.assert_close(f(x), _double(x))
