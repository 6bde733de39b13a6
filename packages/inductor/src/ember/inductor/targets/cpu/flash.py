"""ember's fused CPU attention forward: softmax(q k^T * scale + mask) v in one C++ call.

torch's CPU flash kernel (`_scaled_dot_product_flash_attention_for_cpu`, what eager's and
TorchInductor's SDPA call) does its products through MKL's sgemm, which on the AMD EPYC this
was measured on runs AVX2 code at ~90 GFLOP/s a core against ~200 for AVX-512 (oneDNN), and
blocks the queries 32-64 rows at a time with a gemm call per block. This kernel, compiled by
g++ with -march=native like the other C++ kernels (cache.py), computes per (batch, head) and
block of 8 query rows: the scores against the head's keys (packed once per task as [E, S]
so a score row is vectorised along the keys, 8 rows x 32 keys of accumulators), scale, the
additive mask, the row max, exp and sum over the whole row (it stays in L1: no online
rescaling), then the rows times the packed values (8 rows x 32 output features). Its
logsumexp (`max + log(sum)` of the scaled, masked scores) is the flash kernel's, so its
backward reads it as it reads its own. A row whose every score is -inf gives an output and
a logsumexp of 0, as the flash kernel does. Measured at 1 thread against the flash kernel
(thread CPU time, interleaved in one process, the models' shapes): BERT [2x4, 128x128x64]
with its mask 566 -> 265 us, GPT-2 causal [2x12, 128x128x64] 1787 -> 870, DeiT
[2x3, 197x197x64] 1039 -> 540, Swin's windows [128x3, 49x49x32] 3900 -> 3501.

Threads: with at least 4 (batch, head) pairs a thread, each task is a whole head, packing its
keys and values where it reads them. With fewer (bert's 2x4 heads and DeiT's 2x3 at 16
threads, one head at 2), the heads' keys and values are packed once, in parallel, into one
buffer, and the tasks are parts of a head's query rows in whole blocks of 8, >= 4 a thread
where the rows allow, taken as threads come free, a causal call's heaviest (last) rows first.
Before, each part packed its head again, so parts were kept >= 4 blocks (bert at 16 threads:
32 tasks, each packing a head), and a causal head's parts went to threads in order (at 2
threads, one head of 256 causal rows took the 1-thread time). A row's arithmetic is the same
whichever task computes it: results are bit-identical at any thread count.

`forward` runs it where it serves (f32 CPU tensors, equal batch and head counts, a float mask
broadcastable to [B, H, L, S] or none, no dropout, at least MIN_ROWS query rows: a decode
step's single row pays the per-head packing for one row; at most MAX_KEYS_X_FEATURES per head:
each thread holds a head's packed keys and values) and torch's kernel otherwise.
"""

from __future__ import annotations

import ctypes
import functools
import struct
from typing import Any

import torch

from ember.inductor.targets.cpu import cache
from ember.inductor.targets.cpu.cpp import PRELUDE

_KERNEL = torch.ops.aten._scaled_dot_product_flash_attention_for_cpu.default
# fewer query rows than this keep torch's kernel (per head it packs keys and values once)
MIN_ROWS = 16
# keys x features of one head above this keep torch's kernel (each thread packs them: 64 MB)
MAX_KEYS_X_FEATURES = 1 << 23

