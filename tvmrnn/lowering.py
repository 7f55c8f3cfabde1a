"""Lower one recurrent layer to Relax: the input projection as one GEMM, then our recurrent kernel.

    XW  = X @ W^T + (Wb + foldable Rb)     one matmul over all steps and directions (or, where X is an embedding
                                           lookup, rows of the table's own projection, a constant)
    Y, Y_h[, Y_c] = call_tir(recurrent kernel for this layer and target)

Weight re-layout (stacking directions, transposing R, folding biases) is written as Relax
ops: for weights that are graph initializers FoldConstant evaluates it at compile time, and
weights that arrive as graph inputs take the same path at run time.
"""

from __future__ import annotations

import numpy as np
import tvm
from tvm import relax

from schedules import planned_kernel, projection_cpu, projection_cuda, projection_mma, projection_staged, projection_wgmma, split_halves
from schedules.cells import cell_for
from schedules.recurrent_common import PANEL, panel_count
from schedules.recurrent_wavefront import split_h

op = relax.op


def _split_bias(B, spec, cell):
    """B [D, 2*G*H] -> (bias added to XW [D*G*H], Rb of the gates whose Rb stays in the cell [D, k, H])."""
    G, H, D = cell.gates, spec.hidden_size, spec.num_directions
    wb = op.strided_slice(B, axes=[1], begin=[0], end=[G * H])
    rb = op.strided_slice(B, axes=[1], begin=[G * H], end=[2 * G * H])
    mask = np.zeros((G, H), "float32")
    mask[list(cell.folded_rbias)] = 1
    folded = op.add(wb, op.multiply(rb, relax.const(mask.reshape(-1))))
    return op.reshape(folded, [D * G * H]), op.reshape(rb, [D, G, H])


