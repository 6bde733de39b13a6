"""The fast guard check run in C: its generated Python function translated into a program for a
small register machine in a CPython extension (one call per guard check).

A Hugging Face forward has hundreds of non-tensor guards (`O.__code__ is O`,
`Cell.cell_contents is O`, `'forward' not in OD`, `type(v) is T and v == 'sum'`): ~40 ns each
as Python bytecode, most of it the interpreter's dispatch around one C-API call. Here the fast
check's own source (fastguards.py) is parsed back and each of its expressions becomes one
instruction that makes the C-API call Python's bytecode would make for it:

    x.attr             PyObject_GetAttr (a cell's `cell_contents`, a function's `__code__`:
                       what their getters read, after the same audit event)
    x[k]               PyObject_GetItem (an exact dict: PyDict_GetItemWithError)
    _ga(x, 'a')        PyObject_GenericGetAttr (what `object.__getattribute__` calls)
    type(x)            Py_TYPE
    d.get(k)           an exact dict's PyDict_GetItemWithError, else the `get` method called
    f(a, ...)          PyObject_Vectorcall
    (a, b), [a, b]     a new tuple / list
    a is b             pointer comparison
    a == b, a < b ...  PyObject_RichCompare, then PyObject_IsTrue of its result
    a in b             PySequence_Contains
    x (a condition)    PyObject_IsTrue

so the program passes and fails exactly where the Python function does, evaluating the same
expressions in the same order (a condition's `and`, `or` and `not` become jumps, short-circuit
as Python's; a shape without such a form, a chained comparison or a walrus, keeps the Python
function).
Any failure, and any exception (an `Exception`: others propagate, as in Python), calls the full
check, which gives the first failing guard and its reason; `failed` holds the ordinal of the
`if` that failed (-2: an exception), for tests.

The module builds as the tensor checker does (tensorcheck.py: through the kernel cache, once per
machine) and is used only after a self-test; `EMBER_C_GUARDS=0` keeps the Python function.
"""

from __future__ import annotations

import ast
import builtins
import functools
import logging
import os
import struct
import sys
from collections.abc import Callable
from typing import Any

from ember.runtime import tensorcheck

log = logging.getLogger("ember.runtime.guardvm")

MODULE = "ember_guardvm"
(ATTR, ITEM, GA, TYPE, DGET, CALL, TUPLE, LIST, IS, CMP, IN, TRUTH, RET) = range(13)
_CMP = {ast.Lt: 0, ast.LtE: 1, ast.Eq: 2, ast.NotEq: 3, ast.Gt: 4, ast.GtE: 5}
_MAX_ARGS = 8

