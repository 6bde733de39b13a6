"""The fast guard check's tensor checks in C: one call per guard check for all its tensors.

A tensor guard (type, dtype, shape, strides, device, requires_grad) costs ~0.6 us as Python
(six attribute reads, a torch.Size and a stride tuple built and compared); a 32-layer decoder's
~490 of them were ~75% of its guard check. Here one C call checks them all at ~30-50 ns each,
reading what torch's own C++ tensor guards read: the exact Python type, `requires_grad` and the
TensorImpl's dtype, device, layout, sizes and strides.

How the C reads a tensor: the TensorImpl pointer from `_cdata` (both through TensorBase's getset
descriptors, called directly), then the AOTInductor C shim of libtorch (`aoti_torch_get_sizes`
and friends: exported C functions, exception-safe, that take an `at::Tensor*`, i.e. the address
of a word holding the TensorImpl pointer, as AtenTensorHandle). No torch headers are compiled
(the source declares the few shim functions), so the module builds in about a second, once per
machine: through the kernel cache (inductor/targets/cpu/cache.py), keyed by its source, which
names this Python's headers.

Robustness: the module is used only after a self-test against Python's reading of sample tensors
(layouts, dtypes, a transposed view, 0-dim, a Parameter, requires_grad) passes, and each fast
check validates its own spec on the call it is built from. Without a C++ compiler or Python's
headers, where the build or the self-test fails, or with EMBER_C_GUARDS=0, the fast check keeps
its Python tensor checks. Only tensors of exact type torch.Tensor or nn.Parameter on CPU or an
indexed CUDA device are checked here; while a TorchFunctionMode is active (it may intercept a
tensor's attributes) the fast check hands the call to the full Python check.
"""

from __future__ import annotations

import ctypes
import functools
import importlib.machinery
import importlib.util
import logging
import os
import re
import struct
import sysconfig
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import torch

from ember.inductor.inputcheck import register_checker

log = logging.getLogger("ember.runtime.tensorcheck")

MODULE = "ember_tensorcheck"
SHIM = ("aoti_torch_get_dtype", "aoti_torch_get_device_type", "aoti_torch_get_device_index",
        "aoti_torch_get_layout", "aoti_torch_get_dim", "aoti_torch_get_sizes",
        "aoti_torch_get_strides")
TYPES = (torch.Tensor, torch.nn.Parameter)
_HEAD = 6  # per tensor: ndim, dtype, device type, device index, layout, requires_grad