SOURCE = r"""
#include <cstdlib>
typedef float ember_vf __attribute__((vector_size(64)));
typedef float ember_vfu __attribute__((vector_size(64), aligned(4)));
static inline ember_vf ember_ld(const float* p) { return *(const ember_vfu*)p; }
static inline void ember_st(float* p, ember_vf x) { *(ember_vfu*)p = x; }

// c [R][ldc] = the R rows of a [R][lda] (their first K entries) times b [K][ldb], N columns
// (a multiple of 16): 8 rows x 32 columns of accumulators, the columns vectorised. Both of the
// kernel's products: the scores (q rows x packed keys) and the output (probabilities x packed
// values); inlined into each, so each gets its own strides and counts
template <int R> static inline void ember_attn_mm(const float* a, int64_t lda, const float* b,
                                                  int64_t ldb, float* c, int64_t ldc,
                                                  int64_t K, int64_t N) {
  int64_t n = 0;
  for (; n + 32 <= N; n += 32) {
    ember_vf a0[R], a1[R];
    for (int r = 0; r < R; r++) { a0[r] = (ember_vf){}; a1[r] = (ember_vf){}; }
    for (int64_t k = 0; k < K; k++) {
      const ember_vf b0 = ember_ld(b + k * ldb + n), b1 = ember_ld(b + k * ldb + n + 16);
      for (int r = 0; r < R; r++) {
        const float x = a[r * lda + k]; a0[r] += x * b0; a1[r] += x * b1; }
    }
    for (int r = 0; r < R; r++) {
      ember_st(c + r * ldc + n, a0[r]); ember_st(c + r * ldc + n + 16, a1[r]); }
  }
  for (; n < N; n += 16) {
    ember_vf a0[R];
    for (int r = 0; r < R; r++) a0[r] = (ember_vf){};
    for (int64_t k = 0; k < K; k++) {
      const ember_vf b0 = ember_ld(b + k * ldb + n);
      for (int r = 0; r < R; r++) a0[r] += a[r * lda + k] * b0;
    }
    for (int r = 0; r < R; r++) ember_st(c + r * ldc + n, a0[r]);
  }
}

struct ember_attn_args {
  const float* q; const float* mask; float* out; float* lse; const int64_t* st;
  int64_t S, E, Ev, SP, EP; float scale; int causal;
};

template <int R> static void ember_attn_rows(const ember_attn_args& a, int64_t b, int64_t h,
                                             int64_t i0, const float* kt, const float* vv,
                                             float* qb, float* sc, float* ob) {
  const int64_t* qs = a.st; const int64_t* ms = a.st + 12; const int64_t* os = a.st + 16;
  const int64_t* ls = a.st + 20;
  const int64_t S = a.S, E = a.E;
  for (int r = 0; r < R; r++) {
    const float* qr = a.q + b * qs[0] + h * qs[1] + (i0 + r) * qs[2];
    if (qs[3] == 1) std::memcpy(qb + r * E, qr, E * sizeof(float));
    else for (int64_t e = 0; e < E; e++) qb[r * E + e] = qr[e * qs[3]];
  }
  // the keys a causal block reads: j <= i of its last row
  const int64_t J = a.causal ? std::min(S, i0 + R) : S;
  const int64_t JP = (J + 15) & ~(int64_t)15;
  ember_attn_mm<R>(qb, E, kt, a.SP, sc, a.SP, E, JP);  // scores [R][JP]
  float inv[R];
  for (int r = 0; r < R; r++) {
    const int64_t i = i0 + r;
    float* row = sc + r * a.SP;
    const int64_t n = a.causal ? std::min(S, i + 1) : S;
    const float scale = a.scale;
    float m = -std::numeric_limits<float>::infinity();
    if (a.mask != nullptr && ms[3] == 1) {
      const float* mr = a.mask + b * ms[0] + h * ms[1] + i * ms[2];
      #pragma omp simd reduction(max:m)
      for (int64_t j = 0; j < n; j++) {
        const float s = row[j] * scale + mr[j]; row[j] = s; m = std::max(m, s); }
    } else if (a.mask != nullptr) {
      const float* mr = a.mask + b * ms[0] + h * ms[1] + i * ms[2];
      const int64_t m3 = ms[3];
      for (int64_t j = 0; j < n; j++) {
        const float s = row[j] * scale + mr[j * m3]; row[j] = s; m = std::max(m, s); }
    } else {
      #pragma omp simd reduction(max:m)
      for (int64_t j = 0; j < n; j++) { const float s = row[j] * scale; row[j] = s; m = std::max(m, s); }
    }
    // a row whose every score is -inf: probabilities 0 (output 0, logsumexp 0, as torch's)
    const float mm = m == -std::numeric_limits<float>::infinity() ? 0.0f : m;
    float sum = 0.0f;
    #pragma omp simd reduction(+:sum)
    for (int64_t j = 0; j < n; j++) { const float p = ember_exp<float>(row[j] - mm); row[j] = p; sum += p; }
    for (int64_t j = n; j < JP; j++) row[j] = 0.0f;
    inv[r] = sum > 0.0f ? 1.0f / sum : 0.0f;
    if (a.lse != nullptr) a.lse[b * ls[0] + h * ls[1] + i * ls[2]] = sum > 0.0f ? mm + std::log(sum) : 0.0f;
  }
  ember_attn_mm<R>(sc, a.SP, vv, a.EP, ob, a.EP, J, a.EP);  // [R][EP]
  for (int r = 0; r < R; r++) {
    float* o = a.out + b * os[0] + h * os[1] + (i0 + r) * os[2];
    const float* src = ob + r * a.EP;
    const float s = inv[r];
    if (os[3] == 1) {
      #pragma omp simd
      for (int64_t e = 0; e < a.Ev; e++) o[e] = src[e] * s;
    } else {
      for (int64_t e = 0; e < a.Ev; e++) o[e * os[3]] = src[e] * s;
    }
  }
}

// rows [j0, j1) of a head's packed keys kt [E][SP] (transposed) and values vv [SP][EP]: the
// first J keys are the head's, the rest (and the columns past Ev) zeros
static void ember_attn_pack(const float* kb, const float* vb, const int64_t* ks,
                            const int64_t* vs, int64_t j0, int64_t j1, int64_t J, int64_t E,
                            int64_t Ev, int64_t SP, int64_t EP, float* kt, float* vv) {
  const int64_t jr = std::min(j1, J);
  int64_t j = j0;
  // 16 keys at a time, a feature's 16 keys stored as one line: key by key, the E stores a key
  // went SP floats apart, with SP = 256 to the same few cache sets (S = 1024: 2.2x the time)
  for (; j + 16 <= jr; j += 16) {
    const float* kr = kb + j * ks[2];
    for (int64_t e = 0; e < E; e++) {
      float g[16];
      for (int jj = 0; jj < 16; jj++) g[jj] = kr[jj * ks[2] + e * ks[3]];
      std::memcpy(kt + e * SP + j, g, sizeof g);
    }
  }
  for (; j < jr; j++) {
    const float* kr = kb + j * ks[2];
    for (int64_t e = 0; e < E; e++) kt[e * SP + j] = kr[e * ks[3]];
  }
  for (int64_t e = 0; e < E; e++)
    for (int64_t j = std::max(j0, J); j < j1; j++) kt[e * SP + j] = 0.0f;
  for (int64_t j = j0; j < j1; j++) {
    float* d = vv + j * EP;
    const float* vr = vb + j * vs[2];
    if (j < J && vs[3] == 1) std::memcpy(d, vr, Ev * sizeof(float));
    else if (j < J) { for (int64_t e = 0; e < Ev; e++) d[e] = vr[e * vs[3]]; }
    else { for (int64_t e = 0; e < Ev; e++) d[e] = 0.0f; }
    for (int64_t e = Ev; e < EP; e++) d[e] = 0.0f;
  }
}

static void ember_attn_part(const ember_attn_args& a, int64_t b, int64_t h, int64_t lo,
                            int64_t hi, const float* kt, const float* vv, float* qb, float* sc,
                            float* ob) {
  int64_t i0 = lo;
  for (; i0 + 8 <= hi; i0 += 8) ember_attn_rows<8>(a, b, h, i0, kt, vv, qb, sc, ob);
  if (i0 + 4 <= hi) { ember_attn_rows<4>(a, b, h, i0, kt, vv, qb, sc, ob); i0 += 4; }
  if (i0 + 2 <= hi) { ember_attn_rows<2>(a, b, h, i0, kt, vv, qb, sc, ob); i0 += 2; }
  if (i0 < hi) ember_attn_rows<1>(a, b, h, i0, kt, vv, qb, sc, ob);
}

// floats of the heads' keys and values packed once for all threads: above this, each task
// packs its own (as with many heads)
static const int64_t EMBER_ATTN_SHARED_FLOATS = (int64_t)1 << 24;

// how a call's work is split at nt threads: each head's query rows in *nq parts of whole
// 8-row blocks, one task each. With at least 4 heads a thread, whole heads, each task packing
// its head's keys and values next to where it reads them. With fewer (bert's 2x4 heads, DeiT's
// 2x3 at 16 threads), the heads' keys and values are packed once, in parallel, into one
// buffer, and every block of 8 query rows can be a task of its own: parts for >= 4 tasks a
// thread; returns whether packing is shared. (A split without the shared packing repacks a
// head per part: parts kept >= 4 blocks.)
static int ember_attn_plan(int64_t BH, int64_t L, int64_t S, int64_t E, int64_t Ev,
                           int64_t nt, int64_t* nq) {
  const int64_t nb = (L + 7) / 8;
  const int64_t SP = (S + 15) & ~(int64_t)15, EP = (Ev + 15) & ~(int64_t)15;
  *nq = 1;
  // (BH == 0: an empty batch or no heads, nothing to split; it divides below)
  if (nt <= 1 || BH == 0 || BH >= 4 * nt) return 0;
  if (BH * (E * SP + SP * EP) <= EMBER_ATTN_SHARED_FLOATS) {
    *nq = std::min(nb, (4 * nt + BH - 1) / BH);
    return 1;
  }
  while (BH * *nq < 4 * nt && nb / (*nq * 2) >= 4) *nq *= 2;
  return 0;
}

// (for tests and benchmarks: the plan the kernel follows at nt threads)
extern "C" int64_t ember_attention_tasks(int64_t B, int64_t H, int64_t L, int64_t S,
                                         int64_t E, int64_t Ev, int64_t nt, int* shared) {
  int64_t nq;
  *shared = ember_attn_plan(B * H, L, S, E, Ev, nt, &nq);
  return B * H * nq;
}

// dims: B, H, L, S, E, Ev; st: the strides of q, k, v, mask, out (4 each) and lse (3)
extern "C" void ember_attention_f32(const float* q, const float* k, const float* v,
                                    const float* mask, float* out, float* lse,
                                    const int64_t* dims, const int64_t* st, float scale,
                                    int causal) {
  const int64_t B = dims[0], H = dims[1], L = dims[2], S = dims[3], E = dims[4], Ev = dims[5];
  const int64_t SP = (S + 15) & ~(int64_t)15, EP = (Ev + 15) & ~(int64_t)15;
  const ember_attn_args a{q, mask, out, lse, st, S, E, Ev, SP, EP, scale, causal};
  const int64_t* ks = st + 4; const int64_t* vs = st + 8;
  const int64_t nb = (L + 7) / 8;  // blocks of 8 query rows
  int64_t nq;
  const int shared = ember_attn_plan(B * H, L, S, E, Ev, omp_get_max_threads(), &nq);
  const int64_t head = E * SP + SP * EP;  // a head's packed keys and values
  float* packed = shared ? (float*)std::aligned_alloc(64, ((size_t)(B * H * head) * 4 + 63) / 64 * 64)
                         : nullptr;
  #pragma omp parallel
  {
    const size_t floats = (size_t)((shared ? 0 : head) + 8 * SP + 8 * E + 8 * EP);
    float* kt = (float*)std::aligned_alloc(64, ((floats * 4 + 63) / 64) * 64);
    float* vv = kt + E * SP;
    float* sc = shared ? kt : vv + SP * EP;
    float* qb = sc + 8 * SP;
    float* ob = qb + 8 * E;
    if (shared) {
      // packing: tasks of 64 keys of a head
      const int64_t nc = (SP + 63) / 64;
      #pragma omp for schedule(static)
      for (int64_t t = 0; t < B * H * nc; t++) {
        const int64_t bh = t / nc, j0 = (t % nc) * 64, b = bh / H, h = bh % H;
        float* kp = packed + bh * head;
        ember_attn_pack(k + b * ks[0] + h * ks[1], v + b * vs[0] + h * vs[1], ks, vs, j0,
                        std::min(SP, j0 + 64), S, E, Ev, SP, EP, kp, kp + E * SP);
      }
      // (the implicit barrier: every head packed.) The parts, the heaviest first (a causal
      // part's work grows with its last row), taken as threads come free
      #pragma omp for schedule(dynamic, 1)
      for (int64_t t = 0; t < B * H * nq; t++) {
        const int64_t bh = t % (B * H), p = t / (B * H), c = causal ? nq - 1 - p : p;
        const int64_t lo = std::min(L, (c * nb / nq) * 8), hi = std::min(L, ((c + 1) * nb / nq) * 8);
        if (lo >= hi) continue;
        const float* kp = packed + bh * head;
        ember_attn_part(a, bh / H, bh % H, lo, hi, kp, kp + E * SP, qb, sc, ob);
      }
    } else {
      #pragma omp for schedule(static)
      for (int64_t t = 0; t < B * H * nq; t++) {
        const int64_t b = t / (H * nq), h = (t / nq) % H, c = t % nq;
        const int64_t lo = std::min(L, (c * nb / nq) * 8), hi = std::min(L, ((c + 1) * nb / nq) * 8);
        if (lo >= hi) continue;
        // the keys a causal part reads: up to its last row
        const int64_t J = causal ? std::min(S, hi) : S;
        ember_attn_pack(k + b * ks[0] + h * ks[1], v + b * vs[0] + h * vs[1], ks, vs, 0,
                        (J + 15) & ~(int64_t)15, J, E, Ev, SP, EP, kt, vv);
        ember_attn_part(a, b, h, lo, hi, kt, vv, qb, sc, ob);
      }
    }
    std::free(kt);
  }
  std::free(packed);
}
"""


