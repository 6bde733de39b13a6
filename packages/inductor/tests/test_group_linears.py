"""`group-linears` (targets/cpu/group_linear.py): the linears of one input by parameter weights
become one product by the concatenated weights, sliced per linear, lowered as one
`loop.linear_grouped` call that concatenates the parameters once (and again after they change);
results match eager, training graphs are left alone."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
import torch.nn.functional as F
from hypothesis import given, settings
from hypothesis import strategies as st
from torch import nn

import ember.inductor  # noqa: F401  (registers the CPU target)
from ember.inductor.kernels import compile_module, compiled_runner
from ember.inductor.targets.cpu.group_linear import GROUPED_OP, group_linears
from ember.ir import Module, parse, print_module
from ember.ir.passes import expand_pipeline, run_pipeline
from ember.runtime.compile import compile as ember_compile

OFF = ",".join(s for s in expand_pipeline("inductor").split(",") if s != "group-linears")
# linears read by an extern (q, k, v by the attention) grouped at any thread count
ALL = expand_pipeline("inductor").replace("group-linears", "group-linears{extern_threads=1}")
# ... at none
KERNELS = expand_pipeline("inductor").replace("group-linears",
                                              "group-linears{extern_threads=1000}")


def _linears(m: int, k: int, ns: list[int], bias: list[bool]) -> str:
    """prims IR of -(x @ w_i.T (+ b_i)) for each i, the linear as F.linear decomposes (the
    negation: a linear returned as it is is not grouped)."""
    params = [f"%x: f32[{m}, {k}]"]
    lines: list[str] = []
    outs: list[str] = []
    for i, (n, b) in enumerate(zip(ns, bias, strict=True)):
        params.append(f"%w{i}: f32[{n}, {k}]")
        lines.append(f"  %t{i} = prims.permute(%w{i}, dims=[1, 0]) : f32[{k}, {n}]")
        lines.append(f"  %m{i} = prims.matmul(%x, %t{i}) : f32[{m}, {n}]")
        if b:
            params.append(f"%b{i}: f32[{n}]")
            lines.append(f"  %c{i} = prims.broadcast_in_dim(%b{i}, shape=[{m}, {n}], "
                         f"broadcast_dims=[1]) : f32[{m}, {n}]")
            lines.append(f"  %y{i} = prims.add(%c{i}, %m{i}) : f32[{m}, {n}]")
        lines.append(f"  %o{i} = prims.neg({f'%y{i}' if b else f'%m{i}'}) : f32[{m}, {n}]")
        outs.append(f"%o{i}")
    types = ", ".join(f"f32[{m}, {n}]" for n in ns)
    body = "\n".join(lines)
    return (f"ember.ir 1.0\n\ngraph @f({', '.join(params)}) -> ({types}) {{\n{body}\n"
            f"  return ({', '.join(outs)})\n}}\n")


def _ops(m: Module, op: str) -> int:
    return sum(n.op == op for g in m.graphs.values() for n in g.nodes)


def _externs(m: Module, op: str) -> int:
    return sum(n.kwargs.get("op") == op for g in m.graphs.values() for n in g.nodes)


def _inputs(m: int, k: int, ns: list[int], bias: list[bool], seed: int) -> list[torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    out = [torch.randn(m, k, generator=g)]
    for n, b in zip(ns, bias, strict=True):
        out.append(nn.Parameter(torch.randn(n, k, generator=g), requires_grad=False))
        if b:
            out.append(nn.Parameter(torch.randn(n, generator=g), requires_grad=False))
    return out


def _eager(args: list[torch.Tensor], ns: list[int], bias: list[bool]) -> list[torch.Tensor]:
    x, rest, out = args[0], list(args[1:]), []
    for b in bias:
        w = rest.pop(0)
        out.append(-F.linear(x, w, rest.pop(0) if b else None))
    return out


def test_qkv_become_one_product_and_one_call() -> None:
    """Three biased linears of x: one prims.matmul over the concatenated weights, the bias
    concatenated too, three slices; lowered, one loop.linear_grouped extern (bias folded) and
    no kernel concatenating the weights; the pass leaves its input as it was."""
    text = _linears(6, 8, [4, 4, 5], [True] * 3)
    src = parse(text)
    out = group_linears(src)
    assert print_module(src) == print_module(parse(text))
    assert _ops(src, "prims.matmul") == 3 and _ops(out, "prims.matmul") == 1
    assert _ops(out, "prims.concatenate") == 2 and _ops(out, "prims.slice") == 3
    assert _ops(out, "prims.add") == 1
    compiled = compile_module(parse(text))
    assert _externs(compiled, GROUPED_OP) == 1 and _externs(compiled, "loop.linear_packed") == 0
    # only the negations' kernels, reading the product: no concatenation or bias add kernel
    g = compiled.graph("f")
    (y,) = (n.results[0] for n in g.nodes if n.kwargs.get("op") == GROUPED_OP)
    calls = [n for n in g.nodes if n.op == "kernels.call"]
    assert calls and all(y in n.operands() for n in calls)
    off = compile_module(parse(text), OFF)
    assert _externs(off, "loop.linear_packed") == 3 and _externs(off, GROUPED_OP) == 0
    args = _inputs(6, 8, [4, 4, 5], [True] * 3, 0)
    got = compiled_runner(compiled)(None, args).outputs
    for a, b in zip(got, _eager(args, [4, 4, 5], [True] * 3), strict=True):
        torch.testing.assert_close(a, b)


@settings(max_examples=25, deadline=None)
@given(n=st.integers(1, 5), k=st.integers(1, 24), m=st.integers(1, 9),
       sizes=st.lists(st.integers(1, 20), min_size=5, max_size=5),
       bias=st.lists(st.booleans(), min_size=5, max_size=5), seed=st.integers(0, 99))
def test_groups_match_eager(n: int, k: int, m: int, sizes: list[int], bias: list[bool],
                            seed: int) -> None:
    """Any number of linears of one x, with and without biases: one product per group of 2
    or more with the same bias-ness (none wider than the others together), the others left;
    compiled results equal eager's."""
    ns, bs = sizes[:n], bias[:n]
    text = _linears(m, k, ns, bs)
    out = run_pipeline(parse(text), "group-linears", verify_each=True)
    groups = grouped = 0
    for flag in (True, False):  # per bias-ness, the widest dropped while wider than the rest
        widths = [w for w, b in zip(ns, bs, strict=True) if b == flag]
        while len(widths) >= 2 and 2 * max(widths) > sum(widths):
            widths.remove(max(widths))
        if len(widths) >= 2:
            groups, grouped = groups + 1, grouped + len(widths)
    assert _ops(out, "prims.matmul") == groups + n - grouped
    compiled = compile_module(parse(text))
    assert _externs(compiled, GROUPED_OP) == groups
    args = _inputs(m, k, ns, bs, seed)
    got = compiled_runner(compiled)(None, args).outputs
    for a, b in zip(got, _eager(args, ns, bs), strict=True):
        torch.testing.assert_close(a, b)


