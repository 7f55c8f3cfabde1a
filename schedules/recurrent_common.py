"""The recurrent kernel's arguments and per-unit arithmetic, shared by every target's schedule.

One kernel runs a whole layer (all directions, the whole sequence). Its arguments:

    XW        [seq, batch, D*G*H]   input projection of all steps, foldable biases added
              ([batch, seq, ...] for layout 1; fp32, in CUDA kernels the layer's storage dtype)
    R         [D, G*H, H]           recurrent weights, ONNX's layout (GPU kernels: lanes read along k)
      or RT   [D, H, G*H]           transposed, gate rows contiguous
      or RP   [D, ceil(H/16), H, G, 16]   panels of 16 units, the last one padded with zero rows (CPU kernel:
                                    vectorizes along units, and a work item's weights are 16-unit streams running
                                    straight through memory)
    seq_lens  [batch] int32         when the node has sequence_lens
    h0, c0    [D, batch, H]         when the node has initial_h / initial_c ([batch, D, H] for layout 1)
    params    [D, NP, H]            the cell's per-unit vectors (peepholes, GRU's Rb_h)
  outputs:
    Y         [seq, D, batch, H]    ([batch, seq, D, H] for layout 1)
    Yh, Yc    [D, batch, H]         ([batch, D, H] for layout 1)

Layout 1 is handled by indexing, so no transposes run; padded steps (s >= seq_lens[n]) write
zeros to Y and carry the state; the reverse direction runs each sequence from its last valid
step backwards (ONNX Runtime's semantics).
"""

from __future__ import annotations

from dataclasses import dataclass, field

from tvm import tirx
from tvm.ir.expr import Expr as PrimExpr
from tvm.script.ir_builder import IRBuilder
from tvm.script.ir_builder import tirx as T

from .cells import Cell, Terms, apply_activation
from .layer import RNNLayerSpec

I64 = "int64"
PANEL = 16  # units per panel of the "panels" R layout: one 64-byte line of fp32


