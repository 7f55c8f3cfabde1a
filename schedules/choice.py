"""Which kernel runs which batch: one ordered table per target, the tuned points cut in, and the plan that results.

A layer's kernel is a dispatch over batch buckets (`if batch <= b0: ... elif ...`), each bucket running one point of
one kind's space (space.py): the tuned point where the tuning logs have one for this shape and target and it beat the
default by TUNED_MARGIN, else the default. The defaults are the rows of DEFAULTS whose condition holds for the layer
(space.Fit: does R fit on chip, and how), in order; each runs batches above the row before it up to its own bound, the
last one every batch above. The measurements behind each bound are in docs/decisions.md (Kernels).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

from .device import Device
from .errors import KernelError
from .recurrent_cluster import GRID_MIN_HIDDEN
from .recurrent_cpu import ROW_TILE
from .recurrent_persistent_mma import MID_BATCH as RESIDENT_MID_BATCH
from .recurrent_persistent_mma import POLLED_MID_BATCH
from .recurrent_persistent_mma import SMALL_BATCH as RESIDENT_SMALL_BATCH
from .recurrent_persistent_mma import WIDE_BATCH as RESIDENT_MAX_BATCH
from .space import Fit, KernelConfig, default_config, kinds

KERNEL_CHOICES = ("auto", "stepwise", "persistent", "tiled", "mma", "persistent_mma", "cluster")
PERSISTENT_MAX_BATCH = 4  # persistent up to here (2-2.3x stepwise at batch 1, 1.4x slower at batch 8)
STEPWISE_MAX_BATCH = 32  # stepwise (fp32, R not on chip) up to here, tiled above
TILED_MIN_HIDDEN = 1024  # tiled only from this hidden size (too few blocks fill the GPU below)
# cluster (sync 1) at batch 1 between these hidden sizes: one cluster below H512 (0.67-0.90 us a step against
# persistent's 1.7-3.1 at H64-H256), a grid of them from H512 where one fits (recurrent_cluster.GRID_MIN_HIDDEN:
# 1.00-1.17 us at H512, 1.67-1.95 at H768, 1.53-1.93 at H1024, against persistent's 1.8-2.9;
# benchmarks/results/h100-cluster-step.md). Below H64, above H1024 and one cluster from H512 (GRU H800 fp16 fits) not
# measured
CLUSTER_MIN_HIDDEN, CLUSTER_MAX_HIDDEN, CLUSTER_MAX_BATCH = 64, 1024, 1
# above batch 1 where one cluster holds R: as many clusters a direction side by side, one row each
# (recurrent_cluster.batch_config), up to batch 4 to H512 and batch 8 to H256 (LSTM H256 at batch 4 and 8, H512 at 4:
# 0.79-1.86 us a step against persistent's or persistent_mma's 2.4-6.0; at H512 batch 8 they lost:
# benchmarks/results/h100-cluster-batch.md): (batch bound, largest hidden size)
CLUSTER_BATCHES = ((4, 512), (8, 256))
# ... but from this hidden size, where persistent_mma's points poll h (Fit.polled: fp16 LSTM and PyTorch's GRU), they
# run batch 1-8 ahead of cluster and persistent, and batch 9-16 in two 8-row tiles (POLLED_MID_BATCH): LSTM H1024 batch
# 1 1.48 us a step against cluster's 1.74, batch 4 2.10 against persistent's 7.02, batch 16 3.20 against the barrier's
# 3.89; from H64 too (H200): H64-H448 batch 1 0.67-1.07 us against cluster's 0.77-1.52, H96-H256 batch 8-16 0.94-1.67
# against 1.03-2.49; LSTM H96 batch 1 and H256 batch 1 and 4 within 4% (benchmarks/results/h200-polled-small-hidden.md);
# below H64 unmeasured (docs/decisions.md, Which kernel runs which batch)
POLLED_MIN_HIDDEN = 64
STREAMED_MAX_BATCH = 64  # persistent_mma streaming part of R runs STEPWISE_MAX_BATCH+1 .. here (its 64 rows per pass)
# above RESIDENT_MAX_BATCH (persistent_mma's last 32-row passes) with R resident, in exact fp32: the per-step mma
# (3xTF32) up to this hidden size, where persistent_mma's blocks of 8 units fill a quarter of the H100's SMs (blog-b,
# H256 at batch 64: 2.80 ms against 3.67), persistent_mma's 64-row passes above (b64-h1024-l2: 2.91 against mma's
# 3.54; benchmarks/results/h100-exact-fp32-batch64.md)
EXACT_MMA_MAX_HIDDEN = 256
# ... in half precision and TF32: persistent_mma's 64-row passes for LSTM from this hidden size (128 blocks of 8 units:
# every SM but four), the per-step mma below and for GRU and RNN: LSTM H1024 1.14-1.19x the per-step mma at batch 48-64
# (fp16, TF32), but 0.89-0.92x at LSTM H512-H768 (64 and 96 blocks) and GRU H1024
# (benchmarks/results/h100-persistent-mma-batch64.md); RNN and LSTM H769-H1023 not measured
ROUNDED_PASSES_MIN_HIDDEN = 1024
# a tuned point replaces the default only when it measured this much faster: a kernel timed alone (R left in L2 between
# repeats) can win by a hair yet lose inside a model
TUNED_MARGIN = 0.05


@dataclass(frozen=True)
class Default:
    kind: str
    up_to: int | None  # the largest batch it runs (None: every batch above the row before); the last row's is None
    batch: int | None  # the batch its default point is picked for (None: the kind's general one)
    when: Callable[[Fit], bool]


def _always(fit: Fit) -> bool:
    return True


# CUDA under auto, in batch order. R too large for shared memory but streamed by persistent_mma: the per-step kind, the
# streaming kernel, the per-step kind again. R on chip: persistent_mma's polled 8-row point to batch 8 where it polls,
# else cluster and persistent at small batch, then persistent_mma's batch tiles to
# RESIDENT_MAX_BATCH and the per-step mma above (Fit.per_step_above), or persistent_mma's 64-row passes to any batch
# (exact fp32 above EXACT_MMA_MAX_HIDDEN, LSTM in a rounding mode from ROUNDED_PASSES_MIN_HIDDEN). Neither: persistent
# if it fits, then mma where tensor cores take the dtype, else stepwise and (for wide layers) tiled
CUDA_DEFAULTS = (
    Default("mma", STEPWISE_MAX_BATCH, STEPWISE_MAX_BATCH, lambda f: f.streams and f.tensor_cores),
    Default("stepwise", STEPWISE_MAX_BATCH, STEPWISE_MAX_BATCH, lambda f: f.streams and not f.tensor_cores),
    Default("persistent_mma", STREAMED_MAX_BATCH, STREAMED_MAX_BATCH, lambda f: f.streams),
    Default("mma", None, None, lambda f: f.streams and f.tensor_cores),
    Default("tiled", None, None, lambda f: f.streams and not f.tensor_cores),
    Default("persistent_mma", RESIDENT_SMALL_BATCH, RESIDENT_SMALL_BATCH, lambda f: f.polled),
    Default("persistent_mma", POLLED_MID_BATCH, POLLED_MID_BATCH, lambda f: f.polled),
    Default("cluster", CLUSTER_MAX_BATCH, CLUSTER_MAX_BATCH,
            lambda f: (f.cluster and f.persistent and not f.streams
                       and CLUSTER_MIN_HIDDEN <= f.hidden_size <= CLUSTER_MAX_HIDDEN
                       and (f.hidden_size < GRID_MIN_HIDDEN or f.cluster_grid))),
    *(Default("cluster", b, b, lambda f, b=b, h=h: f.cluster_batch >= b and not f.streams and CLUSTER_MIN_HIDDEN <= f.hidden_size <= h)
      for b, h in CLUSTER_BATCHES),
    Default("persistent", PERSISTENT_MAX_BATCH, None, lambda f: f.persistent and not f.streams),
    Default("persistent_mma", RESIDENT_SMALL_BATCH, RESIDENT_SMALL_BATCH, lambda f: f.resident),
    Default("persistent_mma", RESIDENT_MID_BATCH, RESIDENT_MID_BATCH, lambda f: f.resident),
    Default("persistent_mma", RESIDENT_MAX_BATCH, RESIDENT_MAX_BATCH, lambda f: f.resident),
    Default("persistent_mma", None, None, lambda f: f.resident and not f.per_step_above),
    Default("mma", None, None,
            lambda f: (f.tensor_cores or f.exact_mma) and not f.streams and (f.per_step_above or not f.resident)),
    Default("stepwise", STEPWISE_MAX_BATCH, None, lambda f: not (f.resident or f.streams or f.tensor_cores)),
    Default("tiled", None, None, lambda f: f.wide and not (f.resident or f.streams or f.tensor_cores)),
)
# CPU: single rows at batch 1, one tile of exactly the batch's rows each below ROW_TILE, then tiles of ROW_TILE rows
CPU_DEFAULTS = tuple(Default("cpu", b, b, _always) for b in range(1, ROW_TILE)) + (Default("cpu", None, None, _always),)
# a kind the user named runs every batch; persistent_mma's default point changes with the batch as under auto
NAMED_DEFAULTS = (
    Default("cluster", CLUSTER_MAX_BATCH, CLUSTER_MAX_BATCH, _always),
    *(Default("cluster", b, b, _always) for b, _ in CLUSTER_BATCHES),
    Default("persistent_mma", RESIDENT_SMALL_BATCH, RESIDENT_SMALL_BATCH, _always),
    Default("persistent_mma", POLLED_MID_BATCH, POLLED_MID_BATCH, _always),
    Default("persistent_mma", RESIDENT_MID_BATCH, RESIDENT_MID_BATCH, _always),
    Default("persistent_mma", RESIDENT_MAX_BATCH, RESIDENT_MAX_BATCH, _always),
)


@dataclass(frozen=True)
class Branch:
    up_to: int | None  # the largest batch this branch runs (None: any batch above the previous branch)
    config: KernelConfig
    tuned: bool  # chosen from a tuning log; else the default point of its space
    # chosen from a log that measured the default point within TUNED_MARGIN of its best: the default runs, on evidence
    kept_default: bool = False

    def as_dict(self) -> dict:
        return {"up_to_batch": self.up_to, "config": self.config.as_dict(), "tuned": self.tuned, "kept_default": self.kept_default}

    @property
    def label(self) -> str:
        return "tuned: default kept" if self.kept_default else "tuned" if self.tuned else "default"


@dataclass(frozen=True)
class KernelPlan:
    """The one decision about a layer's recurrent kernel: which point of which space runs each batch bucket."""

    target_kind: str
    branches: tuple[Branch, ...]
    why: str  # why these kinds (does R fit on chip?)
    projection: str = ""  # the GEMM of its input projection (tvmrnn.lowering fills it in as it emits it)

    def describe(self) -> str:
        parts = []
        for b in self.branches:
            when = f"batch <= {b.up_to}: " if b.up_to is not None and len(self.branches) > 1 else ""
            parts.append(f"{when}{b.config.describe()} [{b.label}]")
        why = f" ({self.why})" if self.why else ""
        return f"{self.target_kind}: " + "; else ".join(parts) + why

    @property
    def tuned(self) -> bool:
        return any(b.tuned for b in self.branches)

    def branch_at(self, batch: int) -> Branch:
        """The branch that runs `batch` rows."""
        return next(b for b in self.branches if b.up_to is None or batch <= b.up_to)


