"""A loop kernel's schedule as attributes of its node (docs/inductor.md, "The schedule stage").

A target's schedule pass (the CPU's `schedule-cpu`) writes its decisions for each
`loop.pointwise` / `loop.reduction` node as `sched_*` keyword attributes, which print, parse and
verify as ir-v1 text; the target's code generator only renders them, so a dumped schedule can be
edited and replayed:

    %y = loop.pointwise(@f_k0, %x, ranges=[64, 300], sched_order=[0, 1], sched_parallel=[0],
                        sched_vector=[1], sched_plan="plain", sched_threshold=32768) : f32[64, 300]

- `sched_order`: the loops outermost first, as a permutation of the kernel's dims (`ranges`).
- `sched_parallel`: the dims OpenMP splits, a prefix of the order (its length is the collapse
  depth); `[]` runs the kernel on one thread.
- `sched_vector`: the dim whose loop is `omp simd` (the innermost loop), or `[]`.
- `sched_plan`: the reduction plan, `plain`, `column`, `split`, `rescale`, `split+rescale` or
  `column+rows` (the column plan with each block's rows split over threads, `sched_parallel=[]`).
- `sched_blocks`: the column plan's `[block, count]` (columns per block, blocks), or `"auto"`
  where they are computed per call (symbolic sizes) or by the default rule.
- `sched_threshold`: the work (element-steps) below which threads are not started: per call
  (`if(parallel: work >= N)`) where the work is symbolic, and for which full reductions the
  split plan splits.

The verifier checks the form (`check_schedule_attrs`: dims in range, a permutation, a prefix,
known plan names); whether a plan fits the kernel's reductions is checked by the target's code
generator, which refuses a schedule it cannot render with `ScheduleError` (one line).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from ember.ir import Arg, OpTypeError
from ember.ir.passes import PipelineError

KEYS = ("sched_order", "sched_parallel", "sched_vector", "sched_plan", "sched_blocks",
        "sched_threshold")
PLAN_STEPS = ("column", "split", "rescale", "rows")
PLANS = ("plain", "column", "split", "rescale", "split+rescale", "column+rows")
AUTO = "auto"


class ScheduleError(PipelineError):
    """A kernel's schedule attributes cannot be rendered for it (say, a column plan for a
    kernel whose reductions are not all per output column)."""


@dataclass(frozen=True)
class Schedule:
    order: tuple[int, ...]
    parallel: tuple[int, ...] = ()
    vector: tuple[int, ...] = ()
    plan: str = "plain"
    blocks: tuple[int, int] | None = None  # the column plan's [block, count]; None: auto
    threshold: int = 32768

    @property
    def steps(self) -> frozenset[str]:
        return frozenset(self.plan.split("+")) - {"plain"}

    def attrs(self) -> dict[str, Arg]:
        out: dict[str, Arg] = {"sched_order": list(self.order),
                               "sched_parallel": list(self.parallel),
                               "sched_vector": list(self.vector), "sched_plan": self.plan}
        if "column" in self.steps:
            out["sched_blocks"] = AUTO if self.blocks is None else list(self.blocks)
        out["sched_threshold"] = self.threshold
        return out


def has_schedule(kw: Mapping[str, Arg]) -> bool:
    return any(k in kw for k in KEYS)


def _int(v: object) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


def _dims(op: str, key: str, v: Arg, rank: int) -> list[int]:
    if not isinstance(v, list) or not all(_int(x) for x in v):
        raise OpTypeError(f"{op}: {key}= must be a list of dims (integers), got {v}")
    dims = [int(x) for x in v]
    bad = [d for d in dims if not 0 <= d < rank]
    if bad:
        raise OpTypeError(f"{op}: {key}={dims} names dim {bad[0]}, outside the kernel's "
                          f"{rank} loop dims (0..{rank - 1})" if rank else
                          f"{op}: {key}={dims} names dim {bad[0]}; the kernel has no loops")
    if len(set(dims)) != len(dims):
        raise OpTypeError(f"{op}: {key}={dims} names a dim twice")
    return dims


def check_schedule_attrs(op: str, kw: Mapping[str, Arg], rank: int) -> None:
    """The verifier's check of a loop kernel's `sched_*` attributes (their form, for a kernel
    of `rank` loop dims); OpTypeError naming the attribute."""
    for k in kw:
        if k.startswith("sched_") and k not in KEYS:
            raise OpTypeError(f"{op}: unknown schedule attribute {k}= (known: "
                              f"{', '.join(KEYS)})")
    order = list(range(rank))
    if "sched_order" in kw:
        order = _dims(op, "sched_order", kw["sched_order"], rank)
        if len(order) != rank:
            raise OpTypeError(f"{op}: sched_order={order} is not a permutation of the "
                              f"kernel's {rank} loop dims")
    if "sched_parallel" in kw:
        par = _dims(op, "sched_parallel", kw["sched_parallel"], rank)
        if par != order[:len(par)]:
            raise OpTypeError(f"{op}: sched_parallel={par} must be the outermost loops of "
                              f"sched_order={order} (a prefix)")
    if "sched_vector" in kw:
        vec = _dims(op, "sched_vector", kw["sched_vector"], rank)
        if vec and vec != order[-1:]:
            raise OpTypeError(f"{op}: sched_vector={vec} must be [] or the innermost loop's "
                              f"dim [{order[-1]}] of sched_order={order}")
    plan = kw.get("sched_plan", "plain")
    if not isinstance(plan, str) or plan not in PLANS:
        raise OpTypeError(f"{op}: sched_plan= must be one of {', '.join(PLANS)}, got "
                          f"{plan!r}")
    if "sched_blocks" in kw:
        b = kw["sched_blocks"]
        if "column" not in plan.split("+"):
            raise OpTypeError(f"{op}: sched_blocks= is the column plan's; sched_plan is "
                              f"{plan!r}")
        if b != AUTO and not (isinstance(b, list) and len(b) == 2
                              and all(_int(x) and x >= 1 for x in b)):
            raise OpTypeError(f"{op}: sched_blocks= must be \"auto\" or [block, count] "
                              f"(positive integers), got {b}")
    t = kw.get("sched_threshold", 0)
    if not _int(t) or t < 0:  # type: ignore[operator]
        raise OpTypeError(f"{op}: sched_threshold= must be a non-negative integer, got {t}")


def read_schedule(kw: Mapping[str, Arg], default: Schedule) -> Schedule:
    """The schedule of a node's (verified) attributes; an absent one is the default's."""
    if not has_schedule(kw):
        return default

    def dims(key: str, d: tuple[int, ...]) -> tuple[int, ...]:
        v = kw.get(key)
        return tuple(int(x) for x in v) if isinstance(v, list) else d

    plan = str(kw.get("sched_plan", default.plan))
    b = kw.get("sched_blocks")
    blocks = (int(b[0]), int(b[1])) if isinstance(b, list) else \
        None if b == AUTO or plan != default.plan else default.blocks
    t = kw.get("sched_threshold", default.threshold)
    return Schedule(dims("sched_order", default.order), dims("sched_parallel", default.parallel),
                    dims("sched_vector", default.vector), plan, blocks,
                    int(t))  # type: ignore[arg-type]


__all__ = ["AUTO", "KEYS", "PLANS", "PLAN_STEPS", "Schedule", "ScheduleError",
           "check_schedule_attrs", "has_schedule", "read_schedule"]
