"""ember.ir: the IR every ember layer speaks (ir-v1).

Types, graphs and modules; the text format (`parse`, `str(module)`); the op registry; the
verifier; the reference interpreter; passes and pipelines.
"""

from ember.ir.builder import Builder, BuildError, GraphBuilder
from ember.ir.builtin_ops import register_builtin_ops
from ember.ir.dtypes import DType
from ember.ir.expr import Dim, FloorDiv, PyMod, evaluate, symbol, to_text
from ember.ir.graph import (
    IR_VERSION,
    Arg,
    Graph,
    Kernel,
    Loc,
    Module,
    Node,
    Pos,
    Ref,
    Symbol,
    Value,
)
from ember.ir.interpreter import Interpreter, InterpretError, RunResult, run_graph
from ember.ir.lexer import IRParseError
from ember.ir.parser import parse
from ember.ir.printer import PrintError, print_module
from ember.ir.registry import (
    InferContext,
    OpDef,
    OpRegistry,
    OpTypeError,
    default_registry,
    register_op,
)
from ember.ir.types import BOOL, F64, I64, ScalarKind, ScalarType, TensorType, Type
from ember.ir.verifier import VerificationError, VerifyError, check, verify

register_builtin_ops(default_registry())

__all__ = [
    "BOOL", "F64", "I64", "IR_VERSION", "Arg", "BuildError", "Builder", "DType", "Dim",
    "FloorDiv", "Graph", "GraphBuilder", "IRParseError", "InferContext", "InterpretError",
    "Interpreter", "Kernel", "Loc", "Module", "Node", "OpDef", "OpRegistry", "OpTypeError", "Pos",
    "PrintError", "PyMod", "Ref", "RunResult", "ScalarKind", "ScalarType", "Symbol", "TensorType",
    "Type", "Value", "VerificationError", "VerifyError", "check", "default_registry", "evaluate",
    "parse", "print_module", "register_op", "run_graph", "symbol", "to_text", "verify",
]
