"""A compiled call's result that is a dict subclass with attributes (a Hugging Face
ModelOutput): rebuilt per call by the generated output function through the dict base found
in the class's MRO, looked up once per MRO (runtime/guards.py `_new_object`)."""

from __future__ import annotations

from collections import OrderedDict

import torch
from torch import nn

import ember.runtime as er
from ember.runtime import guards


class Out(OrderedDict):  # type: ignore[type-arg]
    """As ModelOutput: items and attributes both."""

    extra: str


class Net(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.lin = nn.Linear(3, 3)

    def forward(self, x: torch.Tensor) -> Out:
        y = self.lin(x)
        out = Out(hidden=y, pooled=y.sum(-1))
        out.extra = "tag"
        return out


def test_dict_subclass_result_is_rebuilt_as_eager() -> None:
    m = Net()
    c = er.compile(m, backend="eager")
    for _ in range(3):
        x = torch.randn(2, 3)
        want, got = m(x), c(x)
        assert type(got) is Out and list(got) == list(want) == ["hidden", "pooled"]
        assert got.extra == "tag"
        for k in want:
            torch.testing.assert_close(got[k], want[k])
    mro, base = guards._DICT_BASES[Out]
    assert mro is Out.__mro__ and base is OrderedDict


def test_the_base_is_found_again_for_another_mro() -> None:
    guards._DICT_BASES[Out] = ((Out, dict, object), dict)  # a stale entry: another MRO
    obj = guards._new_object(Out, {"extra": 1}, [("a", 1)])
    assert type(obj) is Out and obj["a"] == 1 and obj.extra == 1
    assert guards._DICT_BASES[Out][1] is OrderedDict