_SOURCE = r"""
// ember's tensor guard checker (ember/runtime/tensorcheck.py)
#define PY_SSIZE_T_CLEAN
#include "@PYTHON_H@"
#include <stdint.h>
#include <string.h>

typedef int32_t (*get_i32)(void*, int32_t*);
typedef int32_t (*get_i64)(void*, int64_t*);
typedef int32_t (*get_ptr)(void*, int64_t**);
static get_i32 g_dtype, g_devtype, g_devidx, g_layout;
static get_i64 g_dim;
static get_ptr g_sizes, g_strides;
static getter rg_get, cd_get;
static void *rg_closure, *cd_closure;
static PyObject *keep_rg, *keep_cd;
static int ready = 0;

static PyObject* init(PyObject*, PyObject* args) {
  PyObject *rg, *cd;
  unsigned long long p[7];
  if (!PyArg_ParseTuple(args, "OOKKKKKKK", &rg, &cd, &p[0], &p[1], &p[2], &p[3], &p[4],
                        &p[5], &p[6]))
    return NULL;
  if (Py_TYPE(rg) != &PyGetSetDescr_Type || Py_TYPE(cd) != &PyGetSetDescr_Type) {
    PyErr_SetString(PyExc_TypeError, "expected getset descriptors");
    return NULL;
  }
  for (int i = 0; i < 7; i++)
    if (!p[i]) { PyErr_SetString(PyExc_ValueError, "null shim function"); return NULL; }
  Py_INCREF(rg); Py_INCREF(cd);
  keep_rg = rg; keep_cd = cd;
  rg_get = ((PyGetSetDescrObject*)rg)->d_getset->get;
  rg_closure = ((PyGetSetDescrObject*)rg)->d_getset->closure;
  cd_get = ((PyGetSetDescrObject*)cd)->d_getset->get;
  cd_closure = ((PyGetSetDescrObject*)cd)->d_getset->closure;
  g_dtype = (get_i32)p[0]; g_devtype = (get_i32)p[1]; g_devidx = (get_i32)p[2];
  g_layout = (get_i32)p[3]; g_dim = (get_i64)p[4]; g_sizes = (get_ptr)p[5];
  g_strides = (get_ptr)p[6];
  ready = 1;
  Py_RETURN_NONE;
}

// the TensorImpl pointer (0 on any error) and requires_grad (-1 on error)
static void* impl_of(PyObject* t, int* rg) {
  PyObject* r = rg_get(t, rg_closure);
  if (!r) { PyErr_Clear(); return NULL; }
  *rg = r == Py_True ? 1 : (r == Py_False ? 0 : -1);
  Py_DECREF(r);
  PyObject* c = cd_get(t, cd_closure);
  if (!c) { PyErr_Clear(); return NULL; }
  void* impl = PyLong_Check(c) ? PyLong_AsVoidPtr(c) : NULL;
  Py_DECREF(c);
  if (PyErr_Occurred()) { PyErr_Clear(); return NULL; }
  return impl;
}

#define AHEAD 4

// the TensorImpl of `t` (of the exact type `type`, else NULL), its first lines prefetched
static void* prefetch_impl(PyObject* t, PyObject* type) {
  if ((PyObject*)Py_TYPE(t) != type) return NULL;
  PyObject* c = cd_get(t, cd_closure);
  if (!c) { PyErr_Clear(); return NULL; }
  void* impl = PyLong_Check(c) ? PyLong_AsVoidPtr(c) : NULL;
  Py_DECREF(c);
  if (PyErr_Occurred()) { PyErr_Clear(); return NULL; }
  if (impl) {
    const char* a = (const char*)impl;
    __builtin_prefetch(a); __builtin_prefetch(a + 64); __builtin_prefetch(a + 128);
    __builtin_prefetch(a + 192);
  }
  return impl;
}

// check(types, tensors, spec) -> bool: every tensor of its exact type and spec (int64s per
// tensor: ndim, dtype, device type, device index, layout, requires_grad, sizes, strides)
static PyObject* check(PyObject*, PyObject* const* args, Py_ssize_t nargs) {
  if (nargs != 3 || !ready || !PyTuple_CheckExact(args[0]) || !PyTuple_CheckExact(args[1]) ||
      !PyBytes_CheckExact(args[2]))
    Py_RETURN_FALSE;
  PyObject *types = args[0], *ts = args[1];
  Py_ssize_t n = PyTuple_GET_SIZE(ts);
  if (PyTuple_GET_SIZE(types) != n) Py_RETURN_FALSE;
  const int64_t* s = (const int64_t*)PyBytes_AS_STRING(args[2]);
  const int64_t* end = s + PyBytes_GET_SIZE(args[2]) / 8;
  // A model's parameters lie all over the heap, and each check reads the Python object, then
  // its TensorImpl (then autograd's metadata): run cold, serial cache misses. So the objects
  // AHEAD*2 tensors on are prefetched, and the TensorImpls of those AHEAD on (their objects
  // are in cache by then): a hint only, what is checked is the same.
  void* ring[AHEAD];
  for (Py_ssize_t i = 0; i < n && i < 2 * AHEAD; i++) __builtin_prefetch(PyTuple_GET_ITEM(ts, i));
  for (Py_ssize_t i = 0; i < n && i < AHEAD; i++)
    ring[i] = prefetch_impl(PyTuple_GET_ITEM(ts, i), PyTuple_GET_ITEM(types, i));
  for (Py_ssize_t i = 0; i < n; i++) {
    PyObject* t = PyTuple_GET_ITEM(ts, i);
    if ((PyObject*)Py_TYPE(t) != PyTuple_GET_ITEM(types, i)) Py_RETURN_FALSE;
    if (end - s < 6) Py_RETURN_FALSE;
    int64_t nd = s[0];
    if (nd < 0 || end - s < 6 + 2 * nd) Py_RETURN_FALSE;
    void* impl = ring[i % AHEAD];
    if (i + 2 * AHEAD < n) __builtin_prefetch(PyTuple_GET_ITEM(ts, i + 2 * AHEAD));
    if (i + AHEAD < n)
      ring[i % AHEAD] = prefetch_impl(PyTuple_GET_ITEM(ts, i + AHEAD),
                                      PyTuple_GET_ITEM(types, i + AHEAD));
    int rg = -1;
    PyObject* r = rg_get(t, rg_closure);
    if (!r) { PyErr_Clear(); Py_RETURN_FALSE; }
    rg = r == Py_True ? 1 : (r == Py_False ? 0 : -1);
    Py_DECREF(r);
    if (!impl || rg != s[5]) Py_RETURN_FALSE;
    void* h = &impl;  // an at::Tensor is one intrusive pointer to its TensorImpl
    int32_t v; int64_t d; int64_t* p;
    if (g_layout(h, &v) || v != s[4] || g_dtype(h, &v) || v != s[1] ||
        g_devtype(h, &v) || v != s[2] || g_devidx(h, &v) || v != s[3] ||
        g_dim(h, &d) || d != nd)
      Py_RETURN_FALSE;
    if (nd) {
      if (g_sizes(h, &p) || memcmp(p, s + 6, nd * 8)) Py_RETURN_FALSE;
      if (g_strides(h, &p) || memcmp(p, s + 6 + nd, nd * 8)) Py_RETURN_FALSE;
    }
    s += 6 + 2 * nd;
  }
  if (s != end) Py_RETURN_FALSE;
  Py_RETURN_TRUE;
}

// read(tensor) -> (ndim, dtype, device type, device index, layout, requires_grad, sizes,
// strides) as the checker sees it, or None
static PyObject* read(PyObject*, PyObject* t) {
  if (!ready) Py_RETURN_NONE;
  int rg = -1;
  void* impl = impl_of(t, &rg);
  if (!impl || rg < 0) Py_RETURN_NONE;
  void* h = &impl;
  int32_t dt, dv, di, ly; int64_t nd; int64_t *sz, *st;
  if (g_dtype(h, &dt) || g_devtype(h, &dv) || g_devidx(h, &di) || g_layout(h, &ly) ||
      g_dim(h, &nd) || nd < 0 || g_sizes(h, &sz) || g_strides(h, &st))
    Py_RETURN_NONE;
  PyObject* sizes = PyTuple_New(nd);
  PyObject* strides = PyTuple_New(nd);
  if (!sizes || !strides) { Py_XDECREF(sizes); Py_XDECREF(strides); return NULL; }
  for (int64_t k = 0; k < nd; k++) {
    PyTuple_SET_ITEM(sizes, k, PyLong_FromLongLong(sz[k]));
    PyTuple_SET_ITEM(strides, k, PyLong_FromLongLong(st[k]));
  }
  return Py_BuildValue("(LiiiiiNN)", (long long)nd, dt, dv, di, ly, rg, sizes, strides);
}

static PyMethodDef methods[] = {
  {"init", (PyCFunction)init, METH_VARARGS, "bind the getters and the shim"},
  {"check", (PyCFunction)(void (*)(void))check, METH_FASTCALL, "check tensors"},
  {"read", (PyCFunction)read, METH_O, "read a tensor's metadata"},
  {NULL, NULL, 0, NULL}};

static struct PyModuleDef moddef = {PyModuleDef_HEAD_INIT, "@MODULE@", NULL, -1, methods};

extern "C" PyMODINIT_FUNC PyInit_@MODULE@(void) { return PyModule_Create(&moddef); }
"""


