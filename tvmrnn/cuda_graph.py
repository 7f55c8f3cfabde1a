"""CUDA graphs: a model's run replayed as one graph, through TVM's RewriteCUDAGraph, instead of one launch per kernel.

Per-step kernels launch once per time step and layer; on the H100 blog-b fp16 spent 0.63 of 2.87 ms with the GPU idle
between its 613 launches (benchmarks/results/2026-11-23-h100-profile-rows.txt). TVM's Relax pass lifts the part of
`main` whose memory is planned statically into a function that `vm.builtin.cuda_graph.run_or_capture` captures at its
first call for each value of the symbolic dims (seq, batch) and replays afterwards. Static planning needs an upper
bound for every symbolic dim of the inputs (`max_dims`, e.g. {"seq": 512, "batch": 64}): the intermediate buffers are
sized to them once, so the module records the bounds and its inputs are checked against them (runtime.ModuleInputs).

TVM captures only kernels whose buffers it plans statically, and it allocates main's inputs and outputs per call: so
where a recurrent kernel would read a model input (lengths, states) or write a model output, the plan marks it
(tvmrnn.plan.LayerPlan.copies) and the emission routes that tensor through a copy kernel (frontend.converters,
schedules.device_copy), so the recurrent kernel is captured.
CPU targets have nothing to capture.
"""

from __future__ import annotations

from .errors import UnsupportedModelError

PASS_CONFIG = {"relax.backend.use_cuda_graph": True}


def symbolic_dims(inputs) -> list[str]:
    """The named symbolic dims of the model's inputs, in order of appearance ("?" for an unnamed one)."""
    seen = []
    for info in inputs:
        for d in info.shape:
            if not isinstance(d, int) and d not in seen:
                seen.append(d)
    return seen


def resolve(inputs, target, max_dims: dict | None, cuda_graph: bool | None) -> tuple[dict | None, str]:
    """(the bounds to capture with, or None for no graph; a line saying why) for compile's log and metadata.

    cuda_graph: True requires a graph (an error names the dim without a bound), False turns it off, None (auto) captures
    on CUDA wherever every symbolic dim has a bound (a static model has none to bound: one capture, replayed)."""
    max_dims = dict(max_dims or {})
    dims = symbolic_dims(inputs)
    unknown = sorted(set(max_dims) - set(dims))
    if unknown:
        raise UnsupportedModelError(f"max_dims names {unknown[0]!r}, which no input of the model has; its symbolic dims are "
                                    f"{[d for d in dims if d != '?'] or 'none (the model is static)'}")
    bad = {k: v for k, v in max_dims.items() if not isinstance(v, int) or isinstance(v, bool) or v < 1}
    if bad:
        name, value = next(iter(bad.items()))
        raise UnsupportedModelError(f"max_dims[{name!r}] is {value!r}; a bound is a positive integer")
    if cuda_graph is False:
        return None, "off (cuda_graph=False)"
    if target.kind.name != "cuda":
        if cuda_graph:
            raise UnsupportedModelError(f"cuda_graph=True needs a CUDA target; this one is {target.kind.name}")
        return None, "off (CPU target)"
    missing = [d for d in dims if d not in max_dims]
    if missing:
        why = ("an input has a dim without a name, which cannot be bounded" if "?" in missing else
               f"give an upper bound for {', '.join(missing)} (max_dims / --max-dim {missing[0]}=N) to capture one")
        if cuda_graph:
            raise UnsupportedModelError(f"cuda_graph=True: {why}")
        return None, f"off ({why})"
    bounds = {d: max_dims[d] for d in dims}
    return bounds, "on: " + (", ".join(f"{k} <= {v}" for k, v in bounds.items()) or "static shapes") + \
        " (captured at the first run of each shape, replayed after)"


def annotate(mod, bounds: dict):
    """`mod` (changed in place) with main's symbolic dims bounded and allowed into the graph (each value of them gets its own capture)."""
    main = mod["main"].with_attr("tir_var_upper_bound", bounds)
    if bounds:
        main = main.with_attr("relax.rewrite_cuda_graph.capture_symbolic_vars", list(bounds))
    mod["main"] = main
    return mod


def captured(executable) -> bool:
    """Whether TVM's rewrite lifted anything into a graph (a module whose kernels all write its outputs has nothing)."""
    return "cuda_graph.run_or_capture" in executable.as_text()