def _r_layout(bb, R, layout: str, D: int, G: int, H: int, dtype: str):
    """ONNX's R [D, G*H, H] as the kernel reads it (schedules.recurrent_common): as it is, transposed, or in panels
    RP[d, p, k, g, l] = R[d, g*H + p*PANEL + l, k], the last panel padded with zero rows where PANEL does not divide H."""
    if layout == "rows":
        return R
    if layout == "transposed":
        return bb.emit(op.permute_dims(R, [0, 2, 1]))
    gates = op.reshape(R, [D, G, H, H])
    padded = panel_count(H) * PANEL
    if padded != H:
        zeros = op.zeros([D, G, padded - H, H], dtype)
        gates = op.concat([gates, zeros], axis=2)
    return bb.emit(op.permute_dims(op.reshape(gates, [D, G, padded // PANEL, PANEL, H]), [0, 2, 4, 1, 3]))


def _f32(x):
    if x is None:
        return None
    bb = relax.BlockBuilder.current()
    x = bb.normalize(x)  # fresh op calls get their type here
    return x if str(x.ty.dtype) == "float32" else bb.emit(op.astype(x, "float32"))


def _projection(bb, X, w, bias, gemm, target):
    """XW = X @ w^T + bias for all steps at once, in the dtype the recurrent kernel reads, by the GEMM the plan chose
    (tvmrnn.plan.projection). The tensor-core GEMMs store XW in that dtype themselves; the rest write fp32, cast after."""
    In, cols, rows, xw_dtype = gemm.in_size, gemm.cols, gemm.rows, gemm.xw_dtype
    shape = X.ty.shape
    m = shape[0] * shape[1]
    if gemm.kind == "table":
        return _as_xw(bb, _table_lookup(bb, X, w, bias), xw_dtype)
    w_as_x = lambda: bb.emit(op.astype(w, str(X.ty.dtype)))  # noqa: E731 - the tensor-core GEMMs read W in X's dtype
    operands = lambda x2d: [x2d, weight]  # noqa: E731 - the GEMM's inputs before bias, from X as [rows, In]
    if gemm.kind == "wgmma_f16x3":  # exact fp32 as three fp16 products of X's and W's scaled halves
        func, name = projection_wgmma.projection_wgmma("f16x3", In, cols, rows=rows, xw_dtype=xw_dtype), "projection_wgmma_f16x3" + gemm.suffix
        w_parts = _halves(bb, _f32(w), cols, In, fold=True)
        operands = lambda x2d: [*_halves(bb, x2d, m, In, fold=False), *w_parts]  # noqa: E731
    elif gemm.kind == "wgmma":
        func, weight, name = projection_wgmma.projection_wgmma(gemm.mode, In, cols, rows=rows, xw_dtype=xw_dtype), w_as_x(), f"projection_wgmma_{gemm.mode}{gemm.suffix}"
        if projection_wgmma.reads_low_parts(func):  # W, then its TF32 low parts: evaluated at compile time where W is a constant (FoldConstant)
            # private (no global symbol, opaque to fusion): once folded, DeadCodeElimination drops it from the module
            low = f"tf32_low_parts_{cols}x{In}"
            parts = bb.add_func(projection_wgmma.low_parts(cols, In).without_attr("global_symbol").with_attr("op_pattern", 8), low)
            weight = bb.emit(relax.call_tir(parts, [weight], relax.TensorType([2 * cols, In], "float32")))
    elif gemm.kind == "staged":
        func, weight, name = projection_staged.projection_staged(gemm.mode, In, cols, rows=rows, xw_dtype=xw_dtype), w_as_x(), f"projection_staged_{gemm.mode}{gemm.suffix}"
    elif gemm.kind == "mma":
        func, weight, name = projection_mma.projection_mma(gemm.mode, In, cols), w_as_x(), f"projection_{gemm.mode}"
    elif gemm.kind == "simt":
        X = _f32(X)
        func, weight, name = projection_cuda.projection_cuda(In, cols), _f32(w), "projection"  # W as ONNX stacks it: [cols, In]
    elif gemm.kind == "matmul":
        xw = bb.emit(op.matmul(X, op.permute_dims(w), out_dtype="float32"))  # fp32 results whatever the inputs
        return _as_xw(bb, bb.emit(op.add(xw, bias)) if bias is not None else xw, xw_dtype)
    else:
        mcpu = str((target.attrs or {}).get("mcpu", ""))
        X, (mr, nr) = _f32(X), projection_cpu.tile(cols, mcpu, rows)
        padded = projection_cpu.w_panels(cols, nr) * nr
        w = _f32(w) if padded == cols else op.concat([_f32(w), relax.const(np.zeros((padded - cols, In), "float32"))])
        panels = op.permute_dims(op.reshape(w, [padded // nr, nr, In]), [0, 2, 1])  # [cols/nr, In, nr], the last padded
        func, weight, name = projection_cpu.projection_cpu(In, cols, mcpu, (mr, nr), rows), bb.emit(panels), f"projection_{mr}x{nr}"
    if bias is None:
        bias = relax.const(np.zeros(cols, "float32"))
    out = str(func.params[-1].dtype)  # XW as the chosen GEMM writes it
    name = f"{name}_{In}x{cols}" + ("" if out == "float32" else f"_{out}")  # same shape, same function: add_func shares it between layers
    gv = bb.add_func(func.with_attr("global_symbol", name), name)
    flat = bb.emit(relax.call_tir(gv, [*operands(bb.emit(op.reshape(X, [m, In]))), bias], relax.TensorType([m, cols], out)))
    return _as_xw(bb, bb.emit(op.reshape(flat, [shape[0], shape[1], cols])), xw_dtype)


def _table_lookup(bb, X, w, bias):
    """XW where X is rows of a constant table E (the plan's "table" projection): E @ w^T + bias is a constant, which
    FoldConstant computes at compile time, and XW takes its rows by X's own indices (in X's order of leading axes)."""
    table, indices, axes = _embedding_lookup(bb, X)
    projected = op.matmul(table, op.permute_dims(w))
    if bias is not None:
        projected = op.add(projected, bias)
    if axes is not None:
        indices = bb.emit(op.permute_dims(indices, axes[:-1]))
    return bb.emit(op.take(bb.emit(projected), indices, axis=0))


def _embedding_lookup(bb, X):
    """(E, indices, X's permutation of the lookup's leading axes or None) of X = take(E, indices, axis=0), E a
    constant, maybe through permute_dims: the lookup the plan found in the ONNX graph (GraphIndex.table_rows) as TVM's
    frontend emits it (Gather -> take, Transpose -> permute_dims)."""
    x, axes = _bound(bb, X), None
    if _is_op(x, "relax.permute_dims"):
        axes = [int(a) for a in x.attrs.axes]
        x = _bound(bb, x.args[0])
    found = _is_op(x, "relax.take") and isinstance(x.args[0], tvm.ir.expr.Constant) and int(x.attrs.axis) == 0
    assert found and (axes is None or axes[-1] == len(axes) - 1), f"X is not the embedding lookup the plan found: {x}"
    return x.args[0], x.args[1], axes


def _bound(bb, x):
    """The expression a variable of the function being built is bound to (through variables bound to variables)."""
    while isinstance(x, relax.Var) and bb.lookup_binding(x) is not None:
        x = bb.lookup_binding(x)
    return x


def _is_op(x, name: str) -> bool:
    return isinstance(x, relax.Call) and isinstance(x.op, tvm.ir.Op) and x.op.name == name


def _halves(bb, a, rows, K: int, fold: bool) -> list:
    """An fp32 [rows, K] operand as the f16x3 GEMM reads it (schedules.split_halves): its rows' scaled fp16 halves
    [rows, 2K] and their scales [rows]. fold (W, rows a number): plain TE in a private, opaque function, as W's TF32
    low parts are: folded at compile time where W is a constant (an initializer), then dropped from the module; else
    (X, rows the Relax shape's expression) the CUDA kernel of one warp per row, for any row count."""
    if fold:
        func, name = split_halves.split(int(rows), K).without_attr("global_symbol"), f"halves_{int(rows)}x{K}"
    else:
        name = f"split_halves_{K}"
        func = split_halves.split_on_gpu(K).with_attr("global_symbol", name)
    parts = bb.emit(relax.call_tir(bb.add_func(func.with_attr("op_pattern", 8), name), [a],
                                   [relax.TensorType([rows, 2 * K], "float16"), relax.TensorType([rows], "float32")]))
    return [bb.emit(relax.TupleGetItem(parts, 0)), bb.emit(relax.TupleGetItem(parts, 1))]


def _as_xw(bb, xw, xw_dtype: str):
    """XW in the dtype the recurrent kernel reads (cast where its GEMM wrote fp32)."""
    if str(bb.normalize(xw).ty.dtype) != xw_dtype:
        xw = bb.emit(op.astype(xw, xw_dtype))
    return xw


def emit_rnn_layer(bb: relax.BlockBuilder, layer, inputs: list, target, device) -> list:
    """Emit a planned layer (tvmrnn.plan.LayerPlan) for the device it was planned for: its projection and its recurrent
    kernel. `inputs` are the node's Relax inputs in ONNX order (None where absent). Returns [Y, Y_h(, Y_c)] as Relax
    expressions."""
    spec, cell = layer.spec, cell_for(layer.spec)
    kernel = planned_kernel(spec, cell, target, layer.kernel, device, _static_batch(bb, spec, inputs[0], target))
    assert _xw_dtype(kernel.func) == layer.projection.xw_dtype, (spec.name, layer.projection)
    args = _kernel_inputs(bb, spec, cell, inputs, target, kernel.r_layout, layer.projection)
    results = _call(bb, kernel.func, spec.name, args, _output_types(spec, cell, inputs[0]))
    return _storage_dtype(bb, spec, results)


def _static_batch(bb, spec, X, target) -> int | None:
    """X's batch where the model fixes it, on CPUs (the kernel then builds only the batch branch that runs it); None
    where it is symbolic, and on CUDA, whose kernels are built for any batch."""
    shape = bb.normalize(X).ty.shape
    batch = shape[1] if spec.layout == 0 else shape[0]
    return int(batch) if target.kind.name != "cuda" and isinstance(batch, tvm.tirx.IntImm) else None


def _xw_dtype(func) -> str:
    """The dtype the recurrent kernel reads XW in: its first argument's (recurrent_common.KernelArgs)."""
    return str(func.params[0].dtype)


def _kernel_inputs(bb, spec, cell, inputs: list, target, r_layout: str, gemm) -> list:
    """What a layer's recurrent kernel takes before its outputs (recurrent_common.KernelArgs): XW (the projection of all
    steps, one GEMM: gemm, the plan's), R in r_layout, then the lengths, states and per-unit parameters the node has."""
    inputs = list(inputs) + [None] * (8 - len(inputs))
    X, W, R, B = inputs[:4]
    # Only R keeps the storage dtype inside our kernels (fp16/bf16 halve its bytes on chip); the
    # state, biases and peepholes are fp32, outputs are cast back to the model's dtype.
    B = _f32(B)
    named = dict(zip(("sequence_lens", "initial_h", "initial_c", "P"), inputs[4:8]))
    named.update({k: _f32(named[k]) for k in ("initial_h", "initial_c", "P")})
    G, H, D, In = cell.gates, spec.hidden_size, spec.num_directions, spec.input_size

    bias, rb_cell = _split_bias(B, spec, cell) if B is not None else (None, None)
    xw = _projection(bb, X, op.reshape(W, [D * G * H, In]), bias, gemm, target)
    args = [xw, _r_layout(bb, R, r_layout, D, G, H, spec.dtype)]
    for name in ("sequence_lens", "initial_h", "initial_c"):
        if spec.has(name) and (name != "initial_c" or "c" in cell.states):
            args.append(named[name])
    if cell.params:
        args.append(bb.emit(_params(spec, cell, named["P"], rb_cell)))
    return args


def _output_types(spec, cell, X) -> list:
    """Y, Y_h(, Y_c) as the kernel writes them (fp32), for X's seq and batch."""
    shape, H, D = X.ty.shape, spec.hidden_size, spec.num_directions
    seq, batch = (shape[0], shape[1]) if spec.layout == 0 else (shape[1], shape[0])
    y_shape = [seq, D, batch, H] if spec.layout == 0 else [batch, seq, D, H]
    s_shape = [D, batch, H] if spec.layout == 0 else [batch, D, H]
    return [relax.TensorType(y_shape, "float32")] + [relax.TensorType(s_shape, "float32")] * len(cell.states)


def _call(bb, func, name: str, args: list, outs: list) -> list:
    """call_tir of our kernel and its outputs, one expression each. The kernel is named rnn_<name> after the first
    layer that runs it: layers whose kernels are the same function (a stack's layers above the first: the kernel reads
    XW, not X, so the input size does not enter it) share one, built once (BlockBuilder.add_func finds it), where a
    name of each layer's own made them three functions to compile for resemblyzer's three LSTMs."""
    name = "rnn_" + "".join(c if c.isalnum() else "_" for c in name)
    gv = bb.add_func(func.without_attr("global_symbol"), name)
    res = bb.emit(relax.call_tir(gv, args, outs))
    return [bb.emit(relax.TupleGetItem(res, i)) for i in range(len(outs))]


def _storage_dtype(bb, spec, results: list) -> list:
    return [bb.emit(op.astype(r, spec.dtype)) for r in results] if spec.dtype != "float32" else results


def emit_rnn_stack(bb: relax.BlockBuilder, chain, gemm, first_inputs: list, states: list[dict], target,
                   joined=None) -> list:
    """Emit a chain of stacked layers (plan.ChainPlan) as one kernel (schedules.stack_kernel, as planned). The wavefront
    takes the first layer's inputs as its own kernel would (its projection as one GEMM: gemm), the block stack X and
    the first layer's constants as it takes every other layer's; then each layer above the first: its constants (the
    chain's members'), and its initial states (states: per member, ONNX input name -> Relax expr). first_inputs: the
    first node's Relax inputs in ONNX order (the layers above read its lengths). joined: where the kernel takes the
    layers' initial h as one tensor (StackKernel.joined_states), that tensor. Returns [[Y, Y_h(, Y_c)] per layer];
    the layers above the first project their input (the layer below's h) inside the kernel, step by step."""
    specs, kernel = list(chain.specs), chain.kernel
    cells = [cell_for(s) for s in specs]
    own_states = not kernel.joined_states
    if kernel.reads_x:
        named = dict(zip(("X", "W", "R", "B", "sequence_lens", "initial_h", "initial_c", "P"), first_inputs))
        args = [first_inputs[0]] + ([] if own_states else [_f32(joined)])
        args += _stacked_layer(bb, specs[0], cells[0], chain.head, named, own_states)
    else:
        assert _xw_dtype(kernel.func) == gemm.xw_dtype, (specs[0].name, gemm)
        args = _kernel_inputs(bb, specs[0], cells[0], first_inputs, target, "rows", gemm)
    for spec, cell, member, given in zip(specs[1:], cells[1:], chain.members, states):
        args += _stacked_layer(bb, spec, cell, member.constants, given, own_states)
    # every layer of a stack is unidirectional in layout 0: Y [seq, 1, batch, H] and states [1, batch, H], like the first's
    outs = [_output_types(spec, cell, first_inputs[0])[: None if own_states else 1] for spec, cell in zip(specs, cells)]
    joined_out = [] if own_states else [_joined_type(specs, first_inputs[0])]
    results = _call(bb, kernel.func, "stack_" + specs[0].name, args, [t for layer in outs for t in layer] + joined_out)
    per_layer, at = [], 0
    for i, (spec, layer) in enumerate(zip(specs, outs)):
        mine = results[at:at + len(layer)]
        if not own_states:  # its view of the joined final h: a concatenation of all of them folds back (fold_joined_states)
            mine = mine + [bb.emit(op.strided_slice(results[-1], axes=[0], begin=[i], end=[i + 1]))]
        per_layer.append(_storage_dtype(bb, spec, mine))
        at += len(layer)
    return per_layer


def _joined_type(specs, X) -> relax.TensorType:
    """The layers' final h as one tensor [layers, batch, H] (layout 0: X is [seq, batch, In])."""
    return relax.TensorType([len(specs), X.ty.shape[1], specs[0].hidden_size], "float32")


def _stacked_layer(bb, spec, cell, constants: dict, states: dict, own_states: bool = True) -> list:
    """A stacked layer's arguments (recurrent_common.KernelArgs.declare_inputs with stacked_rows): WR and the biases from
    its constants, its initial states (unless the kernel takes every layer's as one tensor), its per-unit parameters."""
    wr, bias, params = _stacked_weights(spec, cell, constants)
    wr = relax.const(wr)  # cast by Relax: numpy has no bfloat16 (FoldConstant folds it)
    args = [wr if spec.dtype == "float32" else bb.emit(op.astype(wr, spec.dtype)), relax.const(bias)]
    for name in ("initial_h", "initial_c"):
        if own_states and spec.has(name) and (name != "initial_c" or "c" in cell.states):
            args.append(_f32(states[name]))
    if params is not None:
        args.append(relax.const(params))
    return args


def _stacked_weights(spec, cell, w: dict):
    """A layer above a stack's first, as the wavefront kernel takes it (schedules.recurrent_wavefront), in fp32:
    WR [1, rows*H, I+H] (W's columns then R's per gate row; a GRU with linear_before_reset has its h gate as two rows,
    [W_h | 0] and [0 | R_h], since r multiplies R_h h alone), the biases its epilogue adds (Wb, plus Rb where it folds)
    and its per-unit parameters (peepholes, GRU's Rb_h) or None."""
    G, H, In = cell.gates, spec.hidden_size, spec.input_size
    W, R = w["W"].astype("float32").reshape(G * H, In), w["R"].astype("float32").reshape(G * H, H)
    wr = np.concatenate([W, R], axis=1)
    b = w["B"].astype("float32").reshape(2, G, H) if "B" in w else np.zeros((2, G, H), "float32")
    folded = np.zeros((G, 1), "float32")
    folded[list(cell.folded_rbias)] = 1
    if split_h(cell, False):
        wr[2 * H:3 * H, In:] = 0  # the h gate's row: its input part
        wr = np.concatenate([wr, np.concatenate([np.zeros((H, In), "float32"), R[2 * H:]], axis=1)])  # its recurrent part
    params = None
    if cell.params == ("Rb_h",):
        params = b[1, 2].reshape(1, 1, H)
    elif cell.params:
        params = w["P"].astype("float32").reshape(1, 3, H)
    return wr.reshape(1, -1, In + H), (b[0] + b[1] * folded).reshape(-1), params


def _params(spec, cell, P, rb_cell):
    """The cell's per-unit vectors as one [D, len(cell.params), H] tensor, in cell.params order."""
    D, H = spec.num_directions, spec.hidden_size
    if cell.params == ("Rb_h",):  # GRU with linear_before_reset: the h gate's recurrent bias
        if rb_cell is None:
            return relax.const(np.zeros((D, 1, H), "float32"))
        return op.strided_slice(rb_cell, axes=[1], begin=[2], end=[3])
    return op.reshape(P, [D, 3, H])  # LSTM peepholes, ONNX order i, o, f == cell.params order
