"""The last stage of the Relax pipeline a model is built with (build.pipeline): TVM's backend pipeline for the
target, with the layers around the recurrent kernels scheduled.

    decompose   batch norms into pointwise ops over folded constants (they then fuse into the conv before them); on
                CUDA a pointwise activation after a reshape moved before it, into its producer's kernel
    legalize    ops to TIR; on LLVM conv2d (grouped and depthwise too), conv2d_transpose (a conv over the input
                spread by its strides), conv1d, matmul and linear-layer einsums with constant weights as our
                packed-weight computes (schedules.graph_cpu), their weights packed here, at compile time, and sigmoid
                and tanh through TVM's vectorizable approximations; on every target x ** n for a constant whole n as
                products (CUDA's fast-math powf is NaN for negative x)
    fuse        FuseOps + FuseTIR: pointwise ops into the conv/matmul/reduction before them
    schedule    tuning records where given (MetaSchedule's database), then dlight's rules: on LLVM ours for the packed
                convs and GEMMs, dlight's CPU GEMV and row reductions (softmax, layer norm) and a parallel fallback,
                the pool taken at run time where the work is symbolic (graph_cpu.run_time_parallel); on CUDA TVM's
                default GPU rules, reductions of few outputs first (graph_cuda)
    lower       TVM's dataflow lowering and finalization for the target, unchanged

Our recurrent kernels arrive scheduled (`tirx.is_scheduled`) and pass through untouched.
"""

from __future__ import annotations

import numpy as np
import tvm
from tvm import relax


def _default_legalize(op_name):
    return tvm.ir.Op.get(op_name).get_attr("FLegalize")


def _const_f32(expr, ndim):
    return isinstance(expr, tvm.ir.expr.Constant) and str(expr.value.dtype) == "float32" and len(expr.value.shape) == ndim


def _out_dtype_is(call: relax.Call, dtype: str) -> bool:
    """The op writes `dtype`: its out_dtype attribute names it, or is unset (the inputs' dtype)."""
    return str(call.attrs.out_dtype) in ("", "None", "void", dtype)


def _plain_conv(call: relax.Call, data_layout: str, kernel_layout: str, grouped: bool = False) -> bool:
    """fp32, the plain layouts, a constant weight, one group (or any where `grouped`): what our packed convs take."""
    a = call.attrs
    x, w = call.args
    return (a.data_layout == data_layout and a.kernel_layout == kernel_layout and a.out_layout == data_layout
            and (grouped or int(a.groups) == 1) and str(x.ty.dtype) == "float32"
            and _out_dtype_is(call, "float32") and _const_f32(w, len(kernel_layout)))


def _lanes() -> int:
    from schedules import graph_cpu

    return graph_cpu.vector_lanes(tvm.target.Target.current())


