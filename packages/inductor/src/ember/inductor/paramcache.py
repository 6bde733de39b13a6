"""Kernel calls that read only graph inputs: computed once, reused while those inputs are unchanged.

A compiled module's parameters and buffers are graph inputs, and many kernels read nothing
else: BatchNorm's per-channel scale and shift (rsqrt(var + eps) * gamma, beta - mean * scale)
feeding a packed convolution or a linear, an attention bias's index table. Every call
recomputed them: a launcher call and two allocations each (resnet50 53 such calls a forward,
levit_128s ~120), and a serial kernel reading what the previous call's threads wrote. The
wrapper (wrapper.py) now runs such a call only where its inputs changed since the last run:

    _e3 = _pc7[0]       # (at the top of the call, with the other kept calls' tests)
    _h3 = _e3[1][0]() is p2 and _e3[1][1]() is p3 and \
            _e3[0] == (p2._version, p2.data_ptr(), p3._version, p3.data_ptr()) \
            and _same(_e3[5], (p2, p3))
    ...
    if _h3:             # (at the kernel call's place)
        v1_0, v1_1 = _e3[2]
    else:
        _k = _key(_pc7, _e3, (p2, p3))
        ... the call as before ...
        if _k is not None: _pc7[0] = _store(_e3, _k, (p2, p3), (v1_0, v1_1))
        del _e3

The hit tests of all kept calls run together, before the first node's lines: one test
between a linear and the next kernel read cold objects and a cold buffer (its by-value
comparison below), ~20-25 us each at 1 thread on levit_128s (49 tests a call), against a few
us each in one run. Testing early reads what the call's place would: the inputs are graph
inputs, and the wrapper writes over a graph input's storage only at or after its last reader
(plan-buffers' reuse= and inplace= take dead or dying values). On a miss the entry read at
the top is dropped after the store (`del`), not held to the return.

The key is each input's version counter (every in-place write through the tensor or a view
of it bumps it: `running_var.add_(1)`, `copy_` under no_grad, `load_state_dict`) and data
address, and the input itself, held weakly (a freed tensor whose address and version come
back is not the same object). Taken before the kernel runs, so an input written by another
thread meanwhile makes the next call miss. An inference-mode tensor has no version counter:
its call is not kept. The entry is one tuple replaced by one store: a
concurrent call sees the old entry or the new one, never half of one; two threads that miss
together each use their own results. A write that bypasses the version counter (through
`.data`, or by raw pointer) is not seen: the same contract as packed.py's and linear.py's
weight packs, which key on (_version, data_ptr) too. An input that is not an `nn.Parameter`
is also compared by value with a copy taken when the entry was stored: torch's batch norm in
training mode updates `running_mean`/`running_var` in place WITHOUT bumping their version
counters (an eager train-mode forward, `swa_utils.update_bn`, BN recalibration), so a buffer's
version does not show its contents changed (one C memcmp call for all of a kept call's
inputs, `_Check`, ~0.4 us; torch.equal, ~1.5-2 us a buffer, where that does not build or an
input is not contiguous); a call whose non-Parameter inputs exceed COMPARED_BYTES (a caller's
input image) is never kept.

Only calls whose results nothing writes later are cached: where plan-buffers gave such a
call, or a later kernel call or out= extern, a dead buffer's storage that may alias a kept
result (reuse=), the wrapper allocates a new buffer instead; a call whose result an extern
writes over in place (INTO_FORMS) is not kept, nor one whose result may alias a graph output
(a training forward's saved tensors are outputs, so a result autograd needs is never kept; an
output handed to the caller may be written by them). Shapes static, CPU, the results at most
MAX_BYTES (an entry holds them between calls).
EMBER_PARAM_CACHE=0 turns it off (A/B comparisons); read when a wrapper is generated.
"""

from __future__ import annotations

import ctypes
import math
import os
import weakref
from collections.abc import Callable
from typing import Any

import torch

from ember.inductor.buffers import _aliases, out_call
from ember.ir import Graph, Node, TensorType, Value

