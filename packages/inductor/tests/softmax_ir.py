"""The softmax graph of the fusion tests, shared by test_fuse_reductions.py (fuse's golden
output for it) and test_compile_time_memo.py (a fused module whose bodies are signed): a row
softmax as prims (SOFTMAX) and what fuse makes of it, one kernel with its two reductions
inside (SOFTMAX_FUSED)."""

from __future__ import annotations

SOFTMAX = """ember.ir 1.0

graph @softmax(%x: f32[3, 5]) -> (f32[3, 5]) {
  %0 = prims.amax(%x, dims=[1]) : f32[3]
  %1 = prims.unsqueeze(%0, dims=[1]) : f32[3, 1]
  %2 = prims.broadcast_in_dim(%1, shape=[3, 5], broadcast_dims=[0, 1]) : f32[3, 5]
  %3 = prims.sub(%x, %2) : f32[3, 5]
  %4 = prims.exp(%3) : f32[3, 5]
  %5 = prims.sum(%4, dims=[1]) : f32[3]
  %6 = prims.unsqueeze(%5, dims=[1]) : f32[3, 1]
  %7 = prims.broadcast_in_dim(%6, shape=[3, 5], broadcast_dims=[0, 1]) : f32[3, 5]
  %8 = prims.div(%4, %7) : f32[3, 5]
  return (%8)
}
"""

SOFTMAX_FUSED = """ember.ir 1.1

graph @softmax(%x: f32[3, 5]) -> (f32[3, 5]) {
  %8 = loop.pointwise(@softmax_k4, %x, ranges=[3, 5]) : f32[3, 5]
  return (%8)
}

graph @softmax_k4(%x: f32[3, 5]) -> (f32[]) domain(i0 < 3, i1 < 5) {
  %x.load = loop.load(%x, index=[i0, i1]) : f32[]
  %0 = loop.reduce(@softmax_k6, %x, ranges=[3], reduce_ranges=[5], reduction="amax") : f32[]
  %3 = prims.sub(%x.load, %0) : f32[]
  %4 = prims.exp(%3) : f32[]
  %5 = loop.reduce(@softmax_k7, %x, ranges=[3], reduce_ranges=[5], reduction="sum") : f32[]
  %8 = prims.div(%4, %5) : f32[]
  return (%8)
}

graph @softmax_k6(%x: f32[3, 5]) -> (f32[]) domain(i0 < 3, r0 < 5) {
  %x.load = loop.load(%x, index=[i0, r0]) : f32[]
  return (%x.load)
}

graph @softmax_k7(%x: f32[3, 5]) -> (f32[]) domain(i0 < 3, r0 < 5) {
  %x.load = loop.load(%x, index=[i0, r0]) : f32[]
  %0 = loop.reduce(@softmax_k6, %x, ranges=[3], reduce_ranges=[5], reduction="amax") : f32[]
  %3 = prims.sub(%x.load, %0) : f32[]
  %4 = prims.exp(%3) : f32[]
  return (%4)
}
"""
