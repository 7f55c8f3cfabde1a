"""The layers around the recurrent ones on CPUs: convolutions and dense layers as register-blocked kernels, the rest
parallel and vectorized.

TVM 0.27 schedules nothing on LLVM targets by default (dlight's CPU rules cover GEMV and row reductions), so a
legalized conv2d or matmul runs as naive single-threaded loops. Here:
- `conv2d_packed` / `dense_packed` are TE computes over weights packed at compile time so that a vector of
  output channels (conv) or columns (dense) is contiguous: W[O/OB, I, KH, KW, OB] and W[N/NB, K, NB]; grouped convs
  (depthwise ones: OB = 1) take blocks of one group's channels, a conv strided along the columns reads its input
  split into the stride's phases (so that a vector of output columns is a contiguous load), a transposed conv is
  conv2d_packed over its input spread by the strides, and a grouped linear layer (an einsum) is dense_packed with one
  group's B per column tile;
- the rules `ConvPacked` and `DensePacked` schedule them (and the pointwise ops FuseOps fused after them) as a
  register tile of accumulators (OB channels x XB output columns, or MR rows x NB columns) that stays in registers
  while the reduction streams, the tiles spread over TVM's thread pool, the epilogue applied per tile. The computes
  choose the tile (conv_tiling, dense_row_tile) and cover whole tiles, zero-padding the input where a symbolic or
  awkward width or row count does not divide, so that no tile carries a bounds check;
- `Fallback` gives every other unscheduled function parallel outer loops (and leaves inner loops to LLVM's
  vectorizer), so pooling, pads, transposes and pointwise chains use every core;
- `run_time_parallel` keeps a function whose work only the run knows (a symbolic dim) off the thread pool where
  that work is too small to pay for it, and `vector_tails` leaves the bounds test of a tile split off a symbolic
  extent to the last tile.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import tvm
import tvm.script
import tvm_ffi
from tvm import s_tir, te, tirx
from tvm.s_tir.dlight.base import ScheduleRule
from tvm.target.codegen import llvm_get_vector_width

from .device import MIN_PARALLEL_WORK, parallel_pays

CONV_BLOCK, DENSE_BLOCK = "conv2d_packed", "dense_packed"
PADDED_INPUTS = ("spread_input", "pad_temp", "phase_split")  # the stages that lay a conv's input out (in order)
# A register tile's accumulators: a "global"-scope buffer under 1 KB (runtime::kMaxStackAlloca), which TVM's lowering
# puts on the stack, where LLVM keeps it in registers. TVM puts "local" buffers, and larger ones, on the heap
# (TVMBackendAllocWorkspace), where LLVM may store every accumulator back at each step of the reduction: the dense
# head of the captcha CRNN ran 2.4x slower so over a symbolic row count.
TILE_SCOPE, TILE_FLOATS = "global", 1024 // 4 - 1
MIN_PARALLEL_BLOCKS = 8  # GEMM column blocks that keep the thread pool busy without splitting the rows
# input channels from which a conv's channel blocks run innermost, under each row's column tile: the input rows a tile
# reads are then reused from L1 by every block, where with the blocks outermost DeepFilterNet's 1x1 64 -> 64 conv
# re-read its 1.2 MB input from L3 once per block; over fewer channels the blocks outermost write one block's outputs
# in order (ddddocr's 24 -> 24 1x1 conv ran faster so)
WIDE_INPUT = 32
ROWS_LAID_OUT = 3  # the most window rows for which a conv on the thread pool lays its padded input out row by row


def vector_lanes(target, dtype_bits=32) -> int:
    bits = llvm_get_vector_width(target) if target.kind.name == "llvm" else 128
    return max((bits if bits > 0 else 128) // dtype_bits, 4)


def channel_block(channels: int, lanes: int) -> int:
    """Output channels per conv tile: three vectors where they divide the channels (48: 3 x 5 accumulators, each input
    value broadcast to three vectors of weights, 15 of the 32 registers), else two, else the largest power of two
    that does."""
    return next(b for b in (3 * lanes, 2 * lanes, lanes, 8, 4, 2, 1) if channels % b == 0)


def conv_channel_block(channels: int, lanes: int) -> int:
    """Output channels per packed block of a conv2d: all of them where they are narrower than a vector (a group's 5
    output channels tile as 5 x NV vectors of columns, not 1 x NV), else channel_block's."""
    return channels if channels < lanes else channel_block(channels, lanes)