_SOURCE = r"""
// ember's guard program machine (ember/runtime/guardvm.py)
#define PY_SSIZE_T_CLEAN
#include "@PYTHON_H@"
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

enum { ATTR, ITEM, GA, TYPE, DGET, CALL, TUPLE, LIST, IS, CMP, IN, TRUTH, RET };

typedef struct {
  PyObject_HEAD
  vectorcallfunc vectorcall;
  PyObject* code;    // bytes: int32 words
  PyObject* consts;  // tuple
  PyObject* full;    // called on any failure
  Py_ssize_t nregs;
  Py_ssize_t failed; // ordinal of the last failing check; -2 an exception; -1 none
  uintptr_t* trace;  // addresses a recording run read (bit 0: a dict's keys), see run()
  Py_ssize_t tcap;
  uintptr_t* lines;  // the cache lines they span, sorted, each once: prefetched per run
  Py_ssize_t nlines;
  uint64_t runs;
  Py_ssize_t recorded;  // runs that recorded (records())
} Program;

static PyObject *s_cell_contents, *s_get, *s_code;

// an operand: a register (>= 0) or a constant (~index)
#define V(o) ((o) >= 0 ? regs[(o)] : PyTuple_GET_ITEM(consts, ~(o)))
#define JUMP(target, ordinal) \
  if ((target) < 0) { fail = (ordinal); goto failed; } \
  w = w0 + (target); break;
#define SET(d, v) do { PyObject* o_ = regs[(d)]; regs[(d)] = (v); Py_XDECREF(o_); } while (0)
// an address for the next run's prefetch (an exact dict: its keys too, flagged by bit 0)
#define NOTE(x) do { if (nt < tcap) tr[nt++] = (uintptr_t)(x); } while (0)
#define NOTE_DICT(x) do { if (PyDict_CheckExact(x)) { if ((PyObject*)(x) != last_dict && \
    nt + 4 <= tcap) { PyDictObject* d_ = (PyDictObject*)(x); last_dict = (x); \
    tr[nt++] = (uintptr_t)d_; tr[nt++] = (uintptr_t)d_->ma_keys | 1; \
    tr[nt++] = (uintptr_t)keys_lines(d_->ma_keys); \
    if (d_->ma_values) tr[nt++] = (uintptr_t)d_->ma_values; } } else NOTE(x); } while (0)

// the cache lines of a dict's keys object (header, index table, entries) that a lookup may
// read, from CPython's layout of 3.11-3.13 (internal/pycore_dict.h); 4 lines elsewhere
static Py_ssize_t keys_lines(const void* k) {
#if PY_VERSION_HEX >= 0x030B0000 && PY_VERSION_HEX < 0x030E0000
  typedef struct {
    Py_ssize_t refcnt; uint8_t log2_size, log2_index_bytes, kind; uint32_t version;
    Py_ssize_t usable, nentries;
  } Head;
  const Head* h = (const Head*)k;
  Py_ssize_t entry = h->kind == 0 ? 24 : 16;  // DICT_KEYS_GENERAL: hash, key, value
  Py_ssize_t bytes = (Py_ssize_t)sizeof(Head) + ((Py_ssize_t)1 << h->log2_index_bytes) +
                     h->nentries * entry;
  Py_ssize_t lines = (bytes + 63) / 64 + 1;
  return lines < 1 ? 1 : (lines > 32 ? 32 : lines);
#else
  return 4;
#endif
}

// whether run number `r` records what it reads: runs 0, 1, 64, 4096, 262144, ... (a
// recording run sorts its lines, ~1 ms for a large model: paid ever more rarely); none
// without the GIL (p->lines is shared)
static int records(uint64_t r) {
#ifdef Py_GIL_DISABLED
  return 0;
#else
  return r == 0 || ((r & (r - 1)) == 0 && __builtin_ctzll(r) % 6 == 0);
#endif
}

static int cmp_addr(const void* a, const void* b) {
  uintptr_t x = *(const uintptr_t*)a, y = *(const uintptr_t*)b;
  return x < y ? -1 : x > y;
}

// the recorded addresses (the first `nt` of p->trace) as p->lines: each cache line once
static void settle_lines(Program* p, Py_ssize_t nt) {
  const uintptr_t* tr = p->trace;
  Py_ssize_t n = 0;
  for (Py_ssize_t i = 0; i < nt; i++) {
    if ((tr[i] & 1) && i + 1 < nt) { n += (Py_ssize_t)tr[i + 1]; i++; } else n++;
  }
  uintptr_t* lines = (uintptr_t*)PyMem_Malloc((size_t)(n ? n : 1) * sizeof(uintptr_t));
  if (!lines) return;  // (no prefetch: a hint)
  Py_ssize_t k = 0;
  for (Py_ssize_t i = 0; i < nt && k < n; i++) {
    uintptr_t a = tr[i] & ~(uintptr_t)63;
    if ((tr[i] & 1) && i + 1 < nt) {  // a dict's keys object: its lines (keys_lines)
      Py_ssize_t m = (Py_ssize_t)tr[++i];
      for (Py_ssize_t j = 0; j < m && k < n; j++) lines[k++] = a + 64 * (uintptr_t)j;
    } else {
      lines[k++] = a;
    }
  }
  qsort(lines, (size_t)k, sizeof(uintptr_t), cmp_addr);
  Py_ssize_t u = 0;
  for (Py_ssize_t i = 0; i < k; i++)
    if (u == 0 || lines[u - 1] != lines[i]) lines[u++] = lines[i];
  uintptr_t* old = p->lines;
  p->lines = lines; p->nlines = u;
  PyMem_Free(old);
}

static PyObject* run(Program* p, PyObject* const* args) {
  const int32_t* w0 = (const int32_t*)PyBytes_AS_STRING(p->code);
  const int32_t* w = w0;
  PyObject* consts = p->consts;
  Py_ssize_t n = p->nregs;
  PyObject* small[64];
  PyObject** regs = small;
  if (n > 64) {
    regs = (PyObject**)PyMem_Calloc((size_t)n, sizeof(PyObject*));
    if (!regs) return PyErr_NoMemory();
  } else {
    memset(small, 0, sizeof(small));
  }
  for (int i = 0; i < 3; i++) { Py_INCREF(args[i]); regs[i] = args[i]; }
  // The objects a check reads lie all over the heap and each read depends on the one before
  // (a module's dict, its keys, the value, the value's type): run cold (a model's forward
  // between two calls evicts them), each is a serial cache miss, most of a large check's
  // time. So the addresses the last run read are prefetched first, all at once: a hint (a
  // stale or freed address is harmless; what the run computes does not depend on it).
  // What a run reads is recorded on a few runs (records(): the objects are a model's modules
  // and parameters, the same from call to call).
  for (Py_ssize_t i = 0; i < p->nlines; i++) __builtin_prefetch((const char*)p->lines[i]);
  uintptr_t* tr = p->trace;
  Py_ssize_t nt = 0, tcap = records(p->runs++) ? p->tcap : 0;
  PyObject* last_dict = NULL;
  PyObject* result = NULL;
  Py_ssize_t fail = -1;
  for (;;) {
    switch (w[0]) {
      case ATTR: {
        PyObject* x = V(w[2]); PyObject* name = V(w[3]); PyObject* r;
        if (Py_TYPE(x) == &PyCell_Type && name == s_cell_contents) {
          r = PyCell_GET(x);
          if (!r) { PyErr_SetString(PyExc_ValueError, "Cell is empty"); goto error; }
          Py_INCREF(r);
        } else if (Py_TYPE(x) == &PyFunction_Type && name == s_code) {
          // the function type's own __code__ getter: its audit event, then the slot
          if (PySys_Audit("object.__getattr__", "Os", x, "__code__") < 0) goto error;
          r = PyFunction_GET_CODE(x);
          Py_INCREF(r);
        } else {
          r = PyObject_GetAttr(x, name);
          if (!r) goto error;
        }
        NOTE(x); NOTE(r);
        SET(w[1], r); w += 4; break;
      }
      case ITEM: {
        PyObject* x = V(w[2]); PyObject* k = V(w[3]); PyObject* r;
        if (PyDict_CheckExact(x)) {
          r = PyDict_GetItemWithError(x, k);
          if (!r) {
            if (!PyErr_Occurred()) PyErr_SetObject(PyExc_KeyError, k);
            goto error;
          }
          Py_INCREF(r);
        } else {
          r = PyObject_GetItem(x, k);
          if (!r) goto error;
        }
        NOTE_DICT(x); NOTE(r);
        SET(w[1], r); w += 4; break;
      }
      case GA: {
        PyObject* r = PyObject_GenericGetAttr(V(w[2]), V(w[3]));
        if (!r) goto error;
        NOTE(V(w[2])); NOTE(r);
        SET(w[1], r); w += 4; break;
      }
      case TYPE: {
        PyObject* r = (PyObject*)Py_TYPE(V(w[2]));
        NOTE(V(w[2]));
        Py_INCREF(r); SET(w[1], r); w += 3; break;
      }
      case DGET: {
        PyObject* x = V(w[2]); PyObject* k = V(w[3]); PyObject* r;
        if (PyDict_CheckExact(x)) {
          r = PyDict_GetItemWithError(x, k);
          if (!r) {
            if (PyErr_Occurred()) goto error;
            r = Py_None;
          }
          Py_INCREF(r);
        } else {
          PyObject* m = PyObject_GetAttr(x, s_get);
          if (!m) goto error;
          r = PyObject_CallOneArg(m, k);
          Py_DECREF(m);
          if (!r) goto error;
        }
        NOTE_DICT(x); NOTE(r);
        SET(w[1], r); w += 4; break;
      }
      case CALL: {
        int32_t na = w[3];
        PyObject* argv[@MAX_ARGS@];
        for (int32_t i = 0; i < na; i++) argv[i] = V(w[4 + i]);
        PyObject* r = PyObject_Vectorcall(V(w[2]), argv, (size_t)na, NULL);
        if (!r) goto error;
        SET(w[1], r); w += 4 + na; break;
      }
      case TUPLE: case LIST: {
        int32_t na = w[2];
        PyObject* r = w[0] == TUPLE ? PyTuple_New(na) : PyList_New(na);
        if (!r) goto error;
        for (int32_t i = 0; i < na; i++) {
          PyObject* v = V(w[3 + i]);
          Py_INCREF(v);
          if (w[0] == TUPLE) PyTuple_SET_ITEM(r, i, v); else PyList_SET_ITEM(r, i, v);
        }
        SET(w[1], r); w += 3 + na; break;
      }
      // a check: where the truth of its test is not `want`, to the word at `target`, or
      // (target -1) to the failure of the `if` numbered `ordinal`
      case IS: {
        int t = V(w[1]) == V(w[2]);
        if (t != w[3]) { JUMP(w[4], w[5]); }
        w += 6; break;
      }
      case CMP: {
        NOTE(V(w[1])); NOTE(V(w[2]));
        PyObject* r = PyObject_RichCompare(V(w[1]), V(w[2]), w[6]);
        if (!r) goto error;
        int t = PyObject_IsTrue(r);
        Py_DECREF(r);
        if (t < 0) goto error;
        if (t != w[3]) { JUMP(w[4], w[5]); }
        w += 7; break;
      }
      case IN: {
        NOTE_DICT(V(w[2]));
        int t = PySequence_Contains(V(w[2]), V(w[1]));
        if (t < 0) goto error;
        if (t != w[3]) { JUMP(w[4], w[5]); }
        w += 6; break;
      }
      case TRUTH: {
        NOTE_DICT(V(w[1]));
        int t = PyObject_IsTrue(V(w[1]));
        if (t < 0) goto error;
        if (t != w[3]) { JUMP(w[4], w[5]); }
        w += 6; break;
      }
      case RET:
        result = V(w[1]);
        Py_INCREF(result);
        goto done;
      default:
        PyErr_SetString(PyExc_SystemError, "bad guard program");
        goto error;
    }
  }
error:
  // Python's `except Exception` around the checks: other exceptions propagate
  if (!PyErr_ExceptionMatches(PyExc_Exception)) goto done;
  PyErr_Clear();
  fail = -2;
failed:
  p->failed = fail;
done:
  if (nt) { settle_lines(p, nt); p->recorded++; }
  for (Py_ssize_t i = 0; i < n; i++) Py_XDECREF(regs[i]);
  if (regs != small) PyMem_Free(regs);
  if (fail != -1) return PyObject_Vectorcall(p->full, args, 3, NULL);
  p->failed = -1;
  return result;
}

static PyObject* program_vectorcall(PyObject* self, PyObject* const* args, size_t nargsf,
                                    PyObject* kwnames) {
  if (PyVectorcall_NARGS(nargsf) != 3 || (kwnames && PyTuple_GET_SIZE(kwnames))) {
    PyErr_SetString(PyExc_TypeError, "a guard program takes (S, A, K)");
    return NULL;
  }
  return run((Program*)self, args);
}

static PyObject* program_new(PyTypeObject* type, PyObject* args, PyObject* kw) {
  PyObject *code, *consts, *full;
  Py_ssize_t nregs;
  if (!PyArg_ParseTuple(args, "O!O!On", &PyBytes_Type, &code, &PyTuple_Type, &consts, &full,
                        &nregs))
    return NULL;
  if (nregs < 3 || PyBytes_GET_SIZE(code) % 4) {
    PyErr_SetString(PyExc_ValueError, "bad guard program");
    return NULL;
  }
  Py_ssize_t tcap = PyBytes_GET_SIZE(code) / 4 + 16;  // >= the notes of one run
  uintptr_t* trace = (uintptr_t*)PyMem_Calloc((size_t)tcap, sizeof(uintptr_t));
  if (!trace) return PyErr_NoMemory();
  Program* p = (Program*)type->tp_alloc(type, 0);
  if (!p) { PyMem_Free(trace); return NULL; }
  p->trace = trace; p->tcap = tcap; p->lines = NULL; p->nlines = 0; p->runs = 0;
  p->recorded = 0;
  Py_INCREF(code); Py_INCREF(consts); Py_INCREF(full);
  p->code = code; p->consts = consts; p->full = full; p->nregs = nregs; p->failed = -1;
  p->vectorcall = program_vectorcall;
  return (PyObject*)p;
}

static int program_traverse(Program* p, visitproc visit, void* arg) {
  Py_VISIT(p->consts); Py_VISIT(p->full);
  return 0;
}

static int program_clear(Program* p) {
  Py_CLEAR(p->consts); Py_CLEAR(p->full);
  return 0;
}

static void program_dealloc(Program* p) {
  PyObject_GC_UnTrack(p);
  program_clear(p);
  Py_CLEAR(p->code);
  PyMem_Free(p->trace);
  PyMem_Free(p->lines);
  Py_TYPE(p)->tp_free((PyObject*)p);
}

static PyObject* program_failed(Program* p, void*) { return PyLong_FromSsize_t(p->failed); }

static PyObject* program_lines(Program* p, void*) { return PyLong_FromSsize_t(p->nlines); }
static PyObject* program_recorded(Program* p, void*) { return PyLong_FromSsize_t(p->recorded); }

static PyGetSetDef program_getset[] = {
  {"failed", (getter)program_failed, NULL, "the last failing check's ordinal", NULL},
  {"prefetched", (getter)program_lines, NULL, "cache lines prefetched per run", NULL},
  {"recorded", (getter)program_recorded, NULL, "runs that recorded their reads", NULL},
  {NULL, NULL, NULL, NULL, NULL}};

static PyTypeObject ProgramType = {PyVarObject_HEAD_INIT(NULL, 0)};

static struct PyModuleDef moddef = {PyModuleDef_HEAD_INIT, "@MODULE@", NULL, -1, NULL};

extern "C" PyMODINIT_FUNC PyInit_@MODULE@(void) {
  ProgramType.tp_name = "@MODULE@.Program";
  ProgramType.tp_basicsize = sizeof(Program);
  ProgramType.tp_flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_HAVE_GC | Py_TPFLAGS_HAVE_VECTORCALL;
  ProgramType.tp_new = program_new;
  ProgramType.tp_dealloc = (destructor)program_dealloc;
  ProgramType.tp_traverse = (traverseproc)program_traverse;
  ProgramType.tp_clear = (inquiry)program_clear;
  ProgramType.tp_call = PyVectorcall_Call;
  ProgramType.tp_vectorcall_offset = offsetof(Program, vectorcall);
  ProgramType.tp_getset = program_getset;
  if (PyType_Ready(&ProgramType) < 0) return NULL;
  s_cell_contents = PyUnicode_InternFromString("cell_contents");
  s_get = PyUnicode_InternFromString("get");
  s_code = PyUnicode_InternFromString("__code__");
  if (!s_cell_contents || !s_get || !s_code) return NULL;
  PyObject* m = PyModule_Create(&moddef);
  if (!m) return NULL;
  Py_INCREF(&ProgramType);
  if (PyModule_AddObject(m, "Program", (PyObject*)&ProgramType) < 0) return NULL;
  return m;
}
"""


