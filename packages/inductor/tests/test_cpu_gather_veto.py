"""A value gathered through index arithmetic on the CPU target (targets/cpu/gather.py): Swin's
shifted-window mask (a region map read through `//` and `mod` by the window size) under the
softmax that reads it for every head in three passes, and the patch merging's concatenation
of four strided slices under its LayerNorm's three passes, are each written once by a kernel
of their own instead of being evaluated again per head and per pass. A concatenation that its
reader evaluates once per element still fuses. Outputs as eager's."""

from __future__ import annotations

from pathlib import Path

import torch

import ember.inductor  # noqa: F401  (registers the CPU target)
from ember.inductor.targets.cpu.gather import REPEATS
from ember.runtime.compile import compile as ember_compile


def _run(f: object, args: tuple[torch.Tensor, ...], tmp: Path) -> str:
    g = ember_compile(f, options={"dump_dir": str(tmp)})
    with torch.no_grad():
        got, want = g(*args), f(*args)  # type: ignore[operator]
    torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-5)
    return next(tmp.glob("*.kernels.ir")).read_text()


def _kernel(text: str, computes: str) -> str:
    """The C++ of the kernel whose header says it computes a value of type `computes`."""
    for block in text.split("kernel @")[1:]:
        if "// computes %" in block and f": {computes}\n" in block.split("extern")[0]:
            return block
    raise AssertionError(f"no kernel computes {computes}")


def shifted_window_softmax(scores: torch.Tensor, regions: torch.Tensor) -> torch.Tensor:
    """torchvision's shifted-window attention mask over a 14x14 map of 7x7 windows, added to
    the scores of 2 images x 4 windows x 3 heads, then softmax."""
    w = regions.view(2, 7, 2, 7).permute(0, 2, 1, 3).reshape(4, 49)
    mask = w.unsqueeze(1) - w.unsqueeze(2)
    mask = mask.masked_fill(mask != 0, -100.0).masked_fill(mask == 0, 0.0)
    a = scores.view(2, 4, 3, 49, 49) + mask.unsqueeze(1).unsqueeze(0)
    return torch.softmax(a.view(8, 3, 49, 49), -1)


def _window_args() -> tuple[torch.Tensor, torch.Tensor]:
    torch.manual_seed(0)
    regions = torch.zeros(14, 14)
    regions[7:, :] += 3.0
    regions[:, 7:] += 1.0
    regions[10:, 10:] = 8.0  # the shifted windows' corner regions
    return torch.randn(8, 3, 49, 49), regions


def test_a_window_mask_is_computed_once_not_per_head_and_pass(tmp_path: Path) -> None:
    text = _run(shifted_window_softmax, _window_args(), tmp_path)
    mask = _kernel(text, "f32[4, 49, 49]")
    softmax = _kernel(text, "f32[8, 3, 49, 49]")
    # the mask's kernel divides by the window size; the softmax reads its buffer plainly
    # (without the veto: one kernel, two divided loads in each of its three passes)
    assert " / 7)" in mask and " % 7)" in mask, mask
    assert " / 7)" not in softmax and " % 7)" not in softmax, softmax
    assert text.count("kernels.call(") == 2, text


def patch_merge_norm(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor) -> torch.Tensor:
    """torchvision's PatchMerging: four strided slices concatenated along channels, then
    LayerNorm."""
    y = torch.cat([x[:, 0::2, 0::2], x[:, 1::2, 0::2], x[:, 0::2, 1::2], x[:, 1::2, 1::2]], -1)
    return torch.nn.functional.layer_norm(y + 1.0, (64,), weight, bias)


def test_a_concatenation_under_a_layer_norm_is_written_once(tmp_path: Path) -> None:
    torch.manual_seed(0)
    args = (torch.randn(2, 8, 8, 16), torch.randn(64), torch.randn(64))
    text = _run(patch_merge_norm, args, tmp_path)
    # two kernels: the concatenation (its pieces' clamped loads) and the LayerNorm, whose
    # three passes read its buffer without clamps (without the veto: one kernel clamping
    # four pieces' loads in each pass)
    assert text.count("kernels.call(") == 2, text
    norm = _kernel(text, "f32[2, 4, 4, 64]").split("ember_k_")[1]
    assert "ember_imin(" not in norm and "ember_imax(" not in norm, norm  # no clamps


def test_a_concatenation_read_once_per_element_still_fuses(tmp_path: Path) -> None:
    def f(x: torch.Tensor) -> torch.Tensor:
        return torch.cat([x[:, 0::2], x[:, 1::2]], -1) * 2.0

    text = _run(f, (torch.randn(4, 8, 16),), tmp_path)
    assert text.count("kernels.call(") == 1, text
    assert REPEATS == 2
