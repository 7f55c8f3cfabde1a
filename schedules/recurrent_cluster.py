"""The cluster recurrent kernel for Hopper: one thread-block cluster per direction runs the whole sequence on chip.

A grid barrier (about 1.1 us on the H100) or an L2 round trip a step bounds the persistent kernel at batch 1. Here
each direction is one cluster of `ctas` CTAs (8 portable, 16 with the non-portable size sm_90 allows), launched with
cuLaunchKernelEx's cluster dimension (TVM's runtime does so for a kernel bound to "clusterCtaIdx.x"). Each CTA owns
ceil(H / ctas) hidden units: the first reg_k columns of their rows of R (all gates) in the registers of the lanes that
multiply them, the rest in shared memory, beside the CTA's own copy of all of h. A step is warp_gemv's gates from
that copy, with the sums reduce-scattered so that each gate's activation runs in the lanes holding its sum
(_lane_activation), and the rest of the gate program in the lanes that own (unit, row). With sync 1 (the default) the
new values are staged in the CTA, and after a block barrier its threads send them to every CTA's copy, 4 units a
st.async that the receiver's mbarrier counts; each CTA waits for its operand's bytes alone (_Arrivals). With sync 0
each value goes into every CTA's copy (mapa + st.shared::cluster), then one cluster barrier a phase
(barrier.cluster.arrive.release / wait.acquire). Either way the next step reads h from its own shared memory.

Where R does not fit one cluster (or from GRID_MIN_HIDDEN, where a grid is faster), `clusters` clusters share a
direction, each CTA owning ceil(H / (clusters * ctas)) units: its units also go out as tagged words in global memory
(step_sync), and CTA r of each cluster polls those of CTA r of the others and sends them on to its cluster
(_Arrivals.forward). One grid barrier after the words are cleared makes it a cooperative launch.

Why one barrier a phase suffices (sync 0): h is double-buffered by the step's parity, and a CTA writes slot t+1 of a peer only
after the barrier that ended step t, which that peer reached after reading slot t-1 (the one overwritten) for the last
time. GRU's r*h (an operand written and read within a step) has one buffer, written in phase 1 after the barrier that
ended the last step's phase 2. The barrier after the initial states is also the one DSMEM needs before a CTA writes
into a peer (all CTAs started), and the last phase's barrier the one before any exits.

The batch runs in chunks of `batch_tile` rows, each chunk the whole sequence (rows are independent), so shared memory
holds batch_tile rows of h; with `batch_groups` clusters a direction (each holding all of R) that many chunks run at
once, every cluster on its own. XW of step s+1 is loaded into registers at the end of step s, its latency hidden
behind the barrier; the cell state stays in a register of the lane that owns its unit until the chunk ends.
"""

from __future__ import annotations

import dataclasses
import itertools
from dataclasses import dataclass

from tvm import tirx
from tvm.script.ir_builder import tirx as T

from . import cells, step_sync, vector_math
from .cells import Cell
from .device import Device
from .layer import RNNLayerSpec
from .recurrent_common import (KernelArgs, block_sync, direction_activation, i64, load_xw_ahead, shared_dyn, step_phases,
                               store_operand, store_unseen)
from .recurrent_cuda import accurate_math, epilogue, operand_at, vector_width, weight_bytes
from .recurrent_persistent import _each_unit_row, _grid_sync, _strided, _tagged_words
from .warp_gemv import scattered_slot, warp_gates

F32 = "float32"
CLUSTER_SIZES = (8, 16)  # 8 is CUDA's portable cluster size; 16 the largest sm_90 allows (non-portable)
MIN_ARCH = 90  # thread-block clusters and distributed shared memory: sm_90 and newer
GRID_CLUSTERS = (2, 4, 8, 16)  # clusters a direction where R fits no one cluster
# CTAs a launch of several clusters may take, at most, per SM of the device, so that all its clusters are resident at
# once (clusters must fit whole in a GPC): the H100's cooperative launch took 64 CTAs in clusters of 8 and 16 and
# refused 128 (CUDA_ERROR_COOPERATIVE_LAUNCH_TOO_LARGE); side by side, 8 clusters of 16 ran in two waves at twice the
# step of 4 (h100-cluster-batch.md)
RESIDENT_SM_SHARE = 0.5
# from this hidden size a grid of clusters where one fits: 2 x 16 CTAs took 0.71-0.79x one cluster's step at H512
GRID_MIN_HIDDEN = 512
# the grids measured fastest all give each CTA 16 units (2 x 16 at H512, 4 x 16 at H1024); 8 or 12 units a CTA in 4 or
# 8 clusters took 1.5-2x their step (benchmarks/results/h100-cluster-step.md); none fits at H768 (2 x 16: 24 units)
GRID_UNITS = 16
GRID_MAX_UNITS = 24  # 32 units a CTA (2 x 16 at H1024 fp16) took 1.5x the step of 16

PUT = "tvmrnn_cluster_put"
# value into the same shared-memory address of CTAs 0..ctas-1 of the cluster (the caller's own included)
PUT_SRC = (f"__forceinline__ __device__ void {PUT}(float* p, float v, unsigned ctas) {{ "
           "unsigned a = (unsigned)__cvta_generic_to_shared(p); "
           "for (unsigned r = 0; r < ctas; ++r) { unsigned q; "
           'asm volatile("mapa.shared::cluster.u32 %0, %1, %2;" : "=r"(q) : "r"(a), "r"(r)); '
           'asm volatile("st.shared::cluster.f32 [%0], %1;" :: "r"(q), "f"(v) : "memory"); } }')
# sync 1: `width` consecutive values of the CTA's staged units into the same address of CTA `rank` by one st.async,
# which counts its bytes on that CTA's mbarrier (mbarrier::complete_tx), so that a reader waits for the bytes, not for
# every CTA at a barrier
_VEC = {1: ("float", "b32", "%1", '"r"(__float_as_uint(v))'),
        2: ("float2", "v2.b32", "{%1, %2}", '"r"(__float_as_uint(v.x)), "r"(__float_as_uint(v.y))'),
        4: ("float4", "v4.b32", "{%1, %2, %3, %4}", '"r"(__float_as_uint(v.x)), "r"(__float_as_uint(v.y)), '
                                                    '"r"(__float_as_uint(v.z)), "r"(__float_as_uint(v.w))')}


