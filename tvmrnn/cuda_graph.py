"""CUDA graphs: a model's run replayed as one graph, through TVM's RewriteCUDAGraph, instead of one launch per kernel.

Per-step kernels launch once per time step and layer; on the H100 blog-b fp16 spent 0.63 of 2.87 ms with the GPU idle
between its 613 launches (benchmarks/results/2026-11-23-h100-profile-rows.txt). TVM's Relax pass lifts the part of
`main` whose memory is planned statically into a function that `vm.builtin.cuda_graph.run_or_capture` captures at its
first call for each value of the symbolic dims (seq, batch) and replays afterwards. Static planning needs an upper
bound for every symbolic dim of the inputs (`max_dims`, e.g. {"seq": 512, "batch": 64}): the intermediate buffers are
sized to them once, so the module records the bounds and its inputs are checked against them (runtime.ModuleInputs).

TVM captures only kernels whose buffers it plans statically, and it allocates main's inputs and outputs per call: a
kernel that reads an input or writes an output runs outside the graph and splits it (madmom's onset RNN ran four graphs
and six kernels between them). So `isolate_boundary` routes every tensor input and output of main through a copy
kernel (schedules.device_copy; one launch copies them all in, one all out): the copies run outside, everything between
them is one graph. The module also gets `OUTPUTS_TO_HOST`, the same copy of main's outputs as a function of its own: the
runtime hands the copy-in kernel page-locked host memory and has the outputs written into page-locked host memory by
one launch of it, so a call needs no cudaMemcpy (each a synchronous driver call: 27 of a one-kernel model's 66 us a run
on an H100 host went to two small inputs' copies).

run() goes further: the module also gets WHOLE_CALL (`with_whole_call`), main writing its outputs into tensors it is
given, over planned buffers it is given, which the runtime captures whole, copies included, as one graph per input
signature (tvmrnn.graph_replay): one launch a call instead of the VM's instructions and its three launches. main and
its graph stay for invoke().
CPU targets have nothing to capture.
"""

from __future__ import annotations

import tvm
from tvm import relax

from schedules.device_copy import device_copy

from .errors import UnsupportedModelError
from .runtime import OUTPUTS_TO_HOST, WHOLE_CALL, WHOLE_CALL_BUFFERS

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


def _tensors(sinfo) -> list:
    """The tensor types in a (nested) tuple type, in order, with their paths of tuple indices."""
    if isinstance(sinfo, relax.TensorType) and sinfo.shape is not None:
        return [((), sinfo)]
    if isinstance(sinfo, relax.TupleType):
        return [((i, *path), t) for i, field in enumerate(sinfo.fields) for path, t in _tensors(field)]
    return []


def _signature(types: list) -> tuple:
    return tuple((len(t.shape), str(t.dtype)) for t in types)


def _copies(bb, exprs: list, types: list, name: str) -> tuple[list, list]:
    """([a var per expr, its copy], the bindings): all of them copied by one launch of our kernel."""
    func = device_copy(_signature(types))
    gv = bb.add_func(func, func.attrs["global_symbol"])
    if len(types) == 1:
        out = relax.Var(name, types[0])
        return [out], [relax.VarBinding(out, relax.call_tir(gv, exprs, types[0]))]
    copied = relax.Var(name, relax.TupleType(types))
    bindings = [relax.VarBinding(copied, relax.call_tir(gv, exprs, types))]
    out = []
    for i, t in enumerate(types):
        out.append(relax.Var(f"{name}{i}", t))
        bindings.append(relax.VarBinding(out[-1], relax.TupleGetItem(copied, i)))
    return out, bindings


def _get(expr, path):
    for i in path:
        expr = expr.fields[i] if isinstance(expr, relax.Tuple) else relax.TupleGetItem(expr, i)
    return expr


def _rebuilt(ret, sinfo, replaced: dict, path=()):
    """`ret` with the tensor at each path of `replaced` swapped for its copy."""
    if path in replaced:
        return replaced[path]
    if isinstance(sinfo, relax.TupleType):
        return relax.Tuple([_rebuilt(ret, f, replaced, (*path, i)) for i, f in enumerate(sinfo.fields)])
    return _get(ret, path)


@tvm.transform.module_pass(opt_level=0, name="tvmrnn.IsolateGraphBoundary")
def isolate_boundary(mod: tvm.IRModule, _ctx) -> tvm.IRModule:
    """main's tensor inputs and outputs through copy kernels, so that TVM's RewriteCUDAGraph captures every kernel
    between them as one graph (it captures only kernels whose buffers it plans statically)."""
    bb = relax.BlockBuilder(mod)
    func = mod["main"]
    params = [p for p in func.params if _tensors(p.ty) == [((), p.ty)]]
    blocks_in, blocks_out = [], []
    body = func.body
    if params:
        copied, bindings = _copies(bb, params, [p.ty for p in params], "inputs")
        body = func.bind_params(dict(zip(params, copied))).body
        blocks_in.append(relax.BindingBlock(bindings))
    ret = body.body
    outputs = _tensors(func.ret_ty)
    if outputs:
        copied, bindings = _copies(bb, [_get(ret, path) for path, _ in outputs], [t for _, t in outputs], "outputs")
        ret = _rebuilt(ret, func.ret_ty, {path: v for (path, _), v in zip(outputs, copied)})
        blocks_out.append(relax.BindingBlock(bindings))
        bb.add_func(device_copy(_signature([t for _, t in outputs]), OUTPUTS_TO_HOST), OUTPUTS_TO_HOST)
    new_main = relax.Function(func.params, relax.SeqExpr([*blocks_in, *body.blocks, *blocks_out], ret), func.ret_ty,
                              func.is_pure, func.attrs)
    out = bb.get()
    out["main"] = new_main
    return relax.transform.Normalize()(out)


