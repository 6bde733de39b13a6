"""The demo (`python3 dev.py demo`): the IR workbench, then the compiler on a small model.

Part 1 replays a bundled ir-v1 module: parse and verify it, optimize it with a pass pipeline,
replay it from the shell commands a researcher would type, and check the numbers against calling
the same ATen ops in Python. Part 2 compiles a small model with `ember.runtime.compile` (capture
-> decompose to prims -> loop IR, fusion, C++ kernels) and compares with eager.
"""

from __future__ import annotations

import contextlib
import io
import sys
import tempfile
from collections.abc import Callable
from importlib import resources
from pathlib import Path

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


def main() -> int:
    path = demo_path()
    text = path.read_text()
    say = print
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

    ok = compiler_demo(say) and ok
    say("\nTry it yourself:\n"
        f"  .venv/bin/ember opt {path} -p dce,cse --print-after-all\n"
        f"  .venv/bin/ember run {path} --random --out /tmp/out.safetensors\n"
        "  .venv/bin/ember passes")
    if not ok:
        say("demo: MISMATCH (see above)")
        return 1
    return 0


class _Block(torch.nn.Module):
    """A small MLP block: the kind of code ember.capture reads."""

    def __init__(self) -> None:
        super().__init__()
        self.up = torch.nn.Linear(32, 64)
        self.down = torch.nn.Linear(64, 32)
        self.norm = torch.nn.LayerNorm(32)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = F.gelu(self.up(x))
        y: torch.Tensor = self.norm(x + self.down(h))
        return y.softmax(dim=-1)


def compiler_demo(say: Callable[[str], None]) -> bool:
    """Part 2: compile a module with the default backend and compare with eager."""
    from ember.ir import parse as parse_ir
    from ember.runtime import compile as ember_compile
    from ember.runtime import explain

    say("\nember demo, part 2: the compiler on a small model (inference, CPU)\n")
    torch.manual_seed(0)
    model = _Block().eval()
    x = torch.randn(8, 32)
    compiled = ember_compile(model)
    with torch.no_grad():
        want = model(x)
        got = compiled(x)
    report = explain(compiled)
    close = torch.allclose(got, want, rtol=1e-5, atol=1e-5)
    err = float((got - want).abs().max())
    say(f"[6] ember.runtime.compile(model)(x): captured {report.graph_count} graph with "
        f"{sum(report.op_counts.values())} aten ops and "
        f"{sum(len(g) for g in report.guards)} guards; max abs error vs eager {err:.2e}: "
        f"{'ok' if close else 'MISMATCH'}")
    for note in report.notes:
        say(f"    {note}")
    aten = parse_ir(report.graph_texts[0])
    with tempfile.TemporaryDirectory(prefix="ember-demo-") as tmp:
        path = Path(tmp) / "block.ir"
        path.write_text(str(aten))
        checks = [_ember(["check", str(path), "--backend", b]).strip()
                  for b in ("prims", "inductor")]
    say("[7] $ ember check block.ir --backend prims    (aten -> prims, run the prims)\n"
        f"    {checks[0]}\n"
        "    $ ember check block.ir --backend inductor (prims -> loops -> fused C++ kernels)\n"
        f"    {checks[1]}")
    return close


if __name__ == "__main__":
    sys.exit(main())
