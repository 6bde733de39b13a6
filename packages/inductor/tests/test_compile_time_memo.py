"""Compile time on large graphs (issue 18 #5), second part: work codegen repeated per kernel is
done once. A body's structural signature (its sympy index expressions printed) is computed once
per body through a memo, by fusion's duplicate merge and by the C++ writer's reduction keys;
comments of generated C++ take one regex call when their text is already safe. Each shortcut is
checked against the slow way's result."""

from __future__ import annotations

import re
from typing import Any

import pytest
import sympy
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

import ember.inductor  # noqa: F401
from ember.capture import Captured, capture
from ember.inductor import body as body_mod
from ember.inductor import sanitize
from ember.inductor.backend import compile_module
from ember.inductor.body import SignMemo, body_signature
from ember.inductor.sanitize import kernel_symbol
from ember.inductor.targets.cpu import codegen, cppkernel
from ember.inductor.targets.cpu.codegen import PRELUDE_NAME
from ember.inductor.targets.cpu.kernel import kernel_source
from ember.ir import Graph, Module, parse
from ember.runtime import compile as ember_compile
from packages.inductor.tests.softmax_ir import SOFTMAX_FUSED


@pytest.fixture
def reprs(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """Counts body_signature's reprs of sympy expressions (index expressions: the cost)."""
    count = [0]

    def counting(x: Any) -> str:
        count[0] += isinstance(x, sympy.Basic)
        return repr(x)
    monkeypatch.setattr(body_mod, "repr", counting, raising=False)
    return count


def test_body_signature_memo_signs_each_body_once(reprs: list[int]) -> None:
    m = parse(SOFTMAX_FUSED)
    k4 = m.items["softmax_k4"]
    assert isinstance(k4, Graph)
    memo = SignMemo()
    want = body_signature(m.items, k4, memo)
    first = reprs[0]
    assert {id(g) for g in m.items.values()} - {id(m.items["softmax"])} == set(memo.sigs)
    assert body_signature(m.items, k4, memo) == want
    assert reprs[0] == first  # the second ask is the memo's
    # a copy (fusion's copies share their expression objects) prints nothing again
    copy = k4.clone()
    assert body_signature(m.items, copy, memo) == want
    assert reprs[0] == first
    assert body_signature(m.items, copy) == want  # (a fresh memo: printed again)
    assert reprs[0] > first


def test_body_signature_memo_never_answers_for_another_graph() -> None:
    """A memo entry keeps its graph alive and is checked by identity: a graph with another
    body's id (after that one was freed) is never answered with its signature."""
    m = parse(SOFTMAX_FUSED)
    k6, k7 = m.items["softmax_k6"], m.items["softmax_k7"]
    assert isinstance(k6, Graph) and isinstance(k7, Graph)
    memo = SignMemo()
    memo.sigs[id(k7)] = (k6, ("stale",))
    assert body_signature(m.items, k7, memo) == body_signature(m.items, k7)


def test_writer_keys_sign_each_body_once(reprs: list[int],
                                         monkeypatch: pytest.MonkeyPatch) -> None:
    """The C++ kernel of a fused softmax (its reductions asked for by key several times) prints
    each body's expressions once; its source is the same as without the memo."""
    m = parse(SOFTMAX_FUSED)
    node = m.graphs["softmax"].nodes[0]
    k4 = m.items["softmax_k4"]
    assert isinstance(k4, Graph)
    src = kernel_source("softmax", node, k4, "test", m.items)
    with_memo, reprs[0] = reprs[0], 0
    orig = cppkernel.body_signature
    monkeypatch.setattr(cppkernel, "body_signature",
                        lambda items, g, memo=None: orig(items, g))
    assert kernel_source("softmax", node, k4, "test", m.items) == src
    assert 0 < with_memo < reprs[0]


# the comment alphabet's edges, and what it refuses ("*/" ends a C comment)
safe_alphabet = st.lists(st.sampled_from(
    list("abcXYZ019 !#$%&'()*+,-./:;<=>@[]^_`{|}~") + ["*/", "\n", "é", "\x00", "\\"]),
    max_size=40).map("".join)


def _slow_safe_text(text: str) -> str:
    out, prev = [], ""
    for c in text:
        ok = sanitize._COMMENT_SAFE.fullmatch(c) and not (prev == "*" and c == "/")
        out.append(c if ok else f"<U+{ord(c):04X}>")
        prev = c
    return "".join(out)


@settings(max_examples=200, deadline=None)
@given(safe_alphabet)
def test_safe_text_is_the_per_character_rule(text: str) -> None:
    assert sanitize.safe_text(text) == _slow_safe_text(text)


def test_safe_text_takes_one_regex_call_for_safe_text(monkeypatch: pytest.MonkeyPatch) -> None:
    calls = [0]

    class Spy:
        def fullmatch(self, c: str) -> Any:
            calls[0] += 1
            return sanitize._COMMENT_SAFE_TEXT.fullmatch(c[:1]) if c else None
    monkeypatch.setattr(sanitize, "_COMMENT_SAFE", Spy())
    text = "kernel @forward_k12: loop.pointwise of /usr/lib/python3/torch/nn/functional.py:49"
    assert sanitize.safe_text(text) == text
    assert calls[0] == 0
    assert sanitize.safe_text("a*/b") == "a*<U+002F>b"
    assert calls[0] == 4


# ---- one kernel for a layer's repeats -----------------------------------------------------------

class _Block(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.ln = torch.nn.LayerNorm(12)
        self.fc = torch.nn.Linear(12, 12)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + torch.nn.functional.gelu(self.fc(self.ln(x))).softmax(-1) * 0.5


def _compiled(n_blocks: int) -> tuple[Module, torch.nn.Module, torch.Tensor]:
    torch.manual_seed(0)
    model = torch.nn.Sequential(*[_Block() for _ in range(n_blocks)]).eval()
    x = torch.randn(3, 5, 12)
    got = capture(model, (x,), {})
    assert isinstance(got, Captured)
    return compile_module(got.module), model, x


def test_repeated_layers_share_their_kernels() -> None:
    """Four identical blocks compile to one block's kernels, each called four times; the
    results are eager's."""
    one, _, _ = _compiled(1)
    four, model, x = _compiled(4)
    calls = [n for g in four.graphs.values() for n in g.nodes if n.op == "kernels.call"]
    blocks = [k for k in four.kernels.values() if k.name != PRELUDE_NAME]
    assert len(blocks) == len([k for k in one.kernels.values() if k.name != PRELUDE_NAME])
    assert len(calls) >= 4 * len(blocks)
    with torch.no_grad():
        torch.testing.assert_close(ember_compile(model)(x), model(x))


def test_shared_kernel_is_the_kernel_it_would_generate(monkeypatch: pytest.MonkeyPatch) -> None:
    """Without sharing, the loop nodes of one sharing key generate the same C++ but for names
    and comments: what sharing relies on."""
    real_key = codegen._Shared.key
    made: dict[object, list[str]] = {}
    orig = codegen.kernel_source_sizes

    def plain(src: str, name: str) -> str:
        """Comments dropped, the function named K, value-named locals (`v_`, `n<j>_`: cpp.py's
        `_cname`) numbered in order."""
        lines = [ln for ln in src.splitlines() if not ln.lstrip().startswith("//")]
        text = "\n".join(lines).replace(kernel_symbol(name), "K")
        local: dict[str, str] = {}
        return re.sub(r"\b(?:n\d+_|v_)\w+", lambda mt: local.setdefault(mt[0], f"v{len(local)}"),
                      text)

    def recording(name: str, n: Any, body: Any, prov: str, items: Any, syms: Any,
                  *rest: Any) -> Any:
        src, sizes = orig(name, n, body, prov, items, syms, *rest)
        key = real_key(codegen._Shared(), Module({}, dict(items)), n, body)
        made.setdefault(key, []).append(plain(src, name))
        return src, sizes
    monkeypatch.setattr(codegen._Shared, "key", lambda self, m, n, body: object())
    monkeypatch.setattr(codegen, "kernel_source_sizes", recording)
    _compiled(4)
    assert max(len(v) for v in made.values()) >= 3  # the repeats: one key
    assert all(len(set(v)) == 1 for v in made.values())


def test_fuse_operand_set_is_the_operands() -> None:
    """fuse's reader index reads each node's operands through `_operand_set`: the set of
    `Node.operands()`, nested lists and kwargs included, on every node of a lowered model."""
    from ember.inductor import fusion
    from ember.ir.passes import run_pipeline
    got = capture(torch.nn.Sequential(_Block(), _Block()).eval(), (torch.randn(2, 3, 12),), {})
    assert isinstance(got, Captured)
    m = run_pipeline(got.module, "decompose,lower-loops")
    nodes = [n for g in m.graphs.values() for n in g.nodes]
    assert any(n.kwargs for n in nodes) and len(nodes) > 20
    for n in nodes:
        assert fusion._operand_set(n) == set(n.operands())