def _st_async(width: int) -> str:
    """The body that sends `v` (a float, float2 or float4) to `dst` and `bar` in CTA `rank`."""
    _ctype, suffix, operands, regs = _VEC[width]
    bar = len(operands.split(",")) + 1
    return ("unsigned qa, qm; "
            'asm volatile("mapa.shared::cluster.u32 %0, %1, %2;" : "=r"(qa) : "r"((unsigned)__cvta_generic_to_shared(dst)), "r"(rank)); '
            'asm volatile("mapa.shared::cluster.u32 %0, %1, %2;" : "=r"(qm) : "r"((unsigned)__cvta_generic_to_shared(bar)), "r"(rank)); '
            f'asm volatile("st.async.shared::cluster.mbarrier::complete_tx::bytes.{suffix} [%0], {operands}, [%{bar}];" '
            f':: "r"(qa), {regs}, "r"(qm) : "memory"); ')


def _send_source(width: int) -> tuple[str, str]:
    """`width` staged values from the sender's shared memory."""
    ctype = _VEC[width][0]
    name = f"tvmrnn_cluster_send{width}"
    return name, (f"__forceinline__ __device__ void {name}(const float* src, float* dst, void* bar, unsigned rank) {{ "
                  f"{ctype} v = *(const {ctype}*)src; {_st_async(width)}}}")


def _forward_source(width: int) -> tuple[str, str]:
    """`width` values in registers (polled from another cluster's tagged words)."""
    ctype = _VEC[width][0]
    name = f"tvmrnn_cluster_forward{width}"
    return name, (f"__forceinline__ __device__ void {name}({ctype} v, float* dst, void* bar, unsigned rank) {{ "
                  f"{_st_async(width)}}}")


MBAR_INIT = "tvmrnn_mbarrier_init"
MBAR_INIT_SRC = (f"__forceinline__ __device__ void {MBAR_INIT}(void* bar) {{ "
                 "unsigned m = (unsigned)__cvta_generic_to_shared(bar); "
                 'asm volatile("mbarrier.init.shared::cta.b64 [%0], 1;" :: "r"(m) : "memory"); '
                 'asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory"); }')
ARM = "tvmrnn_mbarrier_arm"
# the one arrival a phase of the mbarrier waits for, with the bytes it then expects
ARM_SRC = (f"__forceinline__ __device__ void {ARM}(void* bar, unsigned bytes) {{ "
           "unsigned m = (unsigned)__cvta_generic_to_shared(bar); "
           'asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;" :: "r"(m), "r"(bytes) : "memory"); }')
WAIT = "tvmrnn_mbarrier_wait"
WAIT_SRC = (f"__forceinline__ __device__ void {WAIT}(void* bar, unsigned parity) {{ "
            "unsigned m = (unsigned)__cvta_generic_to_shared(bar), done; "
            'do { asm volatile("{ .reg .pred p; mbarrier.try_wait.parity.acquire.cluster.shared::cta.b64 p, [%1], %2; '
            'selp.u32 %0, 1, 0, p; }" : "=r"(done) : "r"(m), "r"(parity) : "memory"); } while (!done); }')
BARRIER = "tvmrnn_cluster_barrier"
BARRIER_SRC = (f"__forceinline__ __device__ void {BARRIER}() {{ "
               'asm volatile("barrier.cluster.arrive.release.aligned;\\n\\tbarrier.cluster.wait.acquire.aligned;" ::: "memory"); }')


# 32-bit registers a lane may give R's elements at batch_tile 1, divided by the batch tile above: what a thread may
# have (65536 a CTA, at most 255 a thread) less REG_OTHERS for the reduction's sums, which grow with the batch tile, and
# the gate program (at 512 threads, 56 of 128; R at 64 spilled in LSTM H512)
REG_OTHERS = 72