class Unsupported(Exception):
    """The guard function has a shape the machine does not run (it stays Python)."""


def source() -> str | None:
    """The machine's C++ source for this Python (None: no Python headers)."""
    h = tensorcheck._python_h()
    if h is None:
        return None
    return (_SOURCE.replace("@PYTHON_H@", h).replace("@MODULE@", MODULE)
            .replace("@MAX_ARGS@", str(_MAX_ARGS)))


@functools.cache
def machine() -> Any:
    """The loaded, self-tested module, or None (guard checks stay Python)."""
    if os.environ.get("EMBER_C_GUARDS", "1") == "0":
        return None
    src = source()
    if src is None:
        return None
    try:
        mod = tensorcheck.load_extension(MODULE, tensorcheck.build_extension(src))
        why = self_test(mod)
    except Exception as e:  # no compiler, a build error: Python guard functions
        why = f"{type(e).__name__}: {e}"
    if why:
        log.info("C guard programs not used: %s", why)
        return None
    return mod


class _Asm:
    """Translates one generated guard function (fastguards.py's form) into program words."""

    def __init__(self, ns: dict[str, Any]):
        self.ns = ns
        self.words: list[int] = []
        self.consts: list[Any] = []
        self._cids: dict[Any, int] = {}
        self.names: dict[str, int] = {"S": 0, "A": 1, "K": 2}
        self.nregs = 3
        self._temp = 3  # next free temporary register of the current statement
        self._temp0 = 3
        self.ordinal = 0

    def const(self, v: Any) -> int:
        if type(v) is str:  # as Python's compiler does: dict keys then match by identity
            v = sys.intern(v)
        key: Any = (type(v), repr(v)) if type(v) in (int, float, str, bool, bytes) \
            or v is None else id(v)
        if key not in self._cids:
            self._cids[key] = len(self.consts)
            self.consts.append(v)
        return ~self._cids[key]

    def temp(self) -> int:
        r = self._temp
        self._temp += 1
        self.nregs = max(self.nregs, self._temp)
        return r

    def emit(self, *w: int) -> None:
        self.words.extend(w)

    def name(self, n: str) -> int:
        if n in self.names:
            return self.names[n]
        if n in self.ns:
            return self.const(self.ns[n])
        if hasattr(builtins, n) and n not in ("_full",):
            return self.const(getattr(builtins, n))
        raise Unsupported(f"name {n}")

    def _is_builtin(self, node: ast.expr, n: str) -> bool:
        return isinstance(node, ast.Name) and node.id == n and n not in self.names \
            and n not in self.ns

    def val(self, node: ast.expr, dst: int | None = None) -> int:
        """The operand holding `node`'s value (computed into `dst` where given)."""
        if isinstance(node, ast.Name):  # (into no `dst`: the operand is the value itself)
            return self.name(node.id)
        if isinstance(node, ast.Constant):
            return self.const(node.value)
        if isinstance(node, ast.Tuple):
            try:
                return self.const(ast.literal_eval(node))
            except ValueError:
                pass
        if isinstance(node, ast.Attribute):
            x = self.val(node.value)
            d = self.temp() if dst is None else dst
            self.emit(ATTR, d, x, self.const(sys.intern(node.attr)))
            return d
        if isinstance(node, ast.Subscript) and not isinstance(node.slice, ast.Slice):
            x = self.val(node.value)
            k = self.val(node.slice)
            d = self.temp() if dst is None else dst
            self.emit(ITEM, d, x, k)
            return d
        if isinstance(node, ast.Call) and not node.keywords and \
                not any(isinstance(a, ast.Starred) for a in node.args):
            return self._call(node, dst)
        if isinstance(node, ast.Tuple | ast.List) and len(node.elts) <= 1 << 16 and \
                not any(isinstance(a, ast.Starred) for a in node.elts):
            items = [self.val(e) for e in node.elts]
            d = self.temp() if dst is None else dst
            self.emit(TUPLE if isinstance(node, ast.Tuple) else LIST, d, len(items), *items)
            return d
        raise Unsupported(ast.dump(node)[:80])

    def _call(self, node: ast.Call, dst: int | None) -> int:
        f, args = node.func, node.args
        if self._is_builtin(f, "type") and len(args) == 1:
            x = self.val(args[0])
            d = self.temp() if dst is None else dst
            self.emit(TYPE, d, x)
            return d
        if isinstance(f, ast.Name) and f.id in self.ns and \
                self.ns[f.id] is object.__getattribute__ and len(args) == 2 and \
                isinstance(args[1], ast.Constant) and type(args[1].value) is str:
            x = self.val(args[0])
            d = self.temp() if dst is None else dst
            self.emit(GA, d, x, self.const(sys.intern(args[1].value)))
            return d
        if isinstance(f, ast.Attribute) and f.attr == "get" and len(args) == 1:
            x = self.val(f.value)
            k = self.val(args[0])
            d = self.temp() if dst is None else dst
            self.emit(DGET, d, x, k)
            return d
        if len(args) > _MAX_ARGS:
            raise Unsupported("too many arguments")
        fn = self.val(f)
        ops = [self.val(a) for a in args]
        d = self.temp() if dst is None else dst
        self.emit(CALL, d, fn, len(ops), *ops)
        return d

    def check(self, op: int, a: int, b: int, jump_on: bool, target: list[int],
              cmp: int = -1) -> None:
        self.emit(op, a, b, int(not jump_on))
        target.append(len(self.words))  # (patched once the target's place is known)
        self.emit(-1, self.ordinal)
        if op == CMP:
            self.emit(cmp)

    def place(self, label: list[int]) -> None:
        for at in label:
            self.words[at] = len(self.words)

    def jump_if(self, node: ast.expr, value: bool, target: list[int]) -> None:
        """Code that goes to `target` (a label: the places to patch; the failure if never
        placed) where the truth of `node` is `value`, with Python's short-circuit order."""
        if isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.Not):
            self.jump_if(node.operand, not value, target)
        elif isinstance(node, ast.BoolOp):
            # `a and b` is false at its first false part, true when all are true (`or`:
            # the same with true and false swapped)
            stop = isinstance(node.op, ast.Or)
            if value == stop:
                for v in node.values:
                    self.jump_if(v, value, target)
            else:
                skip: list[int] = []
                for v in node.values[:-1]:
                    self.jump_if(v, stop, skip)
                self.jump_if(node.values[-1], value, target)
                self.place(skip)
        elif isinstance(node, ast.Compare) and len(node.ops) == 1:
            op = node.ops[0]
            a = self.val(node.left)
            b = self.val(node.comparators[0])
            if isinstance(op, ast.Is | ast.IsNot):
                self.check(IS, a, b, value == isinstance(op, ast.Is), target)
            elif isinstance(op, ast.In | ast.NotIn):
                self.check(IN, a, b, value == isinstance(op, ast.In), target)
            elif type(op) in _CMP:
                self.check(CMP, a, b, value, target, _CMP[type(op)])
            else:
                raise Unsupported("comparison")
        elif isinstance(node, ast.NamedExpr | ast.Compare | ast.IfExp):
            raise Unsupported(type(node).__name__)
        else:
            self.check(TRUTH, self.val(node), 0, value, target)

    def statement(self, st: ast.stmt) -> None:
        self._temp = self._temp0
        if isinstance(st, ast.Assign) and len(st.targets) == 1 and \
                isinstance(st.targets[0], ast.Name) and st.targets[0].id not in _ROOTS:
            var = st.targets[0].id
            if var in self.names:
                raise Unsupported("a reassigned local")
            reg = self._temp0
            self._temp0 += 1
            self._temp = self._temp0
            self.nregs = max(self.nregs, self._temp0)
            # a name or a constant is not copied: the local is its operand
            self.names[var] = self.val(st.value, dst=reg)
        elif isinstance(st, ast.If) and not st.orelse and _is_fallback(st.body):
            self.jump_if(st.test, True, [])  # (to the failure where the test is true)
            self.ordinal += 1
        elif isinstance(st, ast.Return) and st.value is not None:
            self.emit(RET, self.val(st.value))
        else:
            raise Unsupported(type(st).__name__)


