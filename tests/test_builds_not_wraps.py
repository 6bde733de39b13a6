"""ember builds the compiler layers itself (docs/architecture.md, "What ember builds itself").

No package source may reach into torch's compiler internals, except named interop modules: a file
(or a subpackage) of a layer whose name starts with `interop`, e.g. ember/runtime/interop_fx.py.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

from tools.sources import SourceFile, iter_sources, module_name

# Dotted names: the module itself, or anything below it, is forbidden.
FORBIDDEN_MODULES = (
    "torch._dynamo",
    "torch._C._dynamo",  # the frame hook
    "torch._functorch",  # AOTAutograd
    "functorch",  # the old public face of torch._functorch (make_fx, aot_function)
    "torch.func.functionalize",
    "torch._subclasses.functional_tensor",  # FunctionalTensor(Mode)
    "torch._decomp",
    "torch._refs",
    "torch._prims",
    "torch._prims_common",  # PrimTorch's type-promotion and shape utilities
    "torch._inductor",
    "torch.fx",  # tracing, any use
)
# Bare names that are forbidden wherever they appear in code (names, attributes, strings).
FORBIDDEN_NAMES = ("make_fx", "FunctionalTensor", "FunctionalTensorMode")


def _forbidden_module(dotted: str) -> str | None:
    for mod in FORBIDDEN_MODULES:
        if dotted == mod or dotted.startswith(mod + "."):
            return mod
    return None


def _docstrings(tree: ast.Module) -> set[int]:
    """ids of the string constants that are docstrings (they may name anything)."""
    ids = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Module | ast.ClassDef | ast.FunctionDef | ast.AsyncFunctionDef):
            body = node.body
            if body and isinstance(body[0], ast.Expr) and isinstance(body[0].value, ast.Constant):
                ids.add(id(body[0].value))
    return ids


def _dotted(node: ast.expr, aliases: dict[str, str]) -> str | None:
    """`T._dynamo.config` with `import torch as T` -> 'torch._dynamo.config'."""
    attrs = []
    while isinstance(node, ast.Attribute):
        attrs.append(node.attr)
        node = node.value
    if not isinstance(node, ast.Name) or node.id not in aliases:
        return None
    return ".".join([aliases[node.id], *reversed(attrs)])


def forbidden_uses(source: str, filename: str = "<source>") -> list[str]:
    """Messages for every use of a torch compiler internal in `source`.

    Sees imports (`import torch._dynamo`, `from torch import fx`, `from torch.func import
    functionalize`), attribute chains through any alias (`torch.fx.symbolic_trace`, `F.functionalize`
    after `from torch import func as F`), the forbidden names, and string constants outside
    docstrings (`importlib.import_module("torch._dynamo")`, `getattr(x, "make_fx")`).
    """
    tree = ast.parse(source, filename=filename)
    aliases: dict[str, str] = {}  # local name -> the dotted module/object it is bound to
    found: set[tuple[int, str]] = set()

    def check(dotted: str, line: int) -> None:
        if (mod := _forbidden_module(dotted)) is not None:
            found.add((line, mod))
        found.update((line, n) for n in FORBIDDEN_NAMES if n in dotted.split("."))

    # Pass 1: imports (and the aliases they bind).
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for a in node.names:
                check(a.name, node.lineno)
                if a.asname:
                    aliases[a.asname] = a.name
                else:
                    top = a.name.split(".")[0]
                    aliases[top] = top
        elif isinstance(node, ast.ImportFrom) and not node.level and node.module:
            for a in node.names:
                full = f"{node.module}.{a.name}"
                check(full, node.lineno)
                aliases[a.asname or a.name] = full
    # Pass 2: attribute chains, names, strings.
    docstrings = _docstrings(tree)
    for node in ast.walk(tree):
        if isinstance(node, ast.Attribute):
            if (dotted := _dotted(node, aliases)) is not None:
                check(dotted, node.lineno)
            if node.attr in FORBIDDEN_NAMES:
                found.add((node.lineno, node.attr))
        elif isinstance(node, ast.Name) and node.id in FORBIDDEN_NAMES:
            found.add((node.lineno, node.id))
        elif isinstance(node, ast.Constant) and isinstance(node.value, str):
            if id(node) in docstrings:
                continue
            if (mod := _forbidden_module(node.value)) is not None:
                found.add((node.lineno, mod))
            found.update((node.lineno, n) for n in FORBIDDEN_NAMES if n in node.value)
    return [f"{filename}:{line}: uses {what}" for line, what in sorted(found)]


def is_interop(src: SourceFile) -> bool:
    """Named interop modules: a module or subpackage of the layer whose name starts with interop."""
    return any(part.startswith("interop") for part in src.module.split(".")[2:])


# -- the repository ---------------------------------------------------------------------------

SOURCES = [s for s in iter_sources() if not is_interop(s)]


@pytest.mark.parametrize("src", SOURCES, ids=lambda s: s.module)
def test_no_torch_compiler_internals(src: SourceFile) -> None:
    assert forbidden_uses(src.text, str(src.path)) == []


# -- the checker catches violations ---------------------------------------------------------------

VIOLATIONS = {
    "import": "import torch._dynamo\n",
    "import-as": "import torch._inductor.config as cfg\n",
    "from-import": "from torch import fx\n",
    "from-import-deep": "from torch._C import _dynamo\n",
    "functionalize": "from torch.func import functionalize\n",
    "functional-tensor": "from torch._subclasses.functional_tensor import FunctionalTensorMode\n",
    "decomp": "from torch._decomp import decomposition_table\n",
    "refs": "import torch._refs as refs\n",
    "prims": "from torch._prims import utils\n",
    "functorch": "import torch._functorch.aot_autograd\n",
    "attr-chain": "import torch\ng = torch.fx.symbolic_trace(f)\n",
    "attr-chain-alias": "import torch as T\nT._dynamo.reset()\n",
    "attr-via-from": "from torch import func as F\ng = F.functionalize(f)\n",
    "frame-hook": "import torch\ntorch._C._dynamo.eval_frame.set_eval_frame(None)\n",
    "make_fx-name": "from torch.fx.experimental.proxy_tensor import make_fx\n",
    "make_fx-attr": "import something\nsomething.make_fx(f)\n",
    "make_fx-string": "g = getattr(mod, 'make_fx')(f)\n",
    "importlib-string": "import importlib\nimportlib.import_module('torch._inductor')\n",
    "old-functorch": "from functorch.compile import aot_function\n",
}


@pytest.mark.parametrize("source", VIOLATIONS.values(), ids=VIOLATIONS.keys())
def test_checker_flags_violation(source: str) -> None:
    assert forbidden_uses(source) != []


ALLOWED = {
    "eager-ops": "import torch\ny = torch.ops.aten.add.Tensor(x, x)\n",
    "fake-tensors": "from torch._subclasses.fake_tensor import FakeTensorMode\n",
    "dispatch-mode": "from torch.utils._python_dispatch import TorchDispatchMode\n",
    "func-vmap": "import torch\ny = torch.func.vmap(f)(x)\n",
    "autograd-ref": "import torch\ng = torch.autograd.grad(y, x)\n",
    "docstring": '"""Unlike make_fx and torch.fx, ember reads bytecode."""\n',
    "own-functionalize": "def functionalize(g):\n    return g\n",
    "fx-like-name": "import torch\nfx = 1\ny = torch.fxx\n",
}


@pytest.mark.parametrize("source", ALLOWED.values(), ids=ALLOWED.keys())
def test_checker_allows(source: str) -> None:
    assert forbidden_uses(source) == []


@pytest.mark.parametrize(
    ("rel", "exempt"),
    [
        ("interop_fx.py", True),
        ("interop/__init__.py", True),
        ("interop/inductor.py", True),
        ("compile.py", False),
        ("backends/fx_interop.py", False),
    ],
)
def test_interop_modules_are_exempt(rel: str, exempt: bool) -> None:
    module, is_package = module_name("runtime", Path(rel))
    assert is_interop(SourceFile("runtime", Path(rel), module, is_package)) is exempt