def _python_h() -> str | None:
    inc = sysconfig.get_paths().get("include")
    if not inc or not re.fullmatch(r"[\w/.+-]+", inc):  # it goes into a #include "..."
        return None
    h = Path(inc) / "Python.h"
    return str(h) if h.is_file() else None


def source() -> str | None:
    """The checker's C++ source for this Python (None: no Python headers)."""
    h = _python_h()
    if h is None:
        return None
    return _SOURCE.replace("@PYTHON_H@", h).replace("@MODULE@", MODULE)


def _shim() -> list[int]:
    lib = ctypes.CDLL(str(Path(torch.__file__).parent / "lib" / "libtorch_cpu.so"))
    return [int(ctypes.cast(getattr(lib, n), ctypes.c_void_p).value or 0) for n in SHIM]


def load_extension(name: str, path: Path) -> Any:
    """The extension module `name` from the shared library at `path`."""
    loader = importlib.machinery.ExtensionFileLoader(name, str(path))
    spec = importlib.util.spec_from_file_location(name, str(path), loader=loader)
    assert spec is not None
    mod = importlib.util.module_from_spec(spec)
    loader.exec_module(mod)
    return mod


def _load(path: Path) -> Any:
    mod = load_extension(MODULE, path)
    base = torch._C.TensorBase.__dict__
    mod.init(base["requires_grad"], base["_cdata"], *_shim())
    return mod