_ROOTS = ("S", "A", "K")


def _is_fallback(body: list[ast.stmt]) -> bool:
    """`return _full(S, A, K)`."""
    return len(body) == 1 and isinstance(body[0], ast.Return) and \
        ast.dump(body[0]) == ast.dump(ast.parse("return _full(S, A, K)").body[0])


def assemble(src: str, ns: dict[str, Any]) -> tuple[bytes, tuple[Any, ...], int]:
    """The program (words, constants, registers) of a generated guard function `guard(S, A,
    K)`: a `try:` of assignments, `if ...: return _full(S, A, K)` and one final
    `return`, whose `except Exception:` returns `_full(S, A, K)`."""
    mod = ast.parse(src)
    if len(mod.body) != 1 or not isinstance(fn := mod.body[0], ast.FunctionDef) or \
            [a.arg for a in fn.args.args] != list(_ROOTS) or fn.decorator_list or \
            fn.args.vararg or fn.args.kwarg or fn.args.kwonlyargs or fn.args.defaults or \
            len(fn.body) != 1 or not isinstance(tr := fn.body[0], ast.Try):
        raise Unsupported("not a guard function")
    if tr.orelse or tr.finalbody or len(tr.handlers) != 1 or \
            not isinstance(h := tr.handlers[0].type, ast.Name) or h.id != "Exception" or \
            tr.handlers[0].name or not _is_fallback(tr.handlers[0].body):
        raise Unsupported("not a guard function")
    asm = _Asm(ns)
    for st in tr.body:
        asm.statement(st)
    if not tr.body or not isinstance(tr.body[-1], ast.Return):
        raise Unsupported("no final return")
    return struct.pack(f"={len(asm.words)}i", *asm.words), tuple(asm.consts), asm.nregs


