"""The demo (`python3 dev.py demo`): the IR workbench, then the compiler on a small model.

It starts with `ember verify` (its summary line) and stops, saying why, if the installation
cannot compile (no C++ compiler, torch out of range, ...).
Part 1 replays a bundled ir-v1 module: parse and verify it, optimize it with a pass pipeline,
replay it from the shell commands a researcher would type, and check the numbers against calling
the same ATen ops in Python. Part 2 compiles two models with `ember.runtime.compile` (capture ->
decompose to prims -> loop IR, fusion, C++ kernels): a small GPT-NeoX of dolly-v2's architecture
and a conv net, with random weights; it checks them against eager, times both, and says where
the graphs were dumped (EMBER_DUMP). `--small` shrinks the models (the test uses it).
"""

from __future__ import annotations

import contextlib
import io
import os
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from importlib import resources
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F
from safetensors.torch import load_file, save_file

from ember.ir import Interpreter, parse, verify
from ember.runtime import cli

DEMO_IR = "demo.ir"


def demo_path() -> Path:
    return Path(str(resources.files("ember.runtime").joinpath("examples", DEMO_IR)))


def eager_mlp(x: torch.Tensor, w1: torch.Tensor, b1: torch.Tensor, w2: torch.Tensor,
              b2: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """What @mlp computes, written as the ATen ops it records."""
    h = torch.ops.aten.addmm.default(b1, x, w1.t())
    a = F.gelu(h, approximate="tanh")
    y = torch.ops.aten.addmm.default(b2, a, w2.t())
    m, i = y.max(dim=1)
    return y, m, i


def _ember(args: list[str]) -> str:
    """Run the `ember` CLI in-process, as the shell would, and return what it printed."""
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        rc = cli.main(args)
    if rc != 0:
        raise SystemExit(f"ember {' '.join(args)} failed:\n{err.getvalue()}")
    return out.getvalue()


def installation_ok(say: Callable[[str], None]) -> bool:
    """`ember verify`, briefly: its summary line, and the failed checks when one failed."""
    from ember.runtime import verify

    results = verify.run_checks()
    width = max(len(r.name) for r in results)
    failed = [r for r in results if r.status == "fail"]
    say(verify.summary(results))
    for r in failed:
        say("  " + r.line(width))
    if failed:
        say("demo: stopped: this installation cannot compile (see the FAIL lines above; "
            "`ember verify` shows every check)")
        return False
    say("")
    return True


def main(argv: list[str] | None = None) -> int:
    small = "--small" in (sys.argv[1:] if argv is None else argv)
    torch.set_num_threads(os.cpu_count() or 1)
    path = demo_path()
    text = path.read_text()
    say = print
    if not installation_ok(say):
        return 1
    say("ember demo, part 1: the IR workbench\n")

    m = parse(text)
    verify(m)
    nodes = sum(len(g.nodes) for g in m.graphs.values())
    say(f"[1] parsed and verified {path.name}: {len(m.graphs)} graphs, {nodes} nodes, "
        f"symbols {', '.join(m.symbols)}; print(parse(text)) == text: {str(m) == text}")

    with tempfile.TemporaryDirectory(prefix="ember-demo-") as tmp:
        t = Path(tmp)
        opt = t / "demo.opt.ir"
        _ember(["opt", str(path), "-p", "dce,cse", "--verify-each", "-o", str(opt)])
        m2 = parse(opt.read_text())
        nodes2 = sum(len(g.nodes) for g in m2.graphs.values())
        say(f"[2] $ ember opt demo.ir -p dce,cse --verify-each -o demo.opt.ir\n"
            f"    {nodes} -> {nodes2} nodes (dce dropped unused %unused and %flat, cse merged "
            f"%w2t_again into %w2t)")
        say("    " + _ember(["check", str(path), "-p", "dce,cse"]).strip().replace(
            "\n", "\n    "))

        # Replay the optimized module from files, as from the shell, at a batch size (5)
        # other than the symbol's hint: s0 is bound from the input's shape.
        g = torch.Generator().manual_seed(0)
        inputs = {"x": torch.randn(5, 16, generator=g), "w1": torch.randn(32, 16, generator=g),
                  "b1": torch.randn(32, generator=g), "w2": torch.randn(4, 32, generator=g),
                  "b2": torch.randn(4, generator=g)}
        save_file(inputs, str(t / "in.safetensors"))
        _ember(["run", str(opt), "--inputs", str(t / "in.safetensors"),
                "--out", str(t / "out.safetensors")])
        got = load_file(str(t / "out.safetensors"))
        want = eager_mlp(**inputs)
        same = all(torch.equal(got[f"out{k}"], want[k]) for k in range(3))
        say(f"[3] $ ember run demo.opt.ir --inputs in.safetensors --out out.safetensors\n"
            f"    outputs out0 {list(got['out0'].shape)}, out1 {list(got['out1'].shape)}, "
            f"out2 {list(got['out2'].shape)} (s0 bound to 5); bitwise equal to calling the "
            f"ATen ops in Python: {same}")

        p = torch.randn(32, 16, generator=g)
        grad = torch.randn(32, 16, generator=g)
        save_file({"p": p, "g": grad, "lr": torch.tensor(0.1, dtype=torch.float64)},
                  str(t / "step.safetensors"))
        _ember(["run", str(opt), "--graph", "sgd_step", "--inputs", str(t / "step.safetensors"),
                "--out", str(t / "step.out.safetensors")])
        got2 = load_file(str(t / "step.out.safetensors"))
        p_new = p - grad * 0.1
        ok2 = torch.equal(got2["p"], p_new) and torch.equal(got2["out0"], (p_new * p_new).sum())
        say(f"[4] $ ember run demo.opt.ir --graph sgd_step --inputs step.safetensors --out ...\n"
            f"    input_updates=[[0, 1]] wrote the new %p back under its own name 'p'; "
            f"matches eager: {ok2}")

        # In-process, updates can be applied to the caller's tensors, as the runtime will.
        p_live = p.clone()
        Interpreter(m2).run([p_live, grad, 0.1], "sgd_step", apply_updates=True)
        say(f"[5] in-process replay wrote the update into the caller's tensor: "
            f"{torch.equal(p_live, p_new)}")
        ok = same and ok2 and torch.equal(p_live, p_new)

    ok = compiler_demo(say, small) and ok
    say("\nTry it yourself:\n"
        f"  .venv/bin/ember opt {path} -p dce,cse --print-after-all\n"
        f"  .venv/bin/ember run {path} --random --out /tmp/out.safetensors\n"
        "  .venv/bin/ember passes")
    if not ok:
        say("demo: MISMATCH (see above)")
        return 1
    return 0


class ConvNet(torch.nn.Module):
    """3 blocks of conv 3×3 + BatchNorm + ReLU (3 -> 32 -> 64 -> 64 channels)."""

    def __init__(self) -> None:
        super().__init__()
        chans = [3, 32, 64, 64]
        self.body = torch.nn.Sequential(*[
            torch.nn.Sequential(torch.nn.Conv2d(a, b, 3, padding=1, bias=False),
                                torch.nn.BatchNorm2d(b), torch.nn.ReLU())
            for a, b in zip(chans, chans[1:], strict=False)])
        for m in self.modules():  # non-trivial running statistics, so BN is not the identity
            if isinstance(m, torch.nn.BatchNorm2d):
                assert m.running_mean is not None and m.running_var is not None
                m.running_mean.uniform_(-0.5, 0.5)
                m.running_var.uniform_(0.5, 2.0)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y: torch.Tensor = self.body(x)
        return y


def neox(layers: int = 4, hidden: int = 256) -> torch.nn.Module:
    """A GPT-NeoX with dolly-v2's architecture (parallel residual, rotary embeddings on a
    quarter of each head, GELU), small, random weights: built from a config, nothing
    downloads."""
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    from transformers import GPTNeoXConfig, GPTNeoXForCausalLM
    # rotary_pct is read through the config's **kwargs (transformers 5 types it loosely)
    extra: dict[str, Any] = {"rotary_pct": 0.25}
    cfg = GPTNeoXConfig(hidden_size=hidden, num_hidden_layers=layers, num_attention_heads=4,
                        intermediate_size=4 * hidden, vocab_size=1024,
                        max_position_embeddings=512, use_parallel_residual=True,
                        hidden_act="gelu", **extra)
    model: torch.nn.Module = GPTNeoXForCausalLM(cfg).eval()
    return model


def _logits(x: Any) -> Any:
    return getattr(x, "logits", x)


def _median_ms(fn: Callable[[], Any], reps: int) -> float:
    times = []
    for _ in range(reps):
        t = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t)
    return statistics.median(times) * 1e3