def build_extension(src: str) -> Path:
    """The shared library of a CPython extension source (one naming Python's headers), built
    once per machine through the kernel cache, keyed by the source."""
    from ember.inductor.targets.cpu import cache

    counts = cache.STATS.hits, cache.STATS.builds
    # Python's own headers include each other by paths relative to its include directory
    # (3.13's cpython/pyatomic.h): that directory on g++'s path for this one build (the
    # kernel cache's flags are fixed; the source names the headers, so it keys the entry)
    inc = str(Path(str(_python_h())).parent)
    old = os.environ.get("CPLUS_INCLUDE_PATH")
    os.environ["CPLUS_INCLUDE_PATH"] = inc + (os.pathsep + old if old else "")
    try:
        return cache.build(src)
    finally:  # (not a kernel: the kernel cache's counts stay the kernels')
        cache.STATS.hits, cache.STATS.builds = counts
        if old is None:
            os.environ.pop("CPLUS_INCLUDE_PATH", None)
        else:
            os.environ["CPLUS_INCLUDE_PATH"] = old


@functools.cache
def checker() -> Any:
    """The loaded, self-tested C module, or None (the fast check keeps Python's checks)."""
    if os.environ.get("EMBER_C_GUARDS", "1") == "0":
        return None
    src = source()
    if src is None:
        log.info("no Python headers: tensor guards stay Python")
        return None
    try:
        mod = _load(build_extension(src))
        why = self_test(mod)
    except Exception as e:  # no compiler, no libtorch_cpu, a build error: Python checks
        why = f"{type(e).__name__}: {e}"
    if why:
        log.info("C tensor guards not used: %s", why)
        return None
    return mod


def entry(t: Any, m: Any) -> list[int] | None:
    """The spec words of tensor `t`, which passed the TENSOR_MATCH `m` (a TensorMeta), as the
    C module reads it; None where this guard is not checked in C."""
    mod = checker()
    if mod is None or type(t) not in TYPES or m.cls is not type(t):
        return None
    if m.device.type not in ("cpu", "cuda") or (m.device.type == "cuda" and
                                                   m.device.index is None):
        return None
    got = mod.read(t)
    if got is None:
        return None
    nd, dt, dv, di, ly, rg, sizes, strides = got
    # the C reading of a tensor that passed the guard must be the guard's own metadata
    if sizes != tuple(m.shape) or strides != tuple(m.stride) or bool(rg) != m.requires_grad \
            or t.layout is not torch.strided:
        return None
    return [nd, dt, dv, di, ly, rg, *sizes, *strides]


def pack(entries: Sequence[list[int]]) -> bytes:
    words = [w for e in entries for w in e]
    return struct.pack(f"={len(words)}q", *words)


def self_test(mod: Any) -> str | None:
    """Why the module must not be used (None: it reads tensors as Python does)."""
    a = torch.randn(3, 4)
    samples: list[torch.Tensor] = [
        a, a.t(), a[:, 1:3], torch.zeros((), dtype=torch.int64), torch.ones(2, 1, 5).half(),
        torch.zeros(4, dtype=torch.float64, requires_grad=True), torch.nn.Parameter(a.clone()),
        torch.zeros(0, 3, dtype=torch.bool), torch.randn(2, 3, 4).permute(2, 0, 1)]
    reads = []
    for t in samples:
        got = mod.read(t)
        if got is None or got[0] != t.dim() or got[6] != tuple(t.shape) or \
                got[7] != tuple(t.stride()) or bool(got[5]) != t.requires_grad:
            return f"reads {got} for a tensor {t.dtype}{list(t.shape)} stride={t.stride()}"
        reads.append(got)
    codes: dict[torch.dtype, int] = {}
    for t, got in zip(samples, reads, strict=True):
        if codes.setdefault(t.dtype, got[1]) != got[1]:
            return f"two dtype codes for {t.dtype}"
    if len(set(codes.values())) != len(codes):
        return "one dtype code for two dtypes"
    specs = [[*r[:6], *r[6], *r[7]] for r in reads]
    types = tuple(type(t) for t in samples)
    if mod.check(types, tuple(samples), pack(specs)) is not True:
        return "the samples fail their own spec"
    for k in range(len(samples)):  # each field changed alone must fail
        for field in range(len(specs[k])):
            if field == 0:
                continue
            bad = [list(s) for s in specs]
            bad[k][field] += 1
            if mod.check(types, tuple(samples), pack(bad)) is not False:
                return f"a changed field {field} of sample {k} passes"
        wrong = tuple(torch.nn.Parameter if i == k and type(x) is torch.Tensor else
                      torch.Tensor if i == k else type(x) for i, x in enumerate(samples))
        if mod.check(wrong, tuple(samples), pack(specs)) is not False:
            return f"a changed type of sample {k} passes"
    if mod.check(types, tuple(samples[:-1]), pack(specs)) is not False:
        return "a short tensor tuple passes"
    return None


# generated wrappers check their tensor inputs in one call with this module (inputcheck.py)
register_checker(checker)