def program(src: str, ns: dict[str, Any], full: Callable[..., Any]) -> Any:
    """The C program of guard function `src` (its names bound in `ns`), calling `full` on any
    failure; None where the machine is not available or the function has another shape."""
    mod = machine()
    if mod is None:
        return None
    try:
        code, consts, nregs = assemble(src, ns)
    except (Unsupported, SyntaxError) as e:
        log.debug("guard function stays Python: %s", e)
        return None
    return mod.Program(code, consts, full, nregs)


def self_test(mod: Any) -> str | None:
    """Why the module must not be used (None: its programs agree with Python on samples)."""
    src = "\n".join([
        "def guard(S, A, K):", "    try:",
        "        v0 = A[0]",
        "        if not (type(v0) is D and len(v0) == 2 and v0.get('a') is None):",
        "            return _full(S, A, K)",
        "        if not (not (v0['b'] or S) and 'c' not in v0 and _ga(C, 'x') == 1.5):",
        "            return _full(S, A, K)",
        "        return [v0['b'], (S, A), K]",
        "    except Exception:", "        return _full(S, A, K)", ""])

    class C:
        x = 1.5

    ns = {"D": dict, "C": C, "_ga": object.__getattribute__}
    code, consts, nregs = assemble(src, ns)
    prog = mod.Program(code, consts, lambda S, A, K: "full", nregs)
    cases: list[tuple[Any, tuple[Any, ...], Any, int]] = [
        (0, ({"b": 0, "x": 1},), [0, (0, ({"b": 0, "x": 1},)), {}], -1),
        (0, ({"b": 1, "x": 1},), "full", 1), (1, ({"b": 0, "x": 1},), "full", 1),
        (0, ({"b": 0},), "full", 0), (0, ([1, 2],), "full", 0), (0, (), "full", -2),
        (0, ({"b": 0, "c": 1},), "full", 1), (0, ({"a": 1, "b": 0},), "full", 0)]
    for S, A, want, failed in cases:
        got = prog(S, A, {})
        if got != want or prog.failed != failed:
            return f"the sample ({S}, {A}) gave {got!r} (failed {prog.failed})"
    return None