ALLOCATIONS = ("relax.memory.alloc_storage", "relax.builtin.alloc_tensor")


def with_whole_call(finalize: list) -> list:
    """A backend's finalization passes with main, as memory planning leaves it, also kept as WHOLE_CALL and its planned
    buffers as WHOLE_CALL_BUFFERS (whole_call). RewriteCUDAGraph does not see them (they are added after), so run()
    captures WHOLE_CALL whole, its copies included, as one graph over buffers the runtime holds (the VM's pool would
    otherwise hand them to other tensors once the call returned)."""
    at = next(i for i, p in enumerate(finalize) if p.info.name == "RewriteCUDAGraph")
    planned = {}

    @tvm.transform.module_pass(opt_level=0, name="tvmrnn.KeepPlannedMain")
    def keep(mod, _ctx):
        planned["main"] = mod["main"]
        return mod

    @tvm.transform.module_pass(opt_level=0, name="tvmrnn.AddWholeCall")
    def add(mod, _ctx):
        made = whole_call(planned.pop("main"))
        if made is not None:
            mod[WHOLE_CALL], mod[WHOLE_CALL_BUFFERS] = made
        return mod

    return [*finalize[:at], keep, finalize[at], add, *finalize[at + 1:]]


def whole_call(main: relax.Function) -> tuple[relax.Function, relax.Function] | None:
    """(WHOLE_CALL, WHOLE_CALL_BUFFERS): main in destination-passing style and its planned buffers as a function of
    their own. WHOLE_CALL(inputs..., outputs..., buffers) writes main's outputs into the tensors given after its inputs
    (the runtime's page-locked host arrays: main's copy out then writes them over the bus), takes the buffers memory
    planning sized statically from WHOLE_CALL_BUFFERS() (one set, shared by every capture: they replay one at a time),
    and returns what else it allocates, which the caller keeps while it replays a capture of the call. None where an
    output is not an allocation of its own, or an allocation is in a branch (not returnable)."""
    func = relax.utils.copy_with_new_vars(main)
    bound = {b.var: b.value for block in func.body.blocks for b in block.bindings}
    allocated = [v for v, value in bound.items() if _op(value) in ALLOCATIONS]
    outputs = _leaves(func.body.body, bound)
    count = [0]
    relax.analysis.post_order_visit(func.body, lambda e: count.__setitem__(0, count[0] + (_op(e) in ALLOCATIONS)))
    if (count[0] != len(allocated) or len(set(outputs)) != len(outputs)
            or any(_op(bound.get(v)) != "relax.builtin.alloc_tensor" for v in outputs)):
        return None
    planned = [v for v in allocated if _op(bound[v]) == "relax.memory.alloc_storage" and _static(bound[v].args[0])]
    buffers = relax.Var("buffers", relax.TupleType([v.ty for v in planned]))
    swapped = {v: relax.Var(f"out{i}", v.ty) for i, v in enumerate(outputs)}
    swapped.update({v: relax.TupleGetItem(buffers, i) for i, v in enumerate(planned)})
    blocks = [relax.BindingBlock([relax.VarBinding(b.var, swapped[b.var]) if b.var in swapped else b
                                  for b in block.bindings]) for block in func.body.blocks]
    kept = relax.Tuple([v for v in allocated if v not in swapped])
    whole = relax.Function([*func.params, *(swapped[v] for v in outputs), buffers],
                           relax.BlockBuilder().normalize(relax.SeqExpr(blocks, kept)), None, func.is_pure,
                           _attrs(func, WHOLE_CALL))
    return whole, _buffers_function([bound[v] for v in planned])


def _buffers_function(allocations: list) -> relax.Function:
    """() -> the tuple of these allocations (calls of constant arguments only)."""
    bb = relax.BlockBuilder()
    with bb.function(WHOLE_CALL_BUFFERS, [], pure=True):
        bb.emit_func_output(relax.Tuple([bb.emit(a) for a in allocations]))
    return bb.get()[WHOLE_CALL_BUFFERS]


def _static(shape) -> bool:
    return isinstance(shape, relax.ShapeExpr) and all(isinstance(d, tvm.tirx.IntImm) for d in shape.values)


def _attrs(func: relax.Function, name: str):
    return tvm.ir.make_node("ir.DictAttrs", **{**(func.attrs or {}), "global_symbol": name})


def _op(expr) -> str | None:
    return getattr(expr.op, "name", None) if isinstance(expr, relax.Call) else None


def _leaves(expr, bound: dict) -> list:
    """The variables a (nested) result is made of, seen through tuples, tuple items and aliases, in order."""
    if isinstance(expr, relax.Tuple):
        return [v for field in expr.fields for v in _leaves(field, bound)]
    if isinstance(expr, relax.TupleGetItem):
        tup = bound.get(expr.tuple_value, expr.tuple_value)
        return _leaves(tup.fields[expr.index], bound) if isinstance(tup, relax.Tuple) else [expr]
    if isinstance(expr, relax.Var) and isinstance(bound.get(expr), (relax.Tuple, relax.TupleGetItem, relax.Var)):
        return _leaves(bound[expr], bound)
    return [expr]