def compile_and_compare(say: Callable[[str], None], label: str, what: str,
                        model: torch.nn.Module, x: torch.Tensor, reps: int = 5) -> bool:
    """Compile `model` with ember's default backend, check it against eager, time both."""
    from ember.runtime import compile as ember_compile
    from ember.runtime.bench import ember_status
    from ember.runtime.explain import explain

    say(f"{label} {what}")
    with torch.no_grad():
        want = _logits(model(x))
        compiled = ember_compile(model)
        t = time.perf_counter()
        got = _logits(compiled(x))
        first = time.perf_counter() - t
        eager_ms = ember_ms = 0.0
        for _ in range(2):  # warm up, then interleave
            model(x)
            compiled(x)
        e, c = [], []
        for _ in range(reps):
            e.append(_median_ms(lambda: model(x), 1))
            c.append(_median_ms(lambda: compiled(x), 1))
        eager_ms, ember_ms = statistics.median(e), statistics.median(c)
    rep = explain(compiled)
    st = ember_status(compiled)
    close = isinstance(got, torch.Tensor) and got.shape == want.shape and \
        torch.allclose(got, want, rtol=1e-3, atol=1e-3)
    err = float((got - want).abs().max()) if close else float("nan")
    if rep.graph_count:
        ops = sum(rep.op_counts.values())
        guards = sum(len(g) for g in rep.guards)
        say(f"    captured {rep.graph_count} graph(s): {ops} aten ops, {guards} guards "
            f"(checked on every call)")
        say(f"    compiled to {st['kernels']} fused C++ kernel(s) + {st['externs']} extern "
            f"call(s) (matmul, convolution, attention: torch's own kernels) "
            f"in {first:.1f} s (first call: capture + compile + run)")
    for why in [*st.get("fallbacks", []), *st.get("breaks", []), *st.get("eager_graphs", [])]:
        say(f"    NOTE: part of it runs eagerly: {why}")
    if not rep.graph_count:
        say("    ember fell back to eager for the whole model (reason above); the timing "
            "below is eager against eager")
    say(f"    output vs eager: {'match' if close else 'MISMATCH'} (max abs error {err:.1e})")
    say(f"    eager {eager_ms:.1f} ms, ember {ember_ms:.1f} ms per call: "
        f"{eager_ms / ember_ms:.2f}× eager's speed (median of {reps}, "
        f"{torch.get_num_threads()} threads)")
    return close