# the dims and strides handed over as packed bytes (c_char_p): building ctypes arrays of them
# cost ~3x as much per call (bert's shape: 12 -> 4 us here)
_DIMS, _STRIDES = struct.Struct("6q"), struct.Struct("23q")
_F32 = torch.float32
_empty = torch.empty


@functools.cache
def _module() -> Any:
    return cache.load(PRELUDE + SOURCE)


@functools.cache
def _library() -> Any:
    """The kernel's entry point, built through the compile cache once per process."""
    fn = _module().ember_attention_f32
    p = ctypes.c_void_p
    fn.argtypes = [p, p, p, p, p, p, ctypes.c_char_p, ctypes.c_char_p, ctypes.c_float,
                   ctypes.c_int]
    fn.restype = None
    return fn


def tasks(b: int, h: int, n: int, s: int, e: int, threads: int) -> tuple[int, bool]:
    """The kernel's plan for q [b, h, n, e] and keys [s, e] at `threads` threads: its number
    of tasks and whether the heads' keys and values are packed once for all of them."""
    fn = _module().ember_attention_tasks
    fn.restype = ctypes.c_int64
    shared = ctypes.c_int(0)
    count = fn(*(ctypes.c_int64(x) for x in (b, h, n, s, e, e, threads)), ctypes.byref(shared))
    return int(count), bool(shared.value)