def panel_count(hidden: int) -> int:
    """Panels of the "panels" R layout: the last one is padded with zero rows where PANEL does not divide H."""
    return -(-hidden // PANEL)


def i64(v) -> PrimExpr:
    if isinstance(v, int):
        return tirx.IntImm(I64, v)
    return v if getattr(v, "dtype", None) == I64 else v.astype(I64)


@dataclass
class KernelArgs:
    """The kernel's buffers, declared as arguments of the PrimFunc being built, with layout-aware accessors."""

    spec: RNNLayerSpec
    cell: Cell
    seq: tirx.Var = field(default_factory=lambda: tirx.Var("seq", I64))
    batch: tirx.Var = field(default_factory=lambda: tirx.Var("batch", I64))
    max_batch: int | None = None  # the largest batch the branch being emitted runs (batch_dispatch), None: any
    # operand name ("h" or a stored value) -> its copy in half precision (half_operands), written beside the fp32 one
    mirrors: dict = field(default_factory=dict)
    # f16x3 (split_operands): operand name -> the low fp16 halves of its values times operand_scale, whose high halves
    # are its mirror
    split_mirrors: dict = field(default_factory=dict)
    # operand name -> (words, tag): where store_operand also publishes its values with their step's tag (schedules.step_sync),
    # set by the persistent kernel per step and phase
    published: dict = field(default_factory=dict)
    # operand name -> store(buf, idx, value): how store_operand stores it where a kernel stores it its own way (the cluster
    # kernel: into every CTA's shared memory, recurrent_cluster)
    shared: dict = field(default_factory=dict)
    operand_scale: PrimExpr | None = None

    def declare(self, r_layout: str, weight_dtype: str = "float32", xw_dtype: str = "float32"):
        """Everything is fp32 but R, which keeps the storage dtype (fp16/bf16 halve its bytes), and XW in xw_dtype (the
        CUDA kernels' is the storage dtype too: see xw); R in r_layout ("rows", "transposed" or "panels", as the module
        docstring lays them out)."""
        self.declare_inputs(r_layout, weight_dtype, xw_dtype=xw_dtype)
        self.declare_outputs()

    def declare_inputs(self, r_layout: str, weight_dtype: str = "float32", prefix: str = "", stacked_rows: int = 0,
                       xw_dtype: str = "float32", states: bool = True):
        """The inputs alone (a kernel of several layers declares every layer's inputs before any outputs, as call_tir
        passes them). stacked_rows: for a layer fed by the layer below it inside the kernel (recurrent_wavefront), its
        rows per unit: instead of XW it takes its input weights beside R, WR [D, rows*H, I+H] (W's columns, then R's),
        and the bias XW would carry. states=False: no initial-state arguments (the kernel declares them itself, e.g. a
        stack's views of one tensor of every layer's)."""
        dtype = "float32"
        s, H, G, D = self.spec, self.spec.hidden_size, self.cell.gates, self.spec.num_directions
        seq, n = self.seq, self.batch
        state_shape = (D, n, H) if s.layout == 0 else (n, D, H)
        self.r_layout = r_layout
        if stacked_rows:
            self.XW = None
            self.R = T.arg(prefix + "WR", T.Buffer((D, stacked_rows * H, s.input_size + H), weight_dtype))
            self.bias = T.arg(prefix + "bias", T.Buffer((D * G * H,), dtype))
        else:
            self.XW = T.arg(prefix + "XW", T.Buffer((seq, n, D * G * H) if s.layout == 0 else (n, seq, D * G * H), xw_dtype))
            if r_layout == "panels":
                self.RP = T.arg(prefix + "RP", T.Buffer((D, panel_count(H), H, G, PANEL), weight_dtype))
            elif r_layout == "transposed":
                self.RT = T.arg(prefix + "RT", T.Buffer((D, H, G * H), weight_dtype))
            else:
                self.R = T.arg(prefix + "R", T.Buffer((D, G * H, H), weight_dtype))
        self.seq_lens = T.arg(prefix + "seq_lens", T.Buffer((n,), "int32")) if s.has("sequence_lens") and not stacked_rows else None
        self.h0 = T.arg(prefix + "h0", T.Buffer(state_shape, dtype)) if s.has("initial_h") and states else None
        self.c0 = T.arg(prefix + "c0", T.Buffer(state_shape, dtype)) if s.has("initial_c") and "c" in self.cell.states and states else None
        self.params = T.arg(prefix + "params", T.Buffer((D, len(self.cell.params), H), dtype)) if self.cell.params else None

    def declare_outputs(self, prefix: str = "", states: bool = True):
        """Y, then Y_h (and Y_c) unless states=False (the kernel declares them itself)."""
        s, H, D, seq, n = self.spec, self.spec.hidden_size, self.spec.num_directions, self.seq, self.batch
        state_shape = (D, n, H) if s.layout == 0 else (n, D, H)
        self.Y = T.arg(prefix + "Y", T.Buffer((seq, D, n, H) if s.layout == 0 else (n, seq, D, H), "float32"))
        if states:
            self.Yh = T.arg(prefix + "Yh", T.Buffer(state_shape, "float32"))
            self.Yc = T.arg(prefix + "Yc", T.Buffer(state_shape, "float32")) if "c" in self.cell.states else None

    # -- index helpers (d, n, j, t are int64 PrimExprs) --
    def state_index(self, d, n, j):
        return [d, n, j] if self.spec.layout == 0 else [n, d, j]

    def xw_index(self, d, n, t, g, j):
        col = (d * self.cell.gates + g) * self.spec.hidden_size + j
        return [t, n, col] if self.spec.layout == 0 else [n, t, col]

    def xw(self, d, n, t, g, j):
        """XW's value for gate g of unit j, in fp32. A half-precision layer's XW may be stored in its dtype, as cuDNN
        keeps it: the GEMM writes half the bytes and each step reads half (blog-a fp16: 524 MB of fp32 XW), for one
        rounding of the gates' input term (2^-11 relative in fp16) before the fp32 gate math."""
        value = self.XW[tuple(self.xw_index(d, n, t, g, j))]
        return value if self.XW.dtype == "float32" else value.astype("float32")

    def y_index(self, d, n, t, j):
        return [t, d, n, j] if self.spec.layout == 0 else [n, t, d, j]

    def length(self, n):
        """Row n's valid steps, clamped to [0, seq]: a bad sequence_lens value can never index out of bounds."""
        if self.seq_lens is None:
            return self.seq
        return tirx.max(tirx.min(i64(self.seq_lens[n]), self.seq), i64(0))

    def time_index(self, d, n, s):
        """Position step s reads and writes for direction slot d (valid steps only)."""
        rev = self.spec.reverse_flags
        if len(rev) == 1:
            return self.length(n) - 1 - s if rev[0] else s
        return tirx.Select(d == i64(1), self.length(n) - 1 - s, s)  # bidirectional: slot 1 runs backwards

    def initial(self, name, d, n, j):
        buf = {"h": self.h0, "c": self.c0}[name]
        return buf[tuple(self.state_index(d, n, j))] if buf is not None else tirx.const(0.0, "float32")

    def param_index(self, name):
        return self.cell.params.index(name)

    def new_branch(self):
        """Forget the operand copies, published words and shared stores an earlier branch of the same PrimFunc set up:
        their buffers live in that branch, and a kind that keeps none must not write them."""
        self.mirrors, self.split_mirrors, self.operand_scale, self.published, self.shared = {}, {}, None, {}, {}


def direction_activation(args: KernelArgs, d, activation=apply_activation):
    """activate(k, pre): the cell's activation k of direction slot d (cells.Terms' activate)."""
    per_dir = args.spec.activations

    def activate(k, pre):
        if len(per_dir) == 1 or per_dir[0][k] == per_dir[1][k]:
            return activation(per_dir[0][k], pre)
        # a bidirectional node may give each direction its own functions: pick by slot
        return tirx.Select(d == i64(0), activation(per_dir[0][k], pre), activation(per_dir[1][k], pre))

    return activate


def unit_results(args: KernelArgs, phase, d, n, t, j, rec, state, value, activation=apply_activation, x=None,
                 activated=None) -> dict:
    """Evaluate one phase program for hidden unit j: returns name -> PrimExpr (nothing stored yet).

    rec(gi): the recurrent term of the phase's gi-th gate; state/value: name -> PrimExpr;
    activation(act, x): cells.apply_activation or a target's own formulation of it;
    x(gi): the input projection of the phase's gi-th gate where a kernel loaded it ahead (default: read XW here);
    activated: gate -> its Terms.gate, where a kernel computed it ahead.
    """
    activate = direction_activation(args, d, activation)
    gate_pos = {g: gi for gi, g in enumerate(phase.gates)}
    terms = Terms(
        x=(lambda g: args.xw(d, n, t, g, j)) if x is None else (lambda g: x(gate_pos[g])),
        rec=lambda g: rec(gate_pos[g]),
        state=state,
        param=lambda name: args.params[d, i64(args.param_index(name)), j],
        value=value,
        activate=activate,
        clip=args.spec.clip,
        activated=activated,
    )
    return phase.program(terms)


def carried_states(a: KernelArgs, hbuf, cur, d, n, j) -> dict:
    """The states unit j of row n carries into this step: h (hbuf's half cur) and, in a cell with one, c (in Yc)."""
    state = {"h": hbuf[cur, d, n, j]}
    if a.Yc is not None:
        state["c"] = a.Yc[tuple(a.state_index(d, n, j))]
    return state


def unit_values(a: KernelArgs, phase, hbuf, scratch, cur, d, n, t, j, rec, temps=None, x=None, activated=None,
                state=None) -> dict:
    """The results of one phase program for unit j that get stored: name -> PrimExpr (nothing stored yet). state: the
    carried states where the kernel loaded them ahead (default, or empty: read them here)."""
    state = state or carried_states(a, hbuf, cur, d, n, j)
    value = {v: buf[d, n, j] for v, buf in scratch.items()}
    res = unit_results(a, phase, d, n, t, j, rec, state, value, apply_activation if temps is None else temps.activation, x,
                       activated)
    return {k: v for k, v in res.items() if k in phase.stores or k in ("h", "c")}


def unit_step(a: KernelArgs, phase, hbuf, scratch, cur, nxt, d, n, t, j, rec, temps=None, x=None, activated=None,
              state=None):
    """Run one phase program for unit j of batch row n at position t and store its results.

    Everything is evaluated into registers before the first store, since the results read
    the old cell state that the stores overwrite. temps: None, or what a vectorized caller
    gives instead of a local buffer per call: temps.bind(value) stores value in the lane's own
    slot and returns its load; temps.activation(act, x) replaces cells.apply_activation.
    """
    res = unit_values(a, phase, hbuf, scratch, cur, d, n, t, j, rec, temps, x, activated, state)
    if temps is None:
        tmp = T.alloc_buffer((len(res),), "float32", scope="local")
        for i, v in enumerate(res.values()):
            T.buffer_store(tmp, v, [i64(i)])
        loaded = [tmp[i64(i)] for i in range(len(res))]
    else:
        loaded = [temps.bind(v) for v in res.values()]
    for k, v in zip(res, loaded):
        if k == "h":
            store_operand(a, "h", hbuf, v, [nxt, d, n, j])
            T.buffer_store(a.Y, v, a.y_index(d, n, t, j))
        elif k == "c":
            T.buffer_store(a.Yc, v, a.state_index(d, n, j))
        else:
            store_operand(a, k, scratch[k], v, [d, n, j])


def step_phases(a: KernelArgs, hbuf, scratch, body):
    """The time loop every recurrent kernel runs: for each step s (hbuf's half `cur` read, `nxt` written) and each phase
    of the cell, body(pi, phase, last, operand, s, cur, nxt), `operand` the vector the phase multiplies."""
    phases = a.cell.phases
    with T.serial(0, a.seq) as s:
        cur, nxt = s % 2, (s + 1) % 2
        for pi, phase in enumerate(phases):
            operand = hbuf if phase.operand == "h" else scratch[phase.operand]
            body(pi, phase, pi == len(phases) - 1, operand, s, cur, nxt)


def unit_padding(a: KernelArgs, hbuf, cur, nxt, d, n, s, j):
    """Step s is past row n's sequence: Y there is zero and the hidden state carries over."""
    store_operand(a, "h", hbuf, hbuf[cur, d, n, j], [nxt, d, n, j])
    T.buffer_store(a.Y, tirx.const(0.0, "float32"), a.y_index(d, n, s, j))


def load_xw_ahead(a: KernelArgs, phase, s, d, n, j, xw, slot: list):
    """Store the phase's gates' XW values for unit j of batch row n at step s into xw[slot + [gi]], ahead of the
    reduction they follow (the epilogue then reads them as x(gi)). Callers clamp n and j; a padded step of a reverse
    row points before the start, so t is clamped too: such a value is loaded and never used."""
    t = tirx.max(a.time_index(d, n, s), i64(0))
    for gi, g in enumerate(phase.gates):
        T.buffer_store(xw, a.xw(d, n, t, g, j), slot + [i64(gi)])


def half_operands(a: KernelArgs, dtype: str):
    """Copies in `dtype` of the vectors the phases multiply (h, double-buffered, and stored values such as GRU's r*h),
    which store_operand writes beside the fp32 ones. A tensor-core kernel in half precision rounds its B operand to
    `dtype` anyway, so reading these is bit-identical and moves half the bytes: at batch 20-64 every block reads all
    of h each step, the L2 traffic that bounds a step (64 x 1024 fp32 rows x 128 blocks = 33 MB per step)."""
    D, N, H = a.spec.num_directions, a.batch, a.spec.hidden_size
    for name in dict.fromkeys(p.operand for p in a.cell.phases):
        a.mirrors[name] = T.alloc_buffer((2, D, N, H) if name == "h" else (D, N, H), dtype)


def split_operands(a: KernelArgs):
    """f16x3 steps: the phases' operands kept beside the fp32 ones as the fp16 high and low halves of each value times
    a.operand_scale (schedules.split_halves), which store_operand writes once per value, so that the blocks that read
    them every step do not each split them again; the same bytes as fp32."""
    half_operands(a, "float16")
    for name, high in a.mirrors.items():
        a.split_mirrors[name] = T.alloc_buffer(high.shape, "float16")


def store_operand(a: KernelArgs, name: str, buf, value, idx):
    """Store an operand value (h or a stored value) and its half-precision copy, or its scaled halves, where the kernel
    keeps them, and its tagged word where the kernel publishes it; by the kernel's own store where it has one (a.shared)."""
    if name in a.shared:
        a.shared[name](buf, idx, value)
    else:
        T.buffer_store(buf, value, idx)
    if name in a.published:
        from .step_sync import publish

        words, tag = a.published[name]
        publish(words, idx, value, tag, a.spec.dtype)
    if name in a.split_mirrors:
        from .split_halves import halves_of

        high, low = halves_of(value * a.operand_scale)
        T.buffer_store(a.mirrors[name], high, idx)
        T.buffer_store(a.split_mirrors[name], low, idx)
    elif name in a.mirrors:
        T.buffer_store(a.mirrors[name], value.astype(a.mirrors[name].dtype), idx)


def recurrent_prim_func(spec: RNNLayerSpec, cell: Cell, r_layout: str, emit_body, weight_dtype="float32",
                        seq: int | None = None, batch: int | None = None, xw_dtype="float32") -> tirx.PrimFunc:
    """The recurrent PrimFunc every schedule builds: arguments as KernelArgs declares them, body from emit_body(a).
    lowering gives the projection GEMM XW's dtype from the PrimFunc's first argument.

    seq/batch: None keeps them symbolic (what modules export); numbers give the static-shape
    kernel a tuning task measures.
    """
    a = KernelArgs(spec, cell)
    if seq is not None:
        a.seq = tirx.IntImm(I64, seq)
    if batch is not None:
        a.batch = tirx.IntImm(I64, batch)
    with IRBuilder() as ib:
        with T.prim_func():
            T.func_name("rnn_recurrent")
            T.func_attr({"tirx.noalias": True})
            a.declare(r_layout, weight_dtype=weight_dtype, xw_dtype=xw_dtype)
            emit_body(a)
    return ib.get()


def projection_prim_func(name: str, x_dtype: str, K: int, cols: int, w_shape: tuple, emit_body, xw_dtype="float32",
                         scaled: bool = False) -> tirx.PrimFunc:
    """The input projection's PrimFunc(X [M, K], W w_shape, bias [cols] fp32, XW [M, cols] xw_dtype), M = seq * batch
    symbolic, X and W in `x_dtype`; the body from emit_body(X, W, bias, XW, M). Every target's GEMM has this signature
    (XW fp32 but in the tensor-core GEMMs of half-precision layers, which may store it in their dtype), but for the
    scaled halves of exact fp32 on fp16 tensor cores (schedules.split_halves): PrimFunc(X [M, 2K], x_scale [M] fp32,
    W w_shape, w_scale [cols] fp32, bias, XW), the body from emit_body(X, W, bias, XW, M, (x_scale, w_scale))."""
    M = tirx.Var("M", I64)
    with IRBuilder() as ib:
        with T.prim_func():
            T.func_name(name)
            T.func_attr({"tirx.noalias": True, "tirx.is_scheduled": True})
            X = T.arg("X", T.Buffer((M, 2 * K if scaled else K), x_dtype))
            x_scale = T.arg("x_scale", T.Buffer((M,), "float32")) if scaled else None
            W = T.arg("W", T.Buffer(w_shape, x_dtype))
            w_scale = T.arg("w_scale", T.Buffer((cols,), "float32")) if scaled else None
            bias = T.arg("bias", T.Buffer((cols,), "float32"))
            XW = T.arg("XW", T.Buffer((M, cols), xw_dtype))
            emit_body(X, W, bias, XW, M, *([(x_scale, w_scale)] if scaled else []))
    return ib.get()


def emit_if(cond, body, always: bool = False):
    """body() inside `if cond`, or plainly where `always` says the condition holds at compile time."""
    if always:
        body()
        return
    with T.If(cond):
        with T.Then():
            body()


def guarded(k, size: int, exact: bool, load, dtype):
    """load(k), or zero past `size` (a partial last chunk; k clamped so the address stays in bounds)."""
    if exact:
        return load(k)
    return tirx.if_then_else(k < i64(size), load(tirx.min(k, i64(size - 1))), tirx.const(0, dtype))


def each_element(total, body, threads: int = 256):
    """A launch of one thread per element: body(e) for e in [0, total) (int64, total may be symbolic)."""
    with T.thread_binding(0, tirx.ceildiv(total, i64(threads)), "blockIdx.x") as bx:
        with T.thread_binding(0, i64(threads), "threadIdx.x") as tx:
            e = bx * i64(threads) + tx
            with T.If(e < total):
                with T.Then():
                    body(e)


def shared_dyn(shape, dtype: str):
    """A buffer in dynamic shared memory, named for its dtype: a module's kernels share one translation unit, where two
    kernels' extern shared arrays of one name (TVM names an unnamed one _ptr_1) but other types do not compile."""
    return IRBuilder.name(f"smem_{dtype}", T.alloc_buffer(shape, dtype, scope="shared.dyn"))


STORE = "tvmrnn_shared_store"
STORE_SRC = f"__forceinline__ __device__ void {STORE}(float* p, float v) {{ *p = v; }}"


def store_unseen(buf, idx, value):
    """A plain fp32 store into shared memory behind a call: TVM's barrier planner neither sees it nor adds __syncthreads
    for it (which it cannot place inside a step's conditions). For kernels whose own barriers order such writes."""
    T.evaluate(T.cuda.func_call(STORE, tirx.address_of(buf[tuple(idx)]), value, source_code=STORE_SRC))


def block_sync():
    """__syncthreads(): the block's shared-memory writes are visible to all its threads."""
    T.evaluate(tirx.op.tvm_storage_sync("shared"))


def batch_dispatch(a: KernelArgs, branches):
    """Emit `if batch <= b0: e0(a) elif batch <= b1: e1(a) ... else: en(a)` over (max_batch, emit) pairs, or at a static
    batch only the branch that runs it. Each branch starts afresh (KernelArgs.new_branch)."""
    (limit, emit), rest = branches[0], branches[1:]
    a.new_branch()
    a.max_batch = limit if rest else None
    if isinstance(a.batch, tirx.IntImm) and rest and (limit is None or int(a.batch) > limit):
        batch_dispatch(a, rest)  # a static batch builds the one branch that runs it
        return
    if limit is None or not rest or isinstance(a.batch, tirx.IntImm):
        emit(a)
        return
    with T.If(a.batch <= tirx.IntImm(I64, limit)):
        with T.Then():
            emit(a)
        with T.Else():
            batch_dispatch(a, rest)
