"""The tunable spaces of our recurrent kernels: each schedule kind's knobs, its default point, and the body a point emits.

A point of a space is a `KernelConfig`: a schedule kind and a value for each of its knobs.

    cpu         rows (batch rows per R^T load), units (hidden units per work item)
    stepwise    warps per block, units_per_warp, batch_tile (rows reusing each weight read)
    persistent  blocks (one co-resident wave), warps, batch_tile, stage_h (h staged in shared memory), prefetch (XW loaded
                before the reduction)
    tiled       units per block, row_threads x rows_per_thread batch rows per block, k_chunk staged per round
    mma         (tensor cores) units per block, n_tiles x n_warps batch tiles of 8 rows, k_warps splitting the reduction, depth chunks in flight,
                and in fp16/bf16 half_operand (B read from a half-precision copy of h)
    persistent_mma  the same knobs, prefetch (XW loaded before the reduction) and in exact fp32 split_acc (3xTF32's
                cross products in accumulators of their own), chunk_acc (each k-chunk summed apart, added in fp32) and
                halves (f16x3 instead of 3xTF32, where the cell bounds h and R is resident or its streamed chunks come through the ring), for the persistent tensor-core kernel (one wave, R in shared memory;
                where R is larger than that, streamed: the chunks of R read from L2 every step, ring: the buffers in
                shared memory they pass through, and ring_h: h's chunks through them too)

The kind is itself a knob: persistent, stepwise, tiled, mma and persistent_mma are design spaces of one CUDA tuning task.
MetaSchedule samples the knobs (tvmrnn/tuning/search.py); compile builds each layer's kernel as a
dispatch over batch buckets, each bucket running its tuned point or the default one
(schedules/__init__.py). Every point of every space is a correct kernel: the tests run sampled points.
"""

from __future__ import annotations

from dataclasses import dataclass

from .errors import KernelError

CPU_ROWS = (1, 2, 4, 5, 8)
CPU_UNITS = (8, 16, 32, 64, 128, 256)
# Knobs added to a kind after tuning logs were written for it, with the value that is what the kernel did before: a point
# names them only when set otherwise, so a logged point without the knob and today's point with that value are one point
LATER_KNOBS = {"cpu": {"serpentine": 0}, "persistent": {"prefetch": 0}, "mma": {"chunk_acc": 0}, "persistent_mma": {"chunk_acc": 0, "ring": 0, "ring_h": 0, "halves": 0}}


@dataclass(frozen=True)
class KernelConfig:
    kind: str  # "cpu" | "stepwise" | "persistent" | "tiled" | "mma" | "persistent_mma"
    knobs: tuple[tuple[str, int], ...]  # (name, value), sorted by name

    @staticmethod
    def of(kind: str, **knobs) -> KernelConfig:
        later = LATER_KNOBS.get(kind, {})
        return KernelConfig(kind, tuple(sorted((k, int(v)) for k, v in knobs.items() if later.get(k, -1) != int(v))))

    @staticmethod
    def from_dict(d: dict) -> KernelConfig:
        d = dict(d)
        return KernelConfig.of(d.pop("kind"), **d)

    def __getitem__(self, name: str) -> int:
        knobs = dict(self.knobs)
        return knobs[name] if name in knobs else LATER_KNOBS[self.kind][name]

    def as_dict(self) -> dict:
        return {"kind": self.kind, **dict(self.knobs)}

    def describe(self) -> str:
        return f"{self.kind}(" + ", ".join(f"{k}={v}" for k, v in self.knobs) + ")"


def _arch(target) -> str:
    return str(target.attrs.get("arch", "sm_90a")) if target.attrs is not None else "sm_90a"


def tensor_cores(target) -> bool:
    """Whether the CUDA target has the mma.sync shapes our tensor-core kernels issue (m16n8k16 fp16/bf16, m16n8k8
    TF32: sm_80 and newer)."""
    digits = "".join(c for c in _arch(target).removeprefix("sm_") if c.isdigit())
    return target.kind.name == "cuda" and int(digits or 0) >= 80


def rounding_mode(spec, target) -> str | None:
    """The tensor-core mode of the per-step mma kernel and the projection GEMM on this target: the layer's half
    dtype or its opt-in TF32, None for exact fp32 (those run SIMT) or a target without tensor cores."""
    from .recurrent_mma import mode

    return mode(spec, exact=False) if tensor_cores(target) else None