ENV = "EMBER_PARAM_CACHE"
MAX_BYTES = 4 << 20  # a cached call's results, all together: held between calls
# a cached call's inputs that are not Parameters, all together: compared by value every hit
# (BatchNorm's running stats: a few KB; a model's input image: MBs, never kept)
COMPARED_BYTES = 64 << 10


def enabled() -> bool:
    return os.environ.get(ENV, "1") != "0"


def _static_bytes(t: object) -> int | None:
    if not isinstance(t, TensorType) or not all(isinstance(d, int) for d in t.shape):
        return None
    return math.prod(int(d) for d in t.shape) * t.dtype.torch.itemsize


def _candidate(n: Node, params: set[Value]) -> bool:
    """A kernels.call whose operands are graph inputs of static shape and whose results are
    fresh CPU buffers of static shape, at most MAX_BYTES together."""
    if n.op != "kernels.call" or not n.results:
        return False
    sizes = n.kwargs.get("sizes")
    if isinstance(sizes, list) and not all(isinstance(s, int) for s in sizes):
        return False
    if n.kwargs.get("device", "cpu") != "cpu":
        return False
    for a in n.args[1:]:
        if not isinstance(a, Value) or a not in params or _static_bytes(a.type) is None:
            return False
    total = 0
    for r in n.results:
        b = _static_bytes(r.type)
        if b is None:
            return False
        total += b
    return total <= MAX_BYTES


def cacheable(g: Graph) -> tuple[set[int], set[Value]]:
    """The indices of g's kernel calls whose results the wrapper may keep between calls, and
    the values that may alias those results: the wrapper allocates afresh where a kept call
    or a later kernel call or out= extern was planned (reuse=) onto such storage."""
    params = set(g.params)
    outputs = {o for o in g.outputs if isinstance(o, Value)}
    # storage an op itself writes over (INTO_FORMS' reuse=[operand]), not the wrapper's
    # allocation, which can be made fresh instead
    into: set[Value] = set()
    for n in g.nodes:
        reuse = n.kwargs.get("reuse")
        if n.op != "kernels.call" and isinstance(reuse, list) and out_call(n) is None:
            into.update(r for r in reuse if isinstance(r, Value))
    al = _aliases(g)  # per value: the kernel outputs and fresh extern results it may share
    shared: dict[Value, set[Value]] = {}  # per owned buffer: the values that may alias it
    for v, owners in al.items():
        for o in owners:
            shared.setdefault(o, set()).add(v)
    out: set[int] = set()
    kept: set[Value] = set()
    for i, n in enumerate(g.nodes):
        if not _candidate(n, params):
            continue
        alias = set().union(*(shared.get(r, {r}) for r in n.results))
        if not alias & (outputs | into):
            out.add(i)
            kept |= alias
    return out, kept


# an entry: (key, the inputs held weakly, the results, misses with other inputs, the inputs'
# storages held: a storage reassigned by `.data =` keeps the version counter, and its freed
# address must not come back as the same key; per input, None for a Parameter, else a copy of
# its values when stored, compared on every hit (`_Check`, see the module docstring); `()`
# in an entry that matches nothing)
Entry = tuple[Any, tuple[Any, ...], tuple[torch.Tensor, ...], int, tuple[torch.Tensor, ...],
              "_Check | tuple[()]"]
MISSES = 3  # calls on new input tensors each time (a user's input, a backward's saved
# tensors) stop being kept after this many: their entries would only hold memory


def _dead() -> None:  # a weak reference that never matches (the identities are checked first)
    return None


def empty(n: int, misses: int = 0) -> Entry:
    """An entry for a call of `n` inputs that matches no inputs."""
    return (None, (_dead,) * n, (), misses, (), ())


def key(slot: list[Entry], e: Entry, ins: tuple[torch.Tensor, ...]) -> tuple[int, ...] | None:
    """The inputs' key, taken before the kernel runs (an input written meanwhile by another
    thread makes the next call miss); None where the slot stores no more: turned off, or an
    input without a version counter (an inference-mode tensor, which turns it off)."""
    if e[3] >= MISSES:
        return None
    try:
        return tuple(v for x in ins for v in (x._version, x.data_ptr()))
    except RuntimeError:
        slot[0] = empty(len(ins), MISSES)
        return None