@dataclass(frozen=True)
class ClusterConfig:
    ctas: int = 8  # CTAs per cluster
    warps: int = 16  # each owns units_per_warp units of its CTA (all gates)
    batch_tile: int = 1  # batch rows a pass over the sequence computes together
    # the first reg_k columns of the warp's rows of R stay in the registers of the lanes that multiply them (a multiple
    # of 32 lanes' vector width), the rest in shared memory: each step reads R whole, and shared memory gives a CTA
    # 128 bytes a cycle (R of LSTM H256 fp32 across 8 CTAs: 1000 cycles a step), registers feed the FMAs directly
    reg_k: int = 0
    # how a phase waits for the last one's values: 0 all CTAs meet at a cluster barrier; 1 each CTA waits on an mbarrier
    # of its own for the bytes st.async brings it (_Arrivals)
    sync: int = 0
    # clusters per direction: above 1, each CTA also publishes its units as tagged words in global memory, and CTA r of
    # a cluster forwards those of CTA r of every other cluster into its cluster's copies (_Arrivals.forward)
    clusters: int = 1
    # one cluster a direction (clusters 1): this many clusters run the batch's chunks side by side, cluster p chunks
    # p, p + batch_groups, ... (rows are independent: no cluster waits for another, the launch is not cooperative)
    batch_groups: int = 1

    def units_per_cta(self, spec: RNNLayerSpec) -> int:
        return -(-spec.hidden_size // (self.ctas * self.clusters))

    def reg_weights(self) -> int:
        """32-bit registers a lane may give R's elements at batch_tile 1."""
        return max(0, min(255, 65536 // (self.warps * 32)) - REG_OTHERS)

    def units_per_warp(self, spec: RNNLayerSpec) -> int:
        return -(-self.units_per_cta(spec) // self.warps)

    def reg_words(self, spec: RNNLayerSpec) -> int:
        """32-bit registers of R's elements each lane holds (two fp16 a register)."""
        return self.units_per_warp(spec) * spec.gates * self.reg_k // 32 * weight_bytes(spec) // 4

    def smem_bytes(self, spec: RNNLayerSpec, cell: Cell) -> int:
        """R's rows of the CTA's units past reg_k, and batch_tile rows of h (two slots) and of each stored value."""
        H = spec.hidden_size
        rows = 2 + len(cell.stored_values)
        return self.units_per_cta(spec) * cell.gates * (H - self.reg_k) * weight_bytes(spec) + rows * self.batch_tile * H * 4

    def valid(self, spec: RNNLayerSpec) -> bool:
        """Each (unit, row) of a warp is finished by a lane of its own (warp_gemv); reg_k whole loads of all lanes."""
        step = 32 * vector_width(spec, spec.hidden_size)
        return (self.units_per_warp(spec) * self.batch_tile <= 32 and self.reg_k % step == 0
                and self.reg_k <= spec.hidden_size and self.reg_words(spec) <= self.reg_weights() // self.batch_tile
                and (not self.sync or self.all_ctas_own_units(spec)) and (self.clusters == 1 or self.sync == 1)
                and (self.clusters == 1 or self.batch_groups == 1))

    def all_ctas_own_units(self, spec: RNNLayerSpec) -> bool:
        """sync 1 needs it: a CTA that sends nothing would not hold the others back from overwriting what it reads."""
        return (self.ctas * self.clusters - 1) * self.units_per_cta(spec) < spec.hidden_size

    def launched_ctas(self, spec: RNNLayerSpec) -> int:
        return spec.num_directions * self.clusters * self.batch_groups * self.ctas

    def all_resident(self, spec: RNNLayerSpec, device: Device) -> bool:
        """The launch's clusters fit RESIDENT_SM_SHARE of the device's SMs, so all run at once."""
        return self.launched_ctas(spec) <= device.sm_count * RESIDENT_SM_SHARE

    def grid_fits(self, spec: RNNLayerSpec, device: Device) -> bool:
        """One cluster a direction, or a grid of them all resident (a larger cooperative grid is refused at launch)."""
        return self.clusters == 1 or self.all_resident(spec, device)

    def with_registers(self, spec: RNNLayerSpec) -> ClusterConfig:
        """This point with as many of R's columns in registers as reg_weights allows."""
        step = 32 * vector_width(spec, spec.hidden_size)
        per_round = self.units_per_warp(spec) * spec.gates * step // 32 * weight_bytes(spec) // 4
        rounds = self.reg_weights() // self.batch_tile // per_round
        return dataclasses.replace(self, reg_k=min(rounds * step, spec.hidden_size // step * step))


def clusters_run_on(device: Device) -> bool:
    digits = "".join(c for c in device.arch.removeprefix("sm_") if c.isdigit())
    return int(digits or 0) >= MIN_ARCH


def grid_configs(spec: RNNLayerSpec, cell: Cell, device: Device) -> list[ClusterConfig]:
    """The points with several clusters a direction that fit: every CTA owns units (at most GRID_MAX_UNITS) and its
    rows of R fit beside its registers, and the grid's clusters are all resident."""
    configs = [ClusterConfig(ctas=c, clusters=q, warps=w, sync=1).with_registers(spec)
               for c in CLUSTER_SIZES for q in GRID_CLUSTERS for w in (16, 8)]
    return [c for c in configs if c.valid(spec) and c.smem_bytes(spec, cell) <= device.smem_limit
            and c.units_per_cta(spec) <= GRID_MAX_UNITS and c.grid_fits(spec, device)]


def widest_grid(spec: RNNLayerSpec, device: Device) -> ClusterConfig:
    """The grid of clusters with the most CTAs a direction (the least of R each), registers as full as they go."""
    per_direction = int(device.sm_count * RESIDENT_SM_SHARE) // spec.num_directions
    ctas = max(CLUSTER_SIZES)
    return ClusterConfig(ctas=ctas, clusters=max(1, per_direction // ctas), warps=8, sync=1).with_registers(spec)


def fits(spec: RNNLayerSpec, cell: Cell, device: Device) -> bool:
    """Whether this layer's R fits in the shared memory of one cluster per direction, or of a grid of them."""
    if not clusters_run_on(device):
        return False
    configs = [ClusterConfig(ctas=c).with_registers(spec) for c in CLUSTER_SIZES]
    return any(c.smem_bytes(spec, cell) <= device.smem_limit for c in configs) or bool(grid_configs(spec, cell, device))


def default_config(spec: RNNLayerSpec, cell: Cell, device: Device, batch: int | None = None) -> ClusterConfig:
    """As much of R in registers as they take; the cluster size where every CTA owns units (sync 1 needs it), whose
    CTAs read the fewest bytes of R from shared memory a step (its bandwidth bounds the step), the larger at a tie
    (fewer units a warp: a shorter gate program and exchange a step); st.async and mbarriers (sync 1) where every CTA
    owns units. From GRID_MIN_HIDDEN, or where R fits no one cluster, a grid of clusters: one whose CTAs own GRID_UNITS
    units if there is one, then the fewest clusters, the fewest bytes of R read from shared memory, the most CTAs, the
    fewest warps (the most registers a lane). At a batch above 1, batch_config where one applies."""
    side_by_side = batch_config(spec, cell, device, batch) if batch is not None and batch > 1 else None
    if side_by_side:
        return side_by_side
    configs = [ClusterConfig(ctas=c).with_registers(spec) for c in CLUSTER_SIZES]
    fitting = [c for c in configs if c.smem_bytes(spec, cell) <= device.smem_limit]
    grids = grid_configs(spec, cell, device) if spec.hidden_size >= GRID_MIN_HIDDEN or not fitting else []
    if grids:
        return min(grids, key=lambda c: (c.units_per_cta(spec) != GRID_UNITS, c.clusters,
                                         c.units_per_cta(spec) * (spec.hidden_size - c.reg_k), -c.ctas, c.warps))
    return _single_cluster(spec, fitting or configs[-1:])


def _single_cluster(spec: RNNLayerSpec, configs: list[ClusterConfig]) -> ClusterConfig:
    """Of one-cluster points: every CTA owning units first, then the fewest bytes of R from shared memory, the larger
    cluster; sync 1 where every CTA owns units (0.6-0.7x sync 0's step at H256 and H512, h100-cluster-step.md)."""
    best = min(configs, key=lambda c: (not c.all_ctas_own_units(spec), c.units_per_cta(spec) * (spec.hidden_size - c.reg_k), -c.ctas))
    return dataclasses.replace(best, sync=1) if best.all_ctas_own_units(spec) else best


def batch_config(spec: RNNLayerSpec, cell: Cell, device: Device, batch: int) -> ClusterConfig | None:
    """`batch` rows as `batch` clusters a direction side by side, one row each (every cluster runs at batch 1's
    step), where one cluster holds R and all the clusters are resident; the cluster as _single_cluster picks it. None
    where none fits."""
    configs = [ClusterConfig(ctas=c, batch_groups=batch).with_registers(spec) for c in CLUSTER_SIZES]
    fitting = [c for c in configs if c.valid(spec) and c.smem_bytes(spec, cell) <= device.smem_limit
               and c.all_ctas_own_units(spec) and c.all_resident(spec, device)]
    return _single_cluster(spec, fitting) if fitting else None


def _cluster_barrier():
    T.evaluate(T.cuda.func_call(BARRIER, source_code=BARRIER_SRC))


def _share(ctas: int):
    """store_operand's store of an operand: the value into the same element of every CTA's copy."""
    def put(buf, idx, value):
        T.evaluate(T.cuda.func_call(PUT, tirx.address_of(buf[tuple(idx)]), value, tirx.IntImm("uint32", ctas),
                                    source_code=PUT_SRC))
    return put


def _rows_view(data, shape, strides, offset):
    """A view of one CTA's batch_tile rows as a kernel-wide buffer: the direction's stride 0 (a cluster runs one), row n
    at n - n0 (the chunk's first row, offset = n0 * H)."""
    return T.decl_buffer(shape, F32, data=data, strides=[i64(s) for s in strides], elem_offset=-offset, scope="shared.dyn")


def cluster_body(a: KernelArgs, cfg: ClusterConfig):
    """One cluster (or, clusters > 1, a grid of them) per direction: R's rows into registers and shared memory, the
    grid's words cleared, then the batch chunk by chunk (_chunk)."""
    spec, cell = a.spec, a.cell
    C, Q, P = cfg.ctas, cfg.clusters, cfg.batch_groups
    assert cfg.valid(spec), (cfg, spec.hidden_size)
    words = _tagged_words(a) if Q > 1 else None
    with T.thread_binding(0, i64(cfg.launched_ctas(spec)), "blockIdx.x") as bx:
        with T.thread_binding(0, i64(C), "clusterCtaIdx.x") as rank:
            with T.thread_binding(0, i64(cfg.warps), "threadIdx.y") as ty:
                with T.thread_binding(0, i64(32), "threadIdx.x") as lane:
                    tid = ty * i64(32) + lane
                    d, q, p, j0 = bx // i64(C), None, i64(0), rank * i64(cfg.units_per_cta(spec))
                    if P > 1:
                        d, p = T.bind(bx // i64(P * C)), T.bind(bx // i64(C) % i64(P))
                    if Q > 1:  # bound to variables: a view's offset built on j0 (the cell state's) must not divide (FlattenBuffer)
                        d, q = T.bind(bx // i64(Q * C)), T.bind(bx // i64(C) % i64(Q))
                        j0 = T.bind((q * i64(C) + rank) * i64(cfg.units_per_cta(spec)))
                    weights = _load_weights(a, cfg, d, j0, ty, lane, tid)
                    if words:
                        _clear_words(a, cfg, words, d, j0, tid)
                    layout = _Rows(spec, cell, cfg)
                    # one buffer, so that the offsets _Rows gives are those of shared memory: TVM places a shared buffer
                    # by the loads and stores it sees, and the staged values and mbarriers are only passed by address
                    rows = shared_dyn((layout.size,), F32)
                    # every element access by a view of its own, which CompactBufferAllocation leaves alone (its region
                    # bound divided by zero on the staged sends' indices)
                    rows = T.decl_buffer((layout.size,), F32, data=rows.data, scope="shared.dyn")
                    # per lane: the cell state and next step's XW of the (unit, row) it finishes (warp_gemv), and the
                    # XW of the gate whose scattered sum it holds, in registers
                    regs = {"xw": T.alloc_buffer((len(cell.phases), max(len(p.gates) for p in cell.phases)), F32, scope="local"),
                            "own_xw": T.alloc_buffer((len(cell.phases),), F32, scope="local")}
                    if a.Yc is not None:
                        regs["c"] = T.alloc_buffer((1,), F32, scope="local")
                    arrivals = _Arrivals(a, cfg, tid, rows, layout, j0, words and _Remote(words, d, q, rank)) if cfg.sync else None
                    # this cluster's passes: chunks p, p + P, ... of the batch's
                    passes = tirx.ceildiv(tirx.max(tirx.ceildiv(a.batch, i64(cfg.batch_tile)) - p, i64(0)), i64(P))
                    with T.serial(0, passes) as done:
                        _chunk(a, cfg, rows, layout, regs, weights, d, j0, p + done * i64(P), done, ty, lane, tid, arrivals)


class _Rows:
    """Offsets (in floats) into the one shared buffer of the values CTAs exchange: h's two slots, each stored value
    (GRU's z and r*h), and with sync 1 the CTA's own units of each operand staged for sending (h's by the slot it goes
    to), then the mbarriers (8 bytes each). Staged rows and the mbarriers start at multiples of 4 floats (16-byte
    stores and loads)."""

    def __init__(self, spec: RNNLayerSpec, cell: Cell, cfg: ClusterConfig):
        H, NB = spec.hidden_size, cfg.batch_tile
        self.nb = NB
        self.stage_row = -(-cfg.units_per_cta(spec) // 4) * 4
        self.value = {v: (2 + i) * NB * H for i, v in enumerate(cell.stored_values)}
        at = -(-(2 + len(cell.stored_values)) * NB * H // 4) * 4
        self.stage = {}
        for name in dict.fromkeys(p.operand for p in cell.phases) if cfg.sync else ():
            self.stage[name] = at
            at += (2 if name == "h" else 1) * NB * self.stage_row
        self.bars = at
        self.size = at + 2 * len(_Arrivals.BARS) * cfg.sync

    def staged(self, name, slot, b):
        """Where row b of the chunk's staged units of operand `name` start (h's in its slot `slot`)."""
        row = slot * i64(self.nb) + b if name == "h" else b
        return i64(self.stage[name]) + row * i64(self.stage_row)


def _clear_words(a: KernelArgs, cfg: ClusterConfig, words: dict, d, j0, tid):
    """Every word of the CTA's units INVALID, then one grid barrier: what an earlier launch left there can never pass
    for a step of this one. h[0] is never polled (each CTA loads all of h0 itself)."""
    def clear(n, j):
        for name, buf in words.items():
            for idx in ([[i64(0), d, n, j], [i64(1), d, n, j]] if name == "h" else [[d, n, j]]):
                step_sync.publish(buf, idx, tirx.const(0.0, F32), step_sync.invalid())

    _each_unit_row(a, j0, cfg.units_per_cta(a.spec), cfg.warps * 32, tid, clear)
    _grid_sync()


@dataclass(frozen=True)
class _Remote:
    """clusters > 1: the tagged words, and where this CTA sits: direction d, cluster q, rank in the cluster."""
    words: dict
    d: tirx.PrimExpr
    q: tirx.PrimExpr
    rank: tirx.PrimExpr

    def published(self, s) -> dict:
        """store_operand's publishing during step s: h (of step s + 1) with tag s + 1, a stored value with tag s."""
        return {name: (buf, step_sync.tag_of(s + i64(1)) if name == "h" else step_sync.tag_of(s))
                for name, buf in self.words.items()}


def _load_weights(a: KernelArgs, cfg: ClusterConfig, d, j0, ty, lane, tid) -> dict:
    """R's rows of the CTA's units: columns from reg_k into shared memory ("smem" [unit, gate, k - reg_k]), the first
    reg_k into the registers of the lanes that multiply them ("regs" [warp's unit, gate, round, element]: warp_gemv's
    lane reads V elements a round, 32 lanes apart). Units past the CTA's or H load row H-1 and are never finished."""
    spec = a.spec
    H, G, UPC, UW, RK = spec.hidden_size, spec.gates, cfg.units_per_cta(spec), cfg.units_per_warp(spec), cfg.reg_k
    V = vector_width(spec, H)
    K = H - RK
    row = lambda u, g: g * i64(H) + tirx.min(j0 + u, i64(H - 1))  # noqa: E731
    out = {}
    if K:
        out["smem"] = shared_dyn((UPC, G, K), spec.dtype)

        def load(e):
            u, g, k = e // i64(G * K), e // i64(K) % i64(G), e % i64(K)
            T.buffer_store(out["smem"], a.R[d, row(u, g), k + i64(RK)], [u, g, k])

        _strided(UPC * G * K, cfg.warps * 32, tid, load)
    if RK:
        out["regs"] = T.alloc_buffer((UW, G, RK // (32 * V), V), spec.dtype, scope="local")
        for u, g, r in itertools.product(range(UW), range(G), range(RK // (32 * V))):
            slot = tirx.min(ty * i64(UW) + i64(u), i64(UPC - 1))
            with T.vectorized(0, i64(V)) as v:
                T.buffer_store(out["regs"], a.R[d, row(slot, g), (i64(r * 32) + lane) * i64(V) + v], [i64(u), i64(g), i64(r), v])
    block_sync()
    return out


class _Arrivals:
    """sync 1: per CTA one mbarrier for each slot of h and one for a value a later phase multiplies (GRU's r*h). A phase's
    finishing lanes stage the CTA's own units of such a value in its shared memory; after a block barrier, threads send
    them to every CTA, up to 4 consecutive units a st.async (send_staged), which counts its bytes on the receiver's
    mbarrier; a phase's readers wait for the phase of the mbarrier that completes when all of the operand (H values a
    row) has come. Thread 0 arms each phase (one arrival expecting those bytes) after the wait on the one before, and
    only for values that will be sent, so that no phase is left open when the kernel ends.

    A writer never overwrites what a reader still reads: a CTA sends h[t+1] into slot (t+1) % 2 only after h[t] has
    come whole, so after every CTA's block barrier that followed its last reads of h[t-1] (every CTA owns units, so
    every CTA sends). A staged value is read by the senders before the next phase's block barrier, and h's are staged
    by slot, so that no lane stages over values not yet sent. Phases of the mbarriers run on across batch chunks (one
    init a launch): each one's parity is counted from the step and the cluster's passes before."""

    BARS = ("h slot 0", "h slot 1", "stored operand")

    def __init__(self, a: KernelArgs, cfg: ClusterConfig, tid, buf, layout: _Rows, j0, remote: _Remote | None = None):
        self.a, self.cfg, self.tid, self.buf, self.layout, self.j0, self.remote = a, cfg, tid, buf, layout, j0, remote
        with T.If(tid == i64(0)):
            with T.Then():
                for i in range(len(self.BARS)):
                    T.evaluate(T.cuda.func_call(MBAR_INIT, self._at(i64(i)), source_code=MBAR_INIT_SRC))

    def _at(self, i):
        return tirx.address_of(self.buf[i64(self.layout.bars) + i * i64(2)])

    def stage(self, name, n0):
        """store_operand's store: the value into this CTA's staged units (h's by the slot idx[0] it goes to)."""
        def put(_buf, idx, value):
            slot, n, j = (idx[0] if name == "h" else 0), idx[-2], idx[-1]
            at = self.layout.staged(name, slot, n - n0) + j - self.j0
            store_unseen(self.buf, [at], value)
        return put

    def send_staged(self, name, slot, n0, dests):
        """After a block barrier: the staged units of `name` (into h's slot `slot`) to the same place in every CTA,
        `width` units a st.async from the threads of the block, (destination, row, units) apart."""
        spec, cfg = self.a.spec, self.cfg
        H, NB, UPC = spec.hidden_size, cfg.batch_tile, cfg.units_per_cta(spec)
        width = next(w for w in (4, 2, 1) if UPC % w == 0 and H % w == 0)
        func, source = _send_source(width)
        per_row = -(-UPC // width)
        bar = slot if name == "h" else i64(2)

        def one(e):
            rank, b, q = e // i64(NB * per_row), e // i64(per_row) % i64(NB), e % i64(per_row)
            j = self.j0 + q * i64(width)
            with T.If(tirx.all(n0 + b < self.a.batch, j < i64(H))):
                with T.Then():
                    src = self.layout.staged(name, slot, b) + q * i64(width)
                    dst = dests(b, j)
                    T.evaluate(T.cuda.func_call(func, tirx.address_of(self.buf[src]), tirx.address_of(self.buf[dst]),
                                                self._at(bar), rank.astype("uint32"), source_code=source))

        _strided(cfg.ctas * NB * per_row, cfg.warps * 32, self.tid, one)

    def forward(self, name, slot, n0, dests, s):
        """clusters > 1, after send_staged: the units of `name` that CTA `rank` of each other cluster published (h of
        step s + 1, for slot `slot`; a stored value of step s), polled until their tags say so, then sent on to every
        CTA of this cluster, `width` units a st.async onto the mbarrier the cluster's own units count on. Lanes that
        send one group to different CTAs poll the same words (one load for the warp).

        Nothing is overwritten early, by the argument of the class docstring: this CTA polls h[s+1] after it had all of
        h[s]; and a CTA publishes h[s+1] over the words of h[s-1] only once its cluster had all of h[s], which every
        other cluster sent only after its forwarders had polled h[s-1]."""
        spec, cfg, remote = self.a.spec, self.cfg, self.remote
        H, NB, UPC, C, Q = spec.hidden_size, cfg.batch_tile, cfg.units_per_cta(spec), cfg.ctas, cfg.clusters
        width = 4 if UPC % 4 == 0 and H % 4 == 0 else 1
        func, source = _forward_source(width)
        per_row = UPC // width
        bar = slot if name == "h" else i64(2)
        tag = step_sync.tag_of(s + i64(1) if name == "h" else s)

        def one(e):
            dest, group = e % i64(C), e // i64(C) % i64(per_row)
            b, k = e // i64(C * per_row) % i64(NB), e // i64(C * per_row * NB)
            other = tirx.Select(k >= remote.q, k + i64(1), k)  # every cluster but this one
            j = (other * i64(C) + remote.rank) * i64(UPC) + group * i64(width)
            with T.If(tirx.all(n0 + b < self.a.batch, j < i64(H))):
                with T.Then():
                    n = n0 + b
                    idx = [slot, remote.d, n, j] if name == "h" else [remote.d, n, j]
                    value = step_sync.wait(remote.words[name], idx, tag, width)
                    T.evaluate(T.cuda.func_call(func, value, tirx.address_of(self.buf[dests(b, j)]), self._at(bar),
                                                dest.astype("uint32"), source_code=source))

        _strided((Q - 1) * NB * per_row * C, cfg.warps * 32, self.tid, one)

    def _arm(self, i, n0, when):
        rows = tirx.min(i64(self.cfg.batch_tile), self.a.batch - n0)
        with T.If(tirx.all(self.tid == i64(0), when)):
            with T.Then():
                T.evaluate(T.cuda.func_call(ARM, self._at(i), (rows * i64(4 * self.a.spec.hidden_size)).astype("uint32"),
                                            source_code=ARM_SRC))

    def arm_chunk(self, n0):
        """The first phases of a chunk: h[1] (slot 1), h[2] (slot 0), the stored operand of step 0."""
        seq = self.a.seq
        self._arm(i64(1), n0, seq >= i64(1))
        self._arm(i64(0), n0, seq >= i64(2))
        if any(p.operand != "h" for p in self.a.cell.phases):
            self._arm(i64(2), n0, seq >= i64(1))

    def wait_h(self, s, done, n0):
        """h[s] whole in slot s % 2 (s >= 1); then slot s % 2 armed for h[s+2]. Slot 1 completes (seq+1)//2 phases a
        pass (h[1], h[3], ...), slot 0 seq//2; h[s] is its slot's (s-1)//2-th of pass `done` (the cluster's passes
        before this one)."""
        seq, slot = self.a.seq, s % i64(2)
        phases = tirx.Select(slot == i64(1), (seq + i64(1)) // i64(2), seq // i64(2)) * done + (s - i64(1)) // i64(2)
        self._wait(slot, phases)
        self._arm(slot, n0, s + i64(2) <= seq)

    def wait_stored(self, s, done, n0):
        """The stored operand of step s whole (one phase a step); then armed for step s+1."""
        self._wait(i64(2), self.a.seq * done + s)
        self._arm(i64(2), n0, s + i64(1) < self.a.seq)

    def _wait(self, i, done):
        T.evaluate(T.cuda.func_call(WAIT, self._at(i), (done % i64(2)).astype("uint32"), source_code=WAIT_SRC))


def _chunk(a: KernelArgs, cfg: ClusterConfig, rows, layout: _Rows, regs: dict, weights: dict, d, j0, chunk, done, ty,
           lane, tid, arrivals: _Arrivals | None = None):
    """Rows n0.. of the batch (chunk `chunk`, the cluster's pass `done`: its mbarriers' phases count passes) through the
    whole sequence: initial states, a barrier, the steps, the final states."""
    spec, cell = a.spec, a.cell
    H, D, NB, threads = spec.hidden_size, spec.num_directions, cfg.batch_tile, cfg.warps * 32
    N, n0 = a.batch, chunk * i64(cfg.batch_tile)
    hbuf = _rows_view(rows.data, (2, D, N, H), (NB * H, 0, H, 1), n0 * i64(H))
    scratch = {v: _rows_view(rows.data, (D, N, H), (0, H, 1), n0 * i64(H) - i64(layout.value[v])) for v in cell.stored_values}
    yc, params = a.Yc, a.params
    if params is not None:  # the unit's parameters (peepholes, GRU's Rb_h) in registers, as params is indexed
        regs["params"] = _own_params(a, cfg, d, j0, ty, lane)
        a.params = T.decl_buffer(params.shape, F32, data=regs["params"].data, strides=[i64(0), i64(1), i64(0)], scope="local")
    if yc is not None:  # the lane's cell state as Yc is indexed: its own (unit, row) at 0
        slot, b = _lane_unit(cfg, spec, ty, lane)
        strides = (0, 1, NB) if spec.layout == 0 else (1, 0, NB)
        a.Yc = T.decl_buffer(yc.shape, F32, data=regs["c"].data, strides=[i64(v) for v in strides],
                             elem_offset=-((j0 + slot) * i64(NB) + n0 + b), scope="local")
    operands = dict.fromkeys(p.operand for p in cell.phases)
    if arrivals:
        share = {v: arrivals.stage(v, n0) for v in operands}
    else:
        share = {v: _share(cfg.ctas) for v in operands}
    # a value only its unit's owner reads (GRU's z) goes into its own CTA's copy
    a.shared = {name: share.get(name, store_unseen) for name in ("h", *cell.stored_values)}

    def init_h(e):  # all of h0 into the CTA's own copy
        n, k = n0 + e // i64(H), e % i64(H)
        with T.If(n < N):
            with T.Then():
                T.buffer_store(hbuf, a.initial("h", d, n, k), [i64(0), d, n, k])

    _strided(H * NB, threads, tid, init_h)
    if yc is not None:
        _each_owned(a, cfg, d, j0, n0, ty, lane,
                    lambda n, j: T.buffer_store(a.Yc, a.initial("c", d, n, j), a.state_index(d, n, j)))
    if arrivals:
        arrivals.arm_chunk(n0)
    # the initial states visible to the CTA's threads: written here, as TVM's barrier planner cannot place a barrier
    # under auto's batch dispatch (the kernel is one branch of it)
    block_sync()
    _cluster_barrier()  # every CTA started (DSMEM needs it), holds the initial states (and sees the mbarriers armed)
    _prefetch_xw(a, cfg, regs, i64(0), d, j0, n0, ty, lane)

    def phase_step(pi, phase, last, operand, s, cur, nxt):
        if arrivals and phase.operand == "h":
            with T.If(s >= i64(1)):  # h[0] is the initial state, behind the barrier above
                with T.Then():
                    arrivals.wait_h(s, done, n0)
        elif arrivals:
            arrivals.wait_stored(s, done, n0)
        remote = arrivals and arrivals.remote
        a.published = remote.published(s) if remote else {}
        _phase(a, cfg, pi, phase, last, operand, hbuf, scratch, weights, regs, s, cur, nxt, d, j0, n0, ty, lane)
        a.published = {}
        if arrivals:  # the values this phase staged, once all its lanes have
            block_sync()
            sent = [(name, (lambda b, j: nxt * i64(NB * H) + b * i64(H) + j) if name == "h"
                     else (lambda b, j, name=name: i64(layout.value[name]) + b * i64(H) + j))
                    for name in (["h"] if last else []) + [v for v in phase.stores if v in operands]]
            for name, dests in sent:
                arrivals.send_staged(name, nxt, n0, dests)
            for name, dests in sent if remote else ():  # after the cluster's own: those are ready, these are polled
                arrivals.forward(name, nxt, n0, dests, s)
        if last:  # the next step's XW, in flight across the wait
            _prefetch_xw(a, cfg, regs, s + i64(1), d, j0, n0, ty, lane)
        if not arrivals:
            _cluster_barrier()

    step_phases(a, hbuf, scratch, phase_step)
    if arrivals:  # the last h whole (the CTA's own units came by st.async too), nothing left in flight into this CTA
        with T.If(a.seq >= i64(1)):
            with T.Then():
                arrivals.wait_h(a.seq, done, n0)

    def final(n, j):
        T.buffer_store(a.Yh, hbuf[a.seq % 2, d, n, j], a.state_index(d, n, j))
        if yc is not None:
            T.buffer_store(yc, a.Yc[tuple(a.state_index(d, n, j))], a.state_index(d, n, j))

    _each_owned(a, cfg, d, j0, n0, ty, lane, final)
    block_sync()  # the next chunk's initial states overwrite what this one's final states read
    a.Yc, a.params, a.shared = yc, params, {}


def _own_params(a: KernelArgs, cfg: ClusterConfig, d, j0, ty, lane):
    """The parameters of the unit this lane finishes (clamped: a lane past them loads a value it never uses)."""
    slot, _ = _lane_unit(cfg, a.spec, ty, lane)
    count = len(a.cell.params)
    regs = T.alloc_buffer((count,), F32, scope="local")
    for k in range(count):
        T.buffer_store(regs, a.params[d, i64(k), tirx.min(j0 + slot, i64(a.spec.hidden_size - 1))], [i64(k)])
    return regs


def _lane_unit(cfg: ClusterConfig, spec, ty, lane):
    """The unit slot (in the CTA) and batch row of the chunk that this lane finishes: warp_gemv's lane u*NB + b."""
    return ty * i64(cfg.units_per_warp(spec)) + lane // i64(cfg.batch_tile), lane % i64(cfg.batch_tile)


def _each_owned(a: KernelArgs, cfg: ClusterConfig, d, j0, n0, ty, lane, body):
    """body(n, j) in the lane that finishes unit j of row n, for the chunk's rows."""
    slot, b = _lane_unit(cfg, a.spec, ty, lane)
    valid = [lane < i64(cfg.units_per_warp(a.spec) * cfg.batch_tile), slot < i64(cfg.units_per_cta(a.spec)),
             j0 + slot < i64(a.spec.hidden_size), n0 + b < a.batch]
    with T.If(tirx.all(*valid)):
        with T.Then():
            body(n0 + b, j0 + slot)


def _prefetch_xw(a: KernelArgs, cfg: ClusterConfig, regs, s, d, j0, n0, ty, lane):
    """XW of step s for every phase: of the unit and row this lane finishes, and of the (unit, gate, row) whose
    scattered sum it holds (warp_gemv.scattered_slot); clamped, so that a lane past them loads a value it never uses.
    Nothing past the sequence's end."""
    H, N, UW, UPC = a.spec.hidden_size, a.batch, cfg.units_per_warp(a.spec), cfg.units_per_cta(a.spec)
    slot, b = _lane_unit(cfg, a.spec, ty, lane)
    with T.If(s < a.seq):
        with T.Then():
            for pi, phase in enumerate(a.cell.phases):
                load_xw_ahead(a, phase, s, d, tirx.min(n0 + b, N - 1), tirx.min(j0 + slot, i64(H - 1)), regs["xw"], [i64(pi)])
                own = _own_slot(a, cfg, phase, lane)
                if own is None:
                    continue
                u, gi, ob = own
                n, j = tirx.min(n0 + ob, N - 1), tirx.min(j0 + tirx.min(ty * i64(UW) + u, i64(UPC - 1)), i64(H - 1))
                gate = i64(phase.gates[0])
                for k, g in list(enumerate(phase.gates))[1:]:
                    gate = tirx.Select(gi == i64(k), i64(g), gate)
                t = tirx.max(a.time_index(d, n, s), i64(0))
                T.buffer_store(regs["own_xw"], a.xw(d, n, t, gate, j), [i64(pi)])


def _own_slot(a: KernelArgs, cfg: ClusterConfig, phase, lane):
    """(unit, gate position, row) whose scattered sum this lane holds (warp_gemv.scattered_slot), where the phase
    activates some gate from its own sum alone (cells.own_gate_activations); else None."""
    if not cells.own_gate_activations(phase):
        return None
    return scattered_slot(lane, cfg.units_per_warp(a.spec), len(phase.gates), cfg.batch_tile)


def _lane_activation(a: KernelArgs, cfg: ClusterConfig, phase, pi, regs, d, lane):
    """warp_gates' lane_activation: the gates the phase program activates from their own sums alone
    (cells.own_gate_activations), each computed in the lanes holding its sum. Every lane computes every distinct
    function and keeps its gate's (a select between registers: a branch would run them one after another); sigmoid
    and tanh, the usual pair, as one sigmoid, tanh(x) = 2 sigmoid(2x) - 1."""
    found = _own_slot(a, cfg, phase, lane)
    if found is None:
        return None
    own = cells.own_gate_activations(phase)
    own_gi = {gi: own[g] for gi, g in enumerate(phase.gates) if g in own}
    temps = vector_math.RegisterTemps()
    activation = temps.activation if accurate_math(a.spec) else cells.apply_activation
    terms = cells.Terms(None, None, None, None, None, direction_activation(a, d, activation), a.spec.clip)
    names = {k: {acts[k].name for acts in a.spec.activations} for k in set(own_gi.values())}
    sigmoid, tanh = (next((k for k, n in names.items() if n == {name}), None) for name in ("Sigmoid", "Tanh"))

    def act(total):
        pre = temps.bind(regs["own_xw"][i64(pi)] + total)
        if len(names) == 2 and None not in (sigmoid, tanh):
            is_tanh = tirx.any(*[found[1] == i64(gi) for gi, k in own_gi.items() if k == tanh])
            x = temps.bind(terms.clipped(pre))
            s = temps.bind(terms.act_noclip(sigmoid, tirx.Select(is_tanh, x + x, x)))
            return tirx.Select(is_tanh, s + s - tirx.const(1.0, F32), s)
        by_function = {k: temps.bind(terms.act(k, pre)) for k in sorted(names)}
        value = by_function[min(by_function)]
        for gi, k in own_gi.items():
            value = tirx.Select(found[1] == i64(gi), by_function[k], value)
        return value

    return own_gi, act


def _phase(a, cfg, pi, phase, last, operand, hbuf, scratch, weights, regs, s, cur, nxt, d, j0, n0, ty, lane):
    """Each warp: all gates of its units from the CTA's copy of the operand, the gate program in the lanes that own
    (unit, row), and the results stored into every CTA's copy (store_operand's hook)."""
    spec = a.spec
    H, N, NB, UPC, UW = spec.hidden_size, a.batch, cfg.batch_tile, cfg.units_per_cta(spec), cfg.units_per_warp(spec)
    V = vector_width(spec, H)
    first = ty * i64(UW)

    def h_at(_u, b, k):
        return operand_at(operand, phase, cur, d, tirx.min(n0 + i64(b), N - 1), k)

    RK = cfg.reg_k
    segments = []
    if RK:  # the lane's own V elements of round k // (32 V), in registers (warp_gemv's k = (round*32 + lane)*V + v)
        segments.append((RK, h_at, lambda u, g, k: weights["regs"][i64(u), i64(g), k // i64(32 * V), k % i64(V)], True))
    if RK < H:
        segments.append((H - RK, lambda u, b, k: h_at(u, b, k + i64(RK)),
                         lambda u, g, k: weights["smem"][tirx.min(first + i64(u), i64(UPC - 1)), i64(g), k]))

    def finish(u, b, rec, activated=None):  # u, b: the lane's (warp_gates in_parallel)
        slot, n = first + u, n0 + b
        gates = {phase.gates[gi]: v for gi, v in (activated or {}).items()}
        with T.If(tirx.all(slot < i64(UPC), j0 + slot < i64(H), n < N)):
            with T.Then():
                epilogue(a, phase, last, hbuf, scratch, s, cur, nxt, d, n, j0 + slot, rec,
                         x=lambda gi: regs["xw"][i64(pi), i64(gi)], activated=gates)
                for name in phase.stores:  # a row past its end stores nothing, yet a later phase waits for it
                    if name in operand_names:
                        with T.If(s >= a.length(n)):
                            with T.Then():
                                store_operand(a, name, scratch[name], tirx.const(0.0, F32), [d, n, j0 + slot])

    operand_names = {p.operand for p in a.cell.phases}
    with T.If(tirx.all(first < i64(UPC), j0 + first < i64(H))):  # warp-uniform: a warp with no unit below H has nothing to do
        with T.Then():
            warp_gates(lane, H, phase.gates, UW, NB, V, h_at=None, w_at=None, finish=finish,
                       row_valid=(lambda b: n0 + i64(b) < N) if NB > 1 else None, segments=segments, in_parallel=True,
                       lane_activation=_lane_activation(a, cfg, phase, pi, regs, d, lane))