def _divisors(hidden: int, options) -> tuple[int, ...]:
    return tuple(u for u in options if hidden % u == 0) or (1,)


def knob_space(kind: str, spec, cell, target) -> dict[str, tuple[int, ...]]:
    """Each knob's candidate values for a layer on `target`; every combination builds a correct kernel."""
    if kind == "cpu":
        from .recurrent_cpu import chunk_size

        units = set(_divisors(spec.hidden_size, CPU_UNITS)) | {chunk_size(spec.hidden_size, 64), chunk_size(spec.hidden_size, 16)}
        return {"rows": CPU_ROWS, "units": tuple(sorted(units)), "serpentine": (0, 1)}
    if kind == "stepwise":
        return {"warps": (2, 4, 8), "units_per_warp": (1, 2), "batch_tile": (1, 2, 4, 8, 16)}
    if kind == "persistent":
        from . import recurrent_persistent as persistent

        sms = persistent.sm_count(_arch(target))
        blocks = tuple(b for b in sorted({sms, sms * 3 // 4, sms // 2}, reverse=True)
                       if persistent.fits(spec, cell, _arch(target), blocks=b))
        return {"blocks": blocks or (sms,), "warps": (4, 8, 16), "batch_tile": (1, 2, 4), "stage_h": (0, 1), "prefetch": (0, 1)}
    if kind == "tiled":  # every combination stays within 1024 threads and 48 KB of shared memory
        return {"units": (4, 8, 16, 32), "row_threads": (4, 8, 16, 32), "rows_per_thread": (1, 2, 4), "k_chunk": (16, 32)}
    if kind == "mma":  # at most 8 warps and 33 KB of shared memory
        return {"units": (8, 16), "n_tiles": (1, 2, 4), "n_warps": (1, 2), "k_warps": (1, 2, 4), "depth": (1, 2, 4)} | _half_operand(spec)
    if kind == "persistent_mma":
        return _persistent_mma_space(spec, cell, _arch(target))
    raise ValueError(f"unknown kernel kind {kind!r}")


def _persistent_mma_space(spec, cell, arch) -> dict[str, tuple[int, ...]]:
    """The persistent tensor-core kernel's knobs: tile shapes that fit beside R (or, where R is larger than a wave's
    shared memory, beside the part of it that stays resident), prefetch, and in 3xTF32 split_acc and chunk_acc."""
    resident = _resident_tiles(spec, cell, arch)
    space = resident or _streaming_tiles(spec, cell, arch)
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


def _half_operand(spec) -> dict[str, tuple[int, ...]]:
    """fp16/bf16 layers on tensor cores: B from the half-precision copy of h (bit-identical, half the bytes) or not."""
    from .recurrent_mma import HALF

    return {"half_operand": (0, 1)} if spec.dtype in HALF else {}


def _resident_tiles(spec, cell, arch) -> dict[str, tuple[int, ...]]:
    """Units per block that fit one wave with R in shared memory, and batch tiles whose partial sums still fit
    beside R at the largest of those units with the most warps (so every combination fits, f16x3's row scales too)."""
    from .recurrent_mma import MmaConfig
    from .recurrent_persistent_mma import UNITS, fits, halves_apply

    halves = int(halves_apply(spec))
    units = [u for u in UNITS if fits(spec, cell, arch, MmaConfig(units=u, n_tiles=1, n_warps=1, k_warps=2, halves=halves))]
    while units:
        n_tiles = tuple(nt for nt in (1, 2, 3, 4)
                        if fits(spec, cell, arch, MmaConfig(units=units[-1], n_tiles=nt, n_warps=2, k_warps=8, halves=halves)))
        if n_tiles:
            return {"units": tuple(units), "n_tiles": n_tiles, "n_warps": (1, 2), "k_warps": (2, 4, 8), "depth": (1, 2)}
        units.pop()
    return {}


def _streaming_tiles(spec, cell, arch) -> dict[str, tuple[int, ...]]:
    """Where streaming_config applies: its units, warps, depth and ring, batch tiles and reduction splits around its point,
    and one value of `streamed`, the most any combination needs (streaming_config's own), so every combination fits and
    none streams far more than it must."""
    import itertools

    from .recurrent_mma import MmaConfig
    from .recurrent_persistent_mma import fewest_streamed, streaming_config

    point = streaming_config(spec, cell, arch)
    if point is None:
        return {}
    # depth 1 only: with the ring, depth 2 doubles its buffers (more of R streamed) and ran 10x slower in fp16 and 1.15x in
    # fp32 on the H100 (benchmarks/results/2026-11-25-h100-streamed-ring.md)
    space = {"units": (point.units,), "n_tiles": (2, 4), "n_warps": (point.n_warps,), "k_warps": (2, 4), "depth": (1,), "ring": (point.ring,),
             "ring_h": (point.ring_h,)}
    if _half_operand(spec):  # B's ring buffers in fp32 would take twice the bytes for what the mma rounds to fp16 anyway
        space["half_operand"] = (point.half_operand,)
    need = [fewest_streamed(spec, cell, arch, MmaConfig(**dict(zip(space, values)))) for values in itertools.product(*space.values())]
    return space | {"streamed": (max(need),)}


def persistent_mma_fits(spec, cell, target) -> bool:
    """All of R in shared memory across one wave of blocks."""
    from .recurrent_mma import supported

    return tensor_cores(target) and supported(spec) and bool(_resident_tiles(spec, cell, _arch(target)))


def persistent_mma_streams(spec, cell, target) -> bool:
    """R does not fit on chip, and persistent_mma runs with part of it read from L2 every step (streaming_config)."""
    from .recurrent_mma import supported
    from .recurrent_persistent_mma import streaming_config

    return (tensor_cores(target) and supported(spec) and not persistent_mma_fits(spec, cell, target)
            and streaming_config(spec, cell, _arch(target)) is not None)


def cooperative_blocks(config: KernelConfig, spec) -> int:
    """The grid a point launches cooperatively (all blocks resident at once, one per SM), or 0 for a kind that does not."""
    if config.kind == "persistent":
        from .recurrent_persistent import PersistentConfig

        return PersistentConfig(blocks=config["blocks"]).grid(spec)
    if config.kind == "persistent_mma":
        from .recurrent_persistent_mma import blocks

        return blocks(spec, config["units"])
    if config.kind == "wavefront":  # the whole stack's grid
        return config["grid"]
    return 0


def in_space(config: KernelConfig, spec, cell, target) -> bool:
    """Whether a point is one of its kind's space for this layer. A default may not be: persistent_mma's space keeps only
    knob values whose every combination fits beside R, and a default may fit where its neighbours do not."""
    space = knob_space(config.kind, spec, cell, target)
    return all(k in space and v in space[k] for k, v in config.knobs)


def kinds(spec, cell, target, choice: str = "auto") -> tuple[str, ...]:
    """The schedule kinds a layer may run on `target` under the user's kernel choice."""
    if target.kind.name != "cuda":
        if choice != "auto":  # a GPU kernel asked of a CPU build would otherwise be dropped without a word
            raise KernelError(f"{spec.op} node '{spec.name}': kernel '{choice}' is a CUDA kernel and the target is "
                                        f"{target.kind.name}, whose layers run the CPU kernel; use kernel='auto' (or a cuda target)")
        return ("cpu",)
    from . import recurrent_persistent as persistent

    fits = persistent.fits(spec, cell, _arch(target))
    one_wave = persistent_mma_fits(spec, cell, target) or persistent_mma_streams(spec, cell, target)  # persistent_mma runs
    large = ("mma",) if rounding_mode(spec, target) else ("tiled",)  # tensor cores where the dtype or precision allows them
    if choice in ("mma", "persistent_mma") and not tensor_cores(target):
        raise KernelError(f"{spec.op} node '{spec.name}': kernel '{choice}' issues tensor-core mma.sync shapes of sm_80 "
                                    f"and newer; the target is {_arch(target)} (use auto, stepwise or tiled)")
    if choice == "persistent_mma" and not one_wave:
        raise KernelError(f"{spec.op} node '{spec.name}': kernel 'persistent_mma' needs one wave of blocks with R in shared "
                                    f"memory or part of it streamed from L2, and hidden size {spec.hidden_size} x {spec.num_directions} "
                                    f"direction(s) in {spec.dtype} fits neither on {_arch(target)}; use auto, mma or stepwise")
    return {"auto": (("persistent",) if fits else ()) + (("persistent_mma",) if one_wave else ()) + ("stepwise",) + large,
            "stepwise": ("stepwise",), "persistent": ("persistent",), "tiled": ("tiled",), "mma": ("mma",),
            "persistent_mma": ("persistent_mma",)}[choice]


def default_config(kind: str, spec, cell, target, batch: int | None = None) -> KernelConfig:
    """The hand-picked point of a space (what an untuned module runs), for `batch` rows where that matters."""
    if kind == "cpu":
        from .recurrent_cpu import ROW_TILE, row_tile_rows, row_tile_units, small_batch_units

        small = batch is not None and batch < ROW_TILE
        units = small_batch_units(spec.hidden_size, spec.num_directions) if small else row_tile_units(spec.hidden_size, cell.gates)
        rows = 1 if small else row_tile_rows(batch, cell.gates, units)
        return KernelConfig.of("cpu", rows=rows, units=units, serpentine=1)
    if kind == "stepwise":
        from .recurrent_cuda import StepwiseConfig

        c = StepwiseConfig()
        return KernelConfig.of("stepwise", warps=c.warps, units_per_warp=c.units_per_warp, batch_tile=c.batch_tile)
    if kind == "tiled":
        from .recurrent_tiled import default_config as tiled_default

        c = tiled_default(batch)
        return KernelConfig.of("tiled", units=c.units, row_threads=c.row_threads, rows_per_thread=c.rows_per_thread, k_chunk=c.k_chunk)
    if kind in ("mma", "persistent_mma"):
        from .recurrent_mma import default_config as mma_default
        from .recurrent_mma import mode as mma_mode
        from .recurrent_persistent_mma import default_config as resident_default

        c = mma_default(batch) if kind == "mma" else resident_default(spec, cell, _arch(target), batch)
        knobs = dict(units=c.units, n_tiles=c.n_tiles, n_warps=c.n_warps, k_warps=c.k_warps, depth=c.depth)
        if kind == "persistent_mma":
            knobs["prefetch"] = c.prefetch
            if mma_mode(spec) == "tf32x3":
                knobs["split_acc"] = c.split_acc
                knobs["halves"] = c.halves
        if _half_operand(spec):
            knobs["half_operand"] = c.half_operand
        if c.streamed:  # R does not fit on chip: the default streams part of it (streaming_config)
            knobs["streamed"] = c.streamed
        if c.ring:  # ... through a ring of shared buffers
            knobs["ring"] = c.ring
        if c.ring_h:
            knobs["ring_h"] = c.ring_h
        return KernelConfig.of(kind, **knobs)
    from . import recurrent_persistent as persistent

    c = persistent.default_config(spec, _arch(target))
    return KernelConfig.of("persistent", blocks=c.blocks, warps=c.warps, batch_tile=c.batch_tile, stage_h=int(c.stage_h),
                           prefetch=c.prefetch)


def emitter(config: KernelConfig, spec, cell):
    """The kernel body (a function of KernelArgs) that one point of a space builds."""
    if config.kind == "cpu":
        from .recurrent_cpu import CpuConfig, cpu_steps

        return lambda a: cpu_steps(a, CpuConfig(rows=config["rows"], units=config["units"], serpentine=config["serpentine"]))
    if config.kind == "stepwise":
        from .recurrent_cuda import StepwiseConfig, stepwise_body

        cfg = StepwiseConfig(warps=config["warps"], units_per_warp=config["units_per_warp"], batch_tile=config["batch_tile"])
        return lambda a: stepwise_body(a, cfg)
    if config.kind == "tiled":
        from .recurrent_tiled import TiledConfig, tiled_body

        cfg = TiledConfig(**dict(config.knobs))
        return lambda a: tiled_body(a, cfg)
    if config.kind == "mma":
        from .recurrent_mma import MmaConfig, mma_body

        cfg = MmaConfig(**dict(config.knobs))
        return lambda a: mma_body(a, cfg)
    if config.kind == "persistent_mma":
        from .recurrent_mma import MmaConfig
        from .recurrent_persistent_mma import persistent_mma_body

        cfg = MmaConfig(**dict(config.knobs))
        return lambda a: persistent_mma_body(a, cfg)
    from .recurrent_persistent import PersistentConfig, persistent_body

    cfg = PersistentConfig(blocks=config["blocks"], warps=config["warps"], batch_tile=config["batch_tile"], stage_h=bool(config["stage_h"]),
                           prefetch=config["prefetch"])
    return lambda a: persistent_body(a, cfg)
