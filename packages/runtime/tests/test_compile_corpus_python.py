"""Corpus, part 1: Python features around tensor code, each compiled with backend="eager" and
compared with eager (outputs, arguments afterwards, gradients where marked). Every case must
capture one graph with no fallback, so a construct that capture stopped covering fails here."""

from __future__ import annotations

import dataclasses
import functools
import math
import operator
from collections import OrderedDict, namedtuple
from collections.abc import Callable
from typing import Any, NamedTuple

import pytest
import torch
import torch.nn.functional as F

from ember.runtime.testing import check_against_eager

CASES: list[tuple[str, Callable[..., Any], Callable[[], tuple[Any, ...]], dict[str, Any]]] = []


def case(*make: Callable[[], Any], grad: bool = False, **kw: Any
         ) -> Callable[[Callable[..., Any]], Callable[..., Any]]:
    def deco(fn: Callable[..., Any]) -> Callable[..., Any]:
        CASES.append((fn.__name__, fn, lambda: tuple(m() for m in make),
                      {"grad": grad, **kw}))
        return fn
    return deco


def t(*shape: int) -> Callable[[], torch.Tensor]:
    return lambda: torch.randn(*shape)


def tg(*shape: int) -> Callable[[], torch.Tensor]:
    return lambda: torch.randn(*shape, requires_grad=True)


def v(x: Any) -> Callable[[], Any]:
    return lambda: x


SCALE = 0.5
OFFSET = torch.arange(4.0)
Pair = namedtuple("Pair", ["first", "second"])


class Stats(NamedTuple):
    mean: torch.Tensor
    std: torch.Tensor
    n: int = 0


@dataclasses.dataclass
class Out:
    y: torch.Tensor
    aux: dict[str, torch.Tensor] = dataclasses.field(default_factory=dict)
    tag: str = "out"


@dataclasses.dataclass(frozen=True)
class Config:
    hidden: int = 4
    act: str = "relu"
    eps: float = 1e-5


# -- arithmetic and comparison ---------------------------------------------------------------
@case(tg(3, 4), tg(3, 4), grad=True)
def arith_mix(x, y):
    return (x + y) * 2 - y / 3 + x ** 2 - (-x) + 1 - x


@case(t(3, 4))
def reflected(x):
    return 2 - x, 3 / (x.abs() + 1), 2 ** x, 1 + x, 5 * x


@case(t(4, 5), t(5, 3), grad=False)
def matmul_op(a, b):
    return a @ b


@case(t(6))
def compare_masks(x):
    m = (x > 0) & (x < 1) | (x == 0)
    return m, ~m, x >= 0.5, x != x


@case(t(3, 3))
def floordiv_mod(x):
    y = x * 10
    return y // 3, y % 4


@case(v(3), v(4.5))
def python_numbers_only(a, b):
    n = a * 2 + 1
    n += 3
    n //= 2
    return n, b ** 2, a / b, -a, divmod(17, a), abs(-b)


@case(t(2, 3))
def scalar_from_shapes(x):
    n = x.shape[0] * x.shape[1]
    return x / n + x.numel() + x.dim() + len(x)


@case(lambda: torch.randint(0, 10, (5,)), t(5))
def dtype_promotion(i, f):
    return i + f, i * 2, i / 2, (i > 3).to(torch.float32) + f


# -- containers ----------------------------------------------------------------------------
@case(t(3), t(3))
def tuple_list_unpack(x, y):
    a, b = x, y
    (c, d), e = (a + 1, b + 1), [a, b]
    first, *rest = [x, y, x + y]
    return c + d + e[0] + first + rest[1]


@case(t(4), t(4), t(4))
def list_methods(x, y, z):
    xs = [x]
    xs.append(y)
    xs.extend([z, x])
    xs.insert(0, z)
    last = xs.pop()
    xs.remove(z)
    n = xs.index(x)
    return torch.stack(xs) + last, n, len(xs)


@case(t(3), t(3))
def dict_methods(x, y):
    d = {"x": x, "y": y}
    d["z"] = x * y
    d.update(w=x - y)
    total = sum(d.values())
    keys = sorted(d.keys())
    g = d.get("missing", x)
    d.setdefault("q", y)
    popped = d.pop("x")
    return total, keys, g + popped, {k: val * 2 for k, val in d.items()}


@case(t(5))
def comprehensions(x):
    squares = [x * i for i in range(3)]
    evens = {i: x + i for i in range(6) if i % 2 == 0}
    s = {i * 2 for i in range(4)}
    gen = sum(x[i] for i in range(5))
    nested = [[x[i] * j for j in range(2)] for i in range(2)]
    return torch.stack(squares), evens[4], sorted(s), gen, nested[1][1]