def store(old: Entry, k: tuple[int, ...], ins: tuple[torch.Tensor, ...],
          outs: tuple[torch.Tensor, ...]) -> Entry:
    """The entry after a miss: the new results, unless the kernel's inputs keep being other
    tensors (then an entry that never matches, holding nothing)."""
    misses = old[3]
    if old[0] is not None and not all(r() is x for r, x in zip(old[1], ins, strict=True)):
        misses += 1  # (the same inputs, updated in place or reassigned: a parameter)
    if misses >= MISSES:
        return empty(len(ins), misses)
    snaps: list[torch.Tensor | None] = []
    compared = 0
    for x in ins:  # one pass: the non-Parameters' size cap and their copies
        if type(x) is torch.nn.Parameter:
            snaps.append(None)
            continue
        compared += x.numel() * x.element_size()
        if compared > COMPARED_BYTES:
            # a large input that is not a Parameter is the caller's data (an image the kernel
            # turns channels-last): comparing it every call costs what the kernel does, and a
            # caller passing the same tensor each time (a benchmark) would skip the work
            return empty(len(ins), MISSES)
        snaps.append(x.detach().clone())
    return (k, tuple(weakref.ref(x) for x in ins), outs, misses,
            tuple(x.detach() for x in ins), _Check(tuple(snaps)))


class _Check:
    """A kept call's by-value test: `copies`, per input, None for a Parameter, else a copy of
    its values taken at the store. From its first use on, where the C comparator builds and
    every compared input is contiguous, one C call: `ready` is (call, flag, flag_at, table,
    table_at), `call(flag_at, table_at)` writing `flag` (1: all equal), `table` a count, then
    per compared input its address, its copy's address and bytes; one tuple, set once whole,
    so that a call in another thread holds the flag it writes. Else torch.equal per input.
    Made ready at the first hit, not at the store: a training step stores every kept call and
    hits none."""
    __slots__ = ("copies", "ready", "tried")
    copies: tuple[torch.Tensor | None, ...]
    ready: tuple[Callable[[int, int], Any], ctypes.c_int64, int, Any, int] | None
    tried: bool

    def __init__(self, copies: tuple[torch.Tensor | None, ...]):
        self.copies, self.ready, self.tried = copies, None, False


def same(c: _Check, ins: tuple[torch.Tensor, ...]) -> bool:
    """Whether each input that is not a Parameter still holds the values stored with the
    entry (a buffer batch norm updated in training mode keeps its version counter). Called
    only where the inputs are the entry's own, with its key (versions, data addresses)."""
    r = c.ready
    if r is not None:
        r[0](r[2], r[4])
        return r[1].value == 1
    if not c.tried:
        c.tried = True
        if _in_c(c, ins):
            return same(c, ins)
    for s, x in zip(c.copies, ins, strict=True):
        if s is not None and not torch.equal(s, x):
            return False
    return True


# The by-value test in C where it builds: one call per kept kernel call comparing each
# compared input's bytes with its copy's (memcmp). torch.equal costs ~1.4-1.7 us a tensor warm,
# more cold (a kept BatchNorm call's two statistics ~9 us in a forward: mobilenet_v2's 52 tests
# ~0.46 ms a call at 1 thread), the C call ~0.4 us for all of a call's inputs. Equal bytes
# mean equal values (a NaN statistic then matches itself; -0.0 against 0.0 is a miss: both
# give the kernel's own result). An input not contiguous at the first hit keeps torch.equal.
_MEMEQ = r'''
#include <cstdint>
#include <cstring>
// ember's parameter-cache value test (inductor/paramcache.py): `table` holds a count, then
// per input (its address, its copy's address, bytes); *flag = 1 where all are equal, else 0
extern "C" void ember_paramcache_memeq(int64_t flag, int64_t table) {
  const int64_t* t = (const int64_t*)table;
  int64_t ok = 1;
  for (int64_t i = 0; i < t[0] && ok; i++)
    ok = std::memcmp((const void*)t[1 + 3 * i], (const void*)t[2 + 3 * i],
                     (size_t)t[3 + 3 * i]) == 0;
  *(int64_t*)flag = ok;
}
'''
_NO_BUILD: list[bool] = []  # [True] once the build failed here: not tried again
_KEY: list[str] = []  # its kernel cache key, once computed
_LIB: list[Any] = [None, None]  # the library last loaded and its C caller


