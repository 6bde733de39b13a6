"""Packed weights and the thread count (targets/cpu/packed.py): oneDNN picks a convolution's
weight layout by the thread count too, so a pack is cached per thread count; a pack made under
one count and run under another would be reordered by oneDNN on every call."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest
import torch

import ember.inductor  # noqa: F401  (registers the CPU target)
from ember.inductor.targets.cpu import linear, packed

KW = {"stride": [1, 1], "padding": [1, 1], "dilation": [1, 1], "groups": 1}
needs_mkldnn = pytest.mark.skipif(not torch.backends.mkldnn.is_available(),
                                  reason="oneDNN's packed weights need mkldnn")


@pytest.fixture
def threads() -> object:
    before = torch.get_num_threads()
    yield None
    torch.set_num_threads(before)


@needs_mkldnn
def test_each_thread_count_has_its_own_pack(threads: object) -> None:
    w = torch.nn.Parameter(torch.randn(8, 3, 3, 3))
    a = torch.rand(8) + 0.5
    x = torch.randn(2, 3, 6, 6).contiguous(memory_format=torch.channels_last)
    size = list(x.shape)
    torch.set_num_threads(1)
    one = packed.packed_weight(w, a, size, KW)
    torch.set_num_threads(2)
    two = packed.packed_weight(w, a, size, KW)
    assert two is not one  # made again under 2 threads
    assert packed.packed_weight(w, a, size, KW) is two
    got = torch.ops.mkldnn._convolution_pointwise(x, two, None, [1, 1], [1, 1], [1, 1], 1,
                                                  "none", [], "")
    torch.testing.assert_close(got, torch.conv2d(x, w.detach() * a[:, None, None, None],
                                                 padding=1))
    torch.set_num_threads(1)
    assert packed.packed_weight(w, a, size, KW) is one  # each count keeps its own
    counts = packed.pack_threads()
    assert counts.get(1, 0) >= 1 and counts.get(2, 0) >= 1


@needs_mkldnn
def test_packed_linear_is_packed_per_thread_count(threads: object) -> None:
    w = torch.nn.Parameter(torch.randn(256, 128), requires_grad=False)
    x = torch.randn(64, 128)
    torch.set_num_threads(1)
    torch.testing.assert_close(linear.linear(x, w), x @ w.t())
    torch.set_num_threads(2)
    torch.testing.assert_close(linear.linear(x, w), x @ w.t())
    entries = packed._PACKS[id(w)].entries
    assert sorted(k[-1] for k in entries) == [1, 2]


# resnet50's convolutions (batch 2) whose oneDNN layout differs between 1 and 16 threads on the
# 2-core AVX-512 Xeon (oneDNN 3.12): Acdb48a vs Acdb64a, Acdb48a vs Acdb32a. Another CPU may pick
# one layout for both, and then this test passes without the per-count packs too.
_VERBOSE = """
import torch
import ember.inductor
from ember.inductor.targets.cpu import packed
call = packed.bind({"stride": [1, 1], "padding": [0, 0], "dilation": [1, 1], "groups": 1})
for c, o, h in ((256, 1024, 14), (1024, 512, 14), (2048, 512, 7)):
    torch.manual_seed(0)
    x = torch.randn(2, h, h, c)
    w = torch.nn.Parameter(torch.randn(o, c, 1, 1) / c ** 0.5, requires_grad=False)
    torch.set_num_threads(1)
    ref = call(x, w)
    torch.set_num_threads(16)
    call(x, w)
    print("TIMED", flush=True)
    for _ in range(2):
        torch.testing.assert_close(call(x, w), ref, rtol=1e-4, atol=1e-4)
    print("DONE", flush=True)
"""


@needs_mkldnn
def test_no_per_call_reorder_after_the_thread_count_changes() -> None:
    env = {**os.environ, "ONEDNN_VERBOSE": "1", "OMP_NUM_THREADS": "1"}
    out = subprocess.run([sys.executable, "-c", _VERBOSE], env=env, capture_output=True,
                         text=True, timeout=300, check=True).stdout
    timed = [part.split("DONE")[0] for part in out.split("TIMED")[1:]]
    assert len(timed) == 3
    for part in timed:
        execs = [ln for ln in part.splitlines() if ln.startswith("onednn_verbose,v1,primitive,exec")]
        assert sum(",convolution," in ln for ln in execs) == 2
        assert not [ln for ln in execs if ",reorder," in ln], part