def default_rows(spec, cell, target, choice: str, device: Device) -> list[Default]:
    """The rows of the defaults table a layer runs under `choice`, the last one's bound lifted."""
    if target.kind.name != "cuda":
        rows = list(CPU_DEFAULTS)
    elif choice != "auto":
        rows = [r for r in NAMED_DEFAULTS if r.kind == choice] + [Default(choice, None, None, _always)]
    else:
        fit = Fit.of(spec, cell, target, device)
        rows = [r for r in CUDA_DEFAULTS if r.when(fit)]
    # a row whose batches an earlier row already runs (persistent's after cluster's batch groups) would be dead code
    rows = [r for i, r in enumerate(rows[:-1]) if not _runs_before(r, rows[:i])] + rows[-1:]
    return rows[:-1] + [Default(rows[-1].kind, None, rows[-1].batch, _always)]


def _runs_before(row: Default, earlier: list[Default]) -> bool:
    """Whether the earlier rows already run every batch `row` would (a bound at or below one of theirs)."""
    return row.up_to is not None and any(p.up_to is not None and p.up_to >= row.up_to for p in earlier)


def default_branches(spec, cell, target, choice: str, device: Device) -> list[Branch]:
    """The untuned plan's branches, one per row (the tuned buckets cut in between its bounds)."""
    return [Branch(r.up_to, default_config(r.kind, spec, cell, target, r.batch, device), False)
            for r in default_rows(spec, cell, target, choice, device)]