class Attention(nn.Module):
    """BERT's self-attention and output: q, k, v of one x (biased), SDPA, a projection."""

    def __init__(self, d: int = 64, heads: int = 4) -> None:
        super().__init__()
        self.q, self.k, self.v = nn.Linear(d, d), nn.Linear(d, d), nn.Linear(d, d)
        self.o = nn.Linear(d, d)
        self.heads = heads

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, t, d = x.shape

        def split(y: torch.Tensor) -> torch.Tensor:
            return y.view(b, t, self.heads, d // self.heads).transpose(1, 2)
        a = F.scaled_dot_product_attention(split(self.q(x)), split(self.k(x)), split(self.v(x)))
        return self.o(a.transpose(1, 2).reshape(b, t, d)) + x


class LlamaBlock(nn.Module):
    """llama's attention (q, k, v without bias, rotary-like mixing of q and k) and its MLP
    (gate and up of one x, SiLU)."""

    def __init__(self, d: int = 64, heads: int = 4, ffn: int = 160) -> None:
        super().__init__()
        self.q, self.k = nn.Linear(d, d, bias=False), nn.Linear(d, d // 2, bias=False)
        self.v = nn.Linear(d, d // 2, bias=False)
        self.o = nn.Linear(d, d, bias=False)
        self.gate, self.up = nn.Linear(d, ffn, bias=False), nn.Linear(d, ffn, bias=False)
        self.down = nn.Linear(ffn, d, bias=False)
        self.heads = heads

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, t, d = x.shape
        e = d // self.heads
        q = self.q(x).view(b, t, self.heads, e).transpose(1, 2)
        k = self.k(x).view(b, t, self.heads // 2, e).transpose(1, 2)
        v = self.v(x).view(b, t, self.heads // 2, e).transpose(1, 2)
        q = q * 0.5 + torch.cat([-q[..., e // 2:], q[..., :e // 2]], -1) * 0.25
        k = k * 0.5 + torch.cat([-k[..., e // 2:], k[..., :e // 2]], -1) * 0.25
        # HF's repeat_kv: an expand and a reshape merging the repeated heads (a copy kernel)
        k = k[:, :, None].expand(b, self.heads // 2, 2, t, e).reshape(b, self.heads, t, e)
        v = v[:, :, None].expand(b, self.heads // 2, 2, t, e).reshape(b, self.heads, t, e)
        a = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        h = x + self.o(a.transpose(1, 2).reshape(b, t, d))
        return h + self.down(F.silu(self.gate(h)) * self.up(h))


def _grouped_in_dump(d: Path, parts: int | None = None) -> int:
    """The grouped calls (of `parts` linears) in the kernels.* dumps under `d`."""
    pat = f'op="{GROUPED_OP}"' + ("" if parts is None else f", parts={parts}")
    return sum(p.read_text().count(pat) for p in d.glob("*.kernels.ir"))


@pytest.mark.parametrize("cls,groups,kernels_only",
                         [(Attention, [0, 0, 1], [0, 0, 0]), (LlamaBlock, [0, 1, 1], [0, 1, 1])])
def test_blocks_match_eager(cls: type[nn.Module], groups: list[int], kernels_only: list[int],
                            tmp_path: Path) -> None:
    """bert-like and llama-like blocks compiled: with the pass at any thread count, one
    grouped call for q/k/v (and one for gate/up); where linears an extern reads through views
    are not grouped (at 1-2 threads), bert's q/k/v (read by the attention) stay apart while
    llama's are grouped (rotary's kernel reads q and k, repeat_kv's copy v); results equal
    eager's; with the pass left out of the pipeline, no grouped call. (groups: the grouped
    calls of 1, 2, 3 parts)"""
    torch.manual_seed(0)
    net = cls().eval()
    x = torch.randn(2, 16, 64)
    fns = {k: ember_compile(net, options={"dump_dir": str(tmp_path / k), "pipeline": p})
           for k, p in (("all", ALL), ("kernels", KERNELS), ("off", OFF))}
    with torch.no_grad():
        want = net(x)
        for f in fns.values():
            torch.testing.assert_close(f(x), want)
    assert [_grouped_in_dump(tmp_path / "all", k) for k in (1, 2, 3)] == groups
    assert [_grouped_in_dump(tmp_path / "kernels", k) for k in (1, 2, 3)] == kernels_only
    assert _grouped_in_dump(tmp_path / "off") == 0


def test_weights_changed_between_calls_are_concatenated_again(tmp_path: Path) -> None:
    """An in-place update (optimizer-like, under no_grad) and a `.data` reassignment of one
    part between calls: the next grouped call uses the new weights."""
    torch.manual_seed(1)
    net = Attention(d=128).eval()
    x = torch.randn(2, 16, 128)
    f = ember_compile(net, options={"dump_dir": str(tmp_path), "pipeline": ALL})
    with torch.no_grad():
        torch.testing.assert_close(f(x), net(x))
        net.k.weight.mul_(-2.0)
        torch.testing.assert_close(f(x), net(x))
        net.v.bias.data = torch.randn(128)
        torch.testing.assert_close(f(x), net(x))
        net.q.weight.data = torch.randn(128, 128)
        torch.testing.assert_close(f(x), net(x))
    assert _grouped_in_dump(tmp_path) == 1


def test_training_graphs_are_left_alone(tmp_path: Path) -> None:
    """A training compile (saved= graphs) keeps the separate products, its gradients equal
    eager's; the same block compiled for inference (no_grad) groups them."""
    torch.manual_seed(2)
    net = LlamaBlock()
    x = torch.randn(2, 8, 64)
    g = ember_compile(net, options={"dump_dir": str(tmp_path / "eval"), "pipeline": ALL})
    with torch.no_grad():
        torch.testing.assert_close(g(x), net(x))
    assert _grouped_in_dump(tmp_path / "eval") == 2
    f = ember_compile(net, options={"dump_dir": str(tmp_path / "train"), "pipeline": ALL})
    f(x).sum().backward()
    got = [p.grad.clone() for p in net.parameters()]  # type: ignore[union-attr]
    net.zero_grad()
    net(x).sum().backward()
    for a, p in zip(got, net.parameters(), strict=True):
        torch.testing.assert_close(a, p.grad)
    assert _grouped_in_dump(tmp_path / "train") == 0
    assert any((tmp_path / "train").glob("*.kernels.ir"))


class BufferWeights(nn.Module):
    """Two linears of one x by weights that are buffers, not Parameters."""

    def __init__(self, d: int = 16) -> None:
        super().__init__()
        self.register_buffer("w1", torch.randn(d, d))
        self.register_buffer("w2", torch.randn(d, d))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.tanh(F.linear(x, self.w1)) + torch.sigmoid(F.linear(x, self.w2))


def test_buffer_weights_written_past_their_version_are_seen(tmp_path: Path) -> None:
    """A buffer rewritten through `.data` (its version counter does not move, as batch norm's
    running statistics in a training forward) between calls: the grouped call reads the new
    values, as the ungrouped linear (linear.py keeps only Parameters' packs) does."""
    torch.manual_seed(3)
    net = BufferWeights()
    x = torch.randn(8, 16)
    f = ember_compile(net, options={"dump_dir": str(tmp_path), "pipeline": ALL})
    with torch.no_grad():
        for _ in range(3):
            torch.testing.assert_close(f(x), net(x))
            version = net.w1._version
            net.w1.data.add_(1.0)
            assert net.w1._version == version
    assert _grouped_in_dump(tmp_path) == 1
