"""One Triton mode per test process (ember.testing.triton_mode): the interpreter, or launches on a
GPU with EMBER_TEST_CUDA=1. Test files used to set TRITON_INTERPRET=1 at import; collected in
one pytest process on the H200 they switched the GPU tests to the interpreter."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent

# the mode each environment decides, with torch's CUDA check answered by `cuda` (one process:
# the module is reloaded per case, in a clean environment each time)
_PROBE = """
import importlib, json, os, sys, torch
from ember.testing import triton_mode as t
out = []
for env, cuda in json.loads(sys.argv[1]):
    for k in ("TRITON_INTERPRET", "EMBER_TEST_CUDA"):
        os.environ.pop(k, None)
    os.environ.update(env)
    torch.cuda.is_available = lambda: cuda
    importlib.reload(t)
    out.append([t.INTERPRET, t.REAL_CUDA, os.environ.get("TRITON_INTERPRET"), t.WHY_NOT_CUDA,
                t.NEEDS_CUDA.kwargs["reason"], t.INTERPRETER_ONLY.kwargs["reason"]])
print(json.dumps(out))
"""
CASES: list[tuple[dict[str, str], bool]] = [
    ({}, True),  # a GPU, not asked for
    ({"EMBER_TEST_CUDA": "1"}, True),
    ({"EMBER_TEST_CUDA": "1"}, False),
    ({"EMBER_TEST_CUDA": "1", "TRITON_INTERPRET": "1"}, True),
    ({"TRITON_INTERPRET": "0"}, False),
]


def test_the_interpreter_unless_the_device_run_asks_for_the_gpu() -> None:
    p = subprocess.run([sys.executable, "-c", _PROBE, json.dumps(CASES)], capture_output=True,
                       text=True, timeout=120, cwd=ROOT)
    assert p.returncode == 0, p.stderr[-2000:]
    gpu_unasked, gpu, no_device, forced, compile_only = json.loads(
        p.stdout.strip().splitlines()[-1])
    interp, real, env, why, needs, _ = gpu_unasked
    assert (interp, real, env) == (True, False, "1")
    assert why == "EMBER_TEST_CUDA=1 is not set" and why in needs
    interp, real, env, why, _, only = gpu
    assert (interp, real, env, why) == (False, True, None, None)  # TRITON_INTERPRET left unset
    assert "launches kernels on the GPU" in only
    interp, real, env, why, _, _ = no_device
    assert (interp, real, env) == (True, False, "1") and "no CUDA device" in why
    interp, real, env, why, _, _ = forced
    assert (interp, real, env) == (True, False, "1") and "TRITON_INTERPRET=1" in why
    interp, real, env, _, _, only = compile_only
    assert (interp, real, env) == (False, False, "0") and "compiles them for real" in only


def _test_files() -> list[Path]:
    return sorted(p for d in ("packages", "tests") for p in (ROOT / d).rglob("*.py")
                  if "/tests/" in str(p) or p.parent == ROOT / "tests")


def test_no_test_module_sets_the_triton_mode_itself() -> None:
    """Only ember.testing.triton_mode writes TRITON_INTERPRET for a whole process (a
    subprocess's own environment, or monkeypatch, is local)."""
    writes = re.compile(r"os\.environ\[\s*[\"']TRITON_INTERPRET[\"']\s*\]\s*=|"
                        r"os\.environ\.setdefault\(\s*[\"']TRITON_INTERPRET")
    offenders = [str(p.relative_to(ROOT)) for p in _test_files() if writes.search(p.read_text())]
    assert not offenders, offenders


def test_gpu_tests_skip_with_the_reason_under_the_interpreter() -> None:
    env = {k: v for k, v in os.environ.items() if k not in ("TRITON_INTERPRET", "EMBER_TEST_CUDA")}
    p = subprocess.run([sys.executable, "-m", "pytest", "-q", "-rs", "-p", "no:cacheprovider",
                        "packages/inductor/tests/test_triton_lowp_cuda.py"],
                       env=env, capture_output=True, text=True, timeout=300, cwd=ROOT)
    if "1 skipped" not in p.stdout:
        pytest.fail(p.stdout[-3000:] + p.stderr[-2000:])
    assert "launches Triton kernels on a GPU: EMBER_TEST_CUDA=1 is not set" in p.stdout