def _dims(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, dropout_p: float,
          attn_mask: torch.Tensor | None) -> tuple[int, int, int, int, int] | None:
    """(B, H, L, S, E) where ember's kernel serves the call, else None."""
    # (plain attribute checks: this runs on every call)
    if q.dtype is not _F32 or k.dtype is not _F32 or v.dtype is not _F32 \
            or not q.is_cpu or not k.is_cpu or not v.is_cpu \
            or q.dim() != 4 or k.dim() != 4 or v.dim() != 4 or dropout_p != 0.0:
        return None
    (b, h, n, e), (kb, kh, s, ke), (vb, vh, vs, ve) = q.shape, k.shape, v.shape
    if (kb, kh, vb, vh) != (b, h, b, h) or ke != e or ve != e or vs != s or n < MIN_ROWS \
            or s == 0 or e == 0 or s * e > MAX_KEYS_X_FEATURES:
        return None
    if attn_mask is None:
        return b, h, n, s, e
    # a float mask that broadcasts to [B, H, L, S] without growing it
    ms = attn_mask.shape
    if attn_mask.dtype is not _F32 or not attn_mask.is_cpu:
        return None
    if len(ms) == 4:  # (the usual mask, checked without a generator: ~1 us less a call)
        mb, mh, mn, mz = ms
        ok = (mb == 1 or mb == b) and (mh == 1 or mh == h) and (mn == 1 or mn == n) \
            and (mz == 1 or mz == s)
    else:
        ok = len(ms) < 4 and all(m in (1, t) for m, t in zip(reversed(ms), (s, n, h, b)))
    return (b, h, n, s, e) if ok else None


