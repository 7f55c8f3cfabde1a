"""The layers around the recurrent ones on CPUs: convolutions and dense layers as register-blocked kernels, the rest
parallel and vectorized.

TVM 0.27 schedules nothing on LLVM targets by default (dlight's CPU rules cover GEMV and row reductions), so a
legalized conv2d or matmul runs as naive single-threaded loops. Here:
- `conv2d_packed` / `dense_packed` are TE computes over weights packed at compile time so that a vector of
  output channels (conv) or columns (dense) is contiguous: W[O/OB, I, KH, KW, OB] and W[N/NB, K, NB];
- the rules `ConvPacked` and `DensePacked` schedule them (and the pointwise ops FuseOps fused after them) as a
  register tile of accumulators (OB channels x XB output columns, or MR rows x NB columns) that stays in registers
  while the reduction streams, the tiles spread over TVM's thread pool, the epilogue applied per tile;
- `Fallback` gives every other unscheduled function parallel outer loops (and leaves inner loops to LLVM's
  vectorizer), so pooling, pads, transposes and pointwise chains use every core.
"""

from __future__ import annotations

import numpy as np
from tvm import s_tir, te, tirx, topi
from tvm.s_tir.dlight.base import ScheduleRule
from tvm.target.codegen import llvm_get_vector_width

from .device import parallel_pays

CONV_BLOCK, DENSE_BLOCK = "conv2d_packed", "dense_packed"