def _fit_note(spec, cell, target, choice, device: Device) -> str:
    """Whether R fits on chip for the persistent kinds (why they are or are not among auto's); raises when the user
    asked for persistent and R does not fit."""
    from . import recurrent_persistent as persistent

    need = persistent.default_config(spec, device).smem_bytes(spec, cell) / 1024
    where = f"R slice {need:.1f} KB per block, {device.smem_limit / 1024:.0f} KB on {device.arch}"
    fit = Fit.of(spec, cell, target, device)
    if choice == "persistent" and not fit.persistent:
        raise KernelError(f"{spec.op} node '{spec.name}': kernel 'persistent' needs R on chip, and hidden size "
                          f"{spec.hidden_size} x {spec.num_directions} direction(s) does not fit ({where}); use auto or stepwise")
    resident = "; persistent_mma: R fits in shared memory across one wave" if fit.resident else \
        "; persistent_mma: part of R streamed from L2 each step" if fit.streams else ""
    return f"persistent: {where}: " + ("fits" if fit.persistent else "does not fit") + resident


def plan_kernel(spec, cell, target, choice: str = "auto", tuned: dict | None = None, device: Device | None = None) -> KernelPlan:
    """The plan for one layer on `target` (device: its SM count, shared memory and CPU threads; by default the
    target's). tuned: {batch bucket: [(KernelConfig, seconds), best first]} from the tuning logs; each bucket runs its
    best point of a kind this choice allows, unless the default point for that batch measured within TUNED_MARGIN of
    it. Without any, the defaults."""
    if choice not in KERNEL_CHOICES:
        raise KernelError(f"kernel={choice!r} is not supported; one of {KERNEL_CHOICES}")
    device = device or Device.of_target(target)
    cuda = target.kind.name == "cuda"
    why = _fit_note(spec, cell, target, choice, device) if cuda else ""
    allowed = kinds(spec, cell, target, choice, device)
    defaults = default_branches(spec, cell, target, choice, device)
    picked = {}
    for batch, points in (tuned or {}).items():
        points = [(c, t) for c, t in points if c.kind in allowed]
        default = next(b.config for b in defaults if b.up_to is None or batch <= b.up_to)
        default_t = dict(points).get(default)
        # the tuner always measures the default point: logs without it predate today's default (say, a kind added
        # since) and cannot tell whether their best beats it
        if points and default_t is not None:
            best, best_t = points[0]
            picked[batch] = default if best_t > default_t * (1 - TUNED_MARGIN) else best
    return KernelPlan("cuda" if cuda else "cpu", tuple(_cut_in(defaults, picked)), why)


def _cut_in(defaults: list[Branch], picked: dict) -> list[Branch]:
    """The default branches with the tuned buckets cut in: a tuned bucket runs its point from the boundary below it
    (a smaller bucket's or a default branch's) up to its batch, and every other batch keeps the default that covers it
    (a bucket does not take every batch below it: a default may be tuned for those)."""
    def default_at(batch):
        return next(b for b in defaults if b.up_to is None or batch <= b.up_to)

    bounds = sorted(set(picked) | {b.up_to for b in defaults if b.up_to is not None})
    return _merged([Branch(hi, picked[hi], True, picked[hi] == default_at(hi).config) if hi in picked else default_at(hi)
                    for hi in bounds] + [defaults[-1]])


def _merged(branches: list[Branch]) -> list[Branch]:
    """Neighbours running the same point (a default split by a bucket around it) as one branch."""
    merged = []
    for b in branches:
        if merged and (merged[-1].config, merged[-1].tuned, merged[-1].kept_default) == (b.config, b.tuned, b.kept_default):
            merged[-1] = b
        else:
            merged.append(b)
    return merged