@case(t(6))
def slicing_sequences(x):
    xs = [x * i for i in range(6)]
    ys = xs[1:5:2]
    zs = tuple(xs)[-2:]
    return ys[0] + ys[1] + zs[0], xs[::-1][0], "abcdef"[1:3]


@case(t(3), t(3))
def zip_enumerate_reversed(x, y):
    out = []
    for i, (a, b) in enumerate(zip([x, y], [y, x])):
        out.append(a * i + b)
    for j, a in reversed(list(enumerate([x, y]))):
        out.append(a - j)
    return torch.stack(out)


@case(t(3))
def set_and_membership(x):
    names = {"a", "b"}
    names.add("c")
    ok = "a" in names and "z" not in names
    return x * (2 if ok else 3), 2 in [1, 2, 3], "k" in {"k": 1}


@case(t(2, 2), t(2, 2))
def return_structures(x, y):
    return {"sum": x + y, "list": [x, (y, 3)], "none": None, "nested": {"a": (x,)}}


@case(t(3), t(3))
def namedtuple_build_and_read(x, y):
    p = Pair(x, second=y)
    s = Stats(x.mean(), x.std())
    return p.first * p.second, s, s.n, p._replace(first=y)


@case(t(4, 3))
def torch_return_types(x):
    m = x.max(dim=1)
    v, i = x.min(1)
    top = torch.topk(x, 2, dim=0)
    return m.values, m.indices, v + top.values.sum(), i, top


@case(t(3))
def ordered_dict(x):
    d = OrderedDict()
    d["a"] = x
    d["b"] = x * 2
    return d, list(d)


# -- functions, closures, globals -----------------------------------------------------------
def helper(x, k=2, *rest, scale=1.0, **extra):
    out = x * k * scale
    for r in rest:
        out = out + r
    for name, val in extra.items():
        out = out + val if name != "skip" else out
    return out


@case(t(3), t(3))
def user_function_args(x, y):
    a = helper(x)
    b = helper(x, 3, y, y, scale=0.5, bonus=y, skip=x)
    args = (x, 1)
    kw = {"scale": 2.0}
    c = helper(*args, **kw)
    return a + b + c


@case(t(3))
def closures_and_nonlocal(x):
    count = 0

    def bump(t):
        nonlocal count
        count += 1
        return t * count

    a = bump(x)
    b = bump(x)
    return a + b, count


@case(t(3))
def lambdas_and_partial(x):
    f = lambda t, k=3: t * k  # noqa: E731
    g = functools.partial(helper, k=4)
    h = functools.partial(torch.clamp, min=-0.5)
    return f(x), f(x, 2), g(x), h(x, max=0.5)


@case(t(4))
def globals_read(x):
    return x * SCALE + OFFSET


@case(t(4))
def math_module(x):
    d = x.shape[0]
    return x / math.sqrt(d) + math.pi + math.log(2.0) + math.floor(2.7) + max(d, 2) + min(1, 2)


@case(t(3))
def builtins_mix(x):
    vals = [3, 1, 2]
    out = x
    if isinstance(x, torch.Tensor) and not isinstance(vals, dict):
        out = out + sum(vals) + max(vals) + min(vals) + len(vals)
    out = out + abs(-2) + round(2.6) + int("3") + float(2) + pow(2, 3)
    if all(v > 0 for v in vals) and any(v > 2 for v in vals):
        out = out * 2
    out = out + sum(map(lambda v: v * 2, vals)) + len(list(filter(lambda v: v > 1, vals)))
    return out, sorted(vals, reverse=True), sorted(vals, key=lambda v: -v), list(range(2, 9, 3))


@case(t(3))
def getattr_hasattr(x):
    cfg = Config()
    act = getattr(F, cfg.act)
    y = act(x)
    if hasattr(cfg, "missing"):
        y = y * 100
    return y + getattr(cfg, "other", 1.0)


@case(t(2, 3))
def fstrings(x):
    name = f"layer_{x.shape[0]}_{x.dtype}"
    tag = "{}-{}".format("a", x.dim())
    width = f"{3.14159:.2f}|{'x'!r}|{7:>3}"
    return x * len(name), name, tag, width


def recursive(x, n):
    if n == 0:
        return x
    return recursive(x * 2, n - 1) + 1


@case(t(3))
def bounded_recursion(x):
    return recursive(x, 4)


@case(t(3), t(3))
def operator_module(x, y):
    return operator.add(x, y), operator.mul(x, 2), operator.getitem([x, y], 1), operator.neg(y)


@case(t(3))
def reduce_builtin(x):
    return functools.reduce(lambda a, b: a * b, [x, x + 1, x + 2])