def _memeq() -> Callable[[int, int], Any] | None:
    """The C comparator, or None where it cannot be built (a failed build is not retried in
    this process). Looked up in the kernel cache at each entry's first hit, as kernels are (an
    entry found corrupt is rebuilt, not kept because this process loaded it once); its C
    caller made once per loaded library."""
    from ember.inductor.targets.cpu import cache, trampoline
    if _NO_BUILD:
        return None
    if not _KEY:
        _KEY.append(cache.cache_key(_MEMEQ))
    # (the loaded library by its key: ~10 us less than load's own hashing; where it was
    # forgotten, as after forget_loaded(), load looks it up and checks it again)
    lib = cache._LOADED.get(_KEY[0])
    if lib is not None and lib is _LIB[0]:
        return _LIB[1]  # type: ignore[no-any-return]
    try:
        lib = lib or cache.load(_MEMEQ)
        fn = lib.ember_paramcache_memeq
    except (cache.CompileError, OSError, AttributeError):
        _NO_BUILD.append(True)
        return None
    fn.argtypes, fn.restype = [ctypes.c_int64, ctypes.c_int64], None
    call = trampoline.caller(fn, 2) or fn  # (once per loaded library)
    _LIB[:] = [lib, call]
    return call


def _in_c(c: _Check, ins: tuple[torch.Tensor, ...]) -> bool:
    """Make `c` test in C (its table from the inputs and copies); False where it cannot:
    nothing to compare, an input not contiguous, or no comparator here."""
    pairs = [(x, s) for x, s in zip(ins, c.copies, strict=True) if s is not None and x.numel()]
    if not pairs or not all(x.is_contiguous() and x.is_cpu for x, _ in pairs):
        return False
    call = _memeq()
    if call is None:
        return False
    words = [len(pairs)]
    for x, s in pairs:
        words += [x.data_ptr(), s.data_ptr(), x.numel() * x.element_size()]
    flag, table = ctypes.c_int64(0), (ctypes.c_int64 * len(words))(*words)
    c.ready = (call, flag, ctypes.addressof(flag), table, ctypes.addressof(table))
    return True


def wrap(lines: list[str], slot: str, ins: list[str], outs: list[str], tag: int
         ) -> tuple[list[str], list[str]]:
    """A kernel call's generated lines (`lines`: copies, allocations, the launch) run only
    where the entry in `slot` (a one-item list) is not for inputs `ins`; outputs `outs`.
    Returns (the hit test, placed by the caller among the call's first lines: `_h<tag>`, the
    entry `_e<tag>`; the lines at the kernel call's place). The inputs' identities are checked
    first: an input that is not the entry's own may have no version counter."""
    one = "," if len(ins) == 1 else ""
    e, h = f"_e{tag}", f"_h{tag}"
    k = ", ".join(f"{x}._version, {x}.data_ptr()" for x in ins)
    same = "".join(f"{e}[1][{j}]() is {x} and " for j, x in enumerate(ins))
    res = ", ".join(outs) + ("," if len(outs) == 1 else "")
    tup = f"({', '.join(ins)}{one})"
    test = [f"    {e} = {slot}[0]",
            f"    {h} = {same}{e}[0] == ({k}{one}) and _same({e}[5], {tup})"]
    return test, [f"    if {h}:",
                  f"        {res} = {e}[2]",
                  "    else:",
                  f"        _k = _key({slot}, {e}, {tup})",
                  *("    " + x for x in lines),
                  f"        if _k is not None: {slot}[0] = _store({e}, _k, {tup}, ({res}))",
                  f"        del {e}"]  # (the old entry's results: not held to the return)