def compiler_demo(say: Callable[[str], None], small: bool = False) -> bool:
    """Part 2: compile a GPT-NeoX and a conv net with the default backend, compare with eager.
    `small` shrinks both (the test)."""
    say("\nember demo, part 2: the compiler on two models (inference, CPU)\n")
    dump = os.environ.get("EMBER_DUMP")
    if not dump:
        dump = tempfile.mkdtemp(prefix="ember-demo-dump-")
        os.environ["EMBER_DUMP"] = dump
    torch.manual_seed(0)
    layers, hidden, seq = (1, 64, 16) if small else (4, 256, 128)
    ok = compile_and_compare(
        say, "[6]", f"GPT-NeoX (dolly-v2's architecture), {layers} layers × {hidden} hidden, "
        f"random weights; batch 4 × {seq} tokens", neox(layers, hidden),
        torch.randint(0, 1024, (4, seq)), reps=2 if small else 5)
    torch.manual_seed(0)
    n, hw = (2, 16) if small else (32, 64)
    ok = compile_and_compare(
        say, "[7]", f"conv net, 3 × (conv 3×3 + BatchNorm + ReLU), on {n}×3×{hw}×{hw}",
        ConvNet().eval(), torch.randn(n, 3, hw, hw), reps=2 if small else 5) and ok
    files = sorted(p.name for p in Path(dump).glob("*.ir") if not p.name.endswith(".kernels.ir"))
    compiled = sorted(p.name for p in Path(dump).glob("*.kernels.ir"))
    say(f"[8] EMBER_DUMP={dump}: each captured graph as ir-v1 text with its inputs, outputs "
        f"and guards ({', '.join(files) or 'none'}).\n"
        f"    Replay one from the shell: .venv/bin/ember run {dump}/"
        f"{files[0] if files else 'NAME.ir'} --inputs {dump}/"
        f"{files[0].removesuffix('.ir') if files else 'NAME'}.inputs.safetensors\n"
        f"    and the compiled C++ ({len(compiled)} NAME.kernels.ir file(s)) with the same inputs "
        f"and --allow-kernels.")
    return ok


if __name__ == "__main__":
    sys.exit(main())