# -- classes -----------------------------------------------------------------------------------
class Scaler:
    base = 2.0

    def __init__(self, k):
        self.k = k

    @property
    def factor(self):
        return self.k * self.base

    @classmethod
    def make(cls, k):
        return cls(k)

    @staticmethod
    def shift(x):
        return x + 1

    def __call__(self, x):
        return self.shift(x) * self.factor


class DoubleScaler(Scaler):
    def __call__(self, x):
        return super().__call__(x) * 2


SCALER = Scaler(3.0)


@case(t(3))
def classes_in_frame(x):
    s = Scaler.make(1.5)
    d = DoubleScaler(0.5)
    return s(x) + d(x) + SCALER(x), s.factor


@case(t(3), t(3))
def dataclass_build_return(x, y):
    o = Out(x + y, tag="sum")
    o.aux["prod"] = x * y
    return o


@case(t(4), v(Config(hidden=2, act="gelu")))
def dataclass_argument(x, cfg):
    y = getattr(F, cfg.act)(x) * cfg.hidden
    return y + cfg.eps


class Vec:
    def __init__(self, t):
        self.t = t

    def __add__(self, other):
        return Vec(self.t + other.t)

    def __mul__(self, k):
        return Vec(self.t * k)

    def __len__(self):
        return self.t.shape[0]

    def __getitem__(self, i):
        return self.t[i]


@case(t(3), t(3))
def dunder_methods(x, y):
    a = Vec(x) + Vec(y) * 2
    return a.t, len(a), a[1]


# -- control flow ------------------------------------------------------------------------------
@case(t(2, 3))
def if_on_shape_and_dtype(x):
    if x.shape[0] > 1 and x.dtype == torch.float32:
        y = x * 2
    elif x.ndim == 3:
        y = x
    else:
        y = -x
    return y if x.is_floating_point() else y.float()


@case(t(3), v(True), v(None))
def if_on_flags_and_none(x, flag, maybe):
    y = x + 1 if flag else x - 1
    if maybe is None:
        y = y * 3
    if maybe is not None:
        y = y + maybe
    return y


@case(t(3))
def loops_break_continue(x):
    acc = x
    for i in range(10):
        if i % 2:
            continue
        if i > 6:
            break
        acc = acc + i
    n = 0
    while n < 3:
        acc = acc * 1.5
        n += 1
    else:
        acc = acc - 1
    return acc, n


@case(t(4, 3))
def iterate_tensor_rows(x):
    rows = [r * i for i, r in enumerate(x)]
    a, b, c, d = x
    return torch.stack(rows), a + d


@case(t(3))
def try_except_no_raise(x):
    try:
        y = x * 2
    except ValueError:
        y = x
    finally:
        z = 1
    return y + z


@case(t(3))
def try_except_catches(x):
    d = {"a": 1}
    try:
        k = d["missing"]
    except KeyError:
        k = 5
    try:
        raise ValueError("x")
    except (TypeError, ValueError) as e:
        msg = str(e)
    return x * k, msg


@case(t(3, 4))
def asserts(x):
    assert x.dim() == 2, "rank"
    assert x.shape[1] == 4
    return x.sum(-1)


@case(tg(3), tg(3), grad=True)
def no_grad_region(x, y):
    with torch.no_grad():
        z = x * y
        w = z + 1
    out = w * x + y
    with torch.enable_grad():
        out = out * 2
    return out, z.requires_grad, w


@case(tg(3), grad=True)
def set_grad_enabled_ctx(x):
    with torch.set_grad_enabled(False):
        a = x * 2
    with torch.set_grad_enabled(True):
        b = x * 3
    return a + b, torch.is_grad_enabled()


@case(t(4, 4), t(4, 4))
def autocast_region(a, b):
    with torch.autocast("cpu", dtype=torch.bfloat16):
        c = a @ b
    return c, c.dtype, (a @ b).dtype


# -- tensor creation, constants --------------------------------------------------------------
@case(t(3))
def tensor_literals_lifted(x):
    w = torch.tensor([1.0, 2.0, 3.0])
    i = torch.tensor(2)
    return x * w + i, torch.zeros(2, 3), torch.ones_like(x), torch.arange(5), torch.full((2,), 7.0)


@case(t(2, 3, 4))
def tensor_methods(x):
    y = x.view(6, 4).reshape(2, 12).permute(1, 0).contiguous()
    a, b = x.chunk(2, dim=2)
    parts = x.split([1, 2], dim=1)
    z = x.transpose(0, 1).unsqueeze(0).squeeze(0).flatten(1)
    return y.sum(0), a - b, parts[1].mean(dim=(1, 2), keepdim=True), z.T, x.float().to(
        torch.float64), x.size(), x.size(-1), x.new_zeros(2).dtype, x.mT.shape


