"""The kinds of recurrent kernel, registered one per kind: each its knobs, its default point, the body a point emits
and the grid it launches (KernelKind). Which kind runs which batch is schedules/choice.py's table.

A point of a space is a `KernelConfig`: a kind and a value for each of its knobs. The kind is itself a knob: the CUDA
kinds that run a layer are design spaces of one tuning task, MetaSchedule samples their knobs (tvmrnn/tuning/search.py),
and every point of every space is a correct kernel (the tests run sampled points). Adding a kind is one `register`.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable

from .device import Device
from .errors import KernelError

CPU_ROWS = (1, 2, 3, 4, 5, 8)
CPU_UNITS = (8, 16, 32, 64, 128, 256)


@dataclass(frozen=True)
class KernelConfig:
    kind: str  # a registered KernelKind's name
    knobs: tuple[tuple[str, int], ...]  # (name, value), sorted by name

    @staticmethod
    def of(kind: str, **knobs) -> KernelConfig:
        later = _later_knobs(kind)
        return KernelConfig(kind, tuple(sorted((k, int(v)) for k, v in knobs.items() if later.get(k, -1) != int(v))))

    @staticmethod
    def from_dict(d: dict) -> KernelConfig:
        d = dict(d)
        return KernelConfig.of(d.pop("kind"), **d)

    def __getitem__(self, name: str) -> int:
        knobs = dict(self.knobs)
        return knobs[name] if name in knobs else _later_knobs(self.kind)[name]

    def as_dict(self) -> dict:
        return {"kind": self.kind, **dict(self.knobs)}

    def describe(self) -> str:
        return f"{self.kind}(" + ", ".join(f"{k}={v}" for k, v in self.knobs) + ")"


def _later_knobs(kind: str) -> dict:
    return KINDS[kind].later_knobs if kind in KINDS else {}


def tensor_cores(target) -> bool:
    """Whether the CUDA target has the mma.sync shapes our tensor-core kernels issue (m16n8k16 fp16/bf16, m16n8k8
    TF32: sm_80 and newer)."""
    digits = "".join(c for c in Device.of_target(target).arch.removeprefix("sm_") if c.isdigit())
    return target.kind.name == "cuda" and int(digits or 0) >= 80


def rounding_mode(spec, target) -> str | None:
    """The tensor-core mode of the per-step mma kernel and the projection GEMM on this target: the layer's half
    dtype or its opt-in TF32, None for exact fp32 (those run SIMT) or a target without tensor cores."""
    from .recurrent_mma import mode

    return mode(spec, exact=False) if tensor_cores(target) else None


def _half_operand(spec) -> dict[str, tuple[int, ...]]:
    """fp16/bf16 layers on tensor cores: B from the half-precision copy of h (bit-identical, half the bytes) or not."""
    from .recurrent_mma import HALF

    return {"half_operand": (0, 1)} if spec.dtype in HALF else {}


@dataclass(frozen=True)
class Fit:
    """What of a layer fits on a CUDA device, which decides the kinds it may run."""

    persistent: bool  # R (all directions) in shared memory across one wave of the persistent kernel's blocks
    resident: bool  # ... and across one wave of persistent_mma's
    streams: bool  # R does not fit, and persistent_mma runs with part of it read from L2 every step (streaming_config)
    tensor_cores: bool  # the per-step mma kernel runs: fp16/bf16 or TF32 on sm_80 and newer
    wide: bool  # hidden size of at least TILED_MIN_HIDDEN (choice.py)
    cluster: bool = False  # R (each direction's) in the shared memory of thread-block clusters (sm_90 and newer)
    hidden_size: int = 0
    exact_mma: bool = False  # exact fp32 with R resident and at most EXACT_MMA_MAX_HIDDEN units: mma runs it (3xTF32)
    cluster_grid: bool = False  # the cluster kind's default is a grid of clusters a direction (recurrent_cluster)
    # the largest batch bound of choice.CLUSTER_BATCHES that runs as that many clusters side by side, one row each (0: none)
    cluster_batch: int = 0
    # R resident on tensor cores, and auto's kind above persistent_mma's 32-row passes is the per-step mma, not
    # persistent_mma's 64-row passes: exact fp32 to EXACT_MMA_MAX_HIDDEN units, a rounding mode below
    # ROUNDED_PASSES_MIN_HIDDEN and in GRU and RNN layers (choice.py)
    per_step_above: bool = False
    # R resident, and persistent_mma's points to batch 16 poll h's tagged words (fp16 single-phase LSTM and GRU layers
    # in whole chunks: recurrent_persistent_mma.polls_by_default) from choice.POLLED_MIN_HIDDEN units
    polled: bool = False

    @staticmethod
    def of(spec, cell, target, device: Device) -> Fit:
        from . import recurrent_cluster as cluster
        from . import recurrent_persistent as persistent
        from .choice import CLUSTER_BATCHES, EXACT_MMA_MAX_HIDDEN, POLLED_MIN_HIDDEN, ROUNDED_PASSES_MIN_HIDDEN, TILED_MIN_HIDDEN
        from .recurrent_mma import MmaConfig
        from .recurrent_persistent_mma import polls_by_default

        resident, half_or_tf32 = persistent_mma_fits(spec, cell, target, device), rounding_mode(spec, target) is not None
        H = spec.hidden_size
        exact_mma = resident and not half_or_tf32 and tensor_cores(target) and H <= EXACT_MMA_MAX_HIDDEN
        per_step_above = exact_mma or (resident and half_or_tf32 and (H < ROUNDED_PASSES_MIN_HIDDEN or spec.op != "LSTM"))
        on_clusters = cluster.fits(spec, cell, device)
        return Fit(persistent.fits(spec, cell, device), resident, persistent_mma_streams(spec, cell, target, device),
                   half_or_tf32, spec.hidden_size >= TILED_MIN_HIDDEN, on_clusters, spec.hidden_size, exact_mma,
                   on_clusters and cluster.default_config(spec, cell, device).clusters > 1,
                   max((b for b, _ in CLUSTER_BATCHES if on_clusters and cluster.batch_config(spec, cell, device, b)), default=0),
                   per_step_above, resident and H >= POLLED_MIN_HIDDEN and polls_by_default(spec, cell, MmaConfig()))


@dataclass(frozen=True)
class KernelKind:
    """One kind of recurrent kernel: its target, the layers it runs on, its knobs, its untuned point, the body a point
    emits and the grid a point launches cooperatively (0: an ordinary launch)."""

    name: str
    target: str  # "cpu" | "cuda"
    runs: Callable[[Fit], bool]  # whether auto may pick it for a layer (tuning searches these kinds)
    knobs: Callable  # (spec, cell, device) -> {knob: candidate values}; every combination builds a correct kernel
    default: Callable  # (spec, cell, device, batch) -> KernelConfig: the hand-picked point, for `batch` rows where it matters
    emit: Callable  # (KernelConfig, spec, cell, device) -> the kernel body, a function of KernelArgs
    grid: Callable = lambda config, spec: 0  # (KernelConfig, spec) -> blocks launched cooperatively
    # knobs added after tuning logs were written for the kind, with the value that is what the kernel did before: a
    # point names them only when set otherwise, so a logged point without the knob and today's point are one point
    later_knobs: dict = field(default_factory=dict)


KINDS: dict[str, KernelKind] = {}


def register(kind: KernelKind) -> KernelKind:
    KINDS[kind.name] = kind
    return kind


# ---- cpu: the LLVM kernel (recurrent_cpu): rows (batch rows per load of R), units (hidden units per work item, whole
# panels of R), serpentine (odd steps take each thread's share in reverse)
def _cpu_knobs(spec, cell, device):
    from .recurrent_cpu import chunk_size, units_fit

    H = spec.hidden_size
    units = {u for u in CPU_UNITS if units_fit(H, u)} | {chunk_size(H, 128), chunk_size(H, 64), chunk_size(H, 16)}
    return {"rows": CPU_ROWS, "units": tuple(sorted(units)), "serpentine": (0, 1)}


def _cpu_default(spec, cell, device, batch):
    """Batch 1: single rows, wide items (small_batch_units). Batch 2 to ROW_TILE - 1: one tile of exactly the batch's
    rows, so each step reads R once for all of them (a step at these batches is a pass over R from L2, its bandwidth
    the bound: docs/decisions.md). Else tiles of ROW_TILE (or 5) rows. Row tiles take row_tile_units."""
    from .recurrent_cpu import ROW_TILE, row_tile_rows, row_tile_units, small_batch_units

    if batch == 1:
        return KernelConfig.of("cpu", rows=1, units=small_batch_units(spec.hidden_size, spec.num_directions, device.cpu_threads),
                               serpentine=1)
    if batch is not None and batch < ROW_TILE:
        return KernelConfig.of("cpu", rows=batch, units=row_tile_units(spec.hidden_size, cell.gates), serpentine=1)
    units = row_tile_units(spec.hidden_size, cell.gates)
    return KernelConfig.of("cpu", rows=row_tile_rows(batch, cell.gates, units), units=units, serpentine=1)


def _cpu_emit(config, spec, cell, device):
    from .recurrent_cpu import CpuConfig, cpu_steps

    cfg = CpuConfig(rows=config["rows"], units=config["units"], serpentine=config["serpentine"])
    return lambda a: cpu_steps(a, cfg, device.cpu_threads)


register(KernelKind("cpu", "cpu", lambda fit: False, _cpu_knobs, _cpu_default, _cpu_emit, later_knobs={"serpentine": 0}))


# ---- persistent: one cooperative launch for the whole sequence, R in shared memory (recurrent_persistent): blocks
# (one co-resident wave), warps, batch_tile, stage_h (h staged in shared memory), prefetch (XW loaded before the reduction),
# sync (0: a grid barrier a step; 1: h polled as words tagged with their step, schedules/step_sync.py)
def _persistent_knobs(spec, cell, device):
    from . import recurrent_persistent as persistent

    sms = device.sm_count
    candidates = {sms, sms * 3 // 4, sms // 2, spec.num_directions}  # the last: one block per direction (small layers)
    blocks = tuple(b for b in sorted(candidates, reverse=True) if persistent.fits(spec, cell, device, blocks=b))
    return {"blocks": blocks or (sms,), "warps": (4, 8, 16, 32), "batch_tile": (1, 2, 4), "stage_h": (0, 1), "prefetch": (0, 1),
            "sync": (0, 1)}


def _persistent_config(config):
    from .recurrent_persistent import PersistentConfig

    return PersistentConfig(blocks=config["blocks"], warps=config["warps"], batch_tile=config["batch_tile"],
                            stage_h=bool(config["stage_h"]), prefetch=config["prefetch"], sync=config["sync"])


def _persistent_default(spec, cell, device, batch):
    from . import recurrent_persistent as persistent

    c = persistent.default_config(spec, device)
    return KernelConfig.of("persistent", blocks=c.blocks, warps=c.warps, batch_tile=c.batch_tile, stage_h=int(c.stage_h),
                           prefetch=c.prefetch, sync=c.sync)


def _persistent_emit(config, spec, cell, device):
    from .recurrent_persistent import persistent_body

    cfg = _persistent_config(config)
    return lambda a: persistent_body(a, cfg)


register(KernelKind("persistent", "cuda", lambda fit: fit.persistent, _persistent_knobs, _persistent_default, _persistent_emit,
                    grid=lambda config, spec: _persistent_config(config).grid(spec), later_knobs={"prefetch": 0, "sync": 0}))


# ---- persistent_mma: the persistent tensor-core kernel (recurrent_persistent_mma): mma's knobs, prefetch, and in exact
# fp32 split_acc (3xTF32's cross products in accumulators of their own), chunk_acc (each k-chunk summed apart) and halves
# (f16x3 steps, where the cell bounds h); flat_sums (the k-warps' partial sums in slots of their own, where R is
# resident); sync (steps polling h's tagged half words instead of a grid barrier: fp16 single-phase cells); where R is
# larger than a wave's shared memory, streamed (the chunks of R read from L2 every step), ring (the shared buffers they
# pass through) and ring_h (h's chunks through them too)
def _persistent_mma_knobs(spec, cell, device):
    """Tile shapes that fit beside R (or beside the part of it that stays resident), prefetch, and in 3xTF32 split_acc
    and chunk_acc."""
    resident = _resident_tiles(spec, cell, device)
    space = resident or _streaming_tiles(spec, cell, device)
    if space:
        from .recurrent_mma import mode
        from .recurrent_persistent_mma import halves_apply

        space["prefetch"] = (0, 1)
        if mode(spec) == "tf32x3":
            space["split_acc"] = (0, 1)
            space["chunk_acc"] = (0, 1)
            if halves_apply(spec) and (resident or space["ring"][0]):  # streamed chunks in f16x3 come through the ring
                space["halves"] = (0, 1)
        space = _half_operand(spec) | space  # the streaming space fixes half_operand (_streaming_tiles)
    return space


def _resident_tiles(spec, cell, device) -> dict[str, tuple[int, ...]]:
    """Units per block that fit one wave with R in shared memory, and batch tiles whose partial sums still fit
    beside R at the largest of those units with the most warps (so every combination fits, f16x3's row scales too);
    flat sums where they fit so at every one of those tiles."""
    from .recurrent_mma import MmaConfig
    from .recurrent_persistent_mma import UNITS, fits, halves_apply, polls

    halves = int(halves_apply(spec))
    units = [u for u in UNITS if fits(spec, cell, device, MmaConfig(units=u, n_tiles=1, n_warps=1, k_warps=2, halves=halves))]
    while units:
        def widest_fits(n_tiles, flat_sums=0):  # the most warps at the largest units
            return fits(spec, cell, device, MmaConfig(units=units[-1], n_tiles=n_tiles, n_warps=2, k_warps=8, halves=halves, flat_sums=flat_sums))

        n_tiles = tuple(nt for nt in (1, 2, 3, 4) if widest_fits(nt))
        if n_tiles:
            polled = polls(spec, cell, MmaConfig())  # where it may poll, four chunks a round too (the default's there)
            return {"units": tuple(units), "n_tiles": n_tiles, "n_warps": (1, 2), "k_warps": (2, 4, 8),
                    "depth": (1, 2, 4) if polled else (1, 2),
                    "flat_sums": (0, 1) if all(widest_fits(nt, flat_sums=1) for nt in n_tiles) else (0,),
                    "sync": (0, 1) if polled else (0,)}
        units.pop()
    return {}


def _streaming_tiles(spec, cell, device) -> dict[str, tuple[int, ...]]:
    """Where streaming_config applies: its units, warps, depth and ring, batch tiles and reduction splits around its point,
    and one value of `streamed`, the most any combination needs (streaming_config's own), so every combination fits and
    none streams far more than it must. Depth 1 only: with the ring, depth 2 doubles its buffers (docs/decisions.md)."""
    import itertools

    from .recurrent_mma import MmaConfig
    from .recurrent_persistent_mma import fewest_streamed, streaming_config

    point = streaming_config(spec, cell, device)
    if point is None:
        return {}
    space = {"units": (point.units,), "n_tiles": (2, 4), "n_warps": (point.n_warps,), "k_warps": (2, 4), "depth": (1,), "ring": (point.ring,),
             "ring_h": (point.ring_h,)}
    if _half_operand(spec):  # B's ring buffers in fp32 would take twice the bytes for what the mma rounds to fp16 anyway
        space["half_operand"] = (point.half_operand,)
    need = [fewest_streamed(spec, cell, device, MmaConfig(**dict(zip(space, values)))) for values in itertools.product(*space.values())]
    return space | {"streamed": (max(need),)}


def _mma_point(kind, spec, c) -> KernelConfig:
    """An MmaConfig as a point of `kind`: the knobs that kind has, the streaming ones only where they are set."""
    from .recurrent_mma import mode

    knobs = dict(units=c.units, n_tiles=c.n_tiles, n_warps=c.n_warps, k_warps=c.k_warps, depth=c.depth)
    if kind == "persistent_mma":
        knobs["prefetch"] = c.prefetch
        if mode(spec) == "tf32x3":
            knobs["split_acc"] = c.split_acc
            knobs["halves"] = c.halves
    if _half_operand(spec):
        knobs["half_operand"] = c.half_operand
    for name in ("streamed", "ring", "ring_h", "flat_sums", "sync", "r_regs"):  # named only where on (the first three: R not on chip)
        if getattr(c, name):
            knobs[name] = getattr(c, name)
    return KernelConfig.of(kind, **knobs)


def _persistent_mma_default(spec, cell, device, batch):
    from .recurrent_persistent_mma import default_config

    return _mma_point("persistent_mma", spec, default_config(spec, cell, device, batch))


def _persistent_mma_emit(config, spec, cell, device):
    from .recurrent_mma import MmaConfig
    from .recurrent_persistent_mma import persistent_mma_body

    cfg = MmaConfig(**dict(config.knobs))
    return lambda a: persistent_mma_body(a, cfg)


def _persistent_mma_grid(config, spec):
    from .recurrent_persistent_mma import blocks

    return blocks(spec, config["units"])


register(KernelKind("persistent_mma", "cuda", lambda fit: fit.resident or fit.streams, _persistent_mma_knobs, _persistent_mma_default,
                    _persistent_mma_emit, grid=_persistent_mma_grid,
                    later_knobs={"chunk_acc": 0, "ring": 0, "ring_h": 0, "halves": 0, "flat_sums": 0, "sync": 0, "r_regs": 0}))


# ---- stepwise: one fused launch per step and phase, weights from L2/HBM (recurrent_cuda): warps per block,
# units_per_warp, batch_tile (rows reusing each weight read)
def _stepwise_default(spec, cell, device, batch):
    from .recurrent_cuda import StepwiseConfig

    c = StepwiseConfig()
    return KernelConfig.of("stepwise", warps=c.warps, units_per_warp=c.units_per_warp, batch_tile=c.batch_tile)


def _stepwise_emit(config, spec, cell, device):
    from .recurrent_cuda import StepwiseConfig, stepwise_body

    cfg = StepwiseConfig(warps=config["warps"], units_per_warp=config["units_per_warp"], batch_tile=config["batch_tile"])
    return lambda a: stepwise_body(a, cfg)


register(KernelKind("stepwise", "cuda", lambda fit: True,
                    lambda spec, cell, device: {"warps": (2, 4, 8), "units_per_warp": (1, 2), "batch_tile": (1, 2, 4, 8, 16)},
                    _stepwise_default, _stepwise_emit))


# ---- tiled: per step one tiled GEMM launch, R and h staged in shared memory (recurrent_tiled): units per block,
# row_threads x rows_per_thread batch rows per block, k_chunk staged per round. Every combination stays within 1024
# threads and 48 KB of shared memory
def _tiled_default(spec, cell, device, batch):
    from .recurrent_tiled import default_config

    c = default_config(batch)
    return KernelConfig.of("tiled", units=c.units, row_threads=c.row_threads, rows_per_thread=c.rows_per_thread, k_chunk=c.k_chunk)


def _tiled_emit(config, spec, cell, device):
    from .recurrent_tiled import TiledConfig, tiled_body

    cfg = TiledConfig(**dict(config.knobs))
    return lambda a: tiled_body(a, cfg)


register(KernelKind("tiled", "cuda", lambda fit: not fit.tensor_cores,
                    lambda spec, cell, device: {"units": (4, 8, 16, 32), "row_threads": (4, 8, 16, 32), "rows_per_thread": (1, 2, 4),
                                                "k_chunk": (16, 32)},
                    _tiled_default, _tiled_emit))


# ---- mma: per step one launch of tensor-core mma tiles (recurrent_mma): units per block, n_tiles x n_warps batch
# tiles of 8 rows, k_warps splitting the reduction, depth chunks in flight, and in fp16/bf16 half_operand (B read from
# a half-precision copy of h). At most 8 warps and 33 KB of shared memory
def _mma_default(spec, cell, device, batch):
    from .recurrent_mma import default_config

    return _mma_point("mma", spec, default_config(batch))


def _mma_emit(config, spec, cell, device):
    from .recurrent_mma import MmaConfig, mma_body

    cfg = MmaConfig(**dict(config.knobs))
    return lambda a: mma_body(a, cfg)


register(KernelKind("mma", "cuda", lambda fit: fit.tensor_cores or fit.exact_mma,
                    lambda spec, cell, device: {"units": (8, 16), "n_tiles": (1, 2, 4), "n_warps": (1, 2), "k_warps": (1, 2, 4),
                                                "depth": (1, 2, 4)} | _half_operand(spec),
                    _mma_default, _mma_emit, later_knobs={"chunk_acc": 0}))


# ---- cluster: one thread-block cluster per direction for the whole sequence, R and h in its CTAs' shared memory, h
# passed through distributed shared memory and a cluster barrier a phase (recurrent_cluster): ctas (8, or 16
# non-portable), warps, batch_tile, registers (1: as many of R's columns in registers as they take), sync (0: a cluster
# barrier a phase; 1: st.async counted on each CTA's mbarriers), batch_groups (clusters a direction running chunks of
# the batch side by side). The space keeps
# the values of each knob at which every combination fits
def _cluster_config(config, spec):
    from .recurrent_cluster import ClusterConfig

    cfg = ClusterConfig(ctas=config["ctas"], warps=config["warps"], batch_tile=config["batch_tile"], sync=config["sync"],
                        clusters=config["clusters"], batch_groups=config["batch_groups"])
    return cfg.with_registers(spec) if config["registers"] else cfg


def _cluster_knobs(spec, cell, device):
    import itertools

    from .recurrent_cluster import CLUSTER_SIZES

    space = {"ctas": CLUSTER_SIZES, "warps": (16, 8), "batch_tile": (1, 2, 4), "registers": (1, 0), "sync": (0, 1),
             "batch_groups": (1, 2, 4, 8)}

    def fit(point):
        cfg = _cluster_config(KernelConfig.of("cluster", **point), spec)
        return cfg.valid(spec) and cfg.smem_bytes(spec, cell) <= device.smem_limit and cfg.grid_fits(spec, device)

    default = dict(_cluster_default(spec, cell, device, None).knobs)
    for name in space:  # each knob's values that fit with the others at their default
        space[name] = tuple(v for v in space[name] if fit(default | {name: v})) or (default[name],)
    combos = [dict(zip(space, values)) for values in itertools.product(*space.values())]
    return space if all(fit(p) for p in combos) else {k: (v,) for k, v in default.items()}


def _cluster_default(spec, cell, device, batch):
    from .recurrent_cluster import default_config

    c = default_config(spec, cell, device, batch)
    return KernelConfig.of("cluster", ctas=c.ctas, warps=c.warps, batch_tile=c.batch_tile, registers=int(c.reg_k > 0), sync=c.sync,
                           clusters=c.clusters, batch_groups=c.batch_groups)


def _cluster_emit(config, spec, cell, device):
    from .recurrent_cluster import cluster_body

    cfg = _cluster_config(config, spec)
    return lambda a: cluster_body(a, cfg)


def _cluster_grid(config, spec):
    """Several clusters a direction meet at one grid barrier (a cooperative launch); one does not."""
    clusters = config["clusters"]
    return spec.num_directions * clusters * config["ctas"] if clusters > 1 else 0


register(KernelKind("cluster", "cuda", lambda fit: fit.cluster, _cluster_knobs, _cluster_default, _cluster_emit,
                    grid=_cluster_grid, later_knobs={"clusters": 1, "batch_groups": 1}))


# ---- wavefront: stacked layers in one cooperative kernel (recurrent_wavefront); planned for a whole stack by
# schedules.stack_kernel, not searched: no knobs of its own, its grid the stack's
def _not_searched(*args):
    raise KernelError("stack kernels are planned for a stack of layers (schedules.stack_kernel), not point by point")


register(KernelKind("wavefront", "cuda", lambda fit: False, _not_searched, _not_searched, _not_searched,
                    grid=lambda config, spec: config["grid"]))
# a stack's layers at the per-step mma's batches, one launch of all their tiles a step (recurrent_mma_wavefront)
register(KernelKind("mma_wavefront", "cuda", lambda fit: False, _not_searched, _not_searched, _not_searched))
# the same at batch 5-64 where the stack's weights fit a wave: one cooperative launch (recurrent_persistent_mma_wavefront)
register(KernelKind("persistent_mma_wavefront", "cuda", lambda fit: False, _not_searched, _not_searched, _not_searched,
                    grid=lambda config, spec: config["grid"]))
# a whole small stack in one block (recurrent_block_stack): an ordinary launch, block barriers only
register(KernelKind("block_stack", "cuda", lambda fit: False, _not_searched, _not_searched, _not_searched))


def _kind(name: str) -> KernelKind:
    if name not in KINDS:
        raise ValueError(f"unknown kernel kind {name!r}")
    return KINDS[name]


def knob_space(kind: str, spec, cell, target, device: Device | None = None) -> dict[str, tuple[int, ...]]:
    """Each knob's candidate values for a layer on `target`; every combination builds a correct kernel."""
    return _kind(kind).knobs(spec, cell, device or Device.of_target(target))


def default_config(kind: str, spec, cell, target, batch: int | None = None, device: Device | None = None) -> KernelConfig:
    """The hand-picked point of a space (what an untuned module runs), for `batch` rows where that matters."""
    return _kind(kind).default(spec, cell, device or Device.of_target(target), batch)


def emitter(config: KernelConfig, spec, cell, device: Device | None = None):
    """The kernel body (a function of KernelArgs) that one point of a space builds."""
    return _kind(config.kind).emit(config, spec, cell, device or Device())


def cooperative_blocks(config: KernelConfig, spec) -> int:
    """The grid a point launches cooperatively (all blocks resident at once, one per SM), or 0 for a kind that does not."""
    return _kind(config.kind).grid(config, spec)


def in_space(config: KernelConfig, spec, cell, target, device: Device | None = None) -> bool:
    """Whether a point is one of its kind's space for this layer. A default may not be: persistent_mma's space keeps only
    knob values whose every combination fits beside R, and a default may fit where its neighbours do not."""
    space = knob_space(config.kind, spec, cell, target, device)
    return all(k in space and v in space[k] for k, v in config.knobs)


def persistent_mma_fits(spec, cell, target, device: Device | None = None) -> bool:
    """All of R in shared memory across one wave of blocks."""
    from .recurrent_mma import supported

    return tensor_cores(target) and supported(spec) and bool(_resident_tiles(spec, cell, device or Device.of_target(target)))


def persistent_mma_streams(spec, cell, target, device: Device | None = None) -> bool:
    """R does not fit on chip, and persistent_mma runs with part of it read from L2 every step (streaming_config)."""
    from .recurrent_mma import supported
    from .recurrent_persistent_mma import streaming_config

    device = device or Device.of_target(target)
    return (tensor_cores(target) and supported(spec) and not persistent_mma_fits(spec, cell, target, device)
            and streaming_config(spec, cell, device) is not None)


def kinds(spec, cell, target, choice: str = "auto", device: Device | None = None) -> tuple[str, ...]:
    """The kinds a layer may run on `target` under the user's kernel choice (what tuning searches): under auto every
    registered kind of the target that runs this layer, in registration order; else the one named, where it can run."""
    device = device or Device.of_target(target)
    if target.kind.name != "cuda":
        if choice != "auto":  # a GPU kernel asked of a CPU build would otherwise be dropped without a word
            raise KernelError(f"{spec.op} node '{spec.name}': kernel '{choice}' is a CUDA kernel and the target is "
                              f"{target.kind.name}, whose layers run the CPU kernel; use kernel='auto' (or a cuda target)")
        return ("cpu",)
    if choice in ("mma", "persistent_mma") and not tensor_cores(target):
        raise KernelError(f"{spec.op} node '{spec.name}': kernel '{choice}' issues tensor-core mma.sync shapes of sm_80 "
                          f"and newer; the target is {device.arch} (use auto, stepwise or tiled)")
    fit = Fit.of(spec, cell, target, device)
    if choice == "persistent_mma" and not KINDS[choice].runs(fit):
        raise KernelError(f"{spec.op} node '{spec.name}': kernel 'persistent_mma' needs one wave of blocks with R in shared "
                          f"memory or part of it streamed from L2, and hidden size {spec.hidden_size} x {spec.num_directions} "
                          f"direction(s) in {spec.dtype} fits neither on {device.arch}; use auto, mma or stepwise")
    if choice == "cluster" and not fit.cluster:
        from .recurrent_cluster import CLUSTER_SIZES, ClusterConfig, clusters_run_on, widest_grid

        need = min(ClusterConfig(ctas=c).with_registers(spec).smem_bytes(spec, cell) for c in CLUSTER_SIZES) / 1024
        grid = widest_grid(spec, device)
        why = (f"R of one direction needs {need:.0f} KB of shared memory per CTA across a cluster of 16, and "
               f"{grid.smem_bytes(spec, cell) / 1024:.0f} KB across {grid.clusters} clusters of {grid.ctas} (beside what "
               f"registers hold), and a CTA has {device.smem_limit / 1024:.0f} KB"
               if clusters_run_on(device) else f"thread-block clusters need sm_90 or newer; the target is {device.arch}")
        raise KernelError(f"{spec.op} node '{spec.name}': kernel 'cluster' keeps R in thread-block clusters: "
                          f"{why}; use auto or persistent")
    if choice != "auto":
        return (choice,)
    return tuple(k.name for k in KINDS.values() if k.target == "cuda" and k.runs(fit))