def vector_lanes(target, dtype_bits=32) -> int:
    bits = llvm_get_vector_width(target) if target.kind.name == "llvm" else 128
    return max((bits if bits > 0 else 128) // dtype_bits, 4)


def channel_block(channels: int, lanes: int) -> int:
    """Output channels per conv tile: two vectors where they divide the channels, else the largest power of two that does."""
    return next(b for b in (2 * lanes, lanes, 8, 4, 2, 1) if channels % b == 0)


def pack_conv_weight(w: np.ndarray, ob: int) -> np.ndarray:
    """OIHW -> [O/ob, I, KH, KW, ob]."""
    o, i, kh, kw = w.shape
    return np.ascontiguousarray(w.reshape(o // ob, ob, i, kh, kw).transpose(0, 2, 3, 4, 1))


def dense_block(columns: int, lanes: int) -> int:
    """Columns per GEMM tile: two vectors, or one (or fewer) for narrower outputs; the packed weight is padded to whole
    tiles (8210 classes would otherwise be tiles of 2 columns)."""
    return 2 * lanes if columns >= 2 * lanes else lanes if columns >= lanes else channel_block(columns, lanes)


def pack_conv1d_weight(w: np.ndarray, ob: int) -> np.ndarray:
    """OIW -> [O/ob, I, KW, ob]."""
    o, i, kw = w.shape
    return np.ascontiguousarray(w.reshape(o // ob, ob, i, kw).transpose(0, 2, 3, 1))


def pack_dense_weight(w: np.ndarray, nb: int) -> np.ndarray:
    """B [K, N] of x @ B -> [ceil(N/nb), K, nb], zero columns past N."""
    k, n = w.shape
    padded = np.zeros((k, -(-n // nb) * nb), w.dtype)
    padded[:, :n] = w
    return np.ascontiguousarray(padded.reshape(k, -1, nb).transpose(1, 0, 2))


def conv2d_packed(x: te.Tensor, wp: te.Tensor, strides, padding, dilation) -> te.Tensor:
    """NCHW conv2d over packed weights (groups 1): out[n, o, y, x] = sum_{c,ry,rx} pad(x)[n, c, y*sh+ry*dh, x*sw+rx*dw] * wp[o/OB, c, ry, rx, o%OB]."""
    n, c, h, w = x.shape
    ob_count, _, kh, kw, ob = wp.shape
    (sh, sw), (dh, dw) = strides, dilation
    pt, pl, pb, pr = padding
    padded = topi.nn.pad(x, [0, 0, pt, pl], [0, 0, pb, pr], name="pad_temp") if any(padding) else x
    oh = (h + pt + pb - (kh - 1) * dh - 1) // sh + 1
    ow = (w + pl + pr - (kw - 1) * dw - 1) // sw + 1
    rc, ry, rx = te.reduce_axis((0, c), "rc"), te.reduce_axis((0, kh), "ry"), te.reduce_axis((0, kw), "rx")
    return te.compute(
        (n, ob_count * ob, oh, ow),
        lambda b, o, y, xx: te.sum(padded[b, rc, y * sh + ry * dh, xx * sw + rx * dw] * wp[o // ob, rc, ry, rx, o % ob],
                                   axis=[rc, ry, rx]),
        name=CONV_BLOCK, attrs={"stride_w": sw})


def conv1d_packed(x: te.Tensor, wp: te.Tensor, stride: int, padding, dilation: int) -> te.Tensor:
    """NCW conv1d over packed weights [O/OB, I, KW, OB] (groups 1), the same block as conv2d_packed's less the row axis
    (silero's STFT front end and encoder): out[n, o, x] = sum_{c,rx} pad(x)[n, c, x*s+rx*d] * wp[o/OB, c, rx, o%OB]."""
    n, c, w = x.shape
    ob_count, _, kw, ob = wp.shape
    pl, pr = padding
    padded = topi.nn.pad(x, [0, 0, pl], [0, 0, pr], name="pad_temp") if pl or pr else x
    ow = (w + pl + pr - (kw - 1) * dilation - 1) // stride + 1
    rc, rx = te.reduce_axis((0, c), "rc"), te.reduce_axis((0, kw), "rx")
    return te.compute(
        (n, ob_count * ob, ow),
        lambda b, o, xx: te.sum(padded[b, rc, xx * stride + rx * dilation] * wp[o // ob, rc, rx, o % ob], axis=[rc, rx]),
        name=CONV_BLOCK, attrs={"stride_w": stride})


def dense_packed(x: te.Tensor, wp: te.Tensor, columns: int) -> te.Tensor:
    """x [..., K] @ B [K, columns], B packed [N/NB, K, NB] (padded): one GEMM over the rows of all leading dims and
    every packed column (a 2-D block the rule tiles), then the output's shape and columns."""
    nb_count, k_dim, nb = wp.shape
    lead = tuple(x.shape[:-1])
    rows = 1
    for d in lead:
        rows = rows * d
    k = te.reduce_axis((0, k_dim), "k")

    def row_of(m):
        idx = []
        for d in reversed(lead):
            idx.append(m % d)
            m = m // d
        return tuple(reversed(idx))

    gemm = te.compute((rows, nb_count * nb), lambda m, n: te.sum(x[row_of(m) + (k,)] * wp[n // nb, k, n % nb], axis=k),
                      name=DENSE_BLOCK)
    if len(lead) == 1 and int(nb_count) * int(nb) == columns:
        return gemm

    def back(*i):
        m = 0
        for d, v in zip(lead, i[:-1]):
            m = m * d + v
        return gemm[m, i[-1]]

    return te.compute(lead + (columns,), back, name="dense_rows")


def _divisor_tile(extent, most: int, least: int = 4) -> int:
    """The largest tile in [least, most] dividing a static extent; `most` for a symbolic one or where none divides."""
    if not isinstance(extent, (int, tirx.IntImm)):
        return most
    e = int(extent)
    if e <= most:
        return e
    return next((t for t in range(most, least - 1, -1) if e % t == 0), most)


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
    """conv2d_packed: tiles of OB output channels (vectorized) x XB output columns (unrolled) per (image, row), the
    pointwise epilogue applied to each tile from registers."""

    block = CONV_BLOCK

    def apply(self, func, target, _tunable):
        if not isinstance(func, tirx.PrimFunc) or target.kind.name != "llvm":
            return None
        sch = s_tir.Schedule(func)
        found = _main_and_epilogue(sch, self.block)
        if found is None:
            return None
        self.schedule(sch, *found, vector_lanes(target))
        _schedule_rest(sch, exclude={self.block, sch.get(found[1]).name_hint})
        return sch

    def schedule(self, sch, conv, out, lanes):
        ob = int(sch.get(conv).reads[1].source.shape[-1])
        width = sch.get(sch.get_loops(out)[-1]).extent
        unit_stride = int(sch.get(conv).annotations.get("stride_w", 1)) == 1
        across = next((v for v in (2 * lanes, lanes, 8) if isinstance(width, tirx.IntImm) and int(width) % v == 0), 0)
        if unit_stride and across:
            # output rows whose width divides into vectors: XV columns (loaded straight from the input row) x OC
            # channels (unrolled, each weight broadcast), stored along the row as the output lies (NCHW)
            oc = next(c for c in (16, 8, 4, 2, 1) if ob % c == 0 and c * max(1, across // lanes) <= 16)
            _conv_tile(sch, conv, out, oc, across, columns_vector=True)
        else:
            # any width: OB channels (a vector of the packed weights) x XB columns (unrolled, each input value
            # broadcast); the stores scatter across channel planes
            vectors = max(1, ob // lanes)  # accumulators: vectors x xb of the 32 (AVX-512) or 16 vector registers
            xb = _divisor_tile(width, max(2, (24 if lanes >= 16 else 12) // vectors))
            _conv_tile(sch, conv, out, ob, xb, columns_vector=False)


def _conv_tile(sch, conv, out, oc, xc, columns_vector: bool):
    """Tiles of oc channels x xc output columns per (image, channel block, row) on the thread pool, the conv's
    accumulators for a tile computed under it and the epilogue applied from them; the vector axis is the columns or
    the channels (whose accumulators are then laid out channels-innermost). A conv1d is the same without rows."""
    pays = parallel_pays(_work(sch, conv))
    n, o, *rows, x = sch.get_loops(out)
    oo, oi = sch.split(o, [None, oc])
    xo, xi = sch.split(x, [None, xc])
    vec, unrolled = (xi, oi) if columns_vector else (oi, xi)
    sch.reorder(n, oo, *rows, xo, unrolled, vec)
    outer = sch.fuse(n, oo, *rows)
    if pays:
        sch.parallel(outer)
    sch.vectorize(vec)
    sch.unroll(unrolled)
    sch.compute_at(conv, xo, preserve_unit_loops=True)
    sch.set_scope(conv, 0, "local")
    if not columns_vector:
        sch.transform_layout(conv, ("write", 0), lambda b, o, *yx: (b, *yx, o))
    reduce_axes = len(sch.get(conv).iter_vars) - 3 - len(rows)  # (c, ry, rx) or (c, rx)
    cn, co, *cy, cx = sch.get_loops(conv)[-(3 + len(rows) + reduce_axes):-reduce_axes]
    reduction = sch.get_loops(conv)[-reduce_axes:]
    cvec, cunrolled = (cx, co) if columns_vector else (co, cx)
    sch.reorder(cn, *cy, *reduction, cunrolled, cvec)
    sch.vectorize(cvec)
    sch.unroll(cunrolled)
    _vector_init(sch, sch.decompose_reduction(conv, reduction[0]))


def _vector_init(sch, block) -> None:
    """A tile's zeroing or write-back: the inner loop vectorized, the one above unrolled."""
    loops = sch.get_loops(block)
    if isinstance(sch.get(loops[-1]).extent, tirx.IntImm):  # a tile clipped to a symbolic edge stays a plain loop
        sch.vectorize(loops[-1])
    if isinstance(sch.get(loops[-2]).extent, tirx.IntImm):
        sch.unroll(loops[-2])


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
        rest = [b for b in sch.get_child_blocks(sch.get_sblock("root")) if sch.get(b).name_hint != DENSE_BLOCK]
        try:
            for b in rest[:-1]:
                sch.compute_inline(b)
        except Exception:
            return None
        lanes = vector_lanes(target)
        pays = parallel_pays(_work(sch, dense))
        m, n, k = sch.get_loops(dense)
        nb = int(sch.get(dense).reads[1].source.shape[-1])
        mr = _divisor_tile(sch.get(m).extent, max(1, min(8, 16 * lanes // max(nb, 1))), 2)
        mo, mi = sch.split(m, [None, mr])
        no, ni = sch.split(n, [None, nb])
        sch.reorder(no, mo, k, mi, ni)
        tile = sch.fuse(no, mo)
        if pays:
            sch.parallel(tile)
        wb = sch.cache_write(dense, 0, "local")
        sch.reverse_compute_at(wb, tile)
        sch.vectorize(ni)
        sch.unroll(mi)
        _vector_init(sch, sch.decompose_reduction(dense, k))
        _vector_init(sch, wb)
        _schedule_rest(sch, exclude={DENSE_BLOCK, sch.get(wb).name_hint})
        return sch


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


def cpu_rules():
    """The rules for dlight's ApplyDefaultSchedule on LLVM targets, first match wins."""
    from tvm.s_tir import dlight as dl

    return [ConvPacked(), DensePacked(), dl.cpu.GEMV(), dl.cpu.Reduction(), Fallback()]