def _out_channel_block(out_channels: int, padded=False, groups: int = 1) -> int:
    """Output channels per conv tile: a block of one group's."""
    from schedules import graph_cpu

    block = graph_cpu.padded_channel_block if padded else graph_cpu.conv_channel_block
    return block(out_channels // groups, _lanes())


def _legalize_conv2d(bb: relax.BlockBuilder, call: relax.Call) -> relax.Expr:
    """conv2d (NCHW, OIHW, fp32, any groups: depthwise too) over a constant weight: our packed-weight compute; others
    TVM's."""
    from schedules import graph_cpu

    if not _plain_conv(call, "NCHW", "OIHW", grouped=True):
        return _default_legalize("relax.nn.conv2d")(bb, call)
    a, (x, w) = call.attrs, call.args
    groups = int(a.groups)
    wp = relax.const(graph_cpu.pack_conv_weight(w.value.numpy(), _out_channel_block(int(w.value.shape[0]), groups=groups)))
    ints = lambda v: [int(i) for i in v]  # noqa: E731
    return bb.call_te(graph_cpu.conv2d_packed, x, wp, ints(a.strides), ints(a.padding), ints(a.dilation),
                      _lanes(), groups, primfunc_name_hint="conv2d_packed")


def _legalize_conv2d_transpose(bb: relax.BlockBuilder, call: relax.Call) -> relax.Expr:
    """conv2d_transpose (NCHW, IOHW, fp32, any groups) over a constant weight, its pads no wider than its windows:
    our packed conv over the input spread by the strides (graph_cpu.conv2d_transpose_packed); others TVM's."""
    from schedules import graph_cpu

    a, (x, w) = call.attrs, call.args
    ints = lambda v: [int(i) for i in v]  # noqa: E731
    groups, padding, dilation = int(a.groups), ints(a.padding), ints(a.dilation)
    if not _plain_conv(call, "NCHW", "IOHW", grouped=True) or any(
            p > d * (k - 1) for p, d, k in zip(padding, dilation * 2, [int(k) for k in w.value.shape[2:]] * 2)):
        return _default_legalize("relax.nn.conv2d_transpose")(bb, call)
    weight = graph_cpu.transposed_conv_weight(w.value.numpy(), groups)
    wp = relax.const(graph_cpu.pack_conv_weight(weight, _out_channel_block(weight.shape[0], groups=groups)))
    return bb.call_te(graph_cpu.conv2d_transpose_packed, x, wp, ints(a.strides), padding, ints(a.output_padding),
                      dilation, _lanes(), groups, primfunc_name_hint="conv2d_packed")


def _legalize_conv1d(bb: relax.BlockBuilder, call: relax.Call) -> relax.Expr:
    """conv1d (NCW, OIW, one group, fp32) over a constant weight: our packed-weight compute (conv2d_packed's block
    without the row axis), its channels padded to whole vectors where they divide only into narrow tiles; others TVM's."""
    from schedules import graph_cpu

    if not _plain_conv(call, "NCW", "OIW"):
        return _default_legalize("relax.nn.conv1d")(bb, call)
    a, (x, w) = call.attrs, call.args
    wp = relax.const(graph_cpu.pack_conv1d_weight(w.value.numpy(), _out_channel_block(int(w.value.shape[0]), padded=True)))
    return bb.call_te(graph_cpu.conv1d_packed, x, wp, int(a.strides[0]), [int(p) for p in a.padding], int(a.dilation[0]),
                      _lanes(), int(w.value.shape[0]), primfunc_name_hint="conv1d_packed")


def _legalize_matmul(bb: relax.BlockBuilder, call: relax.Call) -> relax.Expr:
    """x [..., K] @ constant B [K, N] in fp32: our packed-weight GEMM; others TVM's."""
    from schedules import graph_cpu

    x, w = call.args
    if not (_const_f32(w, 2) and str(x.ty.dtype) == "float32" and x.ty.ndim >= 2 and _out_dtype_is(call, "float32")):
        return _default_legalize("relax.matmul")(bb, call)
    columns = int(w.value.shape[1])
    nb = graph_cpu.dense_block(columns, _lanes())
    wp = relax.const(graph_cpu.pack_dense_weight(w.value.numpy(), nb))
    # a GEMM and the copies of its rows in and out: kOutEWiseFusable (4) as one block would be, so the bias and
    # activation after it fuse in (TVM's analysis calls several blocks opaque)
    return bb.call_te(graph_cpu.dense_packed, x, wp, columns, _lanes(), primfunc_name_hint="dense_packed",
                      primfunc_attrs={"op_pattern": 4})


def _grouped_linear_order(subscripts: str):
    """For an einsum x, B -> y that is a linear layer over x's last axis, grouped or not ("btgi,gih->btgh": each group
    g of x's rows times its own B[g]; "bti,ih->bth"), the axes of B in (g, i, h) or (i, h) order; else None."""
    inputs, arrow, out = subscripts.replace(" ", "").partition("->")
    x, _, w = inputs.partition(",")
    if not arrow or "." in subscripts or len(set(x)) != len(x) or len(set(w)) != len(w) or len(w) not in (2, 3):
        return None
    *lead, i = x
    group = lead[-1:] if len(w) == 3 else []
    h = [c for c in w if c not in x]
    if len(h) != 1 or set(w) != set(group + [i] + h) or out != "".join(lead + h):
        return None
    return [w.index(c) for c in group + [i] + h]


def _legalize_einsum(bb: relax.BlockBuilder, call: relax.Call) -> relax.Expr:
    """An einsum that is a (grouped) linear layer over a constant fp32 B (DeepFilterNet's GroupedLinearEinsum): our
    packed-weight GEMM, B laid out at compile time; others TVM's."""
    from schedules import graph_cpu

    operands = call.args[0]
    order = _grouped_linear_order(str(call.attrs.subscripts))
    if (order is None or not isinstance(operands, relax.Tuple) or len(operands.fields) != 2
            or str(operands.fields[0].ty.dtype) != "float32" or not _const_f32(operands.fields[1], len(order))):
        return _default_legalize("relax.einsum")(bb, call)
    x, w = operands.fields
    weight = np.ascontiguousarray(w.value.numpy().transpose(order))
    groups, columns = (weight.shape[0] if weight.ndim == 3 else 1), weight.shape[-1]
    nb = graph_cpu.dense_block(columns, _lanes())
    wp = relax.const(graph_cpu.pack_dense_weight(weight, nb))
    return bb.call_te(graph_cpu.dense_packed, x, wp, columns, _lanes(), groups, primfunc_name_hint="dense_packed",
                      primfunc_attrs={"op_pattern": 4})  # as _legalize_matmul's


def _legalize_sigmoid(bb: relax.BlockBuilder, call: relax.Call) -> relax.Expr:
    """fp32 sigmoid through TVM's polynomial exp (topi.fast_exp, vectorizable; relative error near 1e-7): the exact
    one is a libm call per element (the captcha CRNN's SiLUs took 7 of its 15 ms)."""
    if str(call.args[0].ty.dtype) != "float32":
        return _default_legalize("relax.sigmoid")(bb, call)
    from tvm import topi

    return bb.call_te(lambda x: topi.divide(1.0, topi.add(1.0, topi.fast_exp(topi.negative(x)))), call.args[0],
                      primfunc_name_hint="sigmoid")


def _legalize_tanh(bb: relax.BlockBuilder, call: relax.Call) -> relax.Expr:
    """fp32 tanh through TVM's rational approximation (topi.fast_tanh: vectorizable, within 3e-7 of float64's over
    [-12, 12], where TVM's exact one was 2.5e-5 relative and a libm call per element, 35x slower)."""
    if str(call.args[0].ty.dtype) != "float32":
        return _default_legalize("relax.tanh")(bb, call)
    from tvm import topi

    return bb.call_te(topi.fast_tanh, call.args[0], primfunc_name_hint="tanh")


def _whole_exponent(call: relax.Call):
    """The exponent of x ** e when e is one constant whole number in 1..4 of x's dtype (not widening x), else None."""
    x, e = call.args
    if not isinstance(e, tvm.ir.expr.Constant) or str(e.value.dtype) != str(x.ty.dtype) or x.ty.ndim < len(e.value.shape):
        return None
    v = e.value.numpy()
    if v.size != 1 or float(v.flat[0]) not in (1.0, 2.0, 3.0, 4.0):
        return None
    return int(v.flat[0])


def _legalize_power(bb: relax.BlockBuilder, call: relax.Call) -> relax.Expr:
    """x ** n for a constant whole n in 1..4 as n - 1 products, exact for every x. TVM compiles CUDA with
    --use_fast_math, where powf(x, n) is exp2(n * log2(x)): NaN for every negative x (Silero's STFT magnitude
    sqrt(re^2 + im^2) came out NaN). Other exponents: TVM's."""
    n = _whole_exponent(call)
    if n is None:
        return _default_legalize("relax.power")(bb, call)
    from tvm import topi

    def whole_power(x):
        out = x
        for _ in range(n - 1):
            out = topi.multiply(out, x)
        return out

    return bb.call_te(whole_power, call.args[0], primfunc_name_hint="power")


def _pointwise_conv2d(call: relax.Call) -> bool:
    """A conv2d whose every output sums one product: one input channel per group, a 1x1 window, no padding (NCHW,
    OIHW, a constant weight)."""
    a, (x, w) = call.attrs, call.args
    return (a.data_layout == "NCHW" and a.kernel_layout == "OIHW" and a.out_layout == "NCHW"
            and isinstance(w, tvm.ir.expr.Constant) and tuple(int(d) for d in w.value.shape[1:]) == (1, 1, 1)
            and all(int(p) == 0 for p in a.padding) and _out_dtype_is(call, str(x.ty.dtype)))


def _legalize_pointwise_conv2d(bb: relax.BlockBuilder, call: relax.Call) -> relax.Expr:
    """A conv2d with one product per output (`_pointwise_conv2d`: depthwise 1x1 convs) as a broadcast product, no
    reduction. TVM's legalization makes a reduction over unit extents, and dlight's GPU fallback inlines a bias add
    after it into both the reduction's init and its update, adding the bias twice (DeepFilterNet3's ERB decoder)."""
    if not _pointwise_conv2d(call):
        return _default_legalize("relax.nn.conv2d")(bb, call)
    from tvm import te

    a, (x, w) = call.attrs, call.args
    per_group = int(w.value.shape[0]) // int(a.groups)
    sh, sw = (int(s) for s in a.strides)

    def product(data, weight):
        n, _, h, wd = data.shape
        shape = (n, weight.shape[0], h if sh == 1 else (h - 1) // sh + 1, wd if sw == 1 else (wd - 1) // sw + 1)
        return te.compute(shape, lambda b, o, i, j: data[b, o // per_group, i * sh, j * sw] * weight[o, 0, 0, 0],
                          name="pointwise_conv2d")

    return bb.call_te(product, x, w, primfunc_name_hint="pointwise_conv2d")


def _legalize_outer_matmul(bb: relax.BlockBuilder, call: relax.Call) -> relax.Expr:
    """a [..., M, 1] @ b [..., 1, N] (a linear layer of one input feature) as the broadcast product it is, for the
    reason `_legalize_pointwise_conv2d` gives; other matmuls TVM's."""
    a, b = call.args
    k = a.ty.shape[-1] if a.ty.ndim >= 2 and b.ty.ndim >= 2 and a.ty.shape is not None else None
    same_dtype = str(a.ty.dtype) == str(b.ty.dtype) and _out_dtype_is(call, str(a.ty.dtype))
    if not (isinstance(k, tvm.tirx.IntImm) and int(k) == 1 and same_dtype):
        return _default_legalize("relax.matmul")(bb, call)
    from tvm import topi

    return bb.call_te(topi.multiply, a, b, primfunc_name_hint="outer_matmul")


LEGALIZE = {"relax.power": _legalize_power, "relax.nn.conv2d": _legalize_pointwise_conv2d,
            "relax.matmul": _legalize_outer_matmul}
CPU_LEGALIZE = {**LEGALIZE, "relax.nn.conv2d": _legalize_conv2d, "relax.nn.conv2d_transpose": _legalize_conv2d_transpose,
                "relax.nn.conv1d": _legalize_conv1d, "relax.matmul": _legalize_matmul, "relax.einsum": _legalize_einsum,
                "relax.sigmoid": _legalize_sigmoid, "relax.tanh": _legalize_tanh}


def _schedule_rules(target):
    if target.kind.name == "llvm":
        from schedules.graph_cpu import cpu_rules

        return cpu_rules()
    from schedules.graph_cuda import cuda_rules

    return cuda_rules()


def rule_schedule(func: tvm.tirx.PrimFunc, target):
    """The schedule the first of the target's rules that takes `func` gives it (with its trace), or None."""
    for rule in _schedule_rules(target):
        sch = rule.apply(func, target, False)
        sch = sch[0] if isinstance(sch, list) and sch else sch
        if sch is not None and not isinstance(sch, list):
            return sch
    return None


def _apply_cpu_rules():
    """dlight's ApplyDefaultSchedule with graph_cpu's rules, each schedule made run_time_parallel, its tiles' bounds
    tests left to the last tile (vector_tails)."""
    from schedules.graph_cpu import run_time_parallel, vector_tails

    @tvm.transform.module_pass(opt_level=0, name="tvmrnn.ApplyCpuRules")
    def _apply(mod, _ctx):
        target, updated = tvm.target.Target.current(), {}
        for gv, func in mod.functions_items():
            sch = rule_schedule(func, target) if isinstance(func, tvm.tirx.PrimFunc) and not _scheduled(func) else None
            if sch is not None:
                updated[gv] = vector_tails(run_time_parallel(func, sch, target)).with_attr("tirx.is_scheduled", True)
        for gv, func in updated.items():
            mod[gv] = func
        return mod

    return _apply


@tvm.transform.module_pass(opt_level=0, name="tvmrnn.DimBoundsToKernels")
def dim_bounds_to_kernels(mod: tvm.IRModule, _ctx) -> tvm.IRModule:
    """main's bounds on its symbolic dims (tir_var_upper_bound) copied onto the unscheduled kernels, whose rules size
    their launches by them (schedules.graph_cuda)."""
    from schedules.graph_cuda import DIM_BOUNDS_ATTR

    main = next((f for gv, f in mod.functions_items() if gv.name_hint == "main"), None)
    bounds = dict((main.attrs or {}).get("tir_var_upper_bound", {})) if main is not None else {}
    if not bounds:
        return mod
    for gv, func in list(mod.functions_items()):
        if isinstance(func, tvm.tirx.PrimFunc) and not _scheduled(func):
            mod[gv] = func.with_attr(DIM_BOUNDS_ATTR, {k: int(v) for k, v in bounds.items()})
    return mod


def _default_schedule(target):
    from tvm.s_tir import dlight as dl

    if target.kind.name == "llvm":
        return _apply_cpu_rules()
    return tvm.transform.Sequential([dim_bounds_to_kernels, dl.ApplyDefaultSchedule(*_schedule_rules(target))])


def _backend(target):
    if target.kind.name == "cuda":
        from tvm.relax.backend.cuda import pipeline as backend
    else:
        from tvm.relax.backend.cpu_generic import pipeline as backend
    return backend


# one-input pointwise ops: f(reshape(x)) == reshape(f(x)), and f(x) then fuses into the kernel that made x
POINTWISE = ("relax.sigmoid", "relax.tanh", "relax.nn.relu", "relax.exp", "relax.nn.silu")


@tvm.transform.module_pass(opt_level=0, name="tvmrnn.PointwiseBeforeReshape")
def pointwise_before_reshape(mod: tvm.IRModule, _ctx) -> tvm.IRModule:
    """f(reshape(x)) as reshape(f(x)) for the POINTWISE ops, where x is a matmul (plus a bias): a Linear exported as
    MatMul + Add + Reshape + Sigmoid then runs as one kernel with its activation (FuseOps fuses f into x's producer; it
    cannot through the reshape between), and the reshape is a view where its result stays inside the dataflow block.
    Only after a matmul, whose GPU schedule takes an epilogue; CUDA only: the CPU's packed GEMMs take none."""
    from tvm.relax.dpl import is_op, rewrite_call, wildcard

    matmul = is_op("relax.matmul")(wildcard(), wildcard())
    x, shape = matmul | is_op("relax.add")(matmul, wildcard()) | is_op("relax.add")(wildcard(), matmul), wildcard()
    reshaped = is_op("relax.reshape")(x, shape)
    pattern = is_op(POINTWISE[0])(reshaped)
    for name in POINTWISE[1:]:
        pattern = pattern | is_op(name)(reshaped)

    def swap(call, matches):
        return relax.op.reshape(relax.Call(call.op, [matches[x]], call.attrs), matches[shape])

    for gv, func in list(mod.functions_items()):
        if isinstance(func, relax.Function):
            mod[gv] = rewrite_call(pattern, swap, func)
    return mod


@relax.expr_functor.mutator
class _JoinedStatesFolder(relax.PyExprMutator):
    def visit_call_(self, call):
        call = self.visit_expr_post_order(call)
        source = _joined_slices(call, self.lookup_binding)
        return source if source is not None else call


def _ints(expr) -> list | None:
    values = [getattr(v, "value", v) for v in getattr(expr, "fields", [])]
    return [int(v) for v in values] if all(isinstance(v, int) or hasattr(v, "__int__") for v in values) else None


def _joined_slices(call, lookup):
    """x where `call` concatenates x[0:1], x[1:2], ..., x[n-1:n] along axis 0 (all of x, in order); else None."""
    if not isinstance(call, relax.Call) or getattr(call.op, "name", None) != "relax.concat" or int(call.attrs.axis) != 0:
        return None
    parts = call.args[0] if isinstance(call.args[0], relax.Tuple) else lookup(call.args[0])
    if not isinstance(parts, relax.Tuple) or not parts.fields:
        return None
    slices = [lookup(p) if isinstance(p, relax.Var) else p for p in parts.fields]
    if not all(isinstance(c, relax.Call) and getattr(c.op, "name", None) == "relax.strided_slice" for c in slices):
        return None
    source = slices[0].args[0]
    shape = getattr(source.ty, "shape", None)
    if shape is None or not isinstance(shape[0], tvm.tirx.IntImm) or int(shape[0]) != len(slices):
        return None
    for i, c in enumerate(slices):
        if (not c.args[0].same_as(source) or _ints(c.args[1]) != [0] or _ints(c.args[2]) != [i]
                or _ints(c.args[3]) != [i + 1] or (len(c.args) > 4 and _ints(c.args[4]) not in (None, [1]))):
            return None
    return source


@tvm.transform.module_pass(opt_level=0, name="tvmrnn.FoldJoinedStates")
def fold_joined_states(mod: tvm.IRModule, _ctx) -> tvm.IRModule:
    """concat(x[0:1], ..., x[n-1:n], axis=0) as x itself: a stack kernel that writes its layers' final h as one tensor
    (StackKernel.joined_states) hands each layer its slice, and the graph's concatenation of them folds back; the
    slices, then unused, go with dead-code elimination."""
    for gv, func in list(mod.functions_items()):
        if isinstance(func, relax.Function):
            mod[gv] = _JoinedStatesFolder().visit_expr(func)
    return relax.transform.DeadCodeElimination()(mod)


def fuse_passes(target: tvm.target.Target) -> list:
    """decompose, legalize, fuse: the module whose PrimFuncs the schedule stage (and `tvmrnn tune`) sees."""
    cpu = target.kind.name == "llvm"
    return (
        [relax.transform.DecomposeOpsForInference(), relax.transform.FoldConstant()]
        + ([] if cpu else [pointwise_before_reshape, fold_joined_states])
        + _backend(target).library_dispatch_passes(target)
        + [relax.transform.LegalizeOps(CPU_LEGALIZE if cpu else LEGALIZE), relax.transform.AnnotateTIROpPattern(),
           relax.transform.FoldConstant(), relax.transform.FuseOps(), relax.transform.FuseTIR()]
    )


def fused_module(mod: tvm.IRModule, target: tvm.target.Target) -> tvm.IRModule:
    """The module as the schedule stage gets it (tuning extracts its tasks from this)."""
    with target:
        return tvm.transform.Sequential(fuse_passes(target))(mod)


def _scheduled(func) -> bool:
    return isinstance(func, tvm.tirx.PrimFunc) and func.attrs is not None and bool(func.attrs.get("tirx.is_scheduled", False))


def _apply_database(on_tuned):
    """MetaSchedule's records for the functions the database has; `on_tuned` gets the names of those it scheduled."""
    apply = relax.transform.MetaScheduleApplyDatabase(enable_warning=False)

    @tvm.transform.module_pass(opt_level=0, name="tvmrnn.ApplyTuningRecords")
    def _apply(mod, _ctx):
        before = {gv.name_hint for gv, f in mod.functions_items() if _scheduled(f)}
        out = apply(mod)
        if on_tuned is not None:
            on_tuned(sorted(gv.name_hint for gv, f in out.functions_items() if _scheduled(f) and gv.name_hint not in before))
        return out

    return _apply


def _graph_on(target) -> bool:
    """Whether the module is built to replay as a CUDA graph (cuda_graph.PASS_CONFIG in the pass context)."""
    from .cuda_graph import PASS_CONFIG

    (key, _), = PASS_CONFIG.items()
    return target.kind.name == "cuda" and bool(tvm.transform.PassContext.current().config.get(key, False))


def _graph_boundary(target) -> list:
    """Where the module replays as a CUDA graph: its inputs and outputs through copies (cuda_graph)."""
    from .cuda_graph import isolate_boundary

    return [isolate_boundary] if _graph_on(target) else []


def _finalize(target) -> list:
    """The backend's finalization; where the module replays as a CUDA graph, with main's whole call kept as a
    function of its own (cuda_graph.with_whole_call), which run() captures as one graph."""
    from .cuda_graph import with_whole_call

    backend = _backend(target).finalize_passes(target)
    return with_whole_call(backend) if _graph_on(target) else backend


def passes(target: tvm.target.Target, database=None, on_tuned=None) -> list:
    """The pipeline's passes in order (see the module's docstring). database: a MetaSchedule database whose records
    schedule the functions it has (`tvmrnn tune`'s), before the default rules take the rest; on_tuned(names) is told
    which functions ran tuned."""
    backend = _backend(target)
    tuned = [_apply_database(on_tuned)] if database is not None else []
    return (
        fuse_passes(target)
        + tuned
        + [_default_schedule(target)]
        + _graph_boundary(target)
        + backend.dataflow_lower_passes(target)
        + _finalize(target)
    )


def graph_pipeline(target: tvm.target.Target, database=None, on_tuned=None) -> tvm.transform.Pass:
    """The Relax pipeline for `tvm.compile(mod, target, relax_pipeline=pipeline(target))`."""

    @tvm.transform.module_pass(opt_level=0, name="tvmrnn.graph_pipeline")
    def _pipeline(mod: tvm.IRModule, _ctx) -> tvm.IRModule:
        with target:  # MetaScheduleApplyDatabase reads the target when it is made
            seq = tvm.transform.Sequential(passes(target, database, on_tuned))
            if database is None:
                return seq(mod)
            with database:
                return seq(mod)

    return _pipeline