def pack_conv_weight(w: np.ndarray, ob: int) -> np.ndarray:
    """OIHW -> [O/ob, I, KH, KW, ob]."""
    o, i, kh, kw = w.shape
    return np.ascontiguousarray(w.reshape(o // ob, ob, i, kh, kw).transpose(0, 2, 3, 4, 1))


def dense_block(columns: int, lanes: int) -> int:
    """Columns per GEMM tile: two vectors, or one (or fewer) for narrower outputs; the packed weight is padded to whole
    tiles (8210 classes would otherwise be tiles of 2 columns)."""
    return 2 * lanes if columns >= 2 * lanes else lanes if columns >= lanes else channel_block(columns, lanes)


def padded_channel_block(channels: int, lanes: int) -> int:
    """Output channels per conv tile where the packed weight may end in zero channels: channel_block's unless it is
    under half a vector (258 channels: 129 tiles of 2), then two vectors where that pads at most an eighth more
    channels (more accumulators for narrow outputs), else one."""
    block = channel_block(channels, lanes)
    if 2 * block >= lanes or channels < lanes:
        return block
    return 2 * lanes if -channels % (2 * lanes) <= channels // 8 else lanes


def pack_conv1d_weight(w: np.ndarray, ob: int) -> np.ndarray:
    """OIW -> [ceil(O/ob), I, KW, ob], zero channels past O."""
    o, i, kw = w.shape
    padded = np.zeros((-(-o // ob) * ob, i, kw), w.dtype)
    padded[:o] = w
    return np.ascontiguousarray(padded.reshape(-1, ob, i, kw).transpose(0, 2, 3, 1))


def pack_dense_weight(w: np.ndarray, nb: int) -> np.ndarray:
    """B [K, N] of x @ B -> [ceil(N/nb), K, nb], zero columns past N; a grouped B [G, K, N] -> each group's packed in
    turn, [G * ceil(N/nb), K, nb]."""
    if w.ndim == 3:
        return np.concatenate([pack_dense_weight(g, nb) for g in w])
    k, n = w.shape
    padded = np.zeros((k, -(-n // nb) * nb), w.dtype)
    padded[:, :n] = w
    return np.ascontiguousarray(padded.reshape(k, -1, nb).transpose(1, 0, 2))


@dataclass(frozen=True)
class ConvTiling:
    """A conv tile: `channels` output channels x `columns` output columns, the vector along the columns (a row's
    outputs, loaded straight from the input row) or along the channels (the packed weights' inner axis)."""

    channels: int
    columns: int
    vector_columns: bool

    def attrs(self) -> dict:
        return {"tile_channels": self.channels, "tile_columns": self.columns, "vector_columns": int(self.vector_columns)}


def conv_tiling(width, ob: int, lanes: int, stride: int) -> ConvTiling:
    """The tile for an output row of `width` columns (an int or symbolic) and weights packed by `ob` channels.
    Where the width is whole vectors or `ob` is narrower than one (24 channels under AVX-512), a tile is OC channels x
    whole vectors of columns (loaded straight from the input row, or from one phase of a strided conv's), each weight
    broadcast (_column_tile); otherwise OB channels (a vector of the packed weights) x XB columns, each input value
    broadcast. The columns are padded to whole tiles (_packed_conv) wherever the width does not divide, so no tile
    carries a bounds check."""
    static = _static(width)
    whole_vectors = static is not None and static % lanes == 0
    if ob < lanes or whole_vectors:
        return _column_tile(static // lanes if whole_vectors else 1, ob, lanes)
    vectors = max(1, ob // lanes)  # accumulators: vectors x xb of the 32 (AVX-512) or 16 vector registers
    most = max(2, min((24 if lanes >= 16 else 12) // vectors, TILE_FLOATS // ob))
    return ConvTiling(ob, most if static is None else _balanced_tile(static, most), False)


def _column_tile(row_vectors: int, ob: int, lanes: int) -> ConvTiling:
    """OC channels (dividing ob) x NV vectors of columns (dividing a row's `row_vectors`), the accumulators at most 12
    (of AVX-512's 32 registers; 8 of AVX2's 16) and within TILE_FLOATS, the most multiply-adds per load: a step of
    the reduction loads NV vectors and broadcasts OC weights for OC x NV multiply-adds (4 x 3 where a row is a
    multiple of 3 vectors, 4 x 2 or 8 x 1 otherwise)."""
    most = 12 if lanes >= 16 else 8
    shapes = [(oc, nv) for oc in range(ob, 0, -1) for nv in (6, 5, 4, 3, 2, 1)
              if ob % oc == 0 and row_vectors % nv == 0 and oc * nv <= most and oc * nv * lanes <= TILE_FLOATS]
    oc, nv = max(shapes, key=lambda t: (t[0] * t[1] / (t[0] + t[1]), t[1]))
    return ConvTiling(oc, nv * lanes, True)


def _balanced_tile(extent: int, most: int) -> int:
    """Columns per tile for a static extent: a divisor in [2/3 most, most] where there is one (no padding), else the
    extent split into the fewest tiles of at most `most`, as even as padding to whole tiles allows."""
    if extent <= most:
        return extent
    divisor = next((t for t in range(most, -(-2 * most // 3) - 1, -1) if extent % t == 0), None)
    return divisor or -(-extent // -(-extent // most))


def _static(extent):
    """An extent's value where it is a constant, else None."""
    return int(extent) if isinstance(extent, (int, tirx.IntImm)) else None


def _whole_tiles(extent, tile: int):
    """extent rounded up to whole tiles (the same expression where it already divides)."""
    if _static(extent) is not None and _static(extent) % tile == 0:
        return extent
    return tvm.sym.Analyzer().simplify((extent + tile - 1) // tile * tile)


def _packed_conv(x, wp, strides, pads_before, pads_after, dilation, lanes, channels=None, groups: int = 1):
    """The conv over packed weights with as many spatial axes as x has after (n, c): the padded input, the
    accumulation over whole column tiles, and the output cropped to its true width where the tiles overhang it, and to
    `channels` where the packed weight ends in zero channels. With groups, wp's input channels are a group's and OB
    divides a group's output channels, so a tile of OB channels reads one group's inputs (depthwise: OB = 1).
    A conv strided along the columns whose tile is a vector of columns reads its input split into the stride's
    phases (_phase_split_input): each output vector then loads consecutive values of one phase."""
    n, _, *size = x.shape
    ob_count, c, *kernel, ob = wp.shape
    channel = _group_channel(ob_count, c, ob, groups)
    simplify = tvm.sym.Analyzer().simplify
    out = [simplify((s + b + a - (k - 1) * d - 1) // st + 1)
           for s, b, a, k, d, st in zip(size, pads_before, pads_after, kernel, dilation, strides)]
    stride, step = int(strides[-1]), int(dilation[-1])
    tiling = conv_tiling(out[-1], int(ob), lanes, stride)
    phased = stride > 1 and tiling.vector_columns
    width = _whole_tiles(out[-1], tiling.columns)
    extents = [(o - 1) * st + (k - 1) * d + 1 for o, st, k, d in zip([*out[:-1], width], strides, kernel, dilation)]
    # where only the last tile's overhang leaves the input, no padded copy: a tile of channels, which reads each input
    # value alone (broadcast), clamps that column into x (the outputs it makes are cropped); a tile of a vector of
    # columns over a symbolic width reads x under a likely test of the column, which LoopPartition (vector_tails)
    # leaves to the last tile (ddddocr's 24 -> 24 1x1 conv 20 -> 17 us; the clamp is 8% faster on tiles of channels)
    overhang_only = (not phased and not any(_padded_axes(x, pads_before[:-1], extents[:-1]))
                     and _static(pads_before[-1]) == 0 and _static(pads_after[-1]) == 0)
    tested = overhang_only and tiling.vector_columns and _static(size[-1]) is None
    clamped = overhang_only and not tiling.vector_columns
    if phased:
        padded = _phase_split_input(x, pads_before, extents[:-1], width + (int(kernel[-1]) - 1) * step // stride, stride)
    else:
        padded = x if clamped or tested else _padded_input(x, pads_before, extents)
    reduce = [te.reduce_axis((0, c), "rc")] + [te.reduce_axis((0, k), f"r{i}") for i, k in enumerate(kernel)]

    def body(b, o, *pos):
        at = [p * st + r * d for p, st, r, d in zip(pos[:-1], strides, reduce[1:], dilation)]
        col = reduce[-1] * step
        at += [col % stride, pos[-1] + col // stride] if phased else [pos[-1] * stride + col]
        if clamped:
            at[-1] = tirx.min(at[-1], size[-1] - 1)
        value = padded[(b, channel(o, reduce[0]), *at)]
        if tested:
            value = tirx.if_then_else(tirx.likely(at[-1] < size[-1]), value, tirx.const(0.0, x.dtype))
        return te.sum(value * wp[(o // ob, reduce[0], *reduce[1:], o % ob)], axis=reduce)

    conv = te.compute((n, ob_count * ob, *out[:-1], width), body, name=CONV_BLOCK, attrs=tiling.attrs())
    channels = ob_count * ob if channels is None else tirx.const(int(channels), str(ob_count.ty))  # int64 from Relax
    if width is out[-1] and _static(channels) == _static(ob_count * ob):
        return conv
    return te.compute((n, channels, *out), lambda *i: conv(*i), name="conv_crop")


def _padded_input(x, before, extents):
    """x zero-padded to the spatial `extents` the conv reads (its padding, and the columns its last tile overhangs),
    `before` of them ahead of x's; x itself where that is no padding at all."""
    padded = _padded_axes(x, before, extents)
    if not any(padded):
        return x

    def value(b, ch, *pos):
        return _inside_or_zero(x, b, ch, [p - lo for p, lo in zip(pos, before)], padded)

    return te.compute((*x.shape[:2], *extents), value, name="pad_temp")


def _phase_split_input(x, before, row_extents, phase_columns, stride: int):
    """x zero-padded as _padded_input's, its columns split into the stride's phases: [n, c, *rows, stride,
    phase_columns], phase q's column j the padded input's column j * stride + q."""
    padded = [*_padded_axes(x, before[:-1], row_extents), True]

    def value(b, ch, *pos):
        *rows, q, j = pos
        return _inside_or_zero(x, b, ch, [p - lo for p, lo in zip([*rows, j * stride + q], before)], padded)

    return te.compute((*x.shape[:2], *row_extents, stride, phase_columns), value, name="phase_split")


def _padded_axes(x, before, extents) -> list:
    """Per spatial axis, whether reading it over `extents` from `before` ahead of x can leave x."""
    analyzer = tvm.sym.Analyzer()
    return [_static(b) != 0 or not analyzer.can_prove(e <= s) for b, e, s in zip(before, extents, x.shape[2:])]


def _inside_or_zero(x, b, ch, at, padded):
    """x[b, ch, *at] where `at` lies inside x along the `padded` axes (the others need no test), else zero."""
    tests = [tirx.all(p >= 0, p < s) for p, s, pad in zip(at, x.shape[2:], padded) if pad]
    return tirx.if_then_else(tirx.all(*tests), x[(b, ch, *at)], tirx.const(0.0, x.dtype))


def _group_channel(ob_count, group_channels, ob, groups: int):
    """(output channel o, a group's input channel c) -> the input channel read: c for one group, else c of o's group,
    found from o's channel block (o // OB, the index the packed weight is read by) so that it stays one value across
    the OB channels of a tile."""
    if groups == 1:
        return lambda o, c: c
    blocks_per_group = int(ob_count) // groups
    return lambda o, c: o // ob // blocks_per_group * group_channels + c


def conv2d_packed(x: te.Tensor, wp: te.Tensor, strides, padding, dilation, lanes: int, groups: int = 1) -> te.Tensor:
    """NCHW conv2d over packed weights: out[n, o, y, x] = sum_{c,ry,rx} pad(x)[n, g(o)*C + c, y*sh+ry*dh, x*sw+rx*dw] *
    wp[o/OB, c, ry, rx, o%OB], C a group's input channels (all of them in one group), g(o) output channel o's group."""
    pt, pl, pb, pr = padding
    return _packed_conv(x, wp, strides, [pt, pl], [pb, pr], dilation, lanes, groups=groups)


def transposed_conv_weight(w: np.ndarray, groups: int) -> np.ndarray:
    """A transposed conv's weight [I, O/groups, KH, KW] as the equivalent conv's over the spread input: OIHW
    [O, I/groups, KH, KW], each group's in and out channels swapped and the window flipped."""
    i, og, kh, kw = w.shape
    ig = i // groups
    per_group = w.reshape(groups, ig, og, kh, kw).transpose(0, 2, 1, 3, 4)[..., ::-1, ::-1]
    return np.ascontiguousarray(per_group.reshape(groups * og, ig, kh, kw))


def conv2d_transpose_packed(x: te.Tensor, wp: te.Tensor, strides, padding, output_padding, dilation, lanes: int,
                            groups: int) -> te.Tensor:
    """NCHW conv2d_transpose as conv2d_packed over its input spread by the strides (zeros between the values) and
    padded by dilation * (K - 1) - padding on each side (plus output_padding after), with the weight of
    transposed_conv_weight, packed. Every pad must come out >= 0 (padding <= dilation * (K - 1))."""
    n, c, h, w = x.shape
    (sh, sw), (dh, dw) = strides, dilation
    kh, kw = int(wp.shape[2]), int(wp.shape[3])
    pt, pl, pb, pr = padding
    top, left = dh * (kh - 1) - pt, dw * (kw - 1) - pl
    bottom, right = dh * (kh - 1) - pb + output_padding[0], dw * (kw - 1) - pr + output_padding[1]
    assert min(top, left, bottom, right) >= 0, (padding, dilation, (kh, kw))

    def spread(b, ch, y, xx):
        iy, ix = y - top, xx - left
        inside = tirx.all(iy >= 0, ix >= 0, iy % sh == 0, ix % sw == 0, iy // sh < h, ix // sw < w)
        return tirx.if_then_else(inside, x[b, ch, tirx.max(iy, 0) // sh, tirx.max(ix, 0) // sw], tirx.const(0.0, x.dtype))

    spread_shape = (n, c, (h - 1) * sh + 1 + top + bottom, (w - 1) * sw + 1 + left + right)
    return _packed_conv(te.compute(spread_shape, spread, name="spread_input"), wp, [1, 1], [0, 0], [0, 0], dilation,
                        lanes, groups=groups)


def conv1d_packed(x: te.Tensor, wp: te.Tensor, stride: int, padding, dilation: int, lanes: int, channels=None) -> te.Tensor:
    """NCW conv1d over packed weights [O/OB, I, KW, OB] (groups 1), the same block as conv2d_packed's less the row axis
    (silero's STFT front end and encoder): out[n, o, x] = sum_{c,rx} pad(x)[n, c, x*s+rx*d] * wp[o/OB, c, rx, o%OB].
    channels: the real output channels where the packed weight ends in zero ones (padded_channel_block)."""
    return _packed_conv(x, wp, [stride], [padding[0]], [padding[1]], [dilation], lanes, channels)


def dense_row_tile(rows, nb: int, lanes: int) -> int:
    """Rows per GEMM tile: MR x NB accumulators fill about 16 vector registers, at most 8 rows."""
    most = max(1, min(8, 16 * lanes // max(nb, 1), TILE_FLOATS // max(nb, 1)))
    return most if _static(rows) is None else _balanced_tile(_static(rows), most)


def dense_packed(x: te.Tensor, wp: te.Tensor, columns: int, lanes: int, groups: int = 1) -> te.Tensor:
    """x [..., K] @ B [K, columns], B packed [N/NB, K, NB] (padded): one GEMM over the rows of all leading dims and
    every packed column (a 2-D block the rule tiles in whole tiles of MR rows: the rows are padded with zeros where
    they do not divide), then the output's shape and columns. With groups (a grouped linear layer, out[..., g, :] =
    x[..., g, :] @ B[g]): x [..., G, K], B [G, K, columns] packed group after group, out [..., G, columns]; a column
    tile lies in one group, whose row of x it reads."""
    nb_count, k_dim, nb = wp.shape
    lead = tuple(x.shape[:-1] if groups == 1 else x.shape[:-2])
    per_group = int(nb_count) // groups
    # the dims that make rows: leading dims of extent 1 (DeepFilterNet's batch before its frames) add none, and row m
    # reads them at 0, so that one such dim and a symbolic one are one symbolic dim, not a product
    spans = [d for d in lead if _static(d) != 1]
    rows = 1
    for d in spans:
        rows = rows * d
    rows = tvm.sym.Analyzer().simplify(rows)
    mr = dense_row_tile(rows, int(nb), lanes)
    # rows padded to whole tiles where their count is static or one symbolic dim, with zeros; over a product of
    # symbolic dims only (g2p-en's batch x length) the GEMM reads x itself, the rows past the end reading the last one
    # again (a bounds check in the last tile ran g2p-en's 30 x 256 x 74 head 2.4x slower). Over a product of static
    # and symbolic dims (madmom's batch x 10 frames, either order) TVM refuses both paddings (the rows the output
    # reads, i * 10 + j, are not proven written); there the last tile is bounds-checked
    one_dim = len(spans) <= 1
    clamped = _static(rows) is None and not one_dim and all(_static(d) is None for d in spans)
    padded_rows = _whole_tiles(rows, mr) if _static(rows) is not None or one_dim or clamped else rows
    k = te.reduce_axis((0, k_dim), "k")

    outermost = next((i for i, d in enumerate(lead) if _static(d) != 1), None)

    def row_of(m):  # the leading indices of row m (no modulo by the outermost span: a symbolic one would read as opaque)
        idx = []
        for i in reversed(range(len(lead))):
            if i == outermost or _static(lead[i]) == 1:
                idx.append(m if i == outermost else 0)
            else:
                idx.append(m % lead[i])
                m = m // lead[i]
        return tuple(reversed(idx))

    inner = (groups, k_dim) if groups > 1 else (k_dim,)  # a row of the GEMM's input: a group's K values each
    if padded_rows is rows:  # x read in place (a copy first where a row's indices take a division)
        a = te.compute((rows, *inner), lambda m, *kk: x[row_of(m) + kk], name="dense_input") if len(spans) > 1 else None
    elif not clamped:
        a = te.compute((padded_rows, *inner), lambda m, *kk: tirx.if_then_else(m < rows, x[row_of(m) + kk], tirx.const(0.0, x.dtype)),
                       name="dense_input")
    else:
        a = None  # the GEMM reads x itself, at the last row past the end

    def a_at(m, n):
        kk = (k,) if groups == 1 else (n // nb // per_group, k)
        return x[row_of(tirx.min(m, rows - 1) if clamped else m) + kk] if a is None else a[(m, *kk)]

    gemm = te.compute((padded_rows, nb_count * nb), lambda m, n: te.sum(a_at(m, n) * wp[n // nb, k, n % nb], axis=k),
                      name=DENSE_BLOCK, attrs={"tile_rows": mr})
    if groups == 1 and len(lead) == 1 and padded_rows is rows and int(nb_count) * int(nb) == columns:
        return gemm

    def back(*i):
        m = 0
        for d, v in zip(lead, i[:len(lead)]):
            m = m if _static(d) == 1 else m * d + v
        return gemm[m, (i[-2] * (per_group * nb) if groups > 1 else 0) + i[-1]]

    return te.compute(lead + ((groups,) if groups > 1 else ()) + (columns,), back, name="dense_rows")


def _main_and_epilogue(sch: s_tir.Schedule, name: str):
    """The named compute block and the one block its results leave through: the pointwise blocks after it are
    inlined into the last, or a write-back block is made where there are none. None where the function is another shape."""
    blocks = sch.get_child_blocks(sch.get_sblock("root"))
    names = [sch.get(b).name_hint for b in blocks]
    if name not in names:
        return None
    at = names.index(name)
    main, after = blocks[at], blocks[at + 1:]
    try:
        for b in after[:-1]:
            sch.compute_inline(b)
    except Exception:  # an epilogue that does not inline (a reduction, a broadcast the other way)
        return None
    return main, (after[-1] if after else sch.cache_write(main, 0, "global"))


class ConvPacked(ScheduleRule):
    """conv2d_packed / conv1d_packed: the tile its compute chose (conv_tiling) per (image, row, column tile, channel
    block), the pointwise epilogue applied to each tile from registers; the padded input (or its phase split) a
    parallel pass before. With `pool` off, scheduled for the calling thread (run_time_parallel's copy for the work
    that does not pay for the pool)."""

    block = CONV_BLOCK

    def __init__(self, pool: bool = True):
        self.pool = pool

    def apply(self, func, target, _tunable):
        if not isinstance(func, tirx.PrimFunc) or target.kind.name != "llvm":
            return None
        sch = s_tir.Schedule(func)
        found = _main_and_epilogue(sch, self.block)
        if found is None:
            return None
        outer = self.schedule(sch, *found, vector_lanes(target))
        inputs = [b for b in sch.get_child_blocks(sch.get_sblock("root")) if sch.get(b).name_hint in PADDED_INPUTS]
        for block in reversed(inputs):  # the stage next to the conv first: the one before it reads under the same loop
            if outer is not None:
                _padded_input_under(sch, block, outer)
            else:
                _schedule_padded_input(sch, block)
        _schedule_rest(sch, exclude={self.block, sch.get(found[1]).name_hint, *PADDED_INPUTS})
        return sch

    def schedule(self, sch, conv, out, lanes: int):
        """The tiles (_conv_tile); returns the loop the conv's input stages are computed under, or None."""
        a = sch.get(conv).annotations  # the tile conv_tiling chose when the compute was made
        return _conv_tile(sch, conv, out, int(a["tile_channels"]), int(a["tile_columns"]), bool(int(a["vector_columns"])), lanes,
                          self.pool)


def _conv_tile(sch, conv, out, oc, xc, columns_vector: bool, lanes: int, pool: bool = True):
    """Tiles of oc channels x xc output columns, the conv's accumulators for a tile computed under it and the
    epilogue applied from them; the vector axis is the columns (in vectors of `lanes`) or the channels (whose
    accumulators are then laid out channels-innermost). Over a wide input (WIDE_INPUT channels and more), a symbolic
    row count or an input laid out padded for a conv on the thread pool the tiles run per (image, row, column tile,
    channel block), the rows on the thread pool, so that a tile's input columns stay in L1 across the channel blocks
    (and the padded rows are laid out under the row loop); over a narrow one per (image, channel block, row, column
    tile), one block's outputs written in order. A conv1d is the same without rows."""
    pays = pool and parallel_pays(_work(sch, conv))
    in_channels, *window = [iv.dom.extent for iv in sch.get(conv).iter_vars if iv.iter_type == tirx.IterVar.CommReduce]
    n, o, *rows, x = sch.get_loops(out)
    # a row of tiles lays out the KH padded rows it reads: KH times the rows in all, where KH <= ROWS_LAID_OUT
    # (DeepFilterNet3's grouped 5x1 conv: 90 -> 158 us laid out so, its own pass kept)
    laid_out = (pays and any(r.source.name in PADDED_INPUTS for r in sch.get(conv).reads)
                and (not rows or int(window[0]) <= ROWS_LAID_OUT))
    # blocks fused with a symbolic row count fail TVM's reduction checks for grouped convs: blocks inner there
    blocks_inner = int(in_channels) >= WIDE_INPUT or laid_out or any(_static(sch.get(r).extent) is None for r in rows)
    oo, oi = sch.split(o, [None, oc])
    xo, xi = sch.split(x, [None, xc])
    tile = [n, *rows, xo, oo] if blocks_inner else [n, oo, *rows, xo]
    if columns_vector:
        xv, xl = sch.split(xi, [None, min(xc, lanes)])
        sch.reorder(*tile, oi, xv, xl)
        unrolled, vec = [oi, xv], xl
    else:
        ov, ol = sch.split(oi, [None, min(oc, lanes)])
        sch.reorder(*tile, xi, ov, ol)
        unrolled, vec = [xi, ov], ol
    outer = sch.fuse(*tile[:-2]) if blocks_inner else sch.fuse(*tile[:-1])
    if pays:
        sch.parallel(outer)
    sch.vectorize(vec)
    for loop in unrolled:
        sch.unroll(loop)
    if not columns_vector:
        _staged_store(sch, out, tile[-1])
    sch.compute_at(conv, tile[-1], preserve_unit_loops=True)
    sch.set_scope(conv, 0, TILE_SCOPE)
    if not columns_vector:
        sch.transform_layout(conv, ("write", 0), lambda b, o, *yx: (b, *yx, o))
    reduce_axes = len(sch.get(conv).iter_vars) - 3 - len(rows)  # (c, ry, rx) or (c, rx)
    cn, co, *cy, cx = sch.get_loops(conv)[-(3 + len(rows) + reduce_axes):-reduce_axes]
    reduction = sch.get_loops(conv)[-reduce_axes:]
    if columns_vector:
        cxv, cxl = sch.split(cx, [None, min(xc, lanes)])
        cunrolled, cvec = [co, cxv], cxl
    else:
        cov, col = sch.split(co, [None, min(oc, lanes)])
        cunrolled, cvec = [cx, cov], col
    sch.reorder(cn, *cy, *reduction, *cunrolled, cvec)
    sch.vectorize(cvec)
    for loop in cunrolled:
        sch.unroll(loop)
    _vector_init(sch, sch.decompose_reduction(conv, reduction[0]), unrolled=len(cunrolled))
    return outer if laid_out else None  # the rows the padded input stages are laid out under


def _staged_store(sch, out, tile_loop) -> None:
    """A tile of a vector of channels writes its epilogue's results to a stack buffer laid out channels-innermost (whole
    vector stores), then copies it out along the rows: each channel's columns are consecutive in the NCHW output,
    where a store straight from the vector registers extracts every lane to its own row (vextractps per value)."""
    staged = sch.cache_write(out, 0, TILE_SCOPE)
    sch.reverse_compute_at(staged, tile_loop, preserve_unit_loops=True)
    sch.transform_layout(out, ("write", 0), lambda b, o, *yx: (b, *yx, o))
    columns = sch.get_loops(staged)[-1]
    if isinstance(sch.get(columns).extent, tirx.IntImm):
        sch.unroll(columns)


def _schedule_padded_input(sch, block) -> None:
    """A conv's input stage as its own pass: the rows (of every channel) on the thread pool where the work pays, a
    phase split's phases innermost (_phases_innermost)."""
    loops = sch.get_loops(block)
    inner = 2 if sch.get(block).name_hint == "phase_split" else 1
    if parallel_pays(_work(sch, block)):
        sch.parallel(sch.fuse(*loops[:-inner]) if len(loops) > inner + 1 else loops[0])
    _phases_innermost(sch, block)


def _padded_input_under(sch, block, outer) -> None:
    """pad_temp / phase_split / a transposed conv's spread input computed under the tiles' outermost loop: the input
    rows a row of tiles reads, laid out by the thread that reads them, so that the conv takes one launch of the
    thread pool, not two (a launch wakes a sleeping worker: 9-27 us); a phase split's phases innermost."""
    sch.compute_at(block, outer, preserve_unit_loops=True)
    _phases_innermost(sch, block)


def _phases_innermost(sch, block) -> None:
    """A phase split's phases innermost and unrolled: the input read in order, not every stride-th value."""
    if sch.get(block).name_hint == "phase_split":
        loops = sch.get_loops(block)
        sch.reorder(loops[-1], loops[-2])
        sch.unroll(loops[-2])


def _vector_init(sch, block, unrolled: int = 1) -> None:
    """A tile's zeroing or write-back: the inner loop vectorized, the `unrolled` ones above it unrolled."""
    loops = sch.get_loops(block)
    if isinstance(sch.get(loops[-1]).extent, tirx.IntImm):  # a tile clipped to a symbolic edge stays a plain loop
        sch.vectorize(loops[-1])
    for loop in loops[-1 - unrolled:-1]:
        if isinstance(sch.get(loop).extent, tirx.IntImm):
            sch.unroll(loop)


class DensePacked(ScheduleRule):
    """dense_packed: tiles of MR rows (unrolled) x NB columns (vectorized) accumulated in registers, rows fastest
    across the thread pool; the pointwise ops after it run as a second parallel pass over its result."""

    def apply(self, func, target, _tunable):
        if not isinstance(func, tirx.PrimFunc) or target.kind.name != "llvm":
            return None
        sch = s_tir.Schedule(func)
        try:
            dense = sch.get_sblock(DENSE_BLOCK)
        except Exception:  # not ours
            return None
        blocks = sch.get_child_blocks(sch.get_sblock("root"))
        after = [sch.get(b).name_hint for b in blocks].index(DENSE_BLOCK) + 1
        try:  # the pointwise ops after the GEMM into one pass (the padded input before it stays a stage)
            for b in blocks[after:-1]:
                sch.compute_inline(b)
        except Exception:
            return None
        pays = parallel_pays(_work(sch, dense))
        m, n, k = sch.get_loops(dense)
        nb = int(sch.get(dense).reads[1].source.shape[-1])
        mr = int(sch.get(dense).annotations["tile_rows"])
        mo, mi = sch.split(m, [None, mr])
        no, ni = sch.split(n, [None, nb])
        tile = _tile_loops(sch, mo, no, [k, mi, ni], pays)
        wb = sch.cache_write(dense, 0, TILE_SCOPE)
        sch.reverse_compute_at(wb, tile[-1])
        sch.vectorize(ni)
        sch.unroll(mi)
        _vector_init(sch, sch.decompose_reduction(dense, k))
        _vector_init(sch, wb)
        _schedule_rest(sch, exclude={DENSE_BLOCK, sch.get(wb).name_hint})
        return sch


def _tile_loops(sch, mo, no, inner: list, parallel: bool) -> list:
    """The GEMM's tile loops put outermost (before `inner`), the parallel one made so where `parallel`: row tiles x
    column blocks fused where the row tiles are static; over a symbolic row count the column blocks in parallel (each
    block's weights then serve every row tile from cache) or, where there are few, the row tiles. (Fused with a
    symbolic extent such as ddddocr's (width - 1) // 8 + 1, the tile's buffer compacts to a size TVM cannot prove
    constant: a heap buffer.)"""
    if isinstance(sch.get(mo).extent, tirx.IntImm):
        sch.reorder(no, mo, *inner)
        loops = [sch.fuse(no, mo)]
    else:
        loops = [no, mo] if int(sch.get(no).extent) >= MIN_PARALLEL_BLOCKS else [mo, no]
        sch.reorder(*loops, *inner)
    if parallel:
        sch.parallel(loops[0])
    return loops


def _work(sch, block) -> int | None:
    total = 1
    for lp in sch.get_loops(block):
        e = sch.get(lp).extent
        if not isinstance(e, tirx.IntImm):
            return None
        total *= int(e)
    return total


def _parallel_outer(sch, block) -> None:
    """The block's leading spatial loops fused and parallel (where the work pays for the launch)."""
    loops = sch.get_loops(block)
    if len(loops) == 0 or sch.get(loops[0]).kind != tirx.ForKind.SERIAL:
        return
    iters = sch.get(block).iter_vars
    spatial = 0
    for it in iters:
        if it.iter_type != tirx.IterVar.DataPar:
            break
        spatial += 1
    spatial = min(spatial, len(loops) - 1 if len(loops) > 1 else 1)
    work = _work(sch, block)
    if spatial == 0 or not parallel_pays(work):
        return
    sch.parallel(sch.fuse(*loops[:spatial]) if spatial > 1 else loops[0])


def _schedule_rest(sch, exclude=()) -> None:
    for block in sch.get_child_blocks(sch.get_sblock("root")):
        if sch.get(block).name_hint not in exclude:
            try:
                _parallel_outer(sch, block)
            except Exception:  # loops this simple rule cannot fuse (already nested under another block)
                pass


class Fallback(ScheduleRule):
    """Any other function on LLVM: its top-level blocks' leading spatial loops in parallel; inner loops to LLVM."""

    def apply(self, func, target, _tunable):
        if not isinstance(func, tirx.PrimFunc) or target.kind.name != "llvm":
            return None
        sch = s_tir.Schedule(func)
        for block in sch.get_child_blocks(sch.get_sblock("root"))[:-1]:
            try:  # pointwise stages into the ones that read them: one pass over memory
                sch.compute_inline(block)
            except Exception:  # a reduction or a stage read by more than its neighbour stays
                pass
        _schedule_rest(sch)
        return sch


def _volume(sch, block):
    total = 1
    for lp in sch.get_loops(block):
        total = total * sch.get(lp).extent
    return total


def _symbolic_work(func: tirx.PrimFunc):
    """The iterations of an unscheduled function's blocks as an expression of its symbolic dims, or None where
    they are all static."""
    sch = s_tir.Schedule(func)
    blocks = sch.get_child_blocks(sch.get_sblock("root"))
    if all(_work(sch, b) is not None for b in blocks):
        return None
    return sum((_volume(sch, b) for b in blocks[1:]), _volume(sch, blocks[0]))


def _pays_at_the_smallest(work) -> bool:
    """Whether symbolic work pays for the pool with every dim at 1, and so at every size (the work grows with them):
    the test and its serial copy would be dead code, twice the function to lower and build (ddddocr's convs over its
    image width: compile 9.3 -> 15.6 s of CPU)."""
    analyzer = tvm.sym.Analyzer()
    for var in tirx.analysis.undefined_vars(work):
        analyzer.bind(var, tirx.IntImm(str(var.ty.dtype), 1))
    smallest = analyzer.simplify(work)
    return isinstance(smallest, tirx.IntImm) and parallel_pays(int(smallest))


def run_time_parallel(func: tirx.PrimFunc, sch: s_tir.Schedule, target=None) -> tirx.PrimFunc:
    """The function `sch` scheduled from `func`, its thread pool used where the work pays for it (parallel_pays):
    where that work is symbolic and the schedule has parallel loops, the schedule twice under a test of the work at
    run time, the second replaying a trace less its `parallel` instructions (on the calling thread): a conv's
    schedule for one thread (ConvPacked(pool=False): its input laid out in a pass of its own, where the pool's threads
    lay out the rows each reads: ddddocr's first conv 24 -> 21 us at 160 columns), else `sch`'s."""
    scheduled = sch.mod["main"]
    work = _symbolic_work(func)
    if work is None or _pays_at_the_smallest(work) or not any(inst.kind.name == "Parallel" for inst in sch.trace.insts):
        return scheduled
    target = target or tvm.target.Target.current(allow_none=True)
    one_thread = (ConvPacked(pool=False).apply(func, target, False) if target is not None else None) or sch
    serial = s_tir.Schedule(func)
    s_tir.Trace([i for i in one_thread.trace.insts if i.kind.name != "Parallel"], {}).apply_to_schedule(serial, False)
    body = tirx.IfThenElse(work >= MIN_PARALLEL_WORK, scheduled.body, serial.mod["main"].body)
    # the two bodies define the same loop variables and buffers; TIR allows one definition of each, and printing
    # and parsing the function back gives every definition its own
    return tvm.script.from_source(scheduled.with_body(body).script())


def vector_tails(func: tirx.PrimFunc) -> tirx.PrimFunc:
    """`func` with each block's predicate (the bounds test a split of a symbolic extent leaves: a conv's output columns
    over ddddocr's image width) marked likely, so that TVM's LoopPartition runs the whole tiles without it and only
    the last tile tests each lane: a vectorized store under a per-lane test is scalarized, the epilogue with it (the
    24 -> 24 1x1 conv 40 -> 20 us at 80 columns)."""

    def mark(realize):
        test = realize.predicate
        if isinstance(test, tirx.IntImm) or (isinstance(test, tvm.ir.Call) and test.op.same_as(_LIKELY)):
            return realize
        return s_tir.SBlockRealize(realize.iter_values, tirx.likely(test), realize.block)

    return tvm_ffi.structural_map(func, [(s_tir.SBlockRealize, mark)])


_LIKELY = tvm.ir.Op.get("prim.likely")


def cpu_rules():
    """The rules for dlight's ApplyDefaultSchedule on LLVM targets, first match wins."""
    from tvm.s_tir import dlight as dl

    return [ConvPacked(), DensePacked(), dl.cpu.GEMV(), dl.cpu.Reduction(), Fallback()]