def _serves(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, dropout_p: float,
            attn_mask: torch.Tensor | None) -> bool:
    return _dims(q, k, v, dropout_p, attn_mask) is not None


def _torch(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, dropout_p: float,
           is_causal: bool, attn_mask: torch.Tensor | None, scale: float | None
           ) -> tuple[torch.Tensor, torch.Tensor]:
    if q.dim() == 4 and k.dim() == 4 and v.dim() == 4 \
            and (q.shape[1] == 0 or q.shape[2] == 0 or k.shape[2] == 0):
        # no heads, queries or keys: torch's kernel divides by them (SIGFPE, killing the
        # process, torch 2.13); eager's SDPA gives an empty result, or zeros without keys
        # (their logsumexp: -inf)
        b, h, n, ev = q.shape[0], q.shape[1], q.shape[2], v.shape[3]
        return q.new_zeros(b, h, n, ev), torch.full(
            (b, h, n), float("-inf"), dtype=torch.promote_types(q.dtype, torch.float32))
    # torch's kernel reads a head's features as contiguous (eager's SDPA hands it such
    # views): given a strided last dim it returned wrong values
    q, k, v = (t if t.stride(-1) == 1 else t.contiguous() for t in (q, k, v))
    out, lse = _KERNEL(q, k, v, dropout_p, is_causal, attn_mask=attn_mask, scale=scale)
    return out, lse


