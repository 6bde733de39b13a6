"""The CPU target's schedule stage: the `schedule-cpu` pass (docs/inductor.md, "The schedule
stage").

It writes, on each `loop.pointwise` / `loop.reduction` node of a fused loop module, the decisions
`codegen-cpp` renders: loop order, the loops OpenMP splits (the collapse depth), the vectorised
loop, the reduction plan (plain, column, split, rescale), the column blocks where the sizes are
static and the work threshold of per-call decisions, as `sched_*` attributes
(ember.inductor.schedule). The decisions are `cppkernel.kernel_schedule`'s, the same function
codegen-cpp calls for a node without them, so a module compiles to the same C++ with or without
this stage; attributes already on a node (a hand-edited schedule) are kept.

Another schedule is a pass of its own: register it under a name (`register_pass`) and use a
pipeline that runs it in place of this one (codegen-cpp renders whatever it wrote, refusing a
schedule that does not fit a kernel with a one-line ScheduleError).
"""

from __future__ import annotations

from ember.inductor.body import body_names
from ember.inductor.targets import require_device
from ember.inductor.targets.cpu.cpp import CodegenError
from ember.inductor.targets.cpu.cppkernel import kernel_schedule
from ember.ir import Graph, Module, Ref
from ember.ir.passes import register_pass

KERNEL_OPS = ("loop.pointwise", "loop.reduction")


@register_pass("schedule-cpu", "write the CPU schedule (loop order, OpenMP, SIMD, reduction "
               "plan, blocks) on each loop kernel as sched_* attributes")
def schedule_cpu(module: Module) -> Module:
    m = module.clone()
    bodies = body_names(m)
    graphs = [g for g in m.graphs.values() if g.name not in bodies]
    require_device(m, graphs, "cpu", "schedule-cpu")
    for g in graphs:
        for n in g.nodes:
            ref = n.args[0] if n.args else None
            body = m.items.get(ref.name) if isinstance(ref, Ref) else None
            if n.op not in KERNEL_OPS or not isinstance(body, Graph):
                continue
            try:
                s = kernel_schedule(n, body, m.items, m.symbols)
            except CodegenError:  # a kernel C++ cannot express: it runs on the reference
                continue
            n.kwargs = {**n.kwargs, **{k: v for k, v in s.attrs().items()
                                       if k not in n.kwargs}}
    return m


__all__ = ["KERNEL_OPS", "schedule_cpu"]