@case(t(3, 5))
def torch_functions(x):
    y = torch.cat([x, x * 2], dim=0)
    s = torch.stack([x, x], dim=-1)
    w = torch.where(x > 0, x, torch.zeros_like(x))
    e = torch.einsum("ij,kj->ik", x, x)
    return y, s, w, e, torch.softmax(x, -1), F.log_softmax(x, dim=1), torch.clamp(x, -1, 1)


@case(t(4, 5), t(4, 5))
def indexing(x, y):
    return x[0], x[:, 1], x[1:3, ::2], x[..., -1], x[None, 0], x[[0, 2]], y[:, None, :]



# -- more syntax -----------------------------------------------------------------------------
import enum  # noqa: E402


class Mode(enum.Enum):
    ADD = 1
    MUL = 2


@case(t(3), v(Mode.MUL))
def enum_dispatch(x, mode):
    if mode is Mode.ADD:
        return x + 2
    return x * 2 if mode == Mode.MUL else x, mode.name


@case(t(2, 3))
def walrus_chained_compare_del(x):
    if (n := x.shape[0]) and 0 < n < 5 <= 10:
        y = x * n
    tmp = y + 1
    del tmp
    return y, n


@case(t(2, 3), t(2, 3), t(2, 3))
def star_calls_and_kwonly(a, b, c):
    def combine(*ts, dim=0, scale):
        return torch.cat(ts, dim=dim) * scale

    parts = [a, b]
    return combine(*parts, c, dim=1, scale=0.5), combine(*(a, b), scale=2.0)


@case(t(4, 6))
def shape_unpack_and_size_math(x):
    b, d = x.shape
    h = 2
    y = x.view(b, h, d // h).transpose(1, 2)
    new_shape = x.shape[:-1] + (3, 2)
    return y.reshape(b, -1), x.view(new_shape), torch.Size([b, d]) == x.shape, x.size()[1:]


@case(t(3))
def string_ops(x):
    names = ["w", "b"]
    key = "_".join(names).upper() + ":" + str(len(names))
    parts = "a,b,c".split(",")
    return x * len(key), key, parts, key.startswith("W_"), type(x).__name__


@case(t(3), t(4), t(5))
def key_functions(a, b, c):
    ts = [c, a, b]
    smallest = min(ts, key=lambda t: t.shape[0])
    ordered = sorted(ts, key=lambda t: t.numel())
    big = any(t.shape[0] > 4 for t in ts)
    return smallest * 2, [o.shape[0] for o in ordered], big, dict(zip("abc", [1, 2, 3]))


@case(t(3))
def list_slice_assignment(x):
    xs = [x, x * 2, x * 3, x * 4]
    xs[1:3] = [x - 1]
    xs[0] = xs[-1] + 1
    return torch.stack(xs), len(xs)


def make_multiplier(k):
    def outer(t):
        def inner(u):
            return u * k + t
        return inner
    return outer


@case(t(3))
def nested_closures(x):
    mul = make_multiplier(3.0)
    return mul(x)(x), make_multiplier(0.5)(1.0)(x)


class Registry:
    factor = 4.0
    table = {"relu": torch.relu, "tanh": torch.tanh}

    def apply(self, name, x):
        return self.table[name](x) * self.factor


REG = Registry()


@case(t(3))
def class_attributes_via_instance(x):
    return REG.apply("relu", x) + REG.apply("tanh", x), Registry.factor


@case(t(2, 2))
def isinstance_forms(x):
    out = []
    for v in (x, 3, 2.5, "s", (x,), None):
        out.append(isinstance(v, (int, float)) and not isinstance(v, bool))
        out.append(isinstance(v, torch.Tensor))
    return x, out


@case(t(3), t(3))
def generator_function(x, y):
    def pairs(a, b):
        yield a
        yield b
        for i in range(2):
            yield a * i

    g = pairs(x, y)
    first = next(g)
    return first + sum(g), list(pairs(1, 2))


@case(t(3), v({"scale": 2.0, "names": ("a", "b")}))
def dict_config_argument(x, cfg):
    out = x * cfg["scale"]
    for i, _name in enumerate(cfg["names"], start=1):
        out = out + i
    return out, cfg.get("missing", "default"), "scale" in cfg


@pytest.mark.parametrize("name,fn,make,opts", CASES, ids=[c[0] for c in CASES])
def test_python_corpus(name: str, fn: Callable[..., Any], make: Callable[[], tuple[Any, ...]],
                       opts: dict[str, Any]) -> None:
    torch.manual_seed(0)
    check_against_eager(fn, *make(), calls=2, **opts)