def _launch(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, attn_mask: torch.Tensor | None,
            out: torch.Tensor, lse: torch.Tensor, dims: tuple[int, int, int, int, int],
            out_strides: tuple[int, ...], scale: float | None, is_causal: bool) -> None:
    """ember's kernel on a call `_dims` took, writing `out` and `lse` as [B, H, L, Ev] and
    [B, H, L] with `out_strides` (theirs, 4 then 3)."""
    b, h, n, s, e = dims
    ms: tuple[int, ...] = (0, 0, 0, 0)
    if attn_mask is not None:  # its strides as [B, H, L, S] (0 along broadcast dims)
        st, sh = attn_mask.stride(), attn_mask.shape
        if len(sh) == 4:  # (the usual mask: no index arithmetic)
            ms = tuple(0 if d == 1 else x for d, x in zip(sh, st))
        else:
            ms = tuple(0 if i < 4 - len(sh) or sh[i - 4 + len(sh)] == 1
                       else st[i - 4 + len(sh)] for i in range(4))
    _library()(q.data_ptr(), k.data_ptr(), v.data_ptr(),
               attn_mask.data_ptr() if attn_mask is not None else None, out.data_ptr(),
               lse.data_ptr(), _DIMS.pack(b, h, n, s, e, e),
               _STRIDES.pack(*q.stride(), *k.stride(), *v.stride(), *ms, *out_strides),
               float(scale) if scale is not None else e ** -0.5, int(bool(is_causal)))


def forward(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, dropout_p: float = 0.0,
            is_causal: bool = False, *, attn_mask: torch.Tensor | None = None,
            scale: float | None = None, heads_last: bool = False
            ) -> tuple[torch.Tensor, torch.Tensor]:
    """The flash kernel's (output [B, H, L, Ev], logsumexp [B, H, L]); with heads_last, as
    permuted views of [B, L, H, Ev] and [B, L, H] buffers, else contiguous."""
    dims = _dims(q, k, v, dropout_p, attn_mask)
    if dims is None:
        out, lse = _torch(q, k, v, dropout_p, is_causal, attn_mask, scale)
        if heads_last:
            return out, lse
        return out.contiguous(), lse.contiguous()
    b, h, n, _, e = dims
    if heads_last:
        # (one call each, not empty + transpose: 15 -> 7 us here)
        out = torch.empty_strided((b, h, n, e), (n * h * e, e, h * e, 1), dtype=_F32)
        lse = torch.empty_strided((b, h, n), (n * h, 1, h), dtype=_F32)
    else:
        out, lse = _empty(b, h, n, e, dtype=_F32), _empty(b, h, n, dtype=_F32)
    _launch(q, k, v, attn_mask, out, lse, dims, (*out.stride(), *lse.stride()), scale,
            is_causal)
    return out, lse


def forward_heads_last(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
                       dropout_p: float = 0.0, is_causal: bool = False, *,
                       attn_mask: torch.Tensor | None = None, scale: float | None = None
                       ) -> tuple[torch.Tensor, torch.Tensor]:
    """(output [B, L, H, Ev], logsumexp [B, L, H]), contiguous: the buffers ember's kernel
    writes (torch's results copied into that order where its kernel runs). The generated
    wrapper's call of attention.py's heads-last extern: no views of the results made, their
    strides known without asking (a call's Python was ~20 us against a ~4 us kernel call)."""
    dims = _dims(q, k, v, dropout_p, attn_mask)
    if dims is None:
        o, lse = _torch(q, k, v, dropout_p, is_causal, attn_mask, scale)
        return o.transpose(1, 2).contiguous(), lse.transpose(1, 2).contiguous()
    b, h, n, _, e = dims
    # (f32 whatever torch's default dtype: the kernel writes floats)
    out, lse = _empty(b, n, h, e, dtype=_F32), _empty(b, n, h, dtype=_F32)
    _launch(q, k, v, attn_mask, out, lse, dims, (n * h * e, e, h * e, 1, n * h, 1, h), scale,
            is_causal)
    return out, lse


__all__ = ["MAX_KEYS_X_FEATURES", "MIN_ROWS", "SOURCE", "forward", "forward_heads_last",
           "tasks"]
